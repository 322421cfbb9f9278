"""What `om run` says about cost, saying one thing per figure: a price from the provider's usage
(``$0.0123``), ``unknown`` when litellm has no price for calls that were made, an estimate named as
one, and nothing at all where no model call was made (the offline baseline): never ``$0.0000`` for a
cost nobody knows."""

from __future__ import annotations

from typing import Any


def cost_status(calls: int, usd: float | None, unpriced: int) -> str:
    """``none`` (no model call), ``priced``, ``unknown`` (no call priced) or ``partly priced``."""
    if not calls:
        return "none"
    if unpriced >= calls or usd is None:
        return "unknown"
    return "partly priced" if unpriced else "priced"


def cost_cell(calls: int, usd: float | None, unpriced: int) -> str:
    """A table cell: blank without model calls, ``unknown``, ``$0.0123``, or ``$0.0123 + unknown``."""
    status = cost_status(calls, usd, unpriced)
    if status == "none":
        return ""
    if status == "unknown":
        return "unknown"
    return f"${usd:.4f}" + (" + unknown" if status == "partly priced" else "")


def cost_line(cost: dict[str, Any]) -> str | None:
    """The one line under `om run`'s table: what the run's model calls cost, whether --max-cost stopped
    it, and the estimate made before it (an estimate of the whole run, named as such); None when there
    is nothing to say (no model call, no estimate: the offline baseline)."""
    calls, usd, unpriced = cost.get("model_calls") or 0, cost.get("cost_usd"), cost.get("unpriced_calls") or 0
    estimate, stopped = cost.get("estimated_usd"), cost.get("stopped_by_max_cost")
    if not calls and estimate is None and not stopped:
        return None
    status = cost_status(calls, usd, unpriced)
    if status == "none":
        spent = "nothing spent: no model call was made"
    else:
        figure = ("unknown (litellm has no price for the model)" if status == "unknown" else f"${usd:.4f}"
                  + (f" + unknown ({unpriced} call(s) litellm could not price)" if status == "partly priced" else ""))
        cached = f", {cost['cached_tokens']:,} of them cached" if cost.get("cached_tokens") else ""
        spent = (f"{figure} for {calls} model call{'s' if calls != 1 else ''} ({cost.get('input_tokens') or 0:,} "
                 f"prompt tokens{cached}, {cost.get('output_tokens') or 0:,} output)")
    parts = [f"cost: {spent}"]
    if stopped:
        parts.append(f"stopped by --max-cost ${cost['max_cost']:.4f} before a call could pass it: nothing "
                     "half-done was kept; rerun to resume where it stopped")
    if estimate is not None:
        parts.append(f"estimated beforehand for the whole run: ${estimate:.4f}")
    return "; ".join(parts)
