"""The model-call gate of `--model-limit prefect`: each call holds one slot of Prefect's global limit
om-model-calls under a lease of ``modelSlotLeaseSeconds``, so the slots of a process that died (a lost
Dask worker) come back after that long instead of never; the process gate is unchanged."""

from __future__ import annotations

import pickle

import pytest

from flows.limits import MODEL_CALL_LIMIT, PrefectGate, ProcessGate, ensure_model_call_limit, run_guards
from om_core.settings import Settings, SettingsError, load_settings
from om_core.workers.run_config import ModelConfig


def _settings(tmp_path, **env: str) -> Settings:
    return load_settings(env=env, home=tmp_path, cwd=tmp_path).settings


def test_the_lease_defaults_to_five_minutes_and_an_om_variable_sets_it(tmp_path):
    assert _settings(tmp_path).modelSlotLeaseSeconds == 300
    assert _settings(tmp_path, OM_MODEL_SLOT_LEASE_SECONDS="60").modelSlotLeaseSeconds == 60


@pytest.mark.parametrize("seconds", ["59", "86401", "0"])
def test_a_lease_outside_a_minute_to_a_day_is_refused(tmp_path, seconds):
    # under a minute a slow model call's renewals could lose the slot to another caller; over a day a
    # lost worker's slot is as good as gone
    with pytest.raises(SettingsError, match="modelSlotLeaseSeconds"):
        _settings(tmp_path, OM_MODEL_SLOT_LEASE_SECONDS=seconds)


def test_a_run_s_prefect_gate_carries_the_setting_s_lease_and_pickles(tmp_path):
    settings = _settings(tmp_path, OM_MODEL_SLOT_LEASE_SECONDS="90")
    guards = run_guards(ModelConfig(model="openai/fake", limit="prefect"), settings)
    assert isinstance(guards.gate, PrefectGate) and guards.gate.lease_seconds == 90
    travelled = pickle.loads(pickle.dumps(guards.for_replay(None)))  # to a Dask worker
    assert isinstance(travelled.gate, PrefectGate) and travelled.gate.lease_seconds == 90
    local = run_guards(ModelConfig(model="openai/fake", limit="process"), settings)
    assert isinstance(local.gate, ProcessGate) and local.gate.slots == settings.modelConcurrency


def test_a_slot_is_leased_for_the_setting_s_seconds_on_the_server(prefect_api, tmp_path, monkeypatch):
    """On a real Prefect API: the slot is taken with the lease the setting asks for, counted while the
    call runs and given back after it."""
    import prefect.concurrency._sync as prefect_sync
    from prefect.client.orchestration import get_client

    leases: list[float] = []
    acquire = prefect_sync.acquire_concurrency_slots_with_lease

    def recording(*args, **kwargs):
        leases.append(kwargs["lease_duration"])
        return acquire(*args, **kwargs)

    monkeypatch.setattr(prefect_sync, "acquire_concurrency_slots_with_lease", recording)
    ensure_model_call_limit(2)
    gate = run_guards(ModelConfig(model="openai/fake", limit="prefect"),
                      _settings(tmp_path, OM_MODEL_SLOT_LEASE_SECONDS="75")).gate

    def active_slots() -> int:
        with get_client(sync_client=True) as client:
            return client.read_global_concurrency_limit_by_name(MODEL_CALL_LIMIT).active_slots

    with gate():
        held = active_slots()
    assert leases == [75]
    assert held == 1 and active_slots() == 0
