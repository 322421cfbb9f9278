"""Workers as tool-calling model runs: prompts, the tool loop, and the turn cap."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from om_core.workers import prompts
from om_core.model.client import CACHE_BREAKPOINT, ChatModel, parse_arguments, tool_schema
from om_core.redaction.redact import redact_payload
from om_core.workers.checks import DropCheck, ObservationCheck, ReflectionCheck
from om_core.workers.inputs import DropperInput, ObserverInput, ReflectorInput
from om_core.workers.reflection_dropper import ReflectionDropCheck, ReflectionDropperInput


class ToolCheck(Protocol):
    """What a tool call is checked by: ``submit`` returns the receipt; ``problems`` counts rejections so
    far, so a submit that leaves it unchanged was accepted in full (a clean receipt)."""

    problems: int

    def submit(self, args: Any) -> str: ...


@dataclass
class LoopResult:
    turns: int
    finished: bool  # False: the turn cap stopped the loop
    receipts: list[str] = field(default_factory=list)


def user_parts(stable: str, new: str) -> list[dict[str, Any]]:
    """A worker's message as two text parts: the memory, marked as a cache breakpoint (the end of the
    prefix that repeats between calls), then what is new this call."""
    return [{"type": "text", "text": stable, "cache_control": CACHE_BREAKPOINT}, {"type": "text", "text": new}]


def tool_loop(model: ChatModel, system: str, user: str | list[dict[str, Any]],
              tools: dict[str, tuple[tuple, ToolCheck]], max_turns: int, closing_turn: bool = False,
              offered: tuple[tuple, ...] | None = None) -> LoopResult:
    """Ask, check the tool calls, send the receipts back, until the model stops calling tools, a
    reply's tool calls were all accepted in full (unless ``closing_turn``: then the model gets the
    extension's extra turn to answer in plain text), or ``max_turns`` model calls were made.
    ``offered``: the tool specs the request carries (default: those of ``tools``); the workers offer
    all three, so that every request starts alike, and accept only their own.

    A clean receipt needs no answer: another turn would resend the whole prompt for nothing. A
    rejection gets its receipt and another turn, so the model can correct itself."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    schemas = [tool_schema(*spec) for spec in (offered or [spec for spec, _ in tools.values()])]
    result = LoopResult(turns=0, finished=False)
    for turn in range(1, max_turns + 1):
        reply = model.complete(messages, schemas, turn)
        result.turns = turn
        if not reply.tool_calls:
            result.finished = True
            return result
        messages.append({"role": "assistant", "content": reply.text or None,
                         "tool_calls": [{"id": c.id, "type": "function",
                                         "function": {"name": c.name, "arguments": c.arguments}}
                                        for c in reply.tool_calls]})
        clean = True
        for call in reply.tool_calls:
            if call.name not in tools:
                offered_names = [spec[0] for spec in offered or ()]
                what = "not this task's tool" if call.name in offered_names else "unknown tool"
                receipt, clean = f"{what} {call.name!r}; use {', '.join(tools)}", False
            else:
                args, problem = parse_arguments(call.arguments)
                if problem:
                    receipt, clean = f"rejected: {problem}", False
                else:
                    check = tools[call.name][1]
                    before = check.problems
                    receipt = check.submit(args)
                    clean = clean and check.problems == before
            result.receipts.append(receipt)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": receipt})
        if clean and not closing_turn:
            result.finished = True
            return result
    return result


class ModelBrain:
    """Runs the three workers on a chat model."""

    offline = False

    def __init__(self, model: ChatModel, max_turns: int = 16, redact_secrets: bool = True,
                 closing_turn: bool = False, calls: list | None = None) -> None:
        self.model = model
        self.calls = [] if calls is None else calls  # the model's call records (its ``record`` appends them)
        self.name = model.name
        self.max_turns = max_turns
        self.redact_secrets = redact_secrets
        self.closing_turn = closing_turn  # the extension's extra plain-text turn after a clean receipt

    def _clean(self, text: str) -> str:
        return redact_payload(text) if self.redact_secrets else text  # once per text: prompts repeat

    # Every worker's request: the shared system prompt and all three tools, the memory (a cache
    # breakpoint after it), then the stage's task with what is new (om_core.workers.prompts).

    def _memory(self, lines: list[str], dropped: list[str]) -> str:
        return self._clean(prompts.memory_block(lines, dropped))

    def observer_prompt(self, inp: ObserverInput) -> tuple[str, list[dict[str, Any]]]:
        chunk, _ = inp.render(self._clean)  # entries are redacted whole, before any excerpt is cut
        task = prompts.observer_task(inp.now, chunk, inp.first_id, inp.last_id, inp.render_context(self._clean))
        return prompts.WORKER_SYSTEM, user_parts(self._memory(inp.memory.ordered, inp.memory.dropped), task)

    def reflector_prompt(self, inp: ReflectorInput) -> tuple[str, list[dict[str, Any]]]:
        task = prompts.reflector_task(inp.coverage, inp.new_ids)
        return prompts.WORKER_SYSTEM, user_parts(self._memory(inp.memory.lines, inp.memory.dropped), task)

    def dropper_prompt(self, inp: DropperInput) -> tuple[str, list[dict[str, Any]]]:
        task = prompts.dropper_task(inp.now, inp.rows(), len(inp.covered), inp.pool_tokens, inp.target_tokens,
                                    inp.max_drops, inp.guard,
                                    [c.observation.id for c in inp.covered if c.observation.id in inp.guarded])
        return prompts.WORKER_SYSTEM, user_parts(self._memory(inp.memory.lines, inp.memory.dropped), task)

    def reflection_dropper_prompt(self, inp: ReflectionDropperInput) -> tuple[str, list[dict[str, Any]]]:
        task = prompts.reflection_dropper_task([c.line() for c in inp.candidates], len(inp.candidates),
                                               inp.pool_tokens, inp.target_tokens, inp.max_drops)
        return prompts.WORKER_SYSTEM, user_parts(self._memory(inp.memory.lines, inp.memory.dropped), task)

    def _ask(self, prompt: tuple[str, list[dict[str, Any]]], tool: tuple, check: ToolCheck,
             offered: tuple = prompts.WORKER_TOOLS) -> LoopResult:
        """The tool loop offering the workers' tools and accepting this stage's (``tool``) only."""
        system, user = prompt
        return tool_loop(self.model, system, user, {tool[0]: (tool, check)}, self.max_turns, self.closing_turn,
                         offered=offered)

    def drop_reflections(self, inp: ReflectionDropperInput, check: ReflectionDropCheck) -> LoopResult:
        return self._ask(self.reflection_dropper_prompt(inp), prompts.DROP_REFLECTIONS_TOOL, check,
                         offered=prompts.REFLECTION_DROPPER_TOOLS)

    def observe(self, inp: ObserverInput, check: ObservationCheck) -> LoopResult:
        return self._ask(self.observer_prompt(inp), prompts.RECORD_OBSERVATIONS_TOOL, check)

    def reflect(self, inp: ReflectorInput, check: ReflectionCheck) -> LoopResult:
        return self._ask(self.reflector_prompt(inp), prompts.RECORD_REFLECTIONS_TOOL, check)

    def drop(self, inp: DropperInput, check: DropCheck) -> LoopResult:
        return self._ask(self.dropper_prompt(inp), prompts.DROP_OBSERVATIONS_TOOL, check)
