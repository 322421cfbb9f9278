"""`om`: the command line, assembled. Each command lives in the module of its group and is one thin
function: parse, build the workspace, call the library, print (flows/cli/common.py holds what they
share). The console entry point with the one error handler of every command is flows.cli.launch,
which imports this module for every command but `om live`'s.

Read commands (view, compact, recall, status, sql, sessions, cutpoint) import neither litellm nor
Prefect; the commands that need them import them inside the command.
"""

from __future__ import annotations

# the command groups, in the order `om --help` lists them (each module registers its commands on app)
from flows.cli import catalog, memory, projects, reports, workers, run, serve  # noqa: F401
from flows.cli.common import app, mount
from flows.cli.eval import eval_app  # typer and rich only; the evaluation loads inside its command
from flows.cli.live import live_app  # what a live Pi's extension asks; no litellm, no Prefect
from flows.cli.server import server_app  # the Prefect server om run keeps; no Prefect import

mount(eval_app, "eval")
mount(live_app, "live")
mount(server_app, "server")

