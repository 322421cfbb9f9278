"""Settings (SPEC §11): the extension's names and defaults, the sources they are read from and their
priority (defaults < ~/.pi/agent/settings.json < .pi/settings.json < om.toml / --config < OM_* < flags),
Pi's files read as-is, and errors that name the key and where the bad value came from.
"""

from __future__ import annotations

import json
import re
import os
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from flows.cli.main import app
from om_core.settings import Settings, SettingsError, load_settings
from om_core.workers.run_config import ModelConfig


@pytest.fixture(autouse=True)
def _no_om_env(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith("OM_"):
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def dirs(tmp_path) -> tuple[Path, Path]:
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir(exist_ok=True)
    project.mkdir()
    return home, project


def write_json(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def global_pi(home: Path, section) -> Path:
    return write_json(home / ".pi" / "agent" / "settings.json", section)


def project_pi(project: Path, section) -> Path:
    return write_json(project / ".pi" / "settings.json", section)


# ------------------------------------------------------------------ defaults


def test_defaults_match_spec_section_11(dirs):
    home, project = dirs
    resolved = load_settings(home=home, cwd=project, env={})
    s = resolved.settings
    assert s.observeAfterTokens == 10_000
    assert s.reflectAfterTokens == 20_000
    assert s.observerChunkMaxTokens is None and s.chunk_max_tokens == 60_000
    assert s.compactAfterTokens == 81_000
    assert s.compactAfterTokensMode == "calibrated"
    assert s.compactAfterTokensRatio == 0.68
    assert s.observationsPoolMaxTokens == 20_000
    assert s.pool_target_tokens == 10_000
    assert s.agentMaxTurns == 16
    assert s.model is None
    assert s.passive is False
    assert s.redactSecrets is True
    assert resolved.sources == {} and resolved.notes == []
    assert all(src == "default" or src.startswith("derived: ") for _, _, src in resolved.rows())


@pytest.mark.parametrize("window, chunk", [(200_000, 40_000), (128_000, 25_600), (1_290, 258), (1_000, 256),
                                           (100, 256)])
def test_chunk_cap_is_a_fifth_of_the_context_window_with_a_floor(window, chunk):
    assert Settings(contextWindow=window).chunk_max_tokens == chunk


def test_explicit_chunk_cap_wins_and_has_a_minimum():
    assert Settings(contextWindow=200_000, observerChunkMaxTokens=5_000).chunk_max_tokens == 5_000
    with pytest.raises(ValidationError):
        Settings(observerChunkMaxTokens=255)


@pytest.mark.parametrize("pool_max, target", [(20_000, 10_000), (9_001, 4_500), (2, 1)])
def test_target_defaults_to_half_of_max(pool_max, target):
    assert Settings(observationsPoolMaxTokens=pool_max).pool_target_tokens == target


def test_target_at_or_above_max_is_rejected():
    with pytest.raises(ValidationError, match="observationsPoolTargetTokens"):
        Settings(observationsPoolMaxTokens=100, observationsPoolTargetTokens=100)
    with pytest.raises(ValidationError):
        Settings(observationsPoolMaxTokens=100, observationsPoolTargetTokens=150)
    assert Settings(observationsPoolMaxTokens=100, observationsPoolTargetTokens=99).pool_target_tokens == 99


def test_compaction_threshold_modes():
    assert Settings().compact_threshold == 81_000
    assert Settings(compactAfterTokensMode="ratio", contextWindow=200_000).compact_threshold == 136_000
    with pytest.raises(ValidationError):
        Settings(compactAfterTokensRatio=1.0)


# ------------------------------------------------------------------ sources and priority


def test_priority_of_every_source(dirs):
    home, project = dirs
    g = global_pi(home, {"theme": "dark", "observational-memory": {
        "observeAfterTokens": 1001, "reflectAfterTokens": 2001, "compactAfterTokens": 3001, "agentMaxTurns": 4,
        "observationsPoolMaxTokens": 5001, "passive": True}})
    p = project_pi(project, {"observational-memory": {
        "reflectAfterTokens": 2002, "compactAfterTokens": 3002, "agentMaxTurns": 5, "observationsPoolMaxTokens": 5002}})
    toml = project / "om.toml"
    toml.write_text("compactAfterTokens = 3003\nagentMaxTurns = 6\nobservationsPoolMaxTokens = 5003\n")
    env = {"OM_AGENT_MAX_TURNS": "7", "OM_OBSERVATIONS_POOL_MAX_TOKENS": "5004", "UNRELATED": "x"}
    resolved = load_settings(flags={"observationsPoolMaxTokens": 5005, "reflectAfterTokens": None},
                             home=home, cwd=project, env=env)
    s = resolved.settings
    assert (s.observeAfterTokens, s.reflectAfterTokens, s.compactAfterTokens, s.agentMaxTurns,
            s.observationsPoolMaxTokens, s.passive) == (1001, 2002, 3003, 7, 5005, True)
    assert s.keepRecentTokens == 20_000  # untouched default
    assert resolved.sources == {
        "observeAfterTokens": str(g), "passive": str(g), "reflectAfterTokens": str(p),
        "compactAfterTokens": str(toml), "agentMaxTurns": "env OM_AGENT_MAX_TURNS",
        "observationsPoolMaxTokens": "flag",
    }
    rows = {key: (value, src) for key, value, src in resolved.rows()}
    assert rows["keepRecentTokens"] == (20_000, "default")
    assert rows["agentMaxTurns"] == (7, "env OM_AGENT_MAX_TURNS")


def test_config_file_replaces_the_project_om_toml(dirs, tmp_path):
    home, project = dirs
    (project / "om.toml").write_text("agentMaxTurns = 3\nobserveAfterTokens = 333\n")
    explicit = tmp_path / "custom.toml"
    explicit.write_text('[observational-memory]\nagentMaxTurns = 9\nmodel = { provider = "anthropic", '
                        'id = "claude-sonnet-4-5", thinking = "high" }\n')
    resolved = load_settings(explicit, home=home, cwd=project, env={})
    assert resolved.settings.agentMaxTurns == 9
    assert resolved.settings.observeAfterTokens == 10_000  # ./om.toml is not read when --config is given
    assert resolved.sources["agentMaxTurns"] == str(explicit)
    assert resolved.settings.model.litellm_name == "anthropic/claude-sonnet-4-5"
    assert resolved.settings.model.thinking == "high"
    with pytest.raises(SettingsError, match="missing.toml"):
        load_settings(tmp_path / "missing.toml", home=home, cwd=project, env={})


def test_env_values_are_parsed(dirs):
    home, project = dirs
    env = {"OM_PASSIVE": "true", "OM_REDACT_SECRETS": "false", "OM_COMPACT_AFTER_TOKENS_RATIO": "0.5",
           "OM_COMPACT_AFTER_TOKENS_MODE": "ratio", "OM_MODEL": "openai/gpt-4o-mini", "OM_API_BASE": ""}
    s = load_settings(home=home, cwd=project, env=env).settings
    assert (s.passive, s.redactSecrets, s.compactAfterTokensRatio, s.compactAfterTokensMode) == (
        True, False, 0.5, "ratio")
    assert s.model.litellm_name == "openai/gpt-4o-mini" and s.model.thinking == "off"
    assert s.apiBase is None  # an empty variable is no value
    as_json = load_settings(home=home, cwd=project, env={
        "OM_MODEL": '{"provider": "openrouter", "id": "anthropic/claude-sonnet-4.5", "thinking": "medium"}'}).settings
    config = ModelConfig.from_settings(as_json)
    assert (config.model, config.thinking) == ("openrouter/anthropic/claude-sonnet-4.5", "medium")


def test_pi_files_are_read_as_is_and_unknown_keys_are_noted(dirs):
    home, project = dirs
    g = global_pi(home, {"defaultProvider": "anthropic", "packages": ["pi-observational-memory"],
                         "observational-memory": {"observeAfterTokens": 12_000, "futureKnob": 3,
                                                  "model": {"provider": "anthropic", "id": "claude-haiku-4-5",
                                                            "thinking": "low"}}})
    p = project_pi(project, {"observational-memory": {"observe_after_tokens": 15_000, "legacyFlag": True}})
    resolved = load_settings(home=home, cwd=project, env={})
    assert resolved.settings.observeAfterTokens == 15_000  # project over global
    assert resolved.sources["observeAfterTokens"] == str(p)
    assert resolved.settings.model.litellm_name == "anthropic/claude-haiku-4-5"
    assert resolved.sources["model"] == str(g)
    assert len(resolved.notes) == 2
    assert any("futureKnob" in n and str(g) in n for n in resolved.notes)
    assert any("legacyFlag" in n and str(p) in n for n in resolved.notes)


def test_pi_file_without_our_section_is_ignored(dirs):
    home, project = dirs
    global_pi(home, {"defaultProvider": "anthropic"})
    project_pi(project, {"observational-memory": "not an object"})
    resolved = load_settings(home=home, cwd=project, env={})
    assert resolved.settings == Settings()
    assert resolved.sources == {}


def test_keep_recent_tokens_from_pis_own_compaction_settings(dirs, tmp_path):
    home, project = dirs
    g = global_pi(home, {"compaction": {"enabled": True, "keepRecentTokens": 30_000}})
    resolved = load_settings(home=home, cwd=project, env={})
    assert resolved.settings.keepRecentTokens == 30_000
    assert resolved.sources["keepRecentTokens"] == f"{g} (compaction.keepRecentTokens)"
    # the project's file over the global one, as Pi reads them
    p = project_pi(project, {"compaction": {"keepRecentTokens": 12_000}})
    resolved = load_settings(home=home, cwd=project, env={})
    assert resolved.settings.keepRecentTokens == 12_000
    assert resolved.sources["keepRecentTokens"] == f"{p} (compaction.keepRecentTokens)"
    # a project file without the key leaves the global value
    project_pi(project, {"compaction": {"reserveTokens": 8_000}})
    assert load_settings(home=home, cwd=project, env={}).settings.keepRecentTokens == 30_000
    # below every source of om's own: the observational-memory section (even the global one), om.toml, env
    global_pi(home, {"compaction": {"keepRecentTokens": 30_000}, "observational-memory": {"keepRecentTokens": 25_000}})
    project_pi(project, {"compaction": {"keepRecentTokens": 12_000}})
    assert load_settings(home=home, cwd=project, env={}).settings.keepRecentTokens == 25_000
    (project / "om.toml").write_text("keepRecentTokens = 18000\n")
    assert load_settings(home=home, cwd=project, env={}).settings.keepRecentTokens == 18_000
    env = {"OM_KEEP_RECENT_TOKENS": "9000"}
    assert load_settings(home=home, cwd=project, env=env).settings.keepRecentTokens == 9_000


def test_a_non_numeric_pi_keep_recent_tokens_is_noted_not_used(dirs):
    home, project = dirs
    g = global_pi(home, {"compaction": {"keepRecentTokens": "lots"}})
    resolved = load_settings(home=home, cwd=project, env={})
    assert resolved.settings.keepRecentTokens == 20_000
    assert any("compaction.keepRecentTokens" in n and str(g) in n for n in resolved.notes)


# ------------------------------------------------------------------ errors name the key and its source


def test_invalid_value_in_a_pi_file_names_key_and_file(dirs):
    home, project = dirs
    p = project_pi(project, {"observational-memory": {"agentMaxTurns": 0}})
    with pytest.raises(SettingsError) as info:
        load_settings(home=home, cwd=project, env={})
    assert "agentMaxTurns" in str(info.value) and str(p) in str(info.value)


def test_invalid_thinking_level_names_the_model_key_and_file(dirs):
    home, project = dirs
    g = global_pi(home, {"observational-memory": {"model": {"id": "x", "thinking": "extreme"}}})
    with pytest.raises(SettingsError) as info:
        load_settings(home=home, cwd=project, env={})
    assert "model" in str(info.value) and str(g) in str(info.value)


def test_invalid_env_value_names_the_variable(dirs):
    home, project = dirs
    with pytest.raises(SettingsError) as info:
        load_settings(home=home, cwd=project, env={"OM_AGENT_MAX_TURNS": "many"})
    assert "agentMaxTurns" in str(info.value) and "OM_AGENT_MAX_TURNS" in str(info.value)


def test_invalid_flag_and_unknown_flag(dirs):
    home, project = dirs
    with pytest.raises(SettingsError) as info:
        load_settings(flags={"compactAfterTokensRatio": 2}, home=home, cwd=project, env={})
    assert "compactAfterTokensRatio" in str(info.value) and "flag" in str(info.value)
    with pytest.raises(SettingsError, match="noSuchSetting"):
        load_settings(flags={"noSuchSetting": 1}, home=home, cwd=project, env={})


def test_unknown_key_in_om_toml_is_an_error(dirs):
    home, project = dirs
    (project / "om.toml").write_text("agentMaxTurn = 3\n")
    with pytest.raises(SettingsError) as info:
        load_settings(home=home, cwd=project, env={})
    assert "agentMaxTurn" in str(info.value) and "om.toml" in str(info.value)


def test_broken_files_name_the_file(dirs):
    home, project = dirs
    g = global_pi(home, "{not json")
    with pytest.raises(SettingsError, match=str(g)):
        load_settings(home=home, cwd=project, env={})
    g.unlink()
    (project / "om.toml").write_text("agentMaxTurns = = 3\n")
    with pytest.raises(SettingsError, match="om.toml"):
        load_settings(home=home, cwd=project, env={})


def test_target_at_or_above_max_from_a_file_is_rejected_naming_key_and_source(dirs):
    home, project = dirs
    p = project_pi(project, {"observational-memory": {"observationsPoolTargetTokens": 20_000}})
    with pytest.raises(SettingsError) as info:
        load_settings(home=home, cwd=project, env={})
    message = str(info.value)
    assert "observationsPoolTargetTokens" in message
    assert str(p) in message  # the file that set the offending target


def test_lowering_max_below_an_explicit_target_is_rejected(dirs):
    home, project = dirs
    project_pi(project, {"observational-memory": {"observationsPoolTargetTokens": 6_000}})
    with pytest.raises(SettingsError, match="observationsPoolTargetTokens"):
        load_settings(home=home, cwd=project, env={"OM_OBSERVATIONS_POOL_MAX_TOKENS": "5000"})
    ok = load_settings(home=home, cwd=project, env={"OM_OBSERVATIONS_POOL_MAX_TOKENS": "6001"}).settings
    assert (ok.observationsPoolMaxTokens, ok.pool_target_tokens) == (6_001, 6_000)


# ------------------------------------------------------------------ om config --json


def test_om_config_json_shows_values_and_sources(tmp_path):
    home = tmp_path / "home"
    g = global_pi(home, {"observational-memory": {"observeAfterTokens": 12_345, "somethingNew": 1}})
    cfg = tmp_path / "team.toml"
    cfg.write_text("reflectAfterTokens = 23456\n")
    result = CliRunner().invoke(app, ["--config", str(cfg), "config", "--json"],
                                env={"OM_AGENT_MAX_TURNS": "9", "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["settings"]["observeAfterTokens"] == 12_345
    assert data["settings"]["reflectAfterTokens"] == 23_456
    assert data["settings"]["agentMaxTurns"] == 9
    assert data["settings"]["compactAfterTokens"] == 81_000
    assert data["sources"]["observeAfterTokens"] == str(g)
    assert data["sources"]["reflectAfterTokens"] == str(cfg)
    assert data["sources"]["agentMaxTurns"] == "env OM_AGENT_MAX_TURNS"
    assert data["sources"]["compactAfterTokens"] == "default"
    assert any("somethingNew" in n for n in data["notes"])


def test_om_config_table_lists_every_setting(tmp_path):
    result = CliRunner().invoke(app, ["config"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for key in ("observeAfterTokens", "observerChunkMaxTokens", "observationsPoolTargetTokens", "agentMaxTurns"):
        assert key in result.output


# ------------------------------------------------------------------ a litellm string as model, derived values


def test_model_accepts_a_litellm_string_in_om_toml_and_pi_settings(dirs):
    home, project = dirs
    (project / "om.toml").write_text('model = "openai/gpt-4o-mini"\n')
    s = load_settings(home=home, cwd=project, env={}).settings
    assert s.model.litellm_name == "openai/gpt-4o-mini" and s.model.thinking == "off"
    (project / "om.toml").unlink()
    g = global_pi(home, {"observational-memory": {"model": "anthropic/claude-sonnet-4-5"}})
    resolved = load_settings(home=home, cwd=project, env={})
    assert resolved.settings.model.litellm_name == "anthropic/claude-sonnet-4-5"
    assert resolved.sources["model"] == str(g)
    assert ModelConfig.from_settings(resolved.settings).model == "anthropic/claude-sonnet-4-5"
    project_pi(project, {"observational-memory": {"model": "offline"}})
    assert ModelConfig.from_settings(load_settings(home=home, cwd=project, env={}).settings).offline


def test_config_shows_derived_values_with_their_rule(dirs):
    home, project = dirs
    rows = {k: (v, src) for k, v, src in load_settings(home=home, cwd=project, env={}).rows()}
    assert rows["observerChunkMaxTokens"] == (60_000, "derived: 60000, as no contextWindow is set")
    assert rows["observationsPoolTargetTokens"] == (10_000, "derived: half of observationsPoolMaxTokens 20000")
    assert rows["compactAfterTokens"] == (81_000, "default")
    env = {"OM_CONTEXT_WINDOW": "128000", "OM_COMPACT_AFTER_TOKENS_MODE": "ratio",
           "OM_OBSERVATIONS_POOL_MAX_TOKENS": "30000"}
    rows = {k: (v, src) for k, v, src in load_settings(home=home, cwd=project, env=env).rows()}
    assert rows["observerChunkMaxTokens"] == (25_600, "derived: 20% of contextWindow 128000, at least 256")
    assert rows["observationsPoolTargetTokens"] == (15_000, "derived: half of observationsPoolMaxTokens 30000")
    assert rows["compactAfterTokens"] == (
        87_040, "derived: ratio mode: contextWindow 128000 x compactAfterTokensRatio 0.68")
    (project / "om.toml").write_text("observerChunkMaxTokens = 5000\n")
    rows = {k: (v, src) for k, v, src in load_settings(home=home, cwd=project, env=env).rows()}
    assert rows["observerChunkMaxTokens"] == (5_000, str(project / "om.toml"))  # set, so not derived


def test_om_config_json_has_effective_values(tmp_path):
    result = CliRunner().invoke(app, ["config", "--json"], env={"COLUMNS": "200", "OM_CONTEXT_WINDOW": "50000"})
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["settings"]["observerChunkMaxTokens"] is None  # as configured
    assert data["effective"]["observerChunkMaxTokens"] == 10_000
    assert data["sources"]["observerChunkMaxTokens"].startswith("derived: 20% of contextWindow 50000")
    table = CliRunner().invoke(app, ["config"], env={"COLUMNS": "200", "OM_CONTEXT_WINDOW": "50000"})
    line = next(x for x in table.stdout.splitlines() if "observationsPoolTargetTokens" in x)
    assert "10000" in line and "half of observationsPoolMaxTokens" in line and "null" not in line


def test_every_setting_is_in_the_readme_settings_table():
    """Each setting's name is in the settings page's table (a new setting comes with its name, default
    and effect); the page is generated from the settings table (docs_gen)."""
    from pathlib import Path

    from om_core.settings import Settings

    table = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "settings.md").read_text()
    keys = {key for row in table.splitlines() if row.startswith("| `")
            for key in re.findall(r"`([A-Za-z]+)`", row.split("|")[1])}
    assert set(Settings.model_fields) - keys == set()


def test_the_extensions_passive_switch_and_the_agent_side_settings(dirs):
    """PI_OBSERVATIONAL_MEMORY_PASSIVE (the extension's switch) sets passive, below OM_PASSIVE; selfCompact,
    warnAt and consolidateWhenIdle are off by default, and warnAt reads a list from text."""
    home, project = dirs
    s = load_settings(home=home, cwd=project, env={}).settings
    assert (s.selfCompact, s.warnAt, s.consolidateWhenIdle) == (False, [], False)
    resolved = load_settings(home=home, cwd=project, env={"PI_OBSERVATIONAL_MEMORY_PASSIVE": "1"})
    assert resolved.settings.passive is True and resolved.sources["passive"] == "env PI_OBSERVATIONAL_MEMORY_PASSIVE"
    assert load_settings(home=home, cwd=project, env={"PI_OBSERVATIONAL_MEMORY_PASSIVE": "1",
                                                      "OM_PASSIVE": "false"}).settings.passive is False
    env = {"OM_SELF_COMPACT": "true", "OM_WARN_AT": "0.6, 0.85", "OM_CONSOLIDATE_WHEN_IDLE": "1"}
    s = load_settings(home=home, cwd=project, env=env).settings
    assert (s.selfCompact, s.warnAt, s.consolidateWhenIdle) == (True, [0.6, 0.85], True)
    assert load_settings(home=home, cwd=project, env={"OM_WARN_AT": "[50000]"}).settings.warnAt == [50000]
    with pytest.raises(SettingsError, match="warnAt"):
        load_settings(home=home, cwd=project, env={"OM_WARN_AT": "0.5,-1"})
