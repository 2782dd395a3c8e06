"""Settings are read once from the environment and a bad one stops the start, named."""

from __future__ import annotations

import pytest

from app.settings import SETTINGS, SettingsError, load_settings


@pytest.mark.parametrize(
    "name,value",
    [
        ("PORT", "eighty"),
        ("PORT", "70000"),
        ("REDIS_URL", "http://127.0.0.1:6379"),
        ("LOOM_AUTH", "maybe"),
        ("LOOM_MAX_BODY_BYTES", "12"),
        ("LOOM_STRUCTURED_PROFILE_MAX_USERS_PER_PASS", "0"),
        ("LOOM_PROFILE_CONSOLIDATION_ENABLED", "perhaps"),
        ("LOOM_LLM_TIMEOUT_SECONDS", "-1"),
    ],
)
def test_a_bad_setting_is_named(name, value, tmp_path):
    with pytest.raises(SettingsError, match=name):
        load_settings({name: value, "LOOM_DATA_DIR": str(tmp_path)})


def test_defaults_match_the_seeds(tmp_path):
    settings = load_settings({"LOOM_DATA_DIR": str(tmp_path)})
    assert settings.default_org == "default" and settings.auth == "off"
    assert settings.structured_profile_memory_limit == 100
    assert settings.structured_profile_cooldown_seconds == 600
    assert settings.structured_profile_max_users_per_pass == 20
    assert settings.structured_profile_backoff_cap_seconds == 21600
    assert settings.structured_profile_interval_seconds == 60
    assert settings.profile_consolidation_enabled is False
    # auto: a request budget with auth on (tests/test_request_budget.py), none with it off.
    assert settings.rate_limit == "auto" and settings.request_budget is None


def test_a_local_secret_key_is_generated_once_and_kept(tmp_path):
    first = load_settings({"LOOM_DATA_DIR": str(tmp_path)}).secret_key
    second = load_settings({"LOOM_DATA_DIR": str(tmp_path)}).secret_key
    assert first == second and len(first) == 64
    assert (tmp_path / "secret_key").read_text().strip() == first
    given = load_settings({"LOOM_DATA_DIR": str(tmp_path), "LOOM_SECRET_KEY": "mine"})
    assert given.secret_key == "mine"


def test_every_setting_has_a_description_and_a_unique_name():
    names = [setting.name for setting in SETTINGS]
    assert len(names) == len(set(names))
    assert all(setting.doc for setting in SETTINGS)
