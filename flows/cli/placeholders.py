"""How `om --help` names its placeholders: the names users type (SESSION, --leaf ID, PATHS...), not
Typer's {session} and <str>; flags show none. The command classes here do it for every command and
for sub-apps (`om eval`) built by their own Typer."""

from __future__ import annotations

import inspect
from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

_OPTION_METAVARS = {"leaf": "ID", "first_kept": "ID", "session": "SESSION", "model": "MODEL", "api_base": "URL",
                    "dask_address": "URL", "db": "PATH", "config": "FILE", "out_file": "FILE", "out_dir": "DIR",
                    "archive": "DIR", "live": "DIR", "every": "SECONDS", "runner": "NAME", "model_limit": "WHERE",
                    "reader": "MODEL", "judge": "MODEL"}


class _Argument(TyperArgument):
    def display_type_rich(self, ctx) -> None:
        return None

    def _usage_display_name(self) -> str:
        name = self.display_name_raw + ("..." if self.nargs != 1 else "")
        return name if self.required else f"[{name}]"


def _name_placeholders(params) -> None:
    for param in params:
        if isinstance(param, TyperArgument):
            if param.metavar is None:
                param.metavar = param.name.upper()
            param.__class__ = _Argument
        elif isinstance(param, TyperOption) and param.metavar is None:
            by_type = {"int": "N", "float": "N", "Path": "PATH"}.get(param.bare_type(), "TEXT")
            param.metavar = "" if param.is_flag else _OPTION_METAVARS.get(param.name, by_type)


def _reflow(help_text: str | None) -> str | None:
    """A docstring's paragraphs as single lines, so Rich wraps them between words at any width: Typer
    joins the lines of the first paragraph only and keeps the source's line breaks in the others. A
    paragraph that starts with \\b (click's "do not rewrap") is kept as written."""
    if not help_text:
        return help_text
    paragraphs = inspect.cleandoc(help_text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split()) for p in paragraphs)


class _Command(TyperCommand):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = _reflow(self.help)
        _name_placeholders(self.params)

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        _name_placeholders([option] if option is not None else [])
        return option


class Group(TyperGroup):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = _reflow(self.help)
        _name_placeholders(self.params)
        for command in self.commands.values():  # sub-apps (`om eval`) built by their own Typer
            _adopt(command)

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        _name_placeholders([option] if option is not None else [])
        return option


def _adopt(command: Any) -> None:
    """Give a plain Typer command or group (and its commands) the same placeholders."""
    if type(command) is TyperCommand:
        command.__class__ = _Command
    elif type(command) is TyperGroup:
        command.__class__ = Group
    else:
        return
    command.help = _reflow(command.help)
    if isinstance(command, Group):
        for sub in command.commands.values():
            _adopt(sub)
    _name_placeholders(command.params)


class Typer(typer.Typer):
    """A Typer whose commands name their placeholders."""

    def command(self, *args: Any, cls: Any = None, **kwargs: Any):
        return super().command(*args, cls=cls or _Command, **kwargs)

