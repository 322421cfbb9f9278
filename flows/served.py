"""A flow run of a deployment `om serve` serves cannot be steered.

Whoever may create flow runs on a Prefect API (or edit a deployment there) chooses their parameters:
for om's flows, the sessions folder read, the database written, the model server the prompts go to
and the settings (redaction, the result storage read back). So `om serve` pins the parameters of the
deployments it creates in its own environment (``OM_SERVED_PARAMETERS``: every parameter of each flow,
defaults included, as JSON), which the flow-run processes it starts inherit and no API call can change.
A flow run of such a deployment whose parameters differ in any way is refused: one line in its
logs, a Failed state, nothing read or written. The API key is no parameter at all (the model's JSON
has none: a flow run reads it from its own environment).

Nothing here imports Prefect.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Callable
from typing import Any

PINNED = "OM_SERVED_PARAMETERS"


def _as_json(value: Any) -> Any:
    """A parameter as it travels through Prefect's API (JSON), so pinned and received values compare."""
    from pydantic_core import to_jsonable_python

    return json.loads(json.dumps(to_jsonable_python(value), sort_keys=True))


def all_parameters(fn: Callable[..., Any], given: dict[str, Any]) -> dict[str, Any]:
    """Every parameter of ``fn`` as a call with ``given`` binds it (defaults included), as JSON."""
    bound = inspect.signature(fn).bind_partial(**given)
    bound.apply_defaults()
    return {name: _as_json(value) for name, value in bound.arguments.items()}


def pin(pinned: dict[str, dict[str, Any]]) -> None:
    """``pinned``: each served flow's name and every parameter its runs must have (``all_parameters``)."""
    os.environ[PINNED] = json.dumps(pinned, sort_keys=True)


def steering(flow_name: str, received: dict[str, Any]) -> str | None:
    """Why a run of ``flow_name`` with ``received`` (every parameter the flow got) is refused, or None
    when it may run: outside `om serve` (nothing pinned), or with the very parameters it pinned."""
    raw = os.environ.get(PINNED)
    if not raw:
        return None
    pinned = json.loads(raw).get(flow_name)
    if pinned is None:
        return f"refused: om serve serves no {flow_name} deployment; this flow run was not started by it"
    got = {name: _as_json(value) for name, value in received.items()}
    differing = sorted(name for name in pinned.keys() | got.keys() if pinned.get(name) != got.get(name))
    if not differing:
        return None
    return (f"refused: this flow run's {', '.join(differing)} differ from the deployment om serve created; "
            "om serve takes the folder, database, model and settings only from its own deployment")


def refused_run(line: str):
    """A refused flow run's end: ``line`` in its logs (the only one om writes), and a Failed state saying it.

    Prefect's engine then raises the Failed state's exception and logs it, twice, with a traceback (its
    flow-run logger, then its engine logger), on the terminal of `om serve` and in the run's logs: nothing
    went wrong in om's code, so those two records of this refusal are dropped (a handler filter that
    matches only an exception whose text is ``line``)."""
    import logging

    from prefect import get_run_logger
    from prefect.states import Failed

    class DropRefusalTraceback(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not (record.exc_info and record.exc_info[1] is not None and str(record.exc_info[1]) == line)

    drop = DropRefusalTraceback()
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    for handler in {h for lg in loggers for h in lg.handlers}:
        handler.addFilter(drop)
    get_run_logger().error(line)
    return Failed(message=line)
