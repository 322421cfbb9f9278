"""Running an evaluation: instances in parallel, model calls under one limit, resumable, stoppable.

One task is one (instance, condition): build the context, ask the reader, write the hypothesis,
ask the judge, write the verdict, write the calls. Tasks run on a thread pool of ``concurrency``
threads (default: ``modelConcurrency``); every model call, the workers' included, holds one slot
of a semaphore of ``modelConcurrency`` slots. Transient model errors are retried with backoff
(``RetryPolicy``); a task that still fails is reported, writes no hypothesis, and is done by the
next run. Setting ``stop`` (Ctrl-C) lets running tasks end at their next step and starts no new
ones; what is written stays, and a rerun reuses it (the ledger's stages are exactly-once).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from om_core.store import db as dbmod
from om_core.store.catalog import resolve_tip
from om_core.model.circuit import CircuitBreaker
from om_core.errors import InvalidArgument, OmError
from om_core.eval import reader as R
from om_core.eval.conditions import (
    CONDITIONS,
    NO_CUT_NOTE,
    MemoryIncomplete,
    ReaderContext,
    compacted,
    final_cut,
    om_memory,
    whole_history,
)
from om_core.eval.data import QUESTION_TYPES, Dataset, Instance, load_dataset, require_known_types, select
from om_core.eval.haystack import Haystack, build_haystack, evidence_turns
from om_core.eval.report import build_report, write_report
from om_core.eval.results import ConditionFiles
from om_core.model.client import LiteLLMModel, ModelError, RetryPolicy
from om_core.settings import Settings
from om_core.store.workspace import Workspace
from om_core.replay.engine import replay_session
from om_core.workers.stages import compute_stage
from om_core.workers.run_config import ModelConfig, RunGuards, make_brain

DEFAULT_READER_WINDOW = 128_000
ANSWER_RESERVE_TOKENS = 2_048  # room left in the reader's window for its answer
NATIVE_RESERVE_TOKENS = 16_384  # Pi's reserveTokens: room for the summary itself
# Settings that shape the om memory (a rerun with other values would mix two memories).
_MEMORY_SETTINGS = ("observeAfterTokens", "reflectAfterTokens", "observerChunkMaxTokens", "compactAfterTokens",
                    "compactAfterTokensMode", "compactAfterTokensRatio", "observationsPoolMaxTokens",
                    "observationsPoolTargetTokens", "agentMaxTurns", "tokenCounter", "contextWindow",
                    "keepRecentTokens", "gapSafeCompaction", "gapSafeMaxContextShare", "redactSecrets")


class Interrupted(Exception):
    """The run was asked to stop; the task ends here and a rerun finishes it."""


@dataclass
class EvalOptions:
    data: Path
    out: Path
    model: str | None  # the memory workers' model (om), or 'offline' for the extractive baseline
    reader: str
    settings: Settings  # the workspace's (the memory's and the calls' settings: no default of its own)
    judge: str | None = None  # None: the reader's model; 'off': no judge
    conditions: list[str] = field(default_factory=lambda: list(CONDITIONS))
    types: list[str] | None = None
    limit: int | None = None
    api_base: str | None = None
    api_key: str | None = None
    reader_recall: bool = False
    reader_window: int | None = None
    concurrency: int | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    @property
    def judge_model(self) -> str | None:
        if self.judge is not None and self.judge.lower() in ("off", "none", ""):
            return None
        return self.judge or self.reader

    def validate(self) -> None:
        unknown = [c for c in self.conditions if c not in CONDITIONS]
        if unknown or not self.conditions:
            raise InvalidArgument(f"unknown condition(s) {', '.join(unknown) or '(none given)'}: "
                                  f"choose from {', '.join(CONDITIONS)}")
        bad_types = [t for t in self.types or [] if t not in QUESTION_TYPES]
        if bad_types:
            raise InvalidArgument(f"unknown question type(s) {', '.join(bad_types)}: choose from "
                                  f"{', '.join(QUESTION_TYPES)}")
        if self.limit is not None and self.limit < 1:
            raise InvalidArgument("--limit must be at least 1")
        if not self.reader:
            raise InvalidArgument("--reader is required")
        if "om" in self.conditions and not self.model:
            raise InvalidArgument("the om condition needs --model (the memory workers' model, or 'offline')")


@dataclass
class EvalSummary:
    report: dict[str, Any]
    report_paths: tuple[Path, Path]
    dataset: Dataset
    failures: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False


Progress = Callable[[dict[str, Any]], None]


def reader_window(options: EvalOptions) -> tuple[int, str]:
    """The reader's context window: --reader-window, else litellm's model card, else 128k (said so)."""
    if options.reader_window:
        return options.reader_window, "given"
    from om_core.model.client import _import_litellm

    litellm = _import_litellm()
    try:
        info = litellm.get_model_info(options.reader)
        window = info.get("max_input_tokens") or info.get("max_tokens")
        if window:
            return int(window), "litellm model card"
    except Exception:  # a model litellm does not know
        pass
    return DEFAULT_READER_WINDOW, f"unknown model: assumed {DEFAULT_READER_WINDOW:,} (set --reader-window)"


def open_database(path: Path, settings):
    """The evaluation's own workspace: its DuckDB (sessions, ledger, compactions, model calls), one
    connection its threads take turns on (their model calls run outside it), and the run's settings."""
    return Workspace.on_connection(dbmod.connect(path), settings)


class _Run:
    def __init__(self, options: EvalOptions, progress: Progress | None, stop: threading.Event) -> None:
        self.o = options
        self.progress = progress or (lambda _: None)
        self.stop = stop
        self.settings = options.settings
        self.gate_semaphore = threading.BoundedSemaphore(self.settings.modelConcurrency)
        self.run_id = dbmod.new_run_id()
        self.failures: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.db = None
        # the run's guards, one value for every call of the run: a permanent provider error (bad key,
        # unknown model) stops the run's calls at once instead of failing 500 questions one by one, and
        # every call (the memory workers', the reader's, the judge's) holds a slot of the one gate
        self.guards = RunGuards(CircuitBreaker(), None, self.gate)
        # the memory workers' model
        self.config = ModelConfig(model=options.model, api_base=options.api_base, api_key=options.api_key,
                                  timeout=self.settings.requestTimeoutSeconds, retry=options.retry)

    @property
    def breaker(self) -> CircuitBreaker:
        return self.guards.breaker

    def gate(self):
        return self.gate_semaphore

    def _model(self, name: str, record) -> LiteLLMModel:
        return LiteLLMModel(name, api_base=self.o.api_base, api_key=self.o.api_key,
                            timeout=self.settings.requestTimeoutSeconds, retry=self.o.retry, record=record,
                            gate=self.guards.gate, breaker=self.guards.breaker, keep_texts=self.settings.storePrompts)

    def _check(self) -> None:
        if self.stop.is_set():
            raise Interrupted()

    # ------------------------------------------------------------ contexts

    def context(self, condition: str, inst: Instance, hay: Haystack, log: R.CallLog) -> ReaderContext:
        if condition == "oracle":
            turns = evidence_turns(inst, hay)
            ctx = whole_history("oracle", inst, turns)
            if not turns:
                ctx.notes.append("no evidence session in the haystack: the reader sees only the question")
            return ctx
        if condition == "full":
            return whole_history("full", inst, hay.turns)
        if condition == "native":
            tip, first_kept = final_cut(self.db, hay.session_id, self.settings)
            if first_kept is None:
                return compacted("native", inst, hay, None, None, [NO_CUT_NOTE])
            summary, _ = self.native(hay, first_kept, log.recorder("native:native"))
            return compacted("native", inst, hay, summary, first_kept, [])
        # om: the session replayed and drained on the one replay path (payload, replay, commit), exactly-once
        # through the evaluation database's stage_results; a stop ends it before its next stage
        brain = make_brain(self.config, self.settings, self.guards)

        def compute(prepared):  # noqa: ANN001, ANN202 - PreparedStage -> ComputedStage
            self._check()
            return compute_stage(prepared, brain, self.settings)

        replayed = replay_session(self.db, hay.session_id, brain, guards=self.guards, drain=True, run_id=self.run_id,
                                  compute=compute)
        self._check()
        if replayed.error:
            raise MemoryIncomplete(f"the replay failed: {replayed.error}")
        memory = om_memory(self.db, hay, self.settings, replayed.branches, self.run_id)
        notes = list(memory.notes)
        summary = memory.summary
        if summary is None and memory.first_kept is not None:
            if hay.position[memory.first_kept] == 0:
                notes.append("the compaction keeps the whole history: nothing before the cut to summarize")
            else:
                notes.append("the memory projection was empty: native fallback (a native-style summary, as Pi would)")
                summary, _ = self.native(hay, memory.first_kept, log.recorder(f"native:{self.label('om')}"))
        ctx = compacted("om", inst, hay, summary, memory.first_kept, notes)
        ctx.memory = memory.facts
        return ctx

    def fitted(self, ctx: ReaderContext) -> ReaderContext:
        """Every condition's context is checked against the reader's window: one that does not fit,
        with room for the answer, is skipped and says so (never sent to overflow)."""
        if not ctx.skipped and ctx.tokens + ANSWER_RESERVE_TOKENS > self.window:
            what = "the whole history" if ctx.condition == "full" else f"the {ctx.condition} context"
            ctx.skipped = (f"{what} ({ctx.tokens:,} tokens, plus {ANSWER_RESERVE_TOKENS:,} for the answer) does not "
                           f"fit the reader's window ({self.window:,} tokens, {self.window_source})")
        return ctx

    def native(self, hay: Haystack, first_kept: str, record) -> tuple[str, int]:
        turns = hay.turns[: hay.position[first_kept]]
        budget = max(2_048, self.window - NATIVE_RESERVE_TOKENS - ANSWER_RESERVE_TOKENS)
        return R.native_summary(self._model(self.o.reader, record), turns, budget)

    # ------------------------------------------------------------ one task

    def label(self, condition: str) -> str:
        """The name of a condition's folder and report column: ``om-recall`` for om with --reader-recall,
        so one --out holds both and the second reuses the first's ledger (no worker calls again)."""
        return "om-recall" if condition == "om" and self.o.reader_recall else condition

    def task(self, condition: str, inst: Instance, hay: Haystack, files: ConditionFiles) -> dict[str, Any]:
        qid = inst.question_id
        label = files.condition
        log = R.CallLog()
        started = time.monotonic()
        status = "reused"
        try:
            self._check()
            hypothesis = files.hypotheses.get(qid)
            if hypothesis is None:
                ctx = self.fitted(self.context(condition, inst, hay, log))
                if ctx.skipped:
                    files.add_skip(qid, {"question_type": inst.question_type, "skipped": ctx.skipped,
                                         **ctx.facts()})
                    return {"condition": label, "question_id": qid, "status": "skipped", "reason": ctx.skipped}
                self._check()
                recall = None
                if self.o.reader_recall and condition == "om":
                    with self.db.read() as con:
                        tip = resolve_tip(con, hay.session_id, None)
                    recall = R.recall_tool(self.db, hay.session_id, tip)
                reader_started = time.monotonic()
                hypothesis, recalls = R.answer(self._model(self.o.reader, log.recorder(f"reader:{label}")),
                                               ctx, recall)
                files.add_answer(qid, hypothesis, {
                    "question_type": inst.question_type, "abstention": inst.abstention,
                    "seconds": round(time.monotonic() - started, 3),
                    "reader_seconds": round(time.monotonic() - reader_started, 3),
                    "recall_calls": recalls, **ctx.facts()})
                status = "answered"
            judge = self.o.judge_model
            if judge and files.verdict(qid, judge) is None:
                self._check()
                verdict = R.judge(self._model(judge, log.recorder(f"judge:{label}")), inst, hypothesis)
                files.add_judgement(qid, {"judge": judge, "verdict": verdict.verdict, "judge_reply": verdict.text,
                                          "hypothesis": hypothesis, "question_type": inst.question_type,
                                          "abstention": inst.abstention})
                status = "judged" if status == "reused" else status
            return {"condition": label, "question_id": qid, "status": status}
        except Interrupted:
            return {"condition": label, "question_id": qid, "status": "interrupted"}
        except (ModelError, OmError) as exc:
            return self._failed(label, qid, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # one bad instance never stops the run
            return self._failed(label, qid, f"{type(exc).__name__}: {exc}")
        finally:
            try:
                log.write(self.db, hay.session_id, self.run_id)
            except Exception as exc:  # the answer is kept; only its cost record is lost
                self._failed(label, qid, f"could not record model calls: {exc}")

    def _failed(self, condition: str, qid: str, error: str) -> dict[str, Any]:
        row = {"condition": condition, "question_id": qid, "status": "failed", "error": error[:1000]}
        with self._lock:
            self.failures.append(row)
        return row

    # ------------------------------------------------------------ the run

    def run(self) -> EvalSummary:
        o = self.o
        o.validate()
        self._preflight()
        from om_core.model.client import _import_litellm

        _import_litellm()  # seconds, once: not charged to the first questions' wall time
        wall = time.monotonic()
        started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        dataset = load_dataset(o.data)
        o.out.mkdir(parents=True, exist_ok=True)
        _write_invalid(o.out, dataset)
        chosen = select(dataset.instances, o.types, o.limit)
        if not chosen:  # an empty report with exit 0 would read as a finished evaluation
            raise OmError(_nothing_to_evaluate(dataset, o))
        require_known_types(chosen)  # before any model call
        self.window, self.window_source = reader_window(o)
        files = {c: ConditionFiles(o.out, self.label(c)).open(self._config(c)) for c in o.conditions}
        haystacks = {i.question_id: build_haystack(i) for i in chosen}
        self.db = open_database(o.out / "eval.duckdb", self.settings)
        try:
            return self._run_tasks(dataset, chosen, files, haystacks, wall, started_at)
        finally:
            self.db.close()

    def _run_tasks(self, dataset: Dataset, chosen: list[Instance], files: dict[str, ConditionFiles],
                   haystacks: dict[str, Haystack], wall: float, started_at: str) -> EvalSummary:
        o = self.o
        bad_sessions = self._ingest(chosen, haystacks) if {"om", "native"} & set(o.conditions) else {}
        plan = self._plan(chosen, files)
        self.progress({"event": "start", "tasks": len(plan), "questions": len(chosen), "invalid": len(dataset.invalid),
                       "conditions": [f.condition for f in files.values()],
                       "done": {f.condition: sum(1 for i in chosen if i.question_id in f.hypotheses)
                                for f in files.values()}})
        results: list[dict[str, Any]] = []
        interrupted = False
        pool = ThreadPoolExecutor(max_workers=o.concurrency or self.settings.modelConcurrency,
                                  thread_name_prefix="om-eval")
        try:
            futures: set[Future] = set()
            for condition, inst in plan:
                if inst.question_id in bad_sessions and condition in ("om", "native"):
                    results.append(self._failed(self.label(condition), inst.question_id, bad_sessions[inst.question_id]))
                    continue
                futures.add(pool.submit(self.task, condition, inst, haystacks[inst.question_id], files[condition]))
            while futures:
                done, futures = wait(futures, timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    result = future.result()
                    results.append(result)
                    self.progress({"event": "task", **result})
        except KeyboardInterrupt:
            interrupted = True
            self.stop.set()
            self.progress({"event": "stopping"})
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        interrupted = interrupted or self.stop.is_set() or any(r["status"] == "interrupted" for r in results)
        report = build_report(chosen, {f.condition: f for f in files.values()}, self.db, judge_model=o.judge_model, run={
            "data": str(o.data), "model": o.model, "reader": o.reader, "reader_recall": o.reader_recall,
            "reader_window": self.window, "reader_window_source": self.window_source,
            "questions": len(chosen), "invalid_instances": len(dataset.invalid), "started_at": started_at,
            "wall_seconds": round(time.monotonic() - wall, 3), "interrupted": interrupted,
            "failures": self.failures[:50],
            "model_calls_stopped": str(self.breaker.reason) if self.breaker.reason else None,
            "settings": self.settings.model_dump(mode="json")})
        paths = write_report(o.out, report)
        return EvalSummary(report, paths, dataset, list(self.failures), interrupted)

    def _preflight(self) -> None:
        """Credentials, provider and base URL of every model the run needs, before anything starts."""
        models = [self.o.reader] + ([self.o.judge_model] if self.o.judge_model else [])
        if "om" in self.o.conditions:
            models.append(self.o.model)
        for name in dict.fromkeys(models):
            ModelConfig(model=name, api_base=self.o.api_base, api_key=self.o.api_key).preflight(
                self.settings if name == self.o.model else None)

    def _config(self, condition: str) -> dict[str, Any]:
        config: dict[str, Any] = {"reader": self.o.reader}
        if condition == "om":
            memory = self.settings.model_dump(mode="json")
            config.update(model=self.o.model, reader_recall=self.o.reader_recall,
                          settings={k: memory[k] for k in _MEMORY_SETTINGS})
        if condition == "native":
            config["keepRecentTokens"] = self.settings.keepRecentTokens
        return config

    def _ingest(self, chosen: list[Instance], haystacks: dict[str, Haystack]) -> dict[str, str]:
        """Write the session files and ingest them (unchanged files are skipped). Returns problems by question."""
        from om_core.ingest import ingest

        sessions_dir = self.o.out / "sessions"
        paths = {str(haystacks[i.question_id].write(sessions_dir)): i.question_id for i in chosen}
        report = ingest(self.db, list(paths), command="eval longmemeval")
        problems = {}
        for f in report.files:
            if f.error or f.status in ("no_header", "duplicate_session", "error"):
                problems[paths.get(f.path, f.path)] = f"ingest of its session failed: {f.error or f.status}"
        return problems

    def _plan(self, chosen: list[Instance], files: dict[str, ConditionFiles]) -> list[tuple[str, Instance]]:
        """Tasks still to do, longest first (om replays, then native summaries, then single calls)."""
        judge = self.o.judge_model
        order = sorted(self.o.conditions, key=lambda c: CONDITIONS.index(c) if c != "native" else 0.5)
        plan = []
        for condition in order:
            f = files[condition]
            for inst in chosen:
                q = inst.question_id
                if q in f.hypotheses and (judge is None or f.verdict(q, judge) is not None):
                    continue
                plan.append((condition, inst))
        return plan


def _nothing_to_evaluate(dataset: Dataset, o: EvalOptions) -> str:
    if dataset.instances:
        return (f"no instance of type {', '.join(o.types or [])} in {dataset.path} "
                f"({len(dataset.instances)} valid instance(s) of other types)")
    if not dataset.invalid:
        return f"{dataset.path} holds no instances"
    first = dataset.invalid[0]
    return (f"none of the {len(dataset.invalid)} instance(s) in {dataset.path} is valid (the first, at index "
            f"{first.index}: {first.reason}); every reason is in {o.out / 'invalid.jsonl'}")


def _write_invalid(out: Path, dataset: Dataset) -> None:
    path = out / "invalid.jsonl"
    if dataset.invalid:
        path.write_text("".join(R.dumps(i.model_dump()) + "\n" for i in dataset.invalid))
    elif path.exists():
        path.unlink()


def run_longmemeval(options: EvalOptions, progress: Progress | None = None,
                    stop: threading.Event | None = None) -> EvalSummary:
    """Run (or resume) an evaluation; ``stop`` ends it early, keeping what is done."""
    return _Run(options, progress, stop or threading.Event()).run()
