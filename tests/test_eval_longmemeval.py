"""`om eval longmemeval` on a small LongMemEval-format file written by the project, with
the fake model server playing workers, reader, native summarizer and judge."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longmemeval_builders import TYPES, EvalModel, instance, kind_of, small_dataset, write_dataset
from om_core.eval.data import load_dataset
from om_core.eval.haystack import build_haystack
from om_core.errors import OmError
from om_core.eval.run import EvalOptions, run_longmemeval
from om_core.model.client import RetryPolicy
from om_core.settings import Settings

pytestmark = pytest.mark.usefixtures("isolated_home")

# Small thresholds so a history of a few hundred tokens is observed, reflected and compacted.
SMALL = dict(observeAfterTokens=60, reflectAfterTokens=400, keepRecentTokens=40, compactAfterTokens=300,
             modelConcurrency=3)
QIDS = [f"q{i}-LEAK" for i in range(6)] + ["q6-LEAK_abs"]


def options(tmp_path: Path, server, **overrides) -> EvalOptions:
    values = dict(data=tmp_path / "lme.json", out=tmp_path / "out", model="openai/fake-worker",
                  reader="openai/fake-reader", judge="openai/fake-judge", api_base=server.base_url,
                  reader_window=100_000, settings=Settings(**SMALL), concurrency=3,
                  retry=RetryPolicy(attempts=2, base_seconds=0.001, max_seconds=0.002))
    values.update(overrides)
    return EvalOptions(**values)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_no_labels(server) -> None:
    """No label or haystack id in any request; the answer key only in the judge's own request."""
    assert server.requests
    answers = {f"q{i}": f"LEAK-ANSWER-q{i}" for i in range(6)}
    for body in server.requests:
        sent = json.dumps(body, ensure_ascii=False)
        assert "has_answer" not in sent and "sess-LEAK" not in sent and "_abs" not in sent
        assert "answer_session" not in sent and "haystack_session" not in sent
        if kind_of(body) == "judge":
            leaked = [a for a in answers.values() if a in sent]
            assert len(leaked) <= 1  # its own answer key (none for the abstention question)
            assert sent.count("LEAK") == len(leaked)
        else:
            assert "LEAK" not in sent, kind_of(body)
            assert "You never told me a code word about a red bicycle" not in sent


# ------------------------------------------------------------------ data and session files


def test_dataset_reports_bad_instances_and_keeps_the_rest(tmp_path):
    path = write_dataset(tmp_path / "lme.json")
    raw = json.loads(path.read_text())
    raw.insert(0, {"question_id": "x"})  # most fields missing
    raw.insert(0, "not an object")
    raw.append(dict(raw[2]))  # a duplicate question id
    empty = instance("qempty-LEAK", "multi-session", "KW-E")
    empty["haystack_sessions"] = [[] for _ in empty["haystack_sessions"]]
    raw.append(empty)
    raw[2]["answer"] = 42  # numbers are answers too
    path.write_text(json.dumps(raw))
    data = load_dataset(path)
    assert [i.question_id for i in data.instances] == QIDS
    assert data.instances[0].answer == "42"
    reasons = {(p.index, p.question_id): p.reason for p in data.invalid}
    assert len(reasons) == 5
    assert any("differ in length" in r for r in reasons.values())
    assert any("no turns" in r for r in reasons.values())
    assert any("duplicate question_id" in r for r in reasons.values())
    assert data.instances[-1].abstention and not data.instances[0].abstention


def test_haystack_is_a_pi_session_in_date_order_without_labels(tmp_path):
    raw = instance("qx-LEAK", "multi-session", "KW-X", sessions=5)
    raw["haystack_dates"] = ["2023/05/20 (Sat) 02:21", "2023/05/02 (Tue) 10:00", "2023/05/02 (Tue) 09:00",
                             "2023/06/01 (Thu) 00:00", "2023/05/20 (Sat) 02:21"]
    from om_core.eval.data import Instance

    hay = build_haystack(Instance.model_validate(raw))
    path = hay.write(tmp_path / "s")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    header, entries = lines[0], lines[1:]
    assert header["type"] == "session" and header["version"] == 3 and "LEAK" not in header["id"]
    assert [e["type"] for e in entries] == ["message"] * len(entries)
    assert entries[0]["parentId"] is None
    assert all(b["parentId"] == a["id"] for a, b in zip(entries, entries[1:]))
    stamps = [e["timestamp"] for e in entries]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    # sessions in date order: 2 (09:00), 1 (10:00), 0 and 4 (same time, file order), 3
    order = [t.haystack_index for t in hay.turns]
    assert list(dict.fromkeys(order)) == [2, 1, 0, 4, 3]
    assert stamps[0].startswith("2023-05-02T09:00:00")
    text = path.read_text()
    assert "has_answer" not in text and "sess-LEAK" not in text and "LEAK" not in text
    assert hay.write(tmp_path / "s").stat().st_mtime_ns == path.stat().st_mtime_ns  # unchanged: not rewritten


# ------------------------------------------------------------------ a whole run


def test_every_condition_answers_every_question_and_the_report_scores_them(tmp_path, server):
    write_dataset(tmp_path / "lme.json")
    server.responder = EvalModel()
    summary = run_longmemeval(options(tmp_path, server))
    out = tmp_path / "out"
    assert not summary.failures and not summary.interrupted
    for condition in ("om", "oracle", "native", "full"):
        rows = read_jsonl(out / condition / "hypotheses.jsonl")
        assert sorted(r["question_id"] for r in rows) == sorted(QIDS)
        assert all(set(r) == {"question_id", "hypothesis"} for r in rows)
    assert [json.loads(line)["question_id"] for line in (out / "invalid.jsonl").read_text().splitlines()] == ["qbad-LEAK"]

    report = json.loads((out / "report.json").read_text())
    assert report == summary.report and report["invalid_instances"] == 1 and "approximate" in report["judge_note"]
    c = report["conditions"]
    # oracle and full see the evidence; om's observer recorded it; native's summary lost it
    for name in ("oracle", "full", "om"):
        s = c[name]["scores"]
        assert s["judged"] == 7 and s["per_question_average"] == 1.0 and s["mean_of_type_averages"] == 1.0, name
        assert list(s["by_type"]) == TYPES
    native = c["native"]["scores"]
    assert {t: v["accuracy"] for t, v in native["by_type"].items()} == {
        "single-session-user": 0.5, "single-session-assistant": 0.0, "single-session-preference": 0.0,
        "multi-session": 0.0, "temporal-reasoning": 0.0, "knowledge-update": 0.0}
    assert native["per_question_average"] == 1 / 7
    assert native["mean_of_type_averages"] == 0.5 / 6
    assert native["abstention"] == {"questions": 1, "correct": 1, "accuracy": 1.0}
    judged = read_jsonl(out / "native" / "judged.jsonl")
    assert sum(r["verdict"] is True for r in judged) == 1

    # the om reader got the rendered memory in Pi's compaction wrapper, then the kept tail
    results = {r["question_id"]: r for r in read_jsonl(out / "om" / "results.jsonl")}
    assert all(r["summary_chars"] and r["first_kept_entry_id"] and r["observations"] > 0 for r in results.values())
    om_reader = [b for b in server.requests if kind_of(b) == "reader"
                 and b["messages"][1]["content"].startswith("The conversation history before this point was compacted")
                 and "## Observations" in b["messages"][1]["content"]]
    assert len(om_reader) == 7
    assert all(b["messages"][-1]["content"].startswith("[2023-06-01 (Thu) 10:00] ") for b in om_reader)

    # usage from llm_calls, per condition and part
    om_usage = c["om"]["usage"]
    assert om_usage["memory"]["calls"] == server_count(server, "observer", "reflector", "dropper")
    assert om_usage["reader"]["calls"] == 7 and om_usage["judge"]["calls"] == 7
    assert c["native"]["usage"]["memory"]["calls"] == 7
    assert c["oracle"]["usage"]["total"]["calls"] == 14 and c["oracle"]["usage"]["total"]["input_tokens"] > 0
    assert (out / "report.html").read_text().count("<tr") > 10
    assert_no_labels(server)


def server_count(server, *kinds: str) -> int:
    return sum(1 for b in server.requests if kind_of(b) in kinds)


def test_full_is_skipped_when_the_history_does_not_fit(tmp_path, server):
    write_dataset(tmp_path / "lme.json", broken=False)
    server.responder = EvalModel()
    summary = run_longmemeval(options(tmp_path, server, conditions=["full"], reader_window=1024, limit=2))
    full = summary.report["conditions"]["full"]
    assert full["answered"] == 0 and full["skipped"] == 2 and full["missing"] == 0
    assert all(r.startswith("the whole history (") and "does not fit the reader's window (1,024 tokens" in r
               for r in full["skipped_reasons"].values())
    assert not (tmp_path / "out" / "full" / "hypotheses.jsonl").exists() or not read_jsonl(
        tmp_path / "out" / "full" / "hypotheses.jsonl")
    assert not server.requests


def test_resume_after_an_interruption_reuses_what_is_done(tmp_path, server):
    write_dataset(tmp_path / "lme.json")
    model = EvalModel()
    server.responder = model
    stop = threading.Event()
    seen: list[dict] = []

    def progress(event: dict) -> None:
        if event["event"] == "task":
            seen.append(event)
            if len(seen) == 4:
                stop.set()  # what Ctrl-C does

    first = run_longmemeval(options(tmp_path, server), progress=progress, stop=stop)
    assert first.interrupted
    out = tmp_path / "out"
    done = {c: {r["question_id"] for r in read_jsonl(out / c / "hypotheses.jsonl")}
            if (out / c / "hypotheses.jsonl").exists() else set() for c in ("om", "oracle", "native", "full")}
    answered = sum(len(v) for v in done.values())
    assert 1 <= answered < 28
    first_requests = list(server.requests)
    observer_prompts = {json.dumps(b["messages"][:2]) for b in first_requests
                        if kind_of(b) == "observer" and b["messages"][-1]["role"] != "tool"}

    server.requests.clear()
    second = run_longmemeval(options(tmp_path, server))
    assert not second.interrupted and not second.failures
    for condition in ("om", "oracle", "native", "full"):
        rows = read_jsonl(out / condition / "hypotheses.jsonl")
        assert sorted(r["question_id"] for r in rows) == sorted(QIDS)  # each once
    # the second run asked the reader only for what was missing, and no observer input twice
    assert server_count(server, "reader") == 28 - answered
    again = {json.dumps(b["messages"][:2]) for b in server.requests if kind_of(b) == "observer"}
    assert not (again & observer_prompts)
    assert second.report["conditions"]["oracle"]["scores"]["judged"] == 7

    # a third run has nothing left to do and calls no model
    assert_no_labels(server)
    server.requests.clear()
    third = run_longmemeval(options(tmp_path, server))
    assert not server.requests and third.report["conditions"]["om"]["scores"]["per_question_average"] == 1.0


def test_a_failing_question_is_reported_and_done_by_the_next_run(tmp_path, server):
    write_dataset(tmp_path / "lme.json", broken=False)
    server.responder = EvalModel(fail_reader_for="red bicycle")  # a permanent error for the abstention question
    first = run_longmemeval(options(tmp_path, server, conditions=["oracle"]))
    assert [(f["condition"], f["question_id"]) for f in first.failures] == [("oracle", "q6-LEAK_abs")]
    assert first.report["conditions"]["oracle"]["missing"] == 1
    server.responder = EvalModel()
    server.requests.clear()
    second = run_longmemeval(options(tmp_path, server, conditions=["oracle"]))
    assert not second.failures and second.report["conditions"]["oracle"]["answered"] == 7
    assert server_count(server, "reader") == 1


def test_a_permanent_provider_error_stops_the_run_s_calls(tmp_path, server):
    from fake_openai import http_error

    write_dataset(tmp_path / "lme.json", broken=False)
    server.default = http_error(401, "invalid api key")
    summary = run_longmemeval(options(tmp_path, server, conditions=["oracle"]))
    assert len(summary.failures) == 7 and summary.report["conditions"]["oracle"]["missing"] == 7
    assert "invalid api key" in summary.report["model_calls_stopped"]
    assert len(server.requests) <= 3  # the calls already in flight; none after the breaker tripped


def test_reader_recall_reads_the_ledger(tmp_path, server):
    write_dataset(tmp_path / "lme.json", [small_dataset()[0]], broken=False)
    server.responder = EvalModel(use_recall=True)
    run_longmemeval(options(tmp_path, server, conditions=["om"]))
    assert server_count(server, "observer") > 0
    server.requests.clear()
    # with recall: its own column (om-recall) in the same --out, on the same ledger: no worker runs again
    summary = run_longmemeval(options(tmp_path, server, conditions=["om"], reader_recall=True))
    assert server_count(server, "observer", "reflector", "dropper") == 0
    assert set(summary.report["conditions"]) == {"om-recall"}
    result = read_jsonl(tmp_path / "out" / "om-recall" / "results.jsonl")[0]
    assert result["recall_calls"] == 1
    assert read_jsonl(tmp_path / "out" / "om" / "results.jsonl")[0]["recall_calls"] == 0
    import duckdb

    with duckdb.connect(str(tmp_path / "out" / "eval.duckdb"), read_only=True) as con:  # om logs --full reads these
        kept = dict(con.execute("SELECT c.stage, count(*) FROM llm_call_texts t JOIN llm_calls c USING (call_id) "
                                "GROUP BY c.stage").fetchall())
    assert kept.get("reader:om-recall") == 2 and kept.get("judge:om-recall") == 1 and kept.get("observer")
    usage = summary.report["conditions"]["om-recall"]["usage"]
    assert usage["reader"]["calls"] == 2 and usage["memory"]["calls"] > 0  # the memory's cost, from the first run
    tool_results = [m for b in server.requests if kind_of(b) == "reader" for m in b["messages"] if m["role"] == "tool"]
    assert tool_results and "Observation [" in tool_results[0]["content"] and "[User @ " in tool_results[0]["content"]
    assert summary.report["conditions"]["om-recall"]["scores"]["per_question_average"] == 1.0
    assert_no_labels(server)


@pytest.mark.parametrize("content", ["every_instance_invalid", "empty_list"])
def test_a_file_with_no_valid_instance_is_an_error_not_an_empty_report(tmp_path, server, content):
    import os
    import subprocess
    import sys

    data = tmp_path / "lme.json"
    data.write_text(json.dumps([{"question_id": "x"}, "not an object"] if content == "every_instance_invalid" else []))
    with pytest.raises(OmError) as caught:
        run_longmemeval(options(tmp_path, server))
    assert not (tmp_path / "out" / "report.json").exists()
    if content == "empty_list":
        assert str(caught.value) == f"{data} holds no instances"
        return
    assert str(caught.value).startswith(f"none of the 2 instance(s) in {data} is valid (the first, at index 0: ")
    assert len(read_jsonl(tmp_path / "out" / "invalid.jsonl")) == 2
    # the command: one line and a non-zero exit
    done = subprocess.run([sys.executable, "-m", "flows.cli", "eval", "longmemeval", "--data", str(data),
                           "--model", "offline", "--reader", "openai/fake-reader", "--api-base", server.base_url,
                           "--out", str(tmp_path / "cli-out")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "300"})
    assert done.returncode == 1 and done.stdout == ""
    assert [line for line in done.stderr.splitlines() if line.strip()] == [f"error: {caught.value}".replace(
        str(tmp_path / "out"), str(tmp_path / "cli-out"))]


def test_types_that_select_nothing_is_an_error(tmp_path, server):
    write_dataset(tmp_path / "lme.json", [small_dataset()[0]], broken=False)
    with pytest.raises(OmError, match="no instance of type knowledge-update in .*1 valid instance"):
        run_longmemeval(options(tmp_path, server, types=["knowledge-update"]))


def test_a_rerun_with_another_reader_is_refused(tmp_path, server):
    write_dataset(tmp_path / "lme.json", [small_dataset()[0]], broken=False)
    server.responder = EvalModel()
    run_longmemeval(options(tmp_path, server, conditions=["oracle"]))
    from om_core.errors import OmError

    with pytest.raises(OmError, match="other settings"):
        run_longmemeval(options(tmp_path, server, conditions=["oracle"], reader="openai/other"))


def test_cli_longmemeval(tmp_path, server):
    from flows.cli.main import app

    write_dataset(tmp_path / "lme.json")
    (tmp_path / "om.toml").write_text("\n".join(f"{k} = {v}" for k, v in SMALL.items()) + "\n")
    server.responder = EvalModel()
    result = CliRunner().invoke(app, ["eval", "longmemeval", "--data", str(tmp_path / "lme.json"),
                                      "--model", "openai/fake-worker", "--reader", "openai/fake-reader",
                                      "--conditions", "om,oracle", "--types", "multi-session,knowledge-update",
                                      "--out", str(tmp_path / "cli-out"), "--api-base", server.base_url,
                                      "--reader-window", "100000", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report["conditions"]) == {"om", "oracle"}
    assert report["questions"] == 2 and report["judge"] == "openai/fake-reader"
    assert report["settings"]["keepRecentTokens"] == 40  # om.toml reached the run
    assert report["conditions"]["om"]["scores"]["by_type"]["multi-session"]["accuracy"] == 1.0
    bad = CliRunner().invoke(app, ["eval", "longmemeval", "--data", str(tmp_path / "lme.json"), "--model", "x",
                                   "--reader", "y", "--conditions", "om,nope", "--out", str(tmp_path / "o2")])
    assert bad.exit_code != 0 and "unknown condition" in str(bad.exception or bad.output)


def test_ctrl_c_stops_the_command_cleanly_and_a_rerun_finishes(tmp_path, server):
    """A real SIGINT to `om eval longmemeval`: running work ends, exit 130, nothing half-written."""
    import os
    import signal
    import subprocess
    import sys
    import time

    write_dataset(tmp_path / "lme.json", broken=False)
    model = EvalModel()

    def slow(body):
        reply = model(body)
        reply.delay = 0.3
        return reply

    server.responder = slow
    out = tmp_path / "out"
    hypotheses = out / "oracle" / "hypotheses.jsonl"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "eval", "longmemeval", "--data",
                             str(tmp_path / "lme.json"), "--reader", "openai/fake-reader", "--conditions", "oracle",
                             "--out", str(out), "--api-base", server.base_url, "--reader-window", "100000",
                             "--concurrency", "1"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not (hypotheses.exists() and hypotheses.read_text().count("\n") >= 1):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no hypothesis within 180 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr
    first = read_jsonl(hypotheses)
    assert 1 <= len(first) < 7 and json.loads((out / "report.json").read_text())["interrupted"] is True

    server.responder = EvalModel()
    server.requests.clear()
    second = run_longmemeval(options(tmp_path, server, conditions=["oracle"], judge="openai/fake-reader"))
    assert not second.interrupted
    rows = read_jsonl(hypotheses)
    assert sorted(r["question_id"] for r in rows) == sorted(QIDS)
    assert server_count(server, "reader") == 7 - len(first)


def test_condition_files_drop_a_torn_line_and_keep_whole_ones(tmp_path):
    from om_core.eval.results import ConditionFiles, read_jsonl as read_lines

    folder = tmp_path / "out" / "oracle"
    folder.mkdir(parents=True)
    (folder / "hypotheses.jsonl").write_text('{"question_id": "a", "hypothesis": "x"}\nnot json\n'
                                             '{"question_id": "b", "hypothesis": 3}\n{"question_id": "c", "hyp')
    files = ConditionFiles(tmp_path / "out", "oracle").open({"reader": "r"})
    assert files.hypotheses == {"a": "x"}
    assert (folder / "hypotheses.jsonl").read_text().endswith('hypothesis": 3}\n')  # the torn line is cut off
    files.add_answer("c", "y", {})
    files.add_answer("c", "z", {})  # an answer is written once
    assert read_lines(folder / "hypotheses.jsonl")[-1] == {"question_id": "c", "hypothesis": "y"}
    assert ConditionFiles(tmp_path / "out", "oracle").open({"reader": "r"}).hypotheses == {"a": "x", "c": "y"}
