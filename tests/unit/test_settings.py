from __future__ import annotations

import pytest

from python_backend.settings import SettingsError, env_name, settings_from_parameters

MODEL = "minilm-v2"  # a name with a character that becomes "_" in its variables


def params(**values):
    return {k: {"string_value": v} for k, v in values.items()}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in ("max_queue_rows", "overhead_tokens", "planner", "truncate_default"):
        monkeypatch.delenv(env_name(MODEL, name), raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.delenv("PLANNER_OVERHEAD_TOKENS", raising=False)


def test_defaults_when_parameters_are_empty():
    s = settings_from_parameters(params(overhead_tokens="", max_batch=""), MODEL)
    assert (s.truncate_default, s.max_queue_rows, s.overhead_tokens, s.max_batch) == (
        True,
        4096,
        None,
        None,
    )
    assert s.planner == "dp" and s.default_timeout_ms == 0


def test_an_override_names_its_model(monkeypatch):
    assert env_name(MODEL, "max_queue_rows") == "MINILM_V2__MAX_QUEUE_ROWS"
    monkeypatch.setenv("MINILM_V2__MAX_QUEUE_ROWS", "12")
    assert settings_from_parameters(params(max_queue_rows="99"), MODEL).max_queue_rows == 12
    # another model of the same server keeps its own configuration
    assert settings_from_parameters(params(max_queue_rows="99"), "other").max_queue_rows == 99


def test_a_bare_parameter_name_in_the_environment_applies_to_no_model(monkeypatch):
    monkeypatch.setenv("MAX_QUEUE_ROWS", "12")
    monkeypatch.setenv("PLANNER", "per_bucket")
    s = settings_from_parameters(params(max_queue_rows="99"), MODEL)
    assert s.max_queue_rows == 99 and s.planner == "dp"


def test_the_planner_overhead_variable_applies_to_every_model_unless_one_names_its_own(
    monkeypatch,
):
    monkeypatch.setenv("PLANNER_OVERHEAD_TOKENS", "30")
    assert settings_from_parameters(params(), MODEL).overhead_tokens == 30.0
    monkeypatch.setenv(env_name(MODEL, "overhead_tokens"), "7")
    assert settings_from_parameters(params(), MODEL).overhead_tokens == 7.0


def test_a_bad_overhead_in_the_environment_is_named(monkeypatch):
    monkeypatch.setenv("PLANNER_OVERHEAD_TOKENS", "lots")
    with pytest.raises(SettingsError, match="overhead_tokens must be a number, got 'lots'"):
        settings_from_parameters(params(), MODEL)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"max_queue_rows": "lots"}, "max_queue_rows must be an integer"),
        ({"max_queue_rows": "0"}, "max_queue_rows must be >= 1"),
        ({"truncate_default": "maybe"}, "truncate_default must be true or false"),
        ({"overhead_tokens": "-1"}, "overhead_tokens must be >= 0"),
        ({"overhead_tokens": "lots"}, "overhead_tokens must be a number"),
        ({"planner": "greedy"}, "planner must be dp or per_bucket"),
        ({"class_min_share": "1.5"}, "class_min_share must be <= 1"),
        ({"classes": "0"}, "classes must be >= 1"),
        ({"class_rider_factor": "0.5"}, "class_rider_factor must be >= 1"),
    ],
)
def test_bad_settings_are_named(values, message):
    with pytest.raises(SettingsError, match=message):
        settings_from_parameters(params(**values), MODEL)


def test_the_class_settings_reach_the_scheduler():
    s = settings_from_parameters(
        params(classes="3", class_wait_ms="4", class_rider_factor="3.5", class_min_share="0.1"),
        MODEL,
    )
    classes = s.service_classes()
    assert (classes.classes, classes.wait_s, classes.rider_factor, classes.min_share) == (
        3,
        0.004,
        3.5,
        0.1,
    )


def test_fault_injection_is_not_a_setting(monkeypatch):
    monkeypatch.setenv("FAULT_INJECTION", "oom_above_tokens=1")
    monkeypatch.setenv(env_name(MODEL, "fault_injection"), "oom_above_tokens=1")
    s = settings_from_parameters(params(fault_injection="oom_above_tokens=1"), MODEL)
    assert not hasattr(s, "fault_injection")


def test_the_readme_settings_table_is_the_declarations():
    from pathlib import Path

    from python_backend.settings import settings_table

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = "\n".join(settings_table())
    assert table in readme, "regenerate the README table from settings.settings_table()"


def test_the_config_defaults_parse_to_the_documented_settings():
    from dataclasses import fields

    from python_backend.settings import CONFIG_DEFAULTS, Settings

    assert list(CONFIG_DEFAULTS) == [f.name for f in fields(Settings)]
    parsed = settings_from_parameters({k: {"string_value": v} for k, v in CONFIG_DEFAULTS.items()})
    assert parsed == settings_from_parameters({})
    assert parsed.overhead_tokens is None and parsed.max_batch is None  # the manifest decides


def test_no_setting_is_restated_in_code_outside_its_declaration():
    """Every environment variable the launcher and door read is named only where it is declared
    (non-Python copies are compared by test_compose and test_k8s); no model setting's default
    is written beside its name anywhere else."""
    import re
    from pathlib import Path

    from python_backend.settings import CONFIG_DEFAULTS
    from tools.front_door import FrontDoorSettings, env_defaults
    from tools.serve import ServeSettings

    root = Path(__file__).resolve().parents[2]
    sources = {
        path: path.read_text()
        for package in ("python_backend", "builder", "bench", "tools", "openai_api", "testkit")
        for path in (root / package).rglob("*.py")
    }
    for declaration, home in ((FrontDoorSettings, "front_door.py"), (ServeSettings, "serve.py")):
        for variable in env_defaults(declaration):
            elsewhere = [
                str(p.relative_to(root))
                for p, text in sources.items()
                if f'"{variable}"' in text and p.name != home
            ]
            assert not elsewhere, (variable, elsewhere)
    for name, default in CONFIG_DEFAULTS.items():
        pair = re.compile(rf'"{name}"\s*:\s*"{re.escape(default)}"')
        elsewhere = [
            str(p.relative_to(root))
            for p, text in sources.items()
            if pair.search(text) and p.name != "settings.py"
        ]
        assert not elsewhere, (name, elsewhere)
