"""docker-compose.yml: valid for docker-compose, and shaped as the GPU deployment needs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict:
    tool = shutil.which("docker-compose")
    if tool is None:
        pytest.fail("docker-compose is missing: `make setup` installs Debian's package")
    result = subprocess.run(
        [tool, "-f", str(ROOT / "docker-compose.yml"), "--profile", "bench", "config"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def gpu_devices(service: dict) -> list[dict]:
    return service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])


def test_builder_and_server_reserve_a_gpu(compose):
    for name in ("builder", "triton"):
        devices = gpu_devices(compose["services"][name])
        assert devices and devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]


def test_the_builder_runs_a_build_command_line_the_builder_accepts(compose):
    import argparse

    from builder.spec import add_cli_args, from_cli_args

    command = compose["services"]["builder"]["command"]
    # the NGC image has python3 only: `python` would exit 127 and nothing after it would start
    assert command[:4] == ["python3", "-m", "builder", "build"]
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    spec = from_cli_args(parser.parse_args(command[4:])).validate()
    assert spec.engine == "tensorrt" and spec.instances_per_gpu == 1
    # compose restates the builder's own defaults: fronts per GPU, instances per GPU
    from builder.spec import BuildSpec

    assert (spec.fronts, spec.instances_per_gpu) == (
        BuildSpec().fronts,
        BuildSpec().instances_per_gpu,
    )


def test_server_starts_after_the_builder_completed_and_reports_health(compose):
    triton = compose["services"]["triton"]
    assert triton["depends_on"]["builder"]["condition"] == "service_completed_successfully"
    door = compose["services"]["front-door"]
    assert door["depends_on"]["triton"]["condition"] == "service_healthy"
    perf = compose["services"]["perf"]
    assert perf["depends_on"]["front-door"]["condition"] == "service_healthy"
    assert perf["profiles"] == ["bench"]
    assert "front-door:8001" in perf["command"]


def host_binding(port: dict | str) -> tuple[int, str]:
    """(container port, host address or '') from either form docker-compose prints."""
    if isinstance(port, dict):
        return int(port["target"]), port.get("host_ip", "")
    host, _published, target = port.split("/")[0].split(":")
    return int(target), host


def test_only_the_front_door_publishes_ports_and_metrics_stay_on_loopback(compose):
    published = {name: service.get("ports", []) for name, service in compose["services"].items()}
    assert {name for name, ports in published.items() if ports} == {"front-door"}
    ports = dict(host_binding(p) for p in published["front-door"])
    assert ports == {8000: "", 8001: "", 8002: "127.0.0.1"}
    # Triton sits on a network with no route out and no published port
    assert compose["networks"]["internal"]["internal"] is True
    assert set(compose["services"]["triton"]["networks"]) == {"internal"}


def test_the_front_door_renders_the_template_make_serve_renders(compose):
    from tools.front_door import SCRIPT, TEMPLATES, FrontDoorSettings, template_names

    door = compose["services"]["front-door"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in door["volumes"]}
    for template in TEMPLATES:
        assert Path(mounts[f"/etc/nginx/templates/{template.name}"]).resolve() == template
    # the header check where the template imports it, and the main configuration that loads
    # njs and includes the stream templates the image renders
    environment = door["environment"]
    assert Path(mounts[environment["FRONT_DOOR_SCRIPT"]]).resolve() == SCRIPT
    main = Path(mounts["/etc/nginx/nginx.conf"]).resolve()
    assert main == SCRIPT.parent / "nginx.conf"
    assert "include /etc/nginx/stream-conf.d/*.conf;" in main.read_text()
    # the image's envsubst replaces only names set in its environment: every one must be
    named = template_names()
    # the keys map's script reads the keys; the templates read the rest
    assert named == set(environment) - {"API_KEY", "API_KEYS"}
    example = FrontDoorSettings(*(f"t:{n}" for n in range(7))).template_values()
    assert named == set(example)


def test_the_openai_adapter_is_internal_and_behind_the_door(compose):
    adapter = compose["services"]["openai-api"]
    assert set(adapter["networks"]) == {"internal"} and not adapter.get("ports")
    listen = next(a for a in adapter["command"] if a.startswith("--listen="))
    port = listen.rsplit(":", 1)[1]
    door = compose["services"]["front-door"]
    assert door["environment"]["OPENAI_ADDRESS"] == f"openai-api:{port}"
    assert "--triton-grpc=" + door["environment"]["TRITON_GRPC_ADDRESS"] in adapter["command"]
    assert door["depends_on"]["openai-api"]["condition"] == "service_healthy"
    assert adapter["image"] == compose["services"]["triton"]["image"]


def test_the_body_check_is_internal_and_in_front_of_triton(compose):
    check = compose["services"]["body-check"]
    assert set(check["networks"]) == {"internal"} and not check.get("ports")
    door = compose["services"]["front-door"]["environment"]
    args = dict(a.removeprefix("--").split("=", 1) for a in check["command"] if a.startswith("--"))
    for kind in ("http", "grpc", "stream"):
        port = args[f"{kind}-listen"].rsplit(":", 1)[1]
        assert door[f"CHECK_{kind.upper()}_ADDRESS"] == f"body-check:{port}"
        assert port in check["expose"]
    for kind in ("http", "grpc"):
        assert args[f"triton-{kind}"] == door[f"TRITON_{kind.upper()}_ADDRESS"]
    # the largest body it takes is the door's; streams' messages are bounded by it alone
    assert args["max-body-size"] == door["MAX_BODY_SIZE"]
    assert door["STREAM_BODY_SIZE"] == "0"
    assert door["CHECK_STREAM_ADDRESS"] != door["TRITON_GRPC_ADDRESS"]
    depends = compose["services"]["front-door"]["depends_on"]
    assert depends["body-check"]["condition"] == "service_healthy"
    assert check["image"] == compose["services"]["triton"]["image"]


def test_triton_runs_under_the_watchdog_with_an_admin_key_never_defaulted(compose):
    triton = compose["services"]["triton"]
    command = triton["command"]
    assert command[:3] == ["python3", "-m", "tools.serve"] and "--no-front-door" in command
    # empty when unset: the launcher then makes a random key per start
    assert triton["environment"]["TRITON_ADMIN_KEY"] == ""
    assert triton["restart"] == "unless-stopped"


def test_engines_travel_from_builder_to_server_through_one_volume(compose):
    def mounts(service):
        """target -> (source, mode), from the short form docker-compose prints."""
        out = {}
        for volume in compose["services"][service]["volumes"]:
            source, target, *mode = volume.split(":")
            out[target] = (source, mode[0] if mode else "rw")
        return out

    assert mounts("builder")["/models"] == ("models", "rw")
    assert mounts("triton")["/models"] == ("models", "ro")
    assert "models" in compose["volumes"]
    assert "--repository=/models" in compose["services"]["builder"]["command"]
    assert "--repository=/models" in compose["services"]["triton"]["command"]


def test_builder_and_server_run_one_image_on_the_release(compose):
    builder, triton = compose["services"]["builder"], compose["services"]["triton"]
    assert builder["image"] == triton["image"]
    assert builder["build"] == triton["build"]
    assert builder["build"]["dockerfile"].endswith("docker/Dockerfile")
    release = builder["build"]["args"]
    assert set(release) == {"NGC_RELEASE", "PYTHON_VERSION", "TENSORRT_VERSION"}
    assert builder["image"].endswith(f":{release['NGC_RELEASE']}")
    assert compose["services"]["perf"]["image"].endswith(f":{release['NGC_RELEASE']}-py3-sdk")


def test_the_server_takes_every_gpu_and_reports_the_model_ready(compose):
    triton = compose["services"]["triton"]
    assert gpu_devices(triton)[0]["count"] == "all"
    # the builder sees them all too: --fronts auto divides the node's cores by their count
    assert gpu_devices(compose["services"]["builder"]) == gpu_devices(triton)
    assert "/v2/models/minilm/ready" in " ".join(triton["healthcheck"]["test"])


def test_project_image_commands_run_python3_and_only_gpu_services_see_gpus(compose):
    """NGC images have no `python` and set NVIDIA_VISIBLE_DEVICES=all: a service that reserves
    no GPU says `void`, or the NVIDIA runtime hands it every GPU of the node."""
    for name, service in compose["services"].items():
        command = service.get("command") or []
        assert "python" not in command, name
        image = service.get("image", "")
        if image.startswith("nvcr.io/") or "build" in service:
            visible = (service.get("environment") or {}).get("NVIDIA_VISIBLE_DEVICES")
            assert (visible == "void") == (not gpu_devices(service)), name


def test_the_image_keeps_the_ngc_entrypoint():
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    (entrypoint,) = re.findall(r"^ENTRYPOINT (.+)$", dockerfile, re.M)
    assert entrypoint == '["/opt/nvidia/nvidia_entrypoint.sh"]'


def test_the_defaults_compose_restates_are_the_declared_ones():
    """compose writes ${NAME:-default} for the door's settings: each default is the declaration's."""
    from tools.front_door import FrontDoorSettings, env_defaults

    text = (ROOT / "docker-compose.yml").read_text()
    restated = dict(re.findall(r"\$\{([A-Z_]+):-([^}]*)\}", text))
    declared = env_defaults(FrontDoorSettings)
    shared = set(restated) & set(declared)
    assert {"MAX_BODY_SIZE", "CLIENT_TIMEOUT_S", "MAX_CONNECTIONS_PER_CLIENT"} <= shared
    assert {name: restated[name] for name in shared} == {name: declared[name] for name in shared}
    # the published ports default to the door's own
    for name in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT"):
        assert restated[name] == declared[name]
    # the body check's budget, deadline and stream message, as the launcher's defaults (its workers: 4 here)
    from tools.serve import ServeSettings

    launcher = env_defaults(ServeSettings)
    assert restated["CHECK_GRPC_BYTES_IN_PROGRESS"] == launcher["CHECK_GRPC_BYTES_IN_PROGRESS"]
    assert float(restated["CHECK_BODY_DEADLINE_S"]) == float(launcher["CHECK_BODY_DEADLINE_S"])
    assert restated["CHECK_STREAM_MESSAGE_SIZE"] == launcher["CHECK_STREAM_MESSAGE_SIZE"]


SCRIPT = ROOT / "docker" / "nginx" / "10-api-keys.sh"


def test_the_nginx_entrypoint_applies_the_declared_key_and_name_rules():
    from tools.front_door import API_KEY_PATTERN, CLIENT_NAME_PATTERN

    script = SCRIPT.read_text()
    assert f"key_rule='^{API_KEY_PATTERN.pattern}$'" in script
    assert f"name_rule='^{CLIENT_NAME_PATTERN.pattern}$'" in script


def run_script(tmp_path, env: dict[str, str]) -> tuple[int, str, str]:
    import subprocess

    out = tmp_path / "keys.map"
    result = subprocess.run(
        ["sh", str(SCRIPT)],
        env={"PATH": "/usr/bin:/bin", "FRONT_DOOR_KEYS": str(out), **env},
        capture_output=True,
        text=True,
    )
    return result.returncode, out.read_text() if out.exists() else "", result.stderr


KEY_A, KEY_B = "a" * 16 + "0123", "B/+=" * 5


@pytest.mark.parametrize(
    ("api_key", "lines"),
    [
        ("", []),
        (KEY_A, []),
        ("", [f"team-a {KEY_A}", "", "# a comment", f"  team.b   {KEY_B}  "]),
        (KEY_B, [f"team-a {KEY_A}"]),
        ("", [f"bulk {KEY_A} 2", f"search {KEY_B}"]),
    ],
    ids=["no keys", "one shared key", "named keys", "both", "a key with a class"],
)
def test_the_image_writes_the_keys_map_make_serve_writes(tmp_path, api_key, lines):
    from tools.front_door import keys_map, read_api_keys

    keys_file = tmp_path / "api-keys"
    keys_file.write_text("\n".join(lines) + ("\n" if lines else ""))
    code, written, err = run_script(tmp_path, {"API_KEY": api_key, "API_KEYS": str(keys_file)})
    assert code == 0, err
    assert written == keys_map(api_key, read_api_keys(keys_file))


@pytest.mark.parametrize(
    ("lines", "words"),
    [
        ([f"team-a {KEY_A} 2 extra"], "write `name key` or `name key class`"),
        ([f"team-a {KEY_A} high"], "a class is"),
        ([f"team-a {KEY_A} 0"], "a class is"),
        ([f"team-a {KEY_A}", f"team-a {KEY_B} 2"], "name given twice"),
        ([f"bad/name {KEY_A}"], "a name is"),
        (["team-a short"], "a key is"),
        ([f"team-a {KEY_A}", f"team-b {KEY_A}"], "key given twice"),
        ([f"team-a {KEY_A}", f"team-a {KEY_B}"], "name given twice"),
    ],
)
def test_both_refuse_a_bad_keys_file_naming_the_line(tmp_path, lines, words):
    from tools.front_door import FrontDoorError, read_api_keys

    keys_file = tmp_path / "api-keys"
    keys_file.write_text("\n".join(lines) + "\n")
    code, _, err = run_script(tmp_path, {"API_KEYS": str(keys_file)})
    assert code != 0 and words in err and f"line {len(lines)}" in err
    with pytest.raises(FrontDoorError, match=words) as info:
        read_api_keys(keys_file)
    assert f"line {len(lines)}" in str(info.value)


@pytest.mark.parametrize(
    ("raw", "refused"),
    [
        (f"team-a {KEY_A}\r\nteam-b\t{KEY_B}\r\n".encode(), None),  # CRLF lines, a tab
        (f"# keys\r\n\r\nteam-a {KEY_A}".encode(), None),  # no newline at the end
        (f"team-a {KEY_A}\nteam-b\u00a0{KEY_B}\n".encode(), "line 2: write `name key`"),
        (f"team-a\u2003{KEY_A}\n".encode(), "line 1: write `name key`"),
        (f"team-a {KEY_A}\t3\r\n".encode(), None),  # a class after a tab, CRLF
        (f"team-a {KEY_A}\x0cteam-b {KEY_B}\n".encode(), "line 1: a key is"),
        (f"team-a {KEY_A}\rteam-b {KEY_B}\n".encode(), "line 1: a key is"),
        (f"team-a {KEY_A[:-1]}\xff\n".encode("latin-1"), "line 1: a key is"),
    ],
    ids=[
        "crlf",
        "no final newline",
        "nbsp",
        "em space",
        "class",
        "form feed",
        "bare cr",
        "not utf-8",
    ],
)
def test_both_read_a_keys_file_byte_for_byte_alike(tmp_path, raw, refused):
    """Line ends and blanks as the shell reads them: lines end at LF (a CR before it dropped),
    words are split at spaces and tabs only; anything else is part of a word, so a Unicode space
    or a form feed between name and key is refused by both, naming the same line."""
    from tools.front_door import FrontDoorError, keys_map, read_api_keys

    keys_file = tmp_path / "api-keys"
    keys_file.write_bytes(raw)
    code, written, err = run_script(tmp_path, {"API_KEYS": str(keys_file)})
    if refused is None:
        assert code == 0, err
        assert written == keys_map("", read_api_keys(keys_file))
        assert written.count("\\Q") == len(read_api_keys(keys_file)) >= 1
    else:
        assert code != 0 and refused in err, err
        with pytest.raises(FrontDoorError) as info:
            read_api_keys(keys_file)
        assert refused in str(info.value)
