"""Runs the real Triton server (from the nvidia-pytriton wheel) on a model repository.

`tools.serve` (what `make serve` runs) starts it on loopback behind the front door; the tests
start it directly. In NVIDIA's images, where there is no wheel, the image's own tritonserver runs.

The wheel carries tritonserver and the Python backend but not in the layout Triton expects, so a
backend folder is assembled under build/ (never inside site-packages): libtriton_python.so,
triton_python_backend_utils.py and the stub for the running Python. The virtual environment's
bin/ goes first on PATH, because the stub takes its sys.path from the python3 it finds there:
that is how the model imports python_backend.

`stop()` stops Triton cleanly (SIGTERM: it drains and unloads models, whose finalize answers what
is queued); anything left of its process group after the grace period is killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO, BinaryIO

ROOT = Path(__file__).resolve().parents[1]
BACKEND_DIR = ROOT / "build" / "triton-backends"


def triton_home() -> Path:
    try:
        import pytriton
    except ImportError:
        sys.exit("nvidia-pytriton is not installed: run `make setup` first")
    return Path(pytriton.__file__).resolve().parent / "tritonserver"


def installed_tritonserver() -> str | None:
    """A tritonserver installed as NVIDIA's images install it, when there is no pytriton wheel."""
    if importlib.util.find_spec("pytriton") is not None:
        return None
    return shutil.which("tritonserver") or (
        "/opt/tritonserver/bin/tritonserver"
        if Path("/opt/tritonserver/bin/tritonserver").is_file()
        else None
    )


def set_parent_death_signal(signum: int = signal.SIGTERM) -> None:
    """In a child before exec: the kernel sends `signum` if the launcher dies without stopping it,
    so a killed launcher leaves no server behind (Linux; elsewhere a no-op)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, int(signum), 0, 0, 0)


def child_processes(pid: int) -> list[tuple[int, str, str]]:
    """(pid, command name, state) of each process whose parent is ``pid``, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            # comm sits in parentheses and may hold spaces: the fields after it are fixed
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        except (OSError, ValueError):
            continue
        if int(ppid) == pid:
            found.append((int(entry.name), comm, state))
    return found


def prepare_backend_dir(target: Path = BACKEND_DIR) -> Path:
    """Assembles <target>/python/ with the backend library, its utils and our Python's stub."""
    home = triton_home()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = home / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        sys.exit(f"the Triton wheel has no Python-backend stub for Python {version}")
    python_dir = target / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for source in (
        home / "backends" / "python" / "libtriton_python.so",
        home / "backends" / "python" / "triton_python_backend_utils.py",
        stub,
    ):
        destination = python_dir / source.name
        if not destination.exists() or destination.stat().st_size != source.stat().st_size:
            shutil.copy2(source, destination)
    return target


_GIVEN: set[int] = set()  # the ports free_port has handed out in this process


def free_port() -> int:
    """A loopback port free now, below the kernel's ephemeral range: a port from that range can
    be handed out as the local end of an outgoing connection before the server binds it (seen
    with two test processes: Triton's metrics port taken, every restart failing). Never one it
    handed out before in this process: ports asked for together are all bound only later (two
    listeners of one front door were given the same port)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randrange(10000, max(low, 10001))
        if port in _GIVEN:
            continue
        _GIVEN.add(port)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no free port found below the range: any the kernel gives
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def local_host(listen_address: str | None) -> str:
    """Where this machine reaches a server listening on ``listen_address`` (every interface:
    loopback)."""
    return "127.0.0.1" if listen_address in (None, "", "0.0.0.0") else str(listen_address)


def answers_ok(url: str, timeout_s: float = 1.0) -> bool:
    """True if a GET of ``url`` answers 200 in time (a readiness probe)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def server_env(code_root: Path = ROOT) -> dict[str, str]:
    """The server's environment; ``code_root`` is where its models import python_backend from."""
    env = dict(os.environ)
    if installed_tritonserver() is None:
        libs = str(triton_home().parent.parent / "nvidia_pytriton.libs")
        env["LD_LIBRARY_PATH"] = ":".join(filter(None, [libs, env.get("LD_LIBRARY_PATH", "")]))
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["PYTHONPATH"] = ":".join(filter(None, [str(code_root), env.get("PYTHONPATH", "")]))
    return env


def echo(source: IO[bytes], log: BinaryIO, prefix: str) -> threading.Thread:
    """Copies a child's output, line by line, to its log file and, after ``prefix``, to this
    process's output, on a thread, until the child closes it. It never stops reading (a full
    pipe would stall the child): a write that fails is dropped."""
    mark = prefix.encode()

    def copy() -> None:
        out = sys.stdout.buffer
        for line in iter(source.readline, b""):
            with contextlib.suppress(OSError, ValueError):  # the file closed at stop()
                log.write(line)
                log.flush()
            with contextlib.suppress(OSError, ValueError):
                out.write(mark + line)
                out.flush()

    thread = threading.Thread(target=copy, name="log-echo", daemon=True)
    thread.start()
    return thread


class TritonServer:
    """A tritonserver process on one repository and three ports; a context manager."""

    def __init__(
        self,
        repository: Path,
        http_port: int = 8000,
        grpc_port: int = 8001,
        metrics_port: int = 8002,
        log_path: Path | None = None,
        extra_args: list[str] | None = None,
        exit_timeout_s: int = 30,
        address: str | None = None,
        code_root: Path = ROOT,
        echo_prefix: str | None = None,
    ) -> None:
        self.repository = Path(repository).resolve()
        # with log_path: each line also on this process's output, after this prefix (a
        # container's log, where nobody reads files inside the container)
        self.echo_prefix = echo_prefix
        self.http_port, self.grpc_port, self.metrics_port = http_port, grpc_port, metrics_port
        # None: Triton's default (every interface); the launcher passes loopback
        self.address = address
        # where the models import python_backend from: another checkout serves its own code
        self.code_root = Path(code_root)
        self.log_path = log_path
        self.extra_args = extra_args or []
        self.exit_timeout_s = exit_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self._log_file: BinaryIO | None = None

    @classmethod
    def loading_only(
        cls, repository: Path, models: tuple[str, ...], log_path: Path, code_root: Path = ROOT
    ) -> TritonServer:
        """On free ports, with only ``models`` of the repository loaded (explicit model control):
        a measurement that should see one model, not every model of the repository."""
        return cls(
            repository,
            free_port(),
            free_port(),
            free_port(),
            log_path=log_path,
            extra_args=[*(f"--load-model={m}" for m in models), "--model-control-mode=explicit"],
            code_root=code_root,
        )

    @property
    def loopback(self) -> str:
        """Where this machine reaches the server."""
        return local_host(self.address)

    @property
    def http_url(self) -> str:
        return f"localhost:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"localhost:{self.grpc_port}"

    def command(self) -> list[str]:
        installed = installed_tritonserver()
        if installed is not None:  # NVIDIA's image: its own backends, its default layout
            binary = [installed]
        else:
            binary = [
                str(triton_home() / "bin" / "tritonserver"),
                f"--backend-directory={prepare_backend_dir()}",
            ]
        addresses = (
            [
                f"--http-address={self.address}",
                f"--grpc-address={self.address}",
                f"--metrics-address={self.address}",
            ]
            if self.address
            else []
        )
        return [
            *binary,
            f"--model-repository={self.repository}",
            *addresses,
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            "--strict-readiness=true",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            *self.extra_args,
        ]

    def start(self) -> TritonServer:
        stdout: BinaryIO | int | None = None
        if self.log_path is not None:
            self._log_file = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
            stdout = self._log_file if self.echo_prefix is None else subprocess.PIPE
        self.process = subprocess.Popen(
            self.command(),
            env=server_env(self.code_root),
            # the stub ignores PYTHONPATH; its sys.path has the working folder ahead of the
            # virtual environment (whose editable install points at this checkout), so this is
            # what makes another checkout's models import that checkout's python_backend
            cwd=self.code_root,
            stdout=stdout,
            stderr=subprocess.STDOUT if stdout else None,
            start_new_session=True,  # its own process group: the stubs go with it
            preexec_fn=set_parent_death_signal,
        )
        if stdout is subprocess.PIPE:
            assert self.process.stdout is not None and self._log_file is not None
            echo(self.process.stdout, self._log_file, self.echo_prefix or "")
        return self

    def ready(self) -> bool:
        return answers_ok(f"http://{self.loopback}:{self.http_port}/v2/health/ready")

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"tritonserver exited with code {self.process.returncode}")
            if self.ready():
                return
            time.sleep(0.25)
        raise TimeoutError(f"tritonserver not ready after {timeout_s:.0f} s")

    def stop(self, grace_s: float | None = None) -> int | None:
        """SIGTERM, wait for a clean exit, then kill whatever is left of the process group."""
        if self.process is None:
            return None
        grace = self.exit_timeout_s + 10 if grace_s is None else grace_s
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # stray stubs, if any
        code = self.process.wait()
        if self._log_file is not None:
            self._log_file.close()
        return code

    def __enter__(self) -> TritonServer:
        self.start()
        self.wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
