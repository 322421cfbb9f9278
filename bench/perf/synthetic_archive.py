"""The ingest bench's synthetic archive (bench/perf/ingest.py): Pi v3 session files of a given total
size, their text drawn from a seeded vocabulary (English words, made-up words, identifiers, code and
log templates) so that the tokenizer has real work. Same seed, same bytes.

MB means 10^6 bytes throughout.
"""

from __future__ import annotations

import base64
import json
import math
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

MB = 1_000_000


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
