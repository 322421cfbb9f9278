"""The LongMemEval scores as the official scripts compute them, each case against
the official formulas written out here (LongMemEval src/evaluation/print_qa_metrics.py and
evaluate_qa.py), and what a run refuses or skips before a reader could be misled."""

from __future__ import annotations

import json
from statistics import fmean

import pytest

from longmemeval_builders import TYPES, EvalModel, instance, kind_of, write_dataset
from om_core.errors import OmError
from om_core.eval.data import Instance
from om_core.eval.report import scores
from om_core.eval.run import run_longmemeval
from test_eval_longmemeval import options, read_jsonl

pytestmark = pytest.mark.usefixtures("isolated_home")


def official(labels: dict[str, bool], qtype: dict[str, str]) -> dict[str, float]:
    """print_qa_metrics.py: per-type lists over its six types, the task average of their means, the
    overall mean, and abstention over the ids that contain '_abs'."""
    type2acc: dict[str, list[int]] = {t: [] for t in TYPES}
    abstention: list[int] = []
    for qid, label in labels.items():
        type2acc[qtype[qid]].append(1 if label else 0)
        if "_abs" in qid:
            abstention.append(1 if label else 0)
    all_acc = [x for v in type2acc.values() for x in v]
    return {"task": fmean(fmean(v) for v in type2acc.values()), "overall": fmean(all_acc),
            "abstention": fmean(abstention), **{t: fmean(v) for t, v in type2acc.items()}}


def inst(qid: str, qtype: str) -> Instance:
    return Instance.model_validate(instance(qid, qtype, None if "_abs" in qid else "KW"))


def test_abstention_is_any_id_containing_abs():
    assert inst("q1_abs", "multi-session").abstention
    assert inst("q1_abs_2", "multi-session").abstention  # the official test; endswith would miss it
    assert not inst("q1-absent", "multi-session").abstention


def test_scores_are_the_official_formulas_unrounded():
    # three types at 1/3 and three at 1: the task average is 2/3, 0.6667 to four places, where
    # averaging figures already rounded to four places (0.3333) gives 0.66665, shown as 0.6666
    thirds = TYPES[:3]
    qtype, labels = {}, {}
    for t in TYPES:
        for k in range(3):
            qid = f"{t}-{k}" + ("_abs_x" if (t, k) == ("multi-session", 1) else "")
            qtype[qid], labels[qid] = t, t not in thirds or k == 0
    instances = [inst(q, t) for q, t in qtype.items()]
    got = scores(instances, labels)
    want = official(labels, qtype)
    assert got["mean_of_type_averages"] == pytest.approx(want["task"], abs=1e-12)
    assert got["per_question_average"] == pytest.approx(want["overall"], abs=1e-12)
    assert got["abstention"]["accuracy"] == pytest.approx(want["abstention"], abs=1e-12)
    assert got["abstention"]["questions"] == 1
    for t in TYPES:
        assert got["by_type"][t]["accuracy"] == pytest.approx(want[t], abs=1e-12)
    assert round(got["mean_of_type_averages"], 4) == round(want["task"], 4) == 0.6667
    assert round(fmean(round(got["by_type"][t]["accuracy"], 4) for t in TYPES), 4) == 0.6666  # rounding first
    assert got["by_type"]["single-session-user"]["accuracy"] == 1 / 3  # exact, not 0.3333


def test_an_unknown_question_type_is_refused_before_any_model_call(tmp_path, server):
    data = [instance("q0-LEAK", "single-session-user", "KW-A"), instance("q1-LEAK", "multi-hop", "KW-B")]
    write_dataset(tmp_path / "lme.json", data, broken=False)
    server.responder = EvalModel()
    with pytest.raises(OmError, match=r"q1-LEAK \('multi-hop'\).*official LongMemEval metrics|official LongMemEval "
                                      r"metrics do not know: q1-LEAK \('multi-hop'\)"):
        run_longmemeval(options(tmp_path, server))
    assert not server.requests


def test_every_condition_is_checked_against_the_readers_window(tmp_path, server):
    write_dataset(tmp_path / "lme.json", broken=False)
    server.responder = EvalModel()
    summary = run_longmemeval(options(tmp_path, server, conditions=["oracle"], reader_window=2_100, limit=2))
    oracle = summary.report["conditions"]["oracle"]
    assert oracle["answered"] == 0 and oracle["skipped"] == 2
    assert all(r.startswith("the oracle context (") and "does not fit the reader's window (2,100 tokens" in r
               for r in oracle["skipped_reasons"].values())
    assert not [b for b in server.requests if kind_of(b) == "reader"]


def test_stage_counts_are_stage_runs(tmp_path, server):
    """results.jsonl counts the stages that ran (rows of the stages table), not the replay's outcome
    events: a reflector asked again with an input it already answered is no run and no call."""
    write_dataset(tmp_path / "lme.json", broken=False)
    server.responder = EvalModel()
    run_longmemeval(options(tmp_path, server, conditions=["om"], limit=3))
    rows = read_jsonl(tmp_path / "out" / "om" / "results.jsonl")
    counted = {}
    for r in rows:
        for key, n in r["stages"].items():
            counted[key.split(":")[0]] = counted.get(key.split(":")[0], 0) + n
    first_calls = {k: sum(1 for b in server.requests if kind_of(b) == k and b["messages"][-1]["role"] != "tool")
                   for k in ("observer", "reflector", "dropper")}
    assert counted and all(k.split(":")[1] in ("recorded", "empty", "failed") for r in rows for k in r["stages"])
    for stage, n in counted.items():
        assert n == first_calls[stage], (stage, counted, first_calls)  # one run, one first model call
    assert json.dumps(rows)  # the file stays JSON
