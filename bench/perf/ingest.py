#!/usr/bin/env python3
"""Ingest benchmark: throughput, tokenizer share, and peak memory against file size.

What it does, in one run:

1. Generates a synthetic archive (default 220 MB) of Pi v3 session files: many sessions of 0.2-20 MB
   with user prompts, assistant turns with thinking and tool calls, long tool results (code files,
   logs, test output, diffs), shell runs, model/thinking changes, compactions, a branch now and then,
   and a few images. Text is drawn from a seeded vocabulary (English words, made-up words, identifiers,
   code and log templates), so the tokenizer has real work. Same seed, same bytes.
2. Ingests the archive into a fresh DuckDB with ``om_core.ingest.ingest`` and reports wall time, MB/s
   and entries/s.
3. Times tiktoken alone on exactly the text the ingest tokenizes, through the same function the
   ingest calls: every file is parsed with ``SessionParser`` (not timed), its entries are cut into the
   ingest's batches (BATCH_ENTRIES / BATCH_BYTES), and ``count_tokens(pieces, threads=2, wait=False)``
   is called for all of the file's batches at once and timed until the last count is back (the
   tokenizer threads never wait for the parser here). Prints ingest time / tokenizer time (target:
   at most 1.5).
4. Runs the ingest in fresh subprocesses on single files of ~20, ~200 and ~600 MB (``--mem-mb``) and
   reports each child's peak RSS (VmHWM, reset after the imports), to show whether peak memory grows
   with file size.
5. With ``--breakdown``: ingests once more in a subprocess with timing wrappers around the ingest's
   internals (nothing in om_core is edited) and shows where the time goes, and the process's CPU
   time (the ingest's threads share the machine's cores with the tokenizer threads).

Usage (from the repository root):

    .venv/bin/python bench/perf/ingest.py                  # 220 MB archive in a temp dir, removed afterwards
    .venv/bin/python bench/perf/ingest.py --size-mb 50     # smaller and faster
    .venv/bin/python bench/perf/ingest.py --out /tmp/omb --keep --json

MB means 10^6 bytes throughout.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
from bench import harness  # noqa: E402

from bench.perf.ingest_children import child_breakdown, child_cpu, child_ingest  # noqa: E402
from bench.perf.synthetic_archive import MB, Pools, generate  # noqa: E402

# ---------------------------------------------------------------------------------------------------
# measurements


def measure_ingest(db_path: Path, archive: Path, threads: int = 2) -> dict:
    from om_core.ingest import ingest
    from om_core.settings import Settings
    from om_core.store.workspace import Workspace

    t0 = time.perf_counter()
    report = ingest(Workspace.open(db_path, settings=Settings()), [archive], threads=threads)
    seconds = time.perf_counter() - t0
    summary = report.summary()
    return {"seconds": seconds, "files": summary["files"], "bytes": summary["bytes_read"],
            "entries": summary["entries_added"], "quarantined": summary["lines_quarantined"],
            "errors": summary["errors"], "by_status": summary["by_status"]}


def measure_tokenizer(archive: Path, threads: int = 2) -> dict:
    """Parse like the ingest (untimed), then time count_tokens over the ingest's batches (timed)."""
    from om_core.ingest import discover, reader as ingest_reader
    from om_core.pi.session import ParsedEntry, RejectedLine, SessionHeader, SessionParser
    from om_core.pi.tokens import DEFAULT_ENCODING, count_tokens

    files, _ = discover([archive])
    token_seconds = parse_seconds = 0.0
    pieces_n = chars = tokens = batches = source = 0
    for path in files:
        t0 = time.perf_counter()
        parser = SessionParser()
        file_batches: list[list[str]] = []
        pieces: list[str] = []
        n_entries = size = 0
        with open(path, "rb") as f:
            for line_no, data in enumerate(f, start=1):
                if data.endswith(b"\n"):
                    data = data[:-1]
                result = parser.feed(line_no, data)
                if isinstance(result, SessionHeader) or result is None:
                    continue
                if isinstance(result, ParsedEntry):
                    pieces.extend(result.text_pieces or ())
                    source += result.is_source
                    n_entries += 1
                    size += len(result.raw)
                elif isinstance(result, RejectedLine):
                    size += len(result.raw)
                if n_entries >= ingest_reader.BATCH_ENTRIES or size >= ingest_reader.BATCH_BYTES:
                    file_batches.append(pieces)
                    pieces, n_entries, size = [], 0, 0
        if pieces or n_entries:
            file_batches.append(pieces)
        parse_seconds += time.perf_counter() - t0
        # The ingest hands every batch to count_tokens(wait=False) as soon as it is parsed and collects
        # the counts later; here all of a file's batches are handed over at once (the tokenizer
        # threads never wait for anything) and the clock runs until the last count is in.
        t1 = time.perf_counter()
        pending = [count_tokens(batch, DEFAULT_ENCODING, threads, wait=False) for batch in file_batches]
        file_counts = [p.result() for p in pending]
        token_seconds += time.perf_counter() - t1
        for batch, counts in zip(file_batches, file_counts):
            tokens += sum(counts)
            pieces_n += len(batch)
            chars += sum(len(p) for p in batch)
            batches += 1
    return {"seconds": token_seconds, "parse_seconds": parse_seconds, "pieces": pieces_n, "chars": chars,
            "tokens": tokens, "batches": batches, "source_entries": source, "threads": threads}


def measure_memory(file: Path, db: Path) -> dict:
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--_child", str(file), str(db)],
                          capture_output=True, text=True, cwd=str(harness.REPO), check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"child ingest failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    data["children_ru_maxrss_kb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    data["file_mb"] = file.stat().st_size / MB
    return data


def measure_vs_duckdb(archive: Path, work: Path, runs: int) -> dict:
    """CPU of om's ingest and of DuckDB's read_json_auto on the same files, ``runs`` times each, side by side."""
    out: dict[str, list[float]] = {"om": [], "duckdb": []}
    for i in range(runs):
        for kind in out:
            db = work / f"vs-{kind}-{i}.duckdb"
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--_cpu", kind, str(archive), str(db)],
                                  capture_output=True, text=True, cwd=str(harness.REPO), check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"{kind} child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            out[kind].append(json.loads(proc.stdout.strip().splitlines()[-1])["cpu"])
            for p in (db, Path(str(db) + ".wal")):
                p.unlink(missing_ok=True)
    ratios = [o / d for o, d in zip(out["om"], out["duckdb"])]
    return {**out, "ratios": ratios, "median_ratio": sorted(ratios)[len(ratios) // 2]}


def measure_breakdown(archive: Path, db: Path) -> dict:
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--_breakdown", str(archive), str(db)],
                          capture_output=True, text=True, cwd=str(harness.REPO), check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"breakdown run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------
# main


def table(rows: list[tuple[str, str]], title: str) -> str:
    width = max(len(k) for k, _ in rows)
    lines = [title, "-" * len(title)]
    lines += [f"  {k:<{width}}  {v}" for k, v in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--_cpu":
        child_cpu(sys.argv[2], sys.argv[3], sys.argv[4])
        return 0
    if argv is None and len(sys.argv) > 1 and sys.argv[1] in ("--_child", "--_breakdown"):
        (child_ingest if sys.argv[1] == "--_child" else child_breakdown)(sys.argv[2], sys.argv[3])
        return 0
    ap = argparse.ArgumentParser(description="Benchmark om's session ingest (throughput, tokenizer share, peak memory).")
    ap.add_argument("--size-mb", type=float, default=220, help="size of the synthetic archive (default 220)")
    ap.add_argument("--out", type=Path, help="work directory (default: a temp dir, removed unless --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the generated files and databases")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--seed", type=int, default=7, help="generator seed (default 7)")
    ap.add_argument("--threads", type=int, default=2,
                    help="tokenizer threads for the ingest and for the tokenizer-alone timing (default 2, as om uses)")
    ap.add_argument("--mem-mb", default="20,200,600",
                    help="single-file sizes for the memory test (default 20,200,600)")
    ap.add_argument("--skip-memory", action="store_true", help="skip the single-file memory test")
    ap.add_argument("--vs-duckdb", type=int, default=0, metavar="RUNS",
                    help="also the CPU of om's ingest against DuckDB's read_json_auto of the same files, each in a "
                         "fresh process, RUNS times (target: at most 6x)")
    ap.add_argument("--breakdown", action="store_true",
                    help="ingest once more, in a subprocess with timing wrappers, and show where the time goes")
    args = ap.parse_args(argv)

    work = args.out or Path(tempfile.mkdtemp(prefix="om-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    cleanup = args.out is None and not args.keep
    log = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr))
    results: dict = {"seed": args.seed, "size_mb_requested": args.size_mb, "work_dir": str(work)}
    try:
        from om_core.pi.tokens import get_encoding

        t0 = time.perf_counter()
        get_encoding()  # loaded once up front, so neither timing below includes it
        results["encoding_load_seconds"] = time.perf_counter() - t0

        log(f"generating {args.size_mb:.0f} MB of sessions in {work} ...")
        pools = Pools(args.seed)
        archive = work / "archive"
        if archive.exists():
            shutil.rmtree(archive)
        gen = generate(archive, args.size_mb, args.seed, pools=pools, quiet=args.json)
        results["archive"] = gen
        log(f"  {gen['files']} files, {gen['bytes'] / MB:.1f} MB, {gen['entries']} entries in {gen['seconds']:.1f} s")

        db = work / "bench.duckdb"
        for p in (db, Path(str(db) + ".wal")):
            p.unlink(missing_ok=True)
        log("ingesting ...")
        ing = measure_ingest(db, archive, args.threads)
        results["ingest"] = ing
        log(f"  {ing['seconds']:.1f} s")

        log("tokenizer alone ...")
        tok = measure_tokenizer(archive, args.threads)
        results["tokenizer"] = tok
        results["ratio_ingest_to_tokenizer"] = ing["seconds"] / tok["seconds"] if tok["seconds"] else None

        if args.vs_duckdb:
            log(f"CPU of om's ingest and of DuckDB's read_json_auto, {args.vs_duckdb} run(s) each ...")
            results["vs_duckdb"] = measure_vs_duckdb(archive, work, args.vs_duckdb)

        if args.breakdown:
            log("breakdown: ingesting again with timing wrappers ...")
            results["breakdown"] = measure_breakdown(archive, work / "breakdown.duckdb")

        if not args.skip_memory:
            mem = []
            for size in (float(x) for x in args.mem_mb.split(",")):
                single_dir = work / f"single-{size:g}mb"
                if single_dir.exists():
                    shutil.rmtree(single_dir)
                log(f"memory: generating one {size:g} MB file ...")
                info = generate(single_dir, size, args.seed + 1, pools=pools, single=True, quiet=True)
                file = next(single_dir.rglob("*.jsonl"))
                log("memory: ingesting it in a fresh process ...")
                m = measure_memory(file, work / f"single-{size:g}mb.duckdb")
                m["entries_generated"] = info["entries"]
                mem.append(m)
            results["memory"] = mem
    finally:
        if cleanup:
            shutil.rmtree(work, ignore_errors=True)

    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    ing, tok = results["ingest"], results["tokenizer"]
    mb = ing["bytes"] / MB
    rows = [
        ("archive", f"{results['archive']['files']} files, {results['archive']['bytes'] / MB:.1f} MB, "
                    f"{results['archive']['entries']:,} entries (generated in {results['archive']['seconds']:.1f} s)"),
        ("ingest wall time", f"{ing['seconds']:.2f} s"),
        ("ingest throughput", f"{mb / ing['seconds']:.2f} MB/s, {ing['entries'] / ing['seconds']:,.0f} entries/s"),
        ("ingest result", f"{ing['entries']:,} entries, {ing['quarantined']} quarantined, {len(ing['errors'])} errors, "
                          f"status {ing['by_status']}"),
        ("tokenizer alone", f"{tok['seconds']:.2f} s for {tok['pieces']:,} pieces / {tok['chars'] / MB:.1f} M chars / "
                            f"{tok['tokens']:,} tokens in {tok['batches']} batches ({tok['threads']} threads)"),
        ("tokenizer throughput", f"{tok['chars'] / MB / tok['seconds']:.2f} M chars/s, {tok['tokens'] / tok['seconds']:,.0f} tokens/s"),
        ("parse alone (untimed above)", f"{tok['parse_seconds']:.2f} s (SessionParser.feed over every line)"),
        ("ratio ingest / tokenizer", f"{results['ratio_ingest_to_tokenizer']:.2f}  (target <= 1.5)"),
        ("encoding load (excluded)", f"{results['encoding_load_seconds']:.2f} s"),
    ]
    if "vs_duckdb" in results:
        vs = results["vs_duckdb"]
        rows.append(("CPU om ingest / read_json_auto", f"x{vs['median_ratio']:.2f} median (target <= 6): om "
                     + ", ".join(f"{c:.1f}" for c in vs["om"]) + " CPU-s, DuckDB "
                     + ", ".join(f"{c:.1f}" for c in vs["duckdb"]) + " CPU-s"))
    out = [table(rows, "om ingest benchmark")]
    if "breakdown" in results:
        bd = results["breakdown"]
        brows = [(k, f"{v:6.2f} s  ({100 * v / bd['wall']:4.1f}% of wall)") for k, v in
                 sorted(bd["parts"].items(), key=lambda kv: -kv[1])]
        brows.insert(0, ("wall (this run)", f"{bd['wall']:6.2f} s"))
        if bd.get("errors"):
            brows.insert(1, ("ERRORS in this run", "; ".join(bd["errors"])))
        if "cpu" in bd:
            brows.insert(1, ("process CPU (this run)", f"{bd['cpu']:6.2f} s  (2 cores: at most {2 * bd['wall']:.2f} s)"))
        out.append(table(brows, "where the ingest time goes (threads overlap)"))
    if "memory" in results:
        mrows = []
        for m in results["memory"]:
            peak = m["peak_kb"] or m["ru_maxrss_kb"]
            mrows.append((f"{m['file_mb']:.1f} MB file",
                          f"peak RSS {peak / 1024:.0f} MiB = {m['rss_start_kb'] / 1024:.0f} MiB before the ingest "
                          f"+ {(peak - m['rss_start_kb']) / 1024:.0f} MiB during it; {m['entries']:,} entries in "
                          f"{m['seconds']:.1f} s"))
        def growth(m: dict) -> int:
            return (m["peak_kb"] or m["ru_maxrss_kb"]) - m["rss_start_kb"]

        # each size against the previous one: once DuckDB's buffer cap is full, growth shows here
        for small, large in zip(results["memory"], results["memory"][1:]):
            mrows.append((f"{large['file_mb']:.0f} vs {small['file_mb']:.0f} MB",
                          f"ingest's own peak x{growth(large) / max(growth(small), 1):.2f} for "
                          f"x{large['file_mb'] / small['file_mb']:.1f} the bytes (flat would be about x1)"))
        out.append(table(mrows, "peak memory, one file per fresh process (VmHWM, reset after imports)"))
    sys.stderr.flush()
    print("\n\n".join(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
