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
    return FrontDoorSettings(*(f"127.0.0.1:{port}" for port in range(18000, 18007)), **overrides)


def test_rendering_replaces_only_the_names_given_and_keeps_nginx_variables():
    text = "a ${API_KEY} b ${OTHER} c $http_authorization d ${MAX_BODY_SIZE}"
    out = render_template(text, {"API_KEY": "k" * 16, "MAX_BODY_SIZE": "8m"})
    assert out == f"a {'k' * 16} b ${{OTHER}} c $http_authorization d 8m"


def test_every_name_in_the_templates_is_a_setting():
    assert template_names() == set(settings().template_values())
    for template in TEMPLATES:
        assert re.findall(r"\$\{", template.read_text()), template  # each is rendered
        assert "${" not in render_template(template.read_text(), settings().template_values())


def test_a_stream_is_bounded_whole_only_where_it_goes_straight_to_triton():
    """The body check bounds each stream message, so the door bounds no stream's total; a door
    whose streams go to Triton itself bounds each stream by MAX_BODY_SIZE, as any body."""
    checked = settings(max_body_size="2m").template_values()
    assert checked["STREAM_BODY_SIZE"] == "0"
    straight = FrontDoorSettings(
        *(f"127.0.0.1:{port}" for port in range(18000, 18006)),
        check_stream_address="127.0.0.1:18001",  # Triton's gRPC port
        max_body_size="2m",
    )
    assert straight.triton_grpc_address == straight.check_stream_address
    assert straight.template_values()["STREAM_BODY_SIZE"] == "2m"


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


def test_a_part_backs_off_while_it_keeps_failing_and_afresh_once_it_stayed_up():
    from tools.serve import HEALTHY_RESET_S, PartRestarts

    rule = PartRestarts(start_limit=3)
    rule.up(0.0)
    assert [rule.failed(1.0 + i) for i in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    rule.up(10.0)
    assert rule.failed(10.0 + HEALTHY_RESET_S / 2) == 30, "up briefly: the backoff keeps growing"
    rule.up(100.0)
    assert rule.failed(100.0 + HEALTHY_RESET_S) == 1, "up a minute: from 1 s again"
    assert rule.start_failed() and rule.start_failed()
    assert not rule.start_failed(), "three starts in a row that never became ready: give up"
    rule.up(200.0)
    assert rule.failed_starts == 0 and rule.start_failed(), "a ready start clears the count"


def test_the_launcher_brings_a_part_back_however_often_it_dies_and_counts_each_cause(
    tmp_path, monkeypatch
):
    import tools.serve
    from testkit.prometheus import samples_of, scrape
    from tools.serve import Launcher, ServeSettings, serve_metrics
    from tools.triton_server import free_port

    monkeypatch.setattr(tools.serve, "MAX_BACKOFF_S", 0.0)
    launcher = Launcher(ServeSettings(tmp_path, ["m"], restart_limit=3, state_dir=tmp_path))
    for _ in range(10):  # far past RESTART_LIMIT deaths: each one is brought back
        assert launcher.bring_back("triton", "exited", "it exited", lambda: None)
    assert launcher.bring_back("body_check", "unresponsive", "3 probes missed", lambda: None)
    assert not launcher.bring_back(
        "triton",
        "exited",
        "it exited",
        lambda: (_ for _ in ()).throw(RuntimeError("exited while starting")),
    ), "RESTART_LIMIT (3) starts in a row that never became ready end the launcher"
    port = free_port()
    server = serve_metrics(launcher.counts, "127.0.0.1", port)
    try:
        samples = scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        server.shutdown()

    def count(part: str, cause: str) -> float:
        (sample,) = samples_of(samples, "serve_restarts_total", part=part, cause=cause)
        return sample.value

    assert count("triton", "exited") == 11
    assert count("triton", "start_failed") == 2
    assert count("body_check", "unresponsive") == 1


def test_the_keys_map_is_private_from_its_creation(tmp_path, monkeypatch):
    import os

    import tools.front_door

    api_key = "0123456789abcdef0123"
    keys = tmp_path / "nginx" / "keys.map"
    seen = []
    original = tools.front_door.keys_map

    def keys_map_seeing_the_file(*args):  # runs while the file is being written
        seen.append(keys.stat().st_mode & 0o777 if keys.exists() else None)
        return original(*args)

    monkeypatch.setattr(tools.front_door, "keys_map", keys_map_seeing_the_file)
    previous = os.umask(0)  # the most permissive umask: the file's own mode must protect it
    try:
        door = FrontDoor(settings(api_key=api_key), tmp_path / "nginx")
        door.write_config()
        door.write_config()  # written again over the old one
    finally:
        os.umask(previous)
    assert seen == [0o600, 0o600], "the key file exists with mode 0600 before a key is in it"
    assert keys.stat().st_mode & 0o777 == 0o600 and api_key in keys.read_text()


def test_ports_asked_for_together_are_never_the_same():
    """A front door's listeners take ports asked for one after another and bound only later:
    free_port never hands out a port twice in one process (drawn at random below the ephemeral
    range, 600 draws would repeat one but 4 times in 10,000)."""
    from tools.triton_server import free_port

    ports = [free_port() for _ in range(600)]
    assert len(set(ports)) == len(ports)
