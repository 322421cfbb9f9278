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

    .venv/bin/python bench/ingest.py                  # 220 MB archive in a temp dir, removed afterwards
    .venv/bin/python bench/ingest.py --size-mb 50     # smaller and faster
    .venv/bin/python bench/ingest.py --out /tmp/omb --keep --json

MB means 10^6 bytes throughout.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

MB = 1_000_000
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# ---------------------------------------------------------------------------------------------------
# vocabulary and text pools

COMMON = (
    "the of and to a in is it you that he was for on are with as I his they be at one have this from or had by "
    "word but what some we can out other were all there when up use your how said an each she which do their time "
    "if will way about many then them write would like so these her long make thing see him two has look more day "
    "could go come did number no most people my over know than call first who may down side been now find any new "
    "work part take get place made live where after back little only round year came show every good me give our "
    "under name very through just form sentence great think say help low line differ turn cause much mean before "
    "move right old too same tell does set three want well also play small end put home read hand large add even "
    "here must big high such follow act why ask change went light kind off need try again point near build self "
    "head stand own page should found answer still learn plant cover keep never last let thought start might story "
    "far left late run while press close night real life few because actually probably instead maybe already "
    "however though without between against during before after above below since until whether either neither"
).split()
TECH = (
    "function test file error build config value return module import request response cache index query table "
    "column session entry branch token parser stream batch buffer thread worker queue handler client server path "
    "directory commit merge rebase deploy release version schema migration fixture mock assert exception timeout "
    "retry backoff latency memory heap stack pointer array string integer boolean null undefined promise async "
    "await callback event listener render component state props hook route endpoint payload header cookie auth "
    "user admin role permission leaf parent child node tree walk fold ledger record watermark projection cursor "
    "offset limit page chunk window budget threshold estimate count total sum average median percentile"
).split()
KEYWORDS_PY = "def return if elif else for while in not and or is None True False import from as class with try except finally raise yield lambda pass break continue".split()
ACCENTED = ["Übersicht", "größer", "Straße", "café", "naïve", "déjà", "Ångström", "façade", "jalapeño", "Zürich", "São", "Łódź"]
EMOJI = ["🙂", "🚀", "✅", "⚠️", "🔥", "📦", "🐛"]
SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou", "er", "an", "el")]


class Vocab:
    """Seeded word lists with Zipf-like weights, plus identifier makers."""

    def __init__(self, rng: random.Random) -> None:
        made_up = {"".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))) for _ in range(6000)}
        self.words = COMMON + TECH + sorted(made_up)
        weights = [1.0 / (rank + 8) for rank in range(len(self.words))]
        total = 0.0
        self.cum = []
        for w in weights:
            total += w
            self.cum.append(total)
        self.ident_parts = TECH + sorted(made_up)[:1500]

    def words_(self, rng: random.Random, n: int) -> list[str]:
        return rng.choices(self.words, cum_weights=self.cum, k=n)

    def snake(self, rng: random.Random) -> str:
        return "_".join(rng.choices(self.ident_parts, k=rng.randint(1, 3)))

    def camel(self, rng: random.Random) -> str:
        parts = rng.choices(self.ident_parts, k=rng.randint(1, 3))
        return parts[0] + "".join(p.capitalize() for p in parts[1:])

    def pascal(self, rng: random.Random) -> str:
        return "".join(p.capitalize() for p in rng.choices(self.ident_parts, k=rng.randint(1, 3)))


def make_prose(rng: random.Random, v: Vocab, n_words: int) -> str:
    out: list[str] = []
    words = v.words_(rng, n_words)
    i = 0
    while i < len(words):
        k = rng.randint(5, 24)
        sentence = words[i:i + k]
        i += k
        if not sentence:
            break
        roll = rng.random()
        if roll < 0.25:
            sentence.insert(rng.randrange(len(sentence) + 1), f"`{v.snake(rng) if rng.random() < 0.5 else v.camel(rng)}`")
        elif roll < 0.35:
            sentence.insert(rng.randrange(len(sentence) + 1), f"src/{v.snake(rng)}/{v.snake(rng)}.{rng.choice(['py', 'ts', 'sql', 'md'])}")
        elif roll < 0.42:
            sentence.insert(rng.randrange(len(sentence) + 1), str(rng.choice([rng.randint(0, 99), rng.randint(100, 99999), round(rng.random() * 100, 2)])))
        elif roll < 0.45:
            sentence.insert(rng.randrange(len(sentence) + 1), rng.choice(ACCENTED))
        elif roll < 0.46:
            sentence.append(rng.choice(EMOJI))
        sentence[0] = sentence[0].capitalize()
        out.append(" ".join(sentence) + rng.choice([".", ".", ".", ".", "?", ":", "!"]))
        if rng.random() < 0.15:
            out.append("\n\n")
        elif rng.random() < 0.08:
            out.append("\n- ")
    return " ".join(out).replace(" \n", "\n").replace("\n ", "\n")


def make_code(rng: random.Random, v: Vocab, n_lines: int) -> str:
    lines: list[str] = []
    ts = rng.random() < 0.35
    indent = 0
    for _ in range(n_lines):
        a, b, c = v.snake(rng), v.snake(rng), v.snake(rng)
        ca, cb = v.camel(rng), v.camel(rng)
        P = v.pascal(rng)
        num = rng.randint(0, 4096)
        if ts:
            choices = [
                f"export function {ca}({cb}: {P}, {v.camel(rng)}?: number): {P} {{",
                f"const {ca} = await this.{cb}({v.camel(rng)}, {{ {v.camel(rng)}: {num}, {v.camel(rng)}: \"{v.snake(rng)}\" }});",
                f"if (!{ca} || {ca}.length === 0) return undefined;",
                f"for (const {ca} of {cb}.{v.camel(rng)}()) {{",
                f"// {make_prose(rng, v, rng.randint(4, 14))}",
                f"throw new {P}Error(`{' '.join(v.words_(rng, 5))} ${{{ca}}}`);",
                f"import {{ {P}, {v.pascal(rng)} }} from \"./{v.snake(rng)}.js\";",
                "}",
                f"{ca}.{cb}.push({{ id: {num}, {v.camel(rng)}: {ca}[{rng.randint(0, 9)}] }});",
                f"return {ca}.filter(({cb}) => {cb}.{v.camel(rng)} > {num}).map(({cb}) => {cb}.{v.camel(rng)});",
            ]
        else:
            choices = [
                f"def {a}({b}: {P}, {c}: int = {num}) -> {v.pascal(rng)} | None:",
                f"{b} = self.{a}.{c}({v.snake(rng)}, {v.snake(rng)}={num})",
                f"if {a} is None or not {b}:",
                f"for {a}, {b} in enumerate({c}.{v.snake(rng)}()):",
                f"# {make_prose(rng, v, rng.randint(4, 14))}",
                f"raise {P}Error(f\"{' '.join(v.words_(rng, 5))} {{{a}!r}}\")",
                f"from {a}.{b} import {P}, {v.pascal(rng)}",
                f"return [{a} for {a} in {b} if {a}.{c} > {num}]",
                f"{a}[\"{b}\"] = {{\"{c}\": {num}, \"{v.snake(rng)}\": {rng.choice(['True', 'False', 'None'])}}}",
                f"class {P}({v.pascal(rng)}):",
                f"    \"\"\"{make_prose(rng, v, rng.randint(6, 20))}\"\"\"",
                f"with open({a}, \"rb\") as {b}:",
                f"assert {a}({b}) == {num}, {c}",
            ]
        line = rng.choice(choices)
        lines.append("    " * indent + line if not ts else "  " * indent + line)
        if line.endswith(":") or line.endswith("{"):
            indent = min(indent + 1, 5)
        elif rng.random() < 0.3:
            indent = max(indent - 1, 0)
    return "\n".join(lines) + "\n"


def make_log(rng: random.Random, v: Vocab, n_lines: int) -> str:
    t = datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=rng.randint(0, 40 * 86400))
    out = []
    for _ in range(n_lines):
        t += timedelta(milliseconds=rng.randint(1, 4000))
        kind = rng.random()
        if kind < 0.55:
            out.append(f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond // 1000:03d}Z {rng.choice(['INFO', 'INFO', 'DEBUG', 'WARN', 'ERROR'])} "
                       f"{v.snake(rng)}.{v.snake(rng)} {' '.join(v.words_(rng, rng.randint(3, 10)))} "
                       f"{v.snake(rng)}={rng.randint(0, 99999)} {v.snake(rng)}={rng.getrandbits(48):012x}")
        elif kind < 0.8:
            out.append(f"tests/test_{v.snake(rng)}.py::test_{v.snake(rng)} {rng.choice(['PASSED', 'PASSED', 'PASSED', 'FAILED', 'SKIPPED'])}"
                       f" [{rng.randint(0, 100):>3}%]")
        elif kind < 0.92:
            out.append(f"src/{v.snake(rng)}/{v.snake(rng)}.py:{rng.randint(1, 900)}:{rng.randint(1, 80)}: "
                       f"{rng.choice(['E501', 'F401', 'B008', 'UP035', 'SIM102'])} {' '.join(v.words_(rng, 6))}")
        else:
            out.append(f"  File \"/home/dev/src/{v.snake(rng)}/{v.snake(rng)}.py\", line {rng.randint(1, 900)}, in {v.snake(rng)}")
    return "\n".join(out) + "\n"


class Pools:
    """Pre-generated text; outputs are random windows of it (fast to generate, still varied text)."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self.vocab = Vocab(rng)
        self.prose = [make_prose(rng, self.vocab, rng.randint(20, 400)) for _ in range(2500)]
        self.code = [make_code(rng, self.vocab, rng.randint(20, 400)) for _ in range(900)]
        self.logs = [make_log(rng, self.vocab, rng.randint(20, 300)) for _ in range(500)]

    @staticmethod
    def _window(rng: random.Random, pool: list[str], chars: int) -> str:
        parts: list[str] = []
        have = 0
        while have < chars:
            text = rng.choice(pool)
            start = rng.randrange(len(text)) if len(text) > 200 and rng.random() < 0.7 else 0
            piece = text[start:start + chars - have]
            parts.append(piece)
            have += len(piece)
        return "".join(parts)

    def prose_text(self, rng: random.Random, chars: int) -> str:
        return self._window(rng, self.prose, chars).strip() or "ok"

    def code_text(self, rng: random.Random, chars: int) -> str:
        return self._window(rng, self.code, chars)

    def log_text(self, rng: random.Random, chars: int) -> str:
        return self._window(rng, self.logs, chars)


# ---------------------------------------------------------------------------------------------------
# sessions


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def sized(rng: random.Random, lo: int, hi: int) -> int:
    """Log-uniform size between lo and hi."""
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))


@dataclass
class SessionWriter:
    rng: random.Random
    pools: Pools
    images_left: list[int]  # shared budget across the archive, [n]
    clock: datetime
    ids: set[str] = field(default_factory=set)
    path_ids: list[str] = field(default_factory=list)  # current branch
    user_ids: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    size: int = 0
    entries: int = 0
    model: str = "claude-sonnet-4-5"

    def _id(self) -> str:
        while True:
            candidate = f"{self.rng.getrandbits(32):08x}"
            if candidate not in self.ids:
                self.ids.add(candidate)
                return candidate

    def _tick(self, lo: float, hi: float) -> datetime:
        self.clock += timedelta(milliseconds=int(self.rng.uniform(lo, hi) * 1000))
        return self.clock

    def emit(self, entry_type: str, fields: dict, delay: tuple[float, float] = (0.05, 3.0)) -> str:
        t = self._tick(*delay)
        entry_id = self._id()
        parent = self.path_ids[-1] if self.path_ids else None
        line = json.dumps({"type": entry_type, "id": entry_id, "parentId": parent, "timestamp": iso(t), **fields},
                          ensure_ascii=False, separators=(",", ":"))
        self.lines.append(line)
        self.size += len(line) + 1
        self.entries += 1
        self.path_ids.append(entry_id)
        return entry_id

    def ms(self) -> int:
        return int(self.clock.timestamp() * 1000)

    def image_block(self) -> dict | None:
        if self.images_left[0] <= 0 or self.rng.random() > 0.5:
            return None
        self.images_left[0] -= 1
        data = base64.b64encode(self.rng.randbytes(self.rng.randint(20_000, 160_000))).decode()
        return {"type": "image", "data": data, "mimeType": self.rng.choice(["image/png", "image/jpeg"])}

    # -------------------------------------------------------------- building blocks

    def user(self) -> None:
        r = self.rng
        text = self.pools.prose_text(r, sized(r, 40, 2500))
        if r.random() < 0.2:
            text += "\n\n```\n" + self.pools.log_text(r, sized(r, 200, 6000)) + "```"
        content: list[dict] = [{"type": "text", "text": text}]
        if r.random() < 0.01:
            image = self.image_block()
            if image:
                content.append(image)
        uid = self.emit("message", {"message": {"role": "user", "content": content, "timestamp": self.ms()}},
                        delay=(5, 240))
        self.user_ids.append(uid)

    def usage(self, output: int) -> dict:
        r = self.rng
        cache_read = r.randint(2_000, 150_000)
        cache_write = r.randint(0, 6_000)
        inp = r.randint(1, 12)
        cost = {"input": inp * 3e-6, "output": output * 15e-6, "cacheRead": cache_read * 3e-7, "cacheWrite": cache_write * 3.75e-6}
        cost["total"] = sum(cost.values())
        return {"input": inp, "output": output, "cacheRead": cache_read, "cacheWrite": cache_write,
                "totalTokens": inp + output + cache_read + cache_write, "cost": cost}

    def tool_call(self) -> tuple[dict, dict]:
        """(toolCall block, toolResult message without id/timestamp)."""
        r = self.rng
        v = self.pools.vocab
        call_id = "toolu_01" + "".join(r.choices("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", k=22))
        path = f"src/{v.snake(r)}/{v.snake(r)}.{r.choice(['py', 'py', 'ts', 'sql', 'md'])}"
        kind = r.random()
        details = None
        content: list[dict]
        if kind < 0.38:
            name, args = "read", {"path": path}
            content = [{"type": "text", "text": self.pools.code_text(r, sized(r, 200, 30_000))}]
            if r.random() < 0.004:
                image = self.image_block()
                if image:
                    args = {"path": path.rsplit(".", 1)[0] + ".png"}
                    content = [{"type": "text", "text": "Read image file [image/png]"}, image]
        elif kind < 0.70:
            cmd = r.choice([f"uv run pytest -q tests/test_{v.snake(r)}.py", f"rg -n '{v.camel(r)}' src",
                            f"git log --oneline -{r.randint(5, 40)}", "uv run ruff check", f"cat logs/{v.snake(r)}.log | tail -200",
                            f"find . -name '*.{r.choice(['py', 'ts'])}' | head -100", "make build"])
            name, args = "bash", {"command": cmd}
            big = r.random() < 0.02
            text = self.pools.log_text(r, sized(r, 20_000, 150_000) if big else sized(r, 30, 12_000))
            is_error = r.random() < 0.12
            if is_error:
                text += f"\n\nCommand exited with code {r.choice([1, 1, 2, 124])}"
            content = [{"type": "text", "text": text}]
            details = {}
            return ({"type": "toolCall", "id": call_id, "name": name, "arguments": args},
                    {"role": "toolResult", "toolCallId": call_id, "toolName": name, "content": content,
                     "details": details, "isError": is_error})
        elif kind < 0.92:
            old = self.pools.code_text(r, sized(r, 40, 2000))
            new = self.pools.code_text(r, sized(r, 40, 2400))
            name, args = "edit", {"path": path, "oldText": old, "newText": new}
            ok = r.random() > 0.08
            if ok:
                content = [{"type": "text", "text": f"Successfully replaced text in {path}."}]
                diff = "\n".join(("-" if i % 3 == 0 else "+" if i % 3 == 1 else " ") + f"{r.randint(1, 900):>4} {ln}"
                                 for i, ln in enumerate((old + new).split("\n")[:120]))
                details = {"diff": diff, "firstChangedLine": r.randint(1, 900)}
            else:
                content = [{"type": "text", "text": f"Could not find the exact text in {path}. The old text must match "
                                                     "exactly including all whitespace and newlines."}]
                details = {}
            return ({"type": "toolCall", "id": call_id, "name": name, "arguments": args},
                    {"role": "toolResult", "toolCallId": call_id, "toolName": name, "content": content,
                     "details": details, "isError": not ok})
        else:
            body = self.pools.code_text(r, sized(r, 200, 10_000))
            name, args = "write", {"path": path, "content": body}
            content = [{"type": "text", "text": f"Successfully wrote {len(body.encode())} bytes to {path}"}]
        result = {"role": "toolResult", "toolCallId": call_id, "toolName": name, "content": content}
        if details is not None:
            result["details"] = details
        result["isError"] = False
        return {"type": "toolCall", "id": call_id, "name": name, "arguments": args}, result

    def assistant_turns(self) -> None:
        r = self.rng
        for _ in range(r.randint(1, 9)):
            content: list[dict] = []
            if r.random() < 0.55:
                content.append({"type": "thinking", "thinking": self.pools.prose_text(r, sized(r, 60, 4000)),
                                "thinkingSignature": base64.b64encode(r.randbytes(r.randint(150, 900))).decode()})
            if r.random() < 0.7:
                content.append({"type": "text", "text": self.pools.prose_text(r, sized(r, 20, 1200))})
            calls = [self.tool_call() for _ in range(r.choice([1, 1, 1, 2, 2, 3]))]
            content.extend(c for c, _ in calls)
            out = sum(len(json.dumps(b)) for b in content) // 4
            self.emit("message", {"message": {"role": "assistant", "content": content, "api": "anthropic-messages",
                                              "provider": "anthropic", "model": self.model, "usage": self.usage(out),
                                              "stopReason": "toolUse", "timestamp": self.ms()}}, delay=(1, 40))
            for _, result in calls:
                result["timestamp"] = self.ms()
                self.emit("message", {"message": result}, delay=(0.01, 8))
        text = self.pools.prose_text(r, sized(r, 80, 5000))
        content = [{"type": "text", "text": text}]
        if r.random() < 0.4:
            content.insert(0, {"type": "thinking", "thinking": self.pools.prose_text(r, sized(r, 60, 2500)),
                               "thinkingSignature": base64.b64encode(r.randbytes(r.randint(150, 900))).decode()})
        self.emit("message", {"message": {"role": "assistant", "content": content, "api": "anthropic-messages",
                                          "provider": "anthropic", "model": self.model, "usage": self.usage(len(text) // 4),
                                          "stopReason": "stop", "timestamp": self.ms()}}, delay=(2, 60))

    def extras(self) -> None:
        r = self.rng
        roll = r.random()
        if roll < 0.04:
            self.model = r.choice(["claude-sonnet-4-5", "claude-opus-4-5", "claude-haiku-4-5"])
            self.emit("model_change", {"provider": "anthropic", "modelId": self.model})
        elif roll < 0.08:
            self.emit("thinking_level_change", {"thinkingLevel": r.choice(["off", "minimal", "low", "medium", "high"])})
        elif roll < 0.14:
            cmd = r.choice(["git status --short", "git diff --stat", "ls -la", "uv run pytest -q", "make test"])
            output = self.pools.log_text(r, sized(r, 30, 8000))
            self.emit("message", {"message": {"role": "bashExecution", "command": cmd, "output": output,
                                              "exitCode": r.choice([0, 0, 0, 1]), "cancelled": False,
                                              "truncated": False, "timestamp": self.ms()}}, delay=(5, 60))
        elif roll < 0.17:
            self.emit("custom_message", {"customType": "note", "content": self.pools.prose_text(r, sized(r, 30, 400)),
                                         "display": True})
        elif roll < 0.19 and len(self.path_ids) > 2:
            self.emit("label", {"targetId": self.path_ids[-2], "label": "-".join(self.pools.vocab.words_(r, 2))})
        elif roll < 0.20 and len(self.user_ids) > 4:
            first_kept = self.user_ids[-r.randint(2, 4)]
            summary = "## Goal\n" + self.pools.prose_text(r, sized(r, 400, 6000))
            self.emit("compaction", {"summary": summary, "firstKeptEntryId": first_kept,
                                     "tokensBefore": r.randint(120_000, 190_000),
                                     "details": {"readFiles": [], "modifiedFiles": []}, "fromHook": False})
        elif roll < 0.21 and len(self.path_ids) > 30:
            # /tree back to an earlier point, with a summary of the abandoned branch
            back = r.randint(5, min(60, len(self.path_ids) - 2))
            target = self.path_ids[-back - 1]
            del self.path_ids[-back:]
            self.emit("branch_summary", {"fromId": target, "summary": self.pools.prose_text(r, sized(r, 200, 3000)),
                                         "details": {"readFiles": [], "modifiedFiles": []}, "fromHook": False})


def write_session(path: Path, rng: random.Random, pools: Pools, target_bytes: int, images_left: list[int],
                  start: datetime) -> tuple[int, int]:
    """Write one session of about ``target_bytes``; returns (bytes, entries)."""
    sid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    w = SessionWriter(rng, pools, images_left, start)
    header = json.dumps({"type": "session", "version": 3, "id": sid, "timestamp": iso(start),
                         "cwd": "/home/dev/src/" + pools.vocab.snake(rng)}, separators=(",", ":"))
    written = 0
    with open(path, "w", encoding="utf-8", newline="\n", buffering=1 << 20) as f:
        f.write(header + "\n")
        written += len(header) + 1
        while written + w.size < target_bytes:
            w.user()
            w.assistant_turns()
            w.extras()
            if w.size > 1 << 20:
                f.write("\n".join(w.lines) + "\n")
                written += w.size
                w.lines, w.size = [], 0
        if w.lines:
            f.write("\n".join(w.lines) + "\n")
    return path.stat().st_size, w.entries


def generate(root: Path, total_mb: float, seed: int, *, sizes: tuple[float, float] = (0.2, 20.0),
             pools: Pools | None = None, single: bool = False, quiet: bool = False) -> dict:
    """An archive of sessions in Pi's layout (``--<cwd>--/<ts>_<id>.jsonl``) of about ``total_mb``."""
    pools = pools or Pools(seed)
    rng = random.Random(seed * 7919 + int(total_mb * 1000))
    root.mkdir(parents=True, exist_ok=True)
    images_left = [max(3, int(total_mb // 25))]
    total = files = entries = 0
    target_total = int(total_mb * MB)
    start = datetime(2025, 9, 1, 8, 0, tzinfo=timezone.utc)
    t0 = time.perf_counter()
    while total < target_total:
        size = target_total if single else min(int(sized(rng, int(sizes[0] * MB), int(sizes[1] * MB))),
                                              max(target_total - total, int(sizes[0] * MB)))
        start += timedelta(hours=rng.randint(1, 30))
        project = root / f"--home-dev-src-{pools.vocab.snake(rng).replace('_', '-')}--"
        project.mkdir(exist_ok=True)
        path = project / f"{start.strftime('%Y-%m-%dT%H-%M-%S-%f')[:-3]}Z_{files:05d}.jsonl"
        size_written, n = write_session(path, rng, pools, size, images_left, start)
        total += size_written
        entries += n
        files += 1
        if not quiet and files % 10 == 0:
            print(f"  generated {files} files, {total / MB:.0f} MB", file=sys.stderr)
        if single:
            break
    return {"files": files, "bytes": total, "entries": entries, "seconds": time.perf_counter() - t0}


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


def _vm_hwm_kb() -> int | None:
    """Peak RSS of this process image (VmHWM, Linux); unlike ru_maxrss it does not inherit the parent's."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0), so the peak seen afterwards is the ingest's own."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _rss_kb() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def child_ingest(file: str, db: str) -> None:
    """Runs in a fresh interpreter: ingest one file, print RSS figures (KiB) as JSON.

    After the imports and the tokenizer load, the peak counter is reset to the current RSS; the peak
    read after the ingest is then what the ingest itself needed. ru_maxrss is reported as well, but on
    Linux a child's ru_maxrss starts at its parent's RSS (it survives fork/exec), so it is only an upper
    bound here.
    """
    from om_core.ingest import ingest
    from om_core.settings import Settings
    from om_core.store.workspace import Workspace
    from om_core.pi.tokens import get_encoding

    get_encoding()
    start = _rss_kb()
    reset = _reset_hwm()
    t0 = time.perf_counter()
    report = ingest(Workspace.open(db, settings=Settings()), [file])
    seconds = time.perf_counter() - t0
    print(json.dumps({"rss_start_kb": start, "peak_kb": _vm_hwm_kb() if reset else None,
                      "ru_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "rss_end_kb": _rss_kb(),
                      "seconds": seconds, "entries": report.entries_added,
                      "bytes": sum(f.bytes_read for f in report.files)}))


def measure_memory(file: Path, db: Path) -> dict:
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--_child", str(file), str(db)],
                          capture_output=True, text=True, cwd=str(REPO), check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"child ingest failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    data["children_ru_maxrss_kb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    data["file_mb"] = file.stat().st_size / MB
    return data


def child_breakdown(archive: str, db: str) -> None:
    """Runs in a fresh interpreter: ingest with timing wrappers around the ingest's internals.

    Nothing in om_core is edited; functions are wrapped in this process only. Names that no longer
    exist are skipped. The calling thread (database work), the reader thread (parsing) and the
    tokenizer threads run at the same time, so the parts do not add up to the wall time; the
    process's CPU time is shown as well.
    """
    import hashlib
    import threading
    from collections import defaultdict

    import om_core.store.db as dbmod
    import om_core.ingest as ing
    from om_core.settings import Settings
    from om_core.store.workspace import Workspace
    import om_core.pi.tokens as tok
    from om_core.ingest import file_ingest, files as ing_files, read_ahead, reader as ing_reader, writer as ing_writer
    from om_core.pi.tokens import get_encoding

    get_encoding()
    totals: dict[str, float] = defaultdict(float)
    lock = threading.Lock()

    def add(label: str, seconds: float) -> None:
        with lock:
            totals[label] += seconds

    def timed(owner: object, name: str, label: str) -> None:
        orig = getattr(owner, name, None)
        if orig is None:
            return

        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                add(label, time.perf_counter() - t)

        setattr(owner, name, wrapper)

    if hasattr(tok, "_make_counter"):
        make = tok._make_counter

        def make_timed(enc):
            count = make(enc)

            def counted(texts):
                t, c = time.perf_counter(), time.thread_time()
                try:
                    return count(texts)
                finally:
                    who = "tokenizer threads" if threading.current_thread().name.startswith("om-tokens") \
                        else "small batches, counted by the calling thread"
                    add(f"{who}: counting, wall", time.perf_counter() - t)
                    add(f"{who}: counting, CPU", time.thread_time() - c)

            return counted

        tok._make_counter = make_timed
    else:
        timed(ing_reader, "count_tokens", "count_tokens (tiktoken)")
    timed(ing_reader.SessionParser, "feed", "reader thread: SessionParser.feed (json + Pi estimate)")
    timed(ing_reader.FileReader, "parse_some", "reader thread: read + parse + hash + count_tokens calls")
    timed(read_ahead.ReadAhead, "take", "main: wait for the reader thread to plan the next file")
    timed(read_ahead.ReadAhead, "next_event", "main: wait for the reader thread's next batch")
    timed(ing_writer.BatchWriter, "flush", "main: insert batches (wait for counts, arrow, INSERT, chunk COMMIT)")
    if hasattr(tok, "TokenCounts"):
        timed(tok.TokenCounts, "result", "main: wait for token counts")
    timed(ing_writer.pa, "table", "pyarrow.table")
    timed(file_ingest.FileIngest, "_finish_session", "main: _finish_session (tree, branches, ledger, session row)")

    class _Hash:
        def __init__(self) -> None:
            self.h = hashlib.sha256()

        def update(self, data: bytes) -> None:
            t = time.perf_counter()
            self.h.update(data)
            add("reader thread: sha256 of the lines read (prefix hash)", time.perf_counter() - t)

        def hexdigest(self) -> str:
            return self.h.hexdigest()

        def copy(self) -> "_Hash":
            twin = _Hash.__new__(_Hash)
            twin.h = self.h.copy()
            return twin

    ing_reader.hashlib = ing_files.hashlib = type("hashlib_timed", (), {"sha256": staticmethod(_Hash)})

    class _Con:
        """The ingest's connection, with its COMMITs timed."""

        def __init__(self, con) -> None:
            self._con = con

        def execute(self, sql, *a, **k):
            if not (isinstance(sql, str) and sql.lstrip().upper().startswith("COMMIT")):
                return self._con.execute(sql, *a, **k)
            t = time.perf_counter()
            try:
                return self._con.execute(sql, *a, **k)
            finally:
                add("main: COMMIT", time.perf_counter() - t)

        def __getattr__(self, name):
            return getattr(self._con, name)

    connect = dbmod.connect
    dbmod.connect = lambda *a, **k: _Con(connect(*a, **k))
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    report = ing.ingest(Workspace.open(db, settings=Settings()), [archive])
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    errors = [f.error for f in report.files if f.error][:3]
    print(json.dumps({"wall": wall, "cpu": cpu, "entries": report.entries_added, "errors": errors, "parts": dict(totals)}))


def child_cpu(kind: str, archive: str, db: str) -> None:
    """Runs in a fresh interpreter: one job on the archive, its CPU (user + system) as JSON: ``om``,
    om's ingest; ``duckdb``, DuckDB's read_json_auto of the same files into a table (the floor a
    reader of these files could reach, without Pi's tree, hashes or token counts)."""
    import duckdb

    files = sorted(str(f) for f in Path(archive).rglob("*.jsonl"))
    if kind == "om":
        from om_core.ingest import ingest
        from om_core.settings import Settings
        from om_core.store.workspace import Workspace
        from om_core.pi.tokens import get_encoding

        get_encoding()  # loading the encoding is not ingest work
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    if kind == "om":
        ingest(Workspace.open(db, settings=Settings()), [archive])
    else:
        con = duckdb.connect(db)
        con.execute("CREATE TABLE lines AS SELECT * FROM read_json_auto(?, format = 'newline_delimited', "
                    "union_by_name = true, maximum_object_size = 268435456)", [files])
        con.close()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"cpu": (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)}))


def measure_vs_duckdb(archive: Path, work: Path, runs: int) -> dict:
    """CPU of om's ingest and of DuckDB's read_json_auto on the same files, ``runs`` times each, side by side."""
    out: dict[str, list[float]] = {"om": [], "duckdb": []}
    for i in range(runs):
        for kind in out:
            db = work / f"vs-{kind}-{i}.duckdb"
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--_cpu", kind, str(archive), str(db)],
                                  capture_output=True, text=True, cwd=str(REPO), check=False)
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
                          capture_output=True, text=True, cwd=str(REPO), check=False)
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
