"""What model calls cost: prices from litellm's local cost map, an estimate before a run, the real
cost after it (from the provider's usage), and a budget that stops a run before it would exceed it.

Nothing here imports litellm at import time; prices are looked up only when asked for.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass, field
from typing import Any

from om_core.model.client import ModelError

# Prompt tokens per source token (Pi's estimate), as bench/cost/workers.py measured them on the two
# sample sessions with one call per stage, rounded up from the larger figure (prompt 1.05 and 1.39;
# uncached, what an automatic prefix cache would not serve, 0.60 and 0.95: the current prompts, the
# observer's tool parts shortened at observerToolMaxTokens 1,000). They were measured with the
# scripted fake model, whose memory stays small: a real model's memory (up to
# observationsPoolMaxTokens) adds prompt tokens, most of them cached (bench/cost/prompts.py's careful
# model: 3.0 and 2.4 prompt, 0.68 and 1.03 uncached). The output ratio is an allowance, not a
# measurement (the fake model's answers are short).
PROMPT_PER_SOURCE = 1.40
UNCACHED_PER_SOURCE = 0.95
OUTPUT_PER_SOURCE = 0.05
# Output tokens reserved for one call before it is made (the answer's length is unknown until then).
OUTPUT_ALLOWANCE = 2_048
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class Price:
    """USD per token, from litellm's cost map."""

    model: str
    input: float
    output: float
    cache_read: float | None = None  # a prompt token served from the provider's cache
    cache_write: float | None = None  # a prompt token written to the cache (Anthropic's breakpoints)

    def call(self, input_tokens: int, output_tokens: int, cached_tokens: int = 0, cache_write_tokens: int = 0) -> float:
        """The cost of one call: cached prompt tokens at the cache-read price where there is one."""
        cached = min(max(cached_tokens, 0), input_tokens)
        written = min(max(cache_write_tokens, 0), input_tokens - cached)
        plain = input_tokens - cached - written
        return (plain * self.input + cached * (self.cache_read if self.cache_read is not None else self.input)
                + written * (self.cache_write if self.cache_write is not None else self.input)
                + output_tokens * self.output)

    def per_million(self) -> dict[str, float | None]:
        scale = 1_000_000
        return {"input": self.input * scale, "output": self.output * scale,
                "cache_read": None if self.cache_read is None else self.cache_read * scale,
                "cache_write": None if self.cache_write is None else self.cache_write * scale}


def price_of(model: str | None) -> Price | None:
    """The model's price from litellm's local cost map, or None when litellm has none.

    Read from the JSON file litellm ships (milliseconds) for a name the map holds with both per-token
    prices of one of the common providers (PRICED_PROVIDERS), as itself or as ``provider/name`` of an
    entry of that provider; litellm itself (seconds to import) is asked for any other name (its
    aliases, dated and fine-tuned variants, entries it completes from others): the fallback.
    tests/test_cost.py checks that both give the same price for every name of the map."""
    if not model or model == "offline":
        return None
    entry = _cost_map().get(model)
    if entry is None and "/" in model:
        provider, bare = model.split("/", 1)
        found = _cost_map().get(bare)
        entry = found if found is not None and found.get("litellm_provider") == provider else None
    if (entry is None or entry.get("litellm_provider") not in PRICED_PROVIDERS
            or entry.get("input_cost_per_token") is None or entry.get("output_cost_per_token") is None):
        return _litellm_price_of(model)  # the fallback: litellm's own resolution of the name
    return _price(model, entry)


# Providers whose ``provider/name`` litellm prices as the map's ``name`` (checked by tests/test_cost.py).
PRICED_PROVIDERS = frozenset({"openai", "anthropic", "openrouter", "gemini", "groq", "mistral", "deepseek", "xai"})


def _litellm_price_of(model: str) -> Price | None:
    from om_core.model.client import _import_litellm

    litellm = _import_litellm()
    try:
        info = litellm.get_model_info(model)
    except Exception:  # unknown to litellm
        return None
    return _price(model, info)


def _price(model: str, info: Any) -> Price | None:
    input_cost, output_cost = info.get("input_cost_per_token"), info.get("output_cost_per_token")
    if input_cost is None or output_cost is None:
        return None
    return Price(model, float(input_cost), float(output_cost),
                 _float(info.get("cache_read_input_token_cost")), _float(info.get("cache_creation_input_token_cost")))


_COST_MAP: dict[str, Any] | None = None


def _cost_map() -> dict[str, Any]:
    """litellm's bundled cost map (the file LITELLM_LOCAL_MODEL_COST_MAP makes litellm read), read once."""
    global _COST_MAP
    if _COST_MAP is None:
        from om_core.pi.tokens import litellm_package_dir

        package = litellm_package_dir()
        path = None if package is None else package / "model_prices_and_context_window_backup.json"
        _COST_MAP = json.loads(path.read_text()) if path is not None and path.is_file() else {}
        _COST_MAP.pop("sample_spec", None)
    return _COST_MAP


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


# ------------------------------------------------------------------ before a run


@dataclass
class RunEstimate:
    """What a run is expected to cost: source tokens to process × measured prompt ratios."""

    model: str
    source_tokens: int
    prompt_tokens: int
    uncached_tokens: int
    output_tokens: int
    usd: float | None  # None: litellm has no price for the model
    usd_without_cache: float | None = None
    basis: str = "measured ratios (bench/cost/workers.py)"

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def estimate_run(model: str, source_tokens: int, price: Price | None = None, *,
                 prompt_per_source: float = PROMPT_PER_SOURCE, uncached_per_source: float = UNCACHED_PER_SOURCE,
                 output_per_source: float = OUTPUT_PER_SOURCE) -> RunEstimate:
    price = price if price is not None else price_of(model)
    def tokens(ratio: float) -> int:
        return math.ceil(round(source_tokens * ratio, 6))  # round first: 100,000 × 1.1 is 110,000.00000000001

    prompt = tokens(prompt_per_source)
    uncached = min(prompt, tokens(uncached_per_source))
    output = tokens(output_per_source)
    usd = None if price is None else price.call(prompt, output, cached_tokens=prompt - uncached)
    flat = None if price is None else price.call(prompt, output)
    return RunEstimate(model, source_tokens, prompt, uncached, output, usd, flat)


# ------------------------------------------------------------------ during a run


class BudgetExceeded(ModelError):
    """The next model call would take the run past its ``--max-cost``. Nothing is sent; the stage
    appends nothing, so a rerun resumes exactly there."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "permanent")


def request_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    """A quick upper-side estimate of a request's prompt tokens (4 characters a token)."""
    chars = len(json.dumps(tools or [], ensure_ascii=False))
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(p.get("text", "")) for p in content if isinstance(p, dict))
        chars += sum(len(json.dumps(c, ensure_ascii=False)) for c in m.get("tool_calls") or [])
    return math.ceil(chars / CHARS_PER_TOKEN)


@dataclass
class CostBudget:
    """A run's spending limit, consulted before every model call.

    Before a call, its worst case (the whole prompt uncached plus ``OUTPUT_ALLOWANCE`` output tokens)
    is reserved; a call whose reservation would take spent + reserved past the limit is not made
    (``BudgetExceeded``), and from then on the budget is ``exhausted`` so later stages are skipped
    without calling anything. After the call the reservation is replaced by the real cost. Thread-safe:
    concurrent stages share one budget."""

    max_usd: float
    price: Price
    spent: float = 0.0
    reserved: float = 0.0
    exhausted: bool = False
    calls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def worst_case(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> float:
        return self.price.call(request_tokens(messages, tools), OUTPUT_ALLOWANCE)

    def reserve(self, amount: float) -> float:
        with self._lock:
            if self.exhausted or self.spent + self.reserved + amount > self.max_usd:
                self.exhausted = True
                raise BudgetExceeded(
                    f"cost budget reached: ${self.spent:.4f} spent of --max-cost ${self.max_usd:.4f}; the next call "
                    f"could cost up to ${amount:.4f}. Nothing more is sent; rerun to resume where this run stopped")
            self.reserved += amount
            return amount

    def settle(self, reservation: float, cost: float | None) -> None:
        with self._lock:
            self.reserved = max(0.0, self.reserved - reservation)
            if cost is not None:
                self.spent += cost
                self.calls += 1

    def cost_of(self, input_tokens: int | None, output_tokens: int | None, cached_tokens: int | None) -> float:
        """A call's cost from its usage at this budget's price (when litellm reported none)."""
        return self.price.call(input_tokens or 0, output_tokens or 0, cached_tokens or 0)

    def lend(self, parts: int) -> float:
        """Set aside ``1/parts`` of what is left, for a replay that spends on another process (a Dask
        worker) with a budget of that size; ``settle(amount, what it spent)`` when it is back. So the
        run never passes its limit, wherever its replays run."""
        with self._lock:
            amount = max(0.0, (self.max_usd - self.spent - self.reserved) / max(1, parts))
            self.reserved += amount
            return amount

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
