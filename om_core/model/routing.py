"""Model routing (SPEC §13): which model each stage of a session uses, and its fallback.

``modelMap`` rules are tried in order over the session model's ``provider/id`` (globs ``*`` and ``?``);
the first rule that matches and covers the stage names the stage's model, with ``$provider``, ``$id``,
``$model`` and ``$thinking`` taken from the session model. A rule whose tokens the session model cannot
fill (no session model known, no thinking level) does not apply. No rule: the configured model.
Pure functions over the settings: no model is called and nothing is imported that a read path avoids.
"""

from __future__ import annotations

import fnmatch
import re

from pydantic import BaseModel, ConfigDict

from om_core.settings import MODEL_TOKENS, ModelRule, ModelSetting, Settings

_TOKEN = re.compile(r"\$([A-Za-z_]\w*)")


class SessionModel(BaseModel):
    """The model the session itself talks to: in an archive, the one its assistant messages name."""

    model_config = ConfigDict(frozen=True)

    provider: str | None = None
    id: str
    thinking: str | None = None

    @property
    def name(self) -> str:
        return f"{self.provider}/{self.id}" if self.provider else self.id


def _substitute(template: str, session: SessionModel) -> str | None:
    values = {"provider": session.provider, "id": session.id, "model": session.name, "thinking": session.thinking}
    missing = [t for t in _TOKEN.findall(template) if t in MODEL_TOKENS and not values[t]]
    if missing:
        return None
    return _TOKEN.sub(lambda m: values[m.group(1)] or "", template)


def rule_model(rule: ModelRule, session: SessionModel) -> ModelSetting | None:
    """The model ``rule`` names for ``session`` (None: a token it cannot fill)."""
    text = _substitute(rule.model, session)
    if text is None:
        return None
    name, _, thinking = text.partition(":")
    provider, _, model_id = name.partition("/")
    try:
        return ModelSetting(provider=provider, id=model_id, thinking=thinking or "off")
    except ValueError:  # a substituted thinking level Pi has but the settings do not know
        return None


def routed_model(settings: Settings, session: SessionModel | None, stage: str) -> tuple[ModelSetting | None, int | None]:
    """(the stage's model, the index of the modelMap rule that chose it); (settings.model, None) when no
    rule applies."""
    if session is not None:
        for index, rule in enumerate(settings.modelMap):
            if rule.stages is not None and stage not in rule.stages:
                continue
            if not fnmatch.fnmatchcase(session.name, rule.match):
                continue
            chosen = rule_model(rule, session)
            if chosen is not None:
                return chosen, index
    return settings.model, None
