"""Workers as tool-calling model runs: prompts, the tool loop, and the turn cap."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from om_core import prompts
from om_core.model import ChatModel, parse_arguments, tool_schema
from om_core.redact import redact
from om_core.workers.checks import DropCheck, ObservationCheck, ReflectionCheck
from om_core.workers.inputs import DropperInput, ObserverInput, ReflectorInput

Handler = Callable[[Any], str]


@dataclass
class LoopResult:
    turns: int
    finished: bool  # False: the turn cap stopped the loop
    receipts: list[str] = field(default_factory=list)


def tool_loop(model: ChatModel, system: str, user: str, tools: dict[str, tuple[tuple, Handler]],
              max_turns: int) -> LoopResult:
    """Ask, run the tool calls through their handlers, send the receipts back, until the model stops
    calling tools or ``max_turns`` model calls were made."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    schemas = [tool_schema(*spec) for spec, _ in tools.values()]
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
        for call in reply.tool_calls:
            if call.name not in tools:
                receipt = f"unknown tool {call.name!r}; use {', '.join(tools)}"
            else:
                args, problem = parse_arguments(call.arguments)
                receipt = f"rejected: {problem}" if problem else tools[call.name][1](args)
            result.receipts.append(receipt)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": receipt})
    return result


class ModelBrain:
    """Runs the three workers on a chat model."""

    offline = False

    def __init__(self, model: ChatModel, max_turns: int = 16, redact_secrets: bool = True) -> None:
        self.model = model
        self.name = model.name
        self.max_turns = max_turns
        self.redact_secrets = redact_secrets

    def _clean(self, text: str) -> str:
        return redact(text) if self.redact_secrets else text

    def observer_prompt(self, inp: ObserverInput) -> tuple[str, str]:
        memory = prompts.memory_block(inp.memory.reflection_lines, inp.memory.observation_lines)
        chunk, _ = inp.render(self._clean)  # entries are redacted whole, before any excerpt is cut
        user = prompts.observer_message(self._clean(memory), inp.now, chunk, inp.first_id, inp.last_id)
        return prompts.OBSERVER_SYSTEM, user

    def observe(self, inp: ObserverInput, check: ObservationCheck) -> LoopResult:
        system, user = self.observer_prompt(inp)
        return tool_loop(self.model, system, user, {"record_observations": (prompts.RECORD_OBSERVATIONS_TOOL, check.submit)},
                         self.max_turns)

    def reflect(self, inp: ReflectorInput, check: ReflectionCheck) -> LoopResult:
        user = prompts.reflector_message([r.line() for r in inp.reflections], inp.covered_lines())
        return tool_loop(self.model, prompts.REFLECTOR_SYSTEM, self._clean(user),
                         {"record_reflections": (prompts.RECORD_REFLECTIONS_TOOL, check.submit)}, self.max_turns)

    def drop(self, inp: DropperInput, check: DropCheck) -> LoopResult:
        user = prompts.dropper_message([r.line() for r in inp.reflections], inp.covered_lines(), inp.pool_tokens,
                                       inp.target_tokens, inp.max_drops)
        return tool_loop(self.model, prompts.DROPPER_SYSTEM, self._clean(user),
                         {"drop_observations": (prompts.DROP_OBSERVATIONS_TOOL, check.submit)}, self.max_turns)
