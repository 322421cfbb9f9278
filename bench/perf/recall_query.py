#!/usr/bin/env python3
"""Recall by query: latency (keyword; fused with embeddings) and indexing cost.

Two corpora, each ingested into a fresh DuckDB:
- the two real Pi sessions (../shared/sessions/*.jsonl, or --sessions DIR): their source entries are the documents (the
  transcript a compaction hides), as a live session's first recall finds them;
- 10,000 memory items: one synthetic session whose ledger records hold 10,000 observations (sentences
  drawn from a fixed vocabulary with identifiers in them, seeded), plus its entries.

For each: the index's cost (the BM25 terms, ``refresh_search_index``, and the embeddings,
``refresh_vectors``, timed on the whole corpus and given per 1,000 documents), then the latency of
``recall_query`` (the function ``om recall QUERY`` and the live tool call) for a fixed set of queries,
keyword only and fused, median and worst of several rounds, the session given (its branch first).

Usage (from the repository root; the fused figures need ``pip install -e '.[embeddings]'``):

    .venv/bin/python bench/perf/recall_query.py
    .venv/bin/python bench/perf/recall_query.py --json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
from bench import harness  # noqa: E402

from builders import SessionBuilder  # noqa: E402

from om_core.ingest import ingest  # noqa: E402
from om_core.recall import vectors  # noqa: E402
from om_core.recall.query import recall_query  # noqa: E402
from om_core.store.search_index import refresh_search_index  # noqa: E402
from om_core.settings import Settings  # noqa: E402
from om_core.store import db as dbmod  # noqa: E402
from om_core.store.workspace import Workspace  # noqa: E402

QUERIES = ["upload retries", "src/upload_client.py", "why did the test fail", "database migration schema",
           "deploy to production", "error handling in the parser"]
WORDS = ("upload retry backoff chunk client server parser schema migration ledger deploy staging cluster test "
         "flaky cache token budget compaction summary reflection observation branch commit review release "
         "config setting timeout socket thread queue worker model prompt index search vector cosine").split()
PATHS = ["src/upload_client.py", "flows/cli/main.py", "sql/views/090_search.sql", "om_core/recall/query.py",
         "tests/test_db.py", "deployments/pi/om-memory.ts"]


def synthetic(path: Path, items: int, per_record: int = 100) -> Path:
    rng = random.Random(44)
    sb = SessionBuilder("00000000-bench-4000-8000-000000000044", cwd="/home/dev/bench")
    for start in range(0, items, per_record):
        entry = sb.user(" ".join(rng.choice(WORDS) for _ in range(30)))
        obs = []
        for i in range(start, min(items, start + per_record)):
            text = (f"Item {i}: the {rng.choice(WORDS)} {rng.choice(WORDS)} in {rng.choice(PATHS)} "
                    f"{' '.join(rng.choice(WORDS) for _ in range(12))}.")
            obs.append({"id": hashlib.sha256(text.encode()).hexdigest()[:12], "content": text,
                        "timestamp": "2026-01-15 14:30", "relevance": "medium", "sourceEntryIds": [entry],
                        "tokenCount": 30})
        sb.custom("om.observations.recorded", {"observations": obs, "coversUpToId": entry})
    return sb.write(path)


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def measure(name: str, files: list[Path], tmp: Path, rounds: int) -> dict:
    path = tmp / f"{name}.duckdb"
    ws = Workspace.open(path, settings=Settings())
    ingest(ws, files)
    with dbmod.writing(path) as con:
        sessions = [r[0] for r in con.execute("SELECT session_id FROM om_internal.sessions").fetchall()]
        with dbmod.transaction(con):  # the terms index from nothing, as the writers build it
            con.execute("DELETE FROM om_internal.search_terms")
            con.execute("DELETE FROM om_internal.search_documents")
        with dbmod.transaction(con):
            terms_s = timed(lambda: refresh_search_index(con, sessions))
        docs = con.execute("SELECT count(*) FROM om_internal.search_documents").fetchone()[0]
        kinds = dict(con.execute("SELECT doc_kind, count(*) FROM om_internal.search_documents GROUP BY 1").fetchall())
    out = {"corpus": name, "documents": docs, "by_kind": kinds,
           "terms_index_s": round(terms_s, 3), "terms_ms_per_1000": round(terms_s * 1e6 / max(docs, 1), 1)}
    model = vectors.embedder()
    if model is not None:
        load_s = timed(vectors.embedder)
        with dbmod.writing(path) as con, dbmod.transaction(con):
            vec_s = timed(lambda: vectors.refresh_vectors(con, model))
        out.update(vectors_index_s=round(vec_s, 3), vectors_ms_per_1000=round(vec_s * 1e6 / max(docs, 1), 1),
                   model=model.name, model_load_s=round(load_s, 3))
    session = sessions[0]
    for mode, settings in (("keyword", Settings()), ("fused", Settings(recallEmbeddings=True))):
        if mode == "fused" and model is None:
            out["fused"] = f"skipped: {vectors.unavailable()}"
            continue
        here = Workspace.open(path, settings=settings)
        recall_query(here, "warm up", session)
        samples = []
        for _ in range(rounds):
            for q in QUERIES:
                samples.append(timed(lambda q=q: recall_query(here, q, session)))
        out[mode] = {"median_ms": round(statistics.median(samples) * 1000, 1),
                     "max_ms": round(max(samples) * 1000, 1), "queries": len(samples)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=Path, default=harness.SHARED_SESSIONS, help="The folder of the real sessions.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        results = [measure("real-sessions", sorted(args.sessions.glob("*.jsonl")), tmp_path, args.rounds),
                   measure(f"{args.items}-memory-items", [synthetic(tmp_path / "items.jsonl", args.items)], tmp_path,
                           args.rounds)]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        print(f"{r['corpus']}: {r['documents']} documents {r['by_kind']}")
        print(f"  index: terms {r['terms_index_s']} s ({r['terms_ms_per_1000']} ms per 1,000 documents)"
              + (f"; embeddings {r['vectors_index_s']} s ({r['vectors_ms_per_1000']} ms per 1,000)" if "vectors_index_s" in r else ""))
        for mode in ("keyword", "fused"):
            v = r.get(mode)
            print(f"  {mode}: " + (v if isinstance(v, str) else f"median {v['median_ms']} ms, max {v['max_ms']} ms over {v['queries']} queries"))


if __name__ == "__main__":
    main()
