"""The front door's configuration: settings checked early, the template rendered as nginx's
image renders it, and nginx itself accepting the result (`nginx -t`)."""

from __future__ import annotations

import re

import pytest

from tools.front_door import (
    TEMPLATES,
    FrontDoor,
    FrontDoorError,
    FrontDoorSettings,
    check_api_key,
    render_template,
    template_names,
)
from tools.serve import restricted_api_args


def settings(**overrides) -> FrontDoorSettings:
    return FrontDoorSettings(*(f"127.0.0.1:{port}" for port in range(18000, 18006)), **overrides)


def test_rendering_replaces_only_the_names_given_and_keeps_nginx_variables():
    text = "a ${API_KEY} b ${OTHER} c $http_authorization d ${MAX_BODY_SIZE}"
    out = render_template(text, {"API_KEY": "k" * 16, "MAX_BODY_SIZE": "8m"})
    assert out == f"a {'k' * 16} b ${{OTHER}} c $http_authorization d 8m"


def test_every_name_in_the_templates_is_a_setting():
    assert template_names() == set(settings().template_values())
    for template in TEMPLATES:
        assert re.findall(r"\$\{", template.read_text()), template  # each is rendered
        assert "${" not in render_template(template.read_text(), settings().template_values())


@pytest.mark.parametrize(
    "key",
    ["short", "has space in it 0123", 'quote"0123456789abcdef', "semi;colon0123456789", "x" * 257],
)
def test_an_api_key_that_could_not_sit_in_the_config_is_refused_with_the_rule(key):
    with pytest.raises(FrontDoorError, match="16 to 256 characters"):
        check_api_key(key)
    with pytest.raises(FrontDoorError):
        settings(api_key=key)


def test_no_api_key_is_allowed_and_a_hex_or_base64_key_is_taken():
    assert check_api_key("") == ""
    assert settings(api_key="0123456789abcdef" * 4).api_key
    assert settings(api_key="QUJDREVGR0hJSktMTU5PUA==").api_key


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_body_size", "lots"), ("max_header_size", "8 k"), ("client_timeout_s", 0)],
)
def test_bad_limits_are_named(field, value):
    with pytest.raises(FrontDoorError, match=field.upper()):
        settings(**{field: value})


def test_environment_overrides_are_read_and_bad_numbers_named():
    env = {
        "API_KEY": "k" * 20,
        "MAX_BODY_SIZE": "2m",
        "CLIENT_TIMEOUT_S": "3",
        "METRICS_PUBLIC": "1",
    }
    overrides = FrontDoorSettings.env_overrides(env)
    assert overrides == {
        "api_key": "k" * 20,
        "max_body_size": "2m",
        "client_timeout_s": 3,
        "metrics_public": True,
    }
    with pytest.raises(FrontDoorError, match="UPSTREAM_TIMEOUT_S"):
        FrontDoorSettings.env_overrides({"UPSTREAM_TIMEOUT_S": "soon"})


def test_metrics_listen_on_loopback_unless_opted_in():
    assert settings().template_values()["METRICS_LISTEN"] == "127.0.0.1:8002"
    public = settings(metrics_public=True, public_address="10.0.0.5")
    assert public.template_values()["METRICS_LISTEN"] == "10.0.0.5:8002"


def test_triton_restricts_every_management_api_with_the_admin_key():
    args = restricted_api_args("s3cret-key-0123456789")
    assert args == [
        "--http-restricted-api=shared-memory,model-repository,trace,logging:admin-key=s3cret-key-0123456789",
        "--grpc-restricted-protocol=shared-memory,model-repository,trace,logging:admin-key=s3cret-key-0123456789",
    ]


@pytest.mark.parametrize(
    "api_key", ["", "0123456789abcdef0123", "every.allowed+char/=~-_ 0123456789".replace(" ", "")]
)
def test_nginx_accepts_the_rendered_configuration(tmp_path, api_key):
    door = FrontDoor(settings(api_key=api_key), tmp_path / "nginx")
    try:
        door.write_config()
        door.check()  # raises FrontDoorError with nginx's message otherwise
    finally:
        door.stop()


def test_the_restart_budget_backs_off_and_runs_out_within_its_window():
    from tools.serve import RestartBudget

    budget = RestartBudget(limit=3, window_s=100.0)
    assert budget.record(0.0) and budget.backoff_s() == 1.0
    assert budget.record(10.0) and budget.backoff_s() == 2.0
    assert not budget.record(20.0), "the third failure within 100 s spends the budget"
    fresh = RestartBudget(limit=3, window_s=100.0)
    assert fresh.record(0.0) and fresh.record(10.0)
    assert fresh.record(150.0), "failures older than the window no longer count"
    assert fresh.failures == [150.0] and fresh.backoff_s() == 1.0
    assert RestartBudget(limit=100, window_s=1e9, failures=[0.0] * 20).backoff_s() == 30.0


def test_a_triton_that_dies_while_starting_is_retried_within_the_budget(tmp_path):
    from tools.serve import Launcher, ServeSettings

    launcher = Launcher(ServeSettings(tmp_path, ["m"], restart_limit=4, state_dir=tmp_path))
    attempts = []

    def restart(reason):
        attempts.append(reason)
        if len(attempts) < 3:
            raise RuntimeError("tritonserver exited while starting (code -9)")

    launcher.restart_triton = restart  # type: ignore[method-assign]
    assert launcher.bring_triton_back("it exited", backoff=False)
    assert attempts == ["it exited", "it exited while starting", "it exited while starting"]
    assert len(launcher.budget.failures) == 3
    # one more failure spends the budget of 4: the launcher gives up instead of looping
    launcher.restart_triton = lambda reason: (_ for _ in ()).throw(RuntimeError("dead"))  # type: ignore[method-assign]
    assert not launcher.bring_triton_back("it exited", backoff=False)
