"""The documentation: a README a newcomer reads in five minutes, and a site whose reference pages
(commands, settings, the analyst schema) are generated from the code and never drift from it."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


def test_the_generated_pages_are_those_the_code_gives():
    from docs_gen.pages import generate

    pages = generate()
    assert set(pages) == {"reference/commands.md", "reference/schema.md", "reference/settings.md"}
    for relative, text in pages.items():
        assert (DOCS / relative).read_text() == text, f"docs/{relative} drifted: run `make docs-gen`"


def test_the_check_names_a_page_that_drifted(tmp_path):
    from docs_gen.__main__ import main

    assert main(["--docs", str(tmp_path)]) == 0  # writes the three pages
    assert main(["--check", "--docs", str(tmp_path)]) == 0
    settings = tmp_path / "reference" / "settings.md"
    settings.write_text(settings.read_text().replace("`observeAfterTokens`", "`observeAfter`"))
    done = subprocess.run([sys.executable, "-m", "docs_gen", "--check", "--docs", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 1 and "docs/reference/settings.md" in done.stderr, done.stderr


def test_a_setting_without_a_text_fails_the_generator(monkeypatch):
    from docs_gen.pages import settings_page
    from docs_gen import setting_docs

    docs = dict(setting_docs.SETTING_DOCS)
    del docs["passive"]
    monkeypatch.setattr(setting_docs, "SETTING_DOCS", docs)
    with pytest.raises(SystemExit, match="no text for passive"):
        settings_page()


def test_every_command_and_option_is_on_the_commands_page():
    import typer

    from flows.cli.main import app

    page = (DOCS / "reference" / "commands.md").read_text()
    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="om")

    def walk(command, ctx):
        assert f"# {ctx.command_path}\n" in page or ctx.command_path == "om", ctx.command_path
        for param in command.params:
            for name in param.opts if param.param_type_name == "option" and not param.hidden else []:
                assert f"`{name}`" in page, (ctx.command_path, name)
        for name in getattr(command, "list_commands", lambda _: [])(ctx):
            sub = command.get_command(ctx, name)
            walk(sub, sub.context_class(sub, info_name=name, parent=ctx))

    walk(root, ctx)


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
                    reason="mkdocs and mkdocs-material are not installed (the docs extra: pip install -e '.[docs]')")
def test_the_site_builds_in_strict_mode_without_a_warning(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    assert (tmp_path / "site" / "reference" / "commands" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "schema" / "index.html").is_file()


def test_the_readme_is_short_and_its_links_lead_somewhere():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    for target in re.findall(r"\]\(((?:docs/)[^)#]+)", text):
        assert (REPO / target).is_file(), target
    for command in ("make demo", "make test", "om run ~/.pi/agent/sessions", "om view", "--full", "om recall",
                    "om search", "om report", "pi install", "om serve --live"):
        assert command in text, command


def test_every_page_is_in_the_navigation():
    nav = (REPO / "mkdocs.yml").read_text()
    for page in DOCS.rglob("*.md"):
        assert str(page.relative_to(DOCS)) in nav, page
