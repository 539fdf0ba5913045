"""The whole deployment as `make serve` runs it: `python -m tools.serve` in a subprocess.

Triton on loopback ports of its own, the front door (nginx) on the public ones, the watchdog.
Limits and timeouts are short here so the hostile-traffic tests stay quick; each is one
environment variable, as in production.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tools.triton_server import ROOT, answers_ok, free_port

API_KEY = "test-key-0123456789abcdef"
BULK_KEY = "bulk-key-for-the-second-class"  # the stack's API_KEYS: class 2

SHORT_LIMITS = {
    "MAX_BODY_SIZE": "1m",
    "MAX_HEADER_SIZE": "4k",
    "CLIENT_TIMEOUT_S": "2",
    "UPSTREAM_TIMEOUT_S": "30",
    "MAX_CONNECTIONS_PER_CLIENT": "24",
    # open connections, idle ones too: above what the suite's own clients hold at once
    "MAX_OPEN_CONNECTIONS_PER_CLIENT": "128",
    "EXIT_TIMEOUT_S": "10",
    # probes add rows to the model's metrics: off unless a test asks for them
    "PROBE_INTERVAL_S": "3600",
}


@dataclass
class Stack:
    repository: Path
    state_dir: Path
    env_overrides: dict[str, str] = field(default_factory=dict)
    models: tuple[str, ...] = ("minilm",)
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        names = (
            "HTTP",
            "GRPC",
            "METRICS",
            "TRITON_HTTP",
            "TRITON_GRPC",
            "TRITON_METRICS",
            "OPENAI",
            "CHECK_HTTP",
            "CHECK_GRPC",
            "CHECK_STREAM",
            "SERVE_METRICS",
        )
        self.ports = {name: free_port() for name in names}

    @property
    def http_port(self) -> int:
        return self.ports["HTTP"]

    @property
    def grpc_port(self) -> int:
        return self.ports["GRPC"]

    @property
    def metrics_port(self) -> int:
        return self.ports["METRICS"]

    @property
    def http_url(self) -> str:
        return f"localhost:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"localhost:{self.grpc_port}"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "serve.log"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        for key in ("API_KEY", "TRITON_ADMIN_KEY", "METRICS_PUBLIC", "PUBLIC_ADDRESS"):
            env.pop(key, None)
        env.update({f"{name}_PORT": str(port) for name, port in self.ports.items()})
        env["PUBLIC_ADDRESS"] = "127.0.0.1"
        env.update(SHORT_LIMITS)
        env.update(self.env_overrides)
        return env

    def start(self, timeout_s: float = 180.0) -> Stack:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "tools.serve", "--repository", str(self.repository)]
        for model in self.models:
            command += ["--model", model]
        command += ["--state-dir", str(self.state_dir)]
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=self.env(),
            stdout=open(self.log_path, "wb"),  # noqa: SIM115 - the child holds it
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout_s
        while "ready:" not in self.output():
            if self.process.poll() is not None:
                raise RuntimeError(f"tools.serve exited early:\n{self.output()[-3000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"not ready in {timeout_s:.0f} s:\n{self.output()[-3000:]}")
            time.sleep(0.2)
        return self

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def ready(self) -> bool:
        """The public readiness route, as a load balancer's probe sees it."""
        return answers_ok(f"http://127.0.0.1:{self.http_port}/v2/health/ready", timeout_s=2)

    def triton_pid(self) -> int:
        out = subprocess.run(
            ["pgrep", "-f", f"tritonserver.*--http-port={self.ports['TRITON_HTTP']}"],
            capture_output=True,
            text=True,
        ).stdout.split()
        assert out, "no tritonserver of this stack is running"
        return int(out[0])

    def metrics_samples(self, name: str, **labels: str) -> list:
        """Samples of one series on the front door's metrics port (Triton's and the launcher's)."""
        from testkit.prometheus import samples_of, scrape

        return samples_of(scrape(f"http://127.0.0.1:{self.metrics_port}/metrics"), name, **labels)

    def server_processes(self) -> set[int]:
        """Every process the launcher runs (Triton, its stubs, nginx, the adapter, the body
        check): the same set before and after a case means nothing was restarted."""
        import psutil

        assert self.process is not None
        return {p.pid for p in psutil.Process(self.process.pid).children(recursive=True)}

    def stop(self, timeout_s: float = 60.0) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        return self.process.returncode
