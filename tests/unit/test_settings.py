from __future__ import annotations

import pytest

from python_backend.settings import SettingsError, settings_from_parameters


def params(**values):
    return {k: {"string_value": v} for k, v in values.items()}


def test_defaults_when_parameters_are_empty(monkeypatch):
    for name in ("MAX_QUEUE_ROWS", "OVERHEAD_TOKENS", "PLANNER_OVERHEAD_TOKENS", "PLANNER"):
        monkeypatch.delenv(name, raising=False)
    s = settings_from_parameters(params(overhead_tokens="", max_batch=""))
    assert (s.truncate_default, s.max_queue_rows, s.overhead_tokens, s.max_batch) == (
        True,
        4096,
        None,
        None,
    )
    assert s.planner == "dp"


def test_environment_overrides_config(monkeypatch):
    monkeypatch.setenv("MAX_QUEUE_ROWS", "12")
    monkeypatch.setenv("PLANNER_OVERHEAD_TOKENS", "30")
    s = settings_from_parameters(params(max_queue_rows="99"))
    assert s.max_queue_rows == 12 and s.overhead_tokens == 30.0


def test_a_bad_overhead_in_the_environment_is_named(monkeypatch):
    monkeypatch.delenv("OVERHEAD_TOKENS", raising=False)
    monkeypatch.setenv("PLANNER_OVERHEAD_TOKENS", "lots")
    with pytest.raises(SettingsError, match="overhead_tokens must be a number, got 'lots'"):
        settings_from_parameters(params())


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"max_queue_rows": "lots"}, "max_queue_rows must be an integer"),
        ({"max_queue_rows": "0"}, "max_queue_rows must be >= 1"),
        ({"truncate_default": "maybe"}, "truncate_default must be true or false"),
        ({"overhead_tokens": "-1"}, "overhead_tokens must be >= 0"),
        ({"overhead_tokens": "lots"}, "overhead_tokens must be a number"),
        ({"planner": "greedy"}, "planner must be dp or per_bucket"),
    ],
)
def test_bad_settings_are_named(values, message, monkeypatch):
    for name in values:
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.delenv("PLANNER_OVERHEAD_TOKENS", raising=False)
    with pytest.raises(SettingsError, match=message):
        settings_from_parameters(params(**values))
