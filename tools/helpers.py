"""The Python services beside Triton, behind the front door: the OpenAI-compatible adapter
(openai_api) and the body check (body_check). The launcher and the benchmarks start them the
same way: each in a session of its own, dying with its parent, ready once its /health answers.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tools.triton_server import ROOT, answers_ok, set_parent_death_signal


@dataclass
class HelperProcess:
    name: str  # as the launcher's log names it
    part: str  # as its metrics name it (serve_restarts_total's part)
    command: list[str]
    health_url: str
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> HelperProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.log_path.exists():  # why the last one died stays readable beside the new one
            self.log_path.replace(self.log_path.with_name(f"{self.log_path.name}.previous"))
        with self.log_path.open("wb") as log:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                self.command,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=set_parent_death_signal,
            )
        deadline = time.monotonic() + timeout_s
        while not answers_ok(self.health_url):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log_path.read_text(errors="replace")[-1500:]
                raise RuntimeError(f"{self.name} did not start; its log ends:\n{tail}")
            time.sleep(0.1)
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exit_reason(self) -> str:
        assert self.process is not None
        tail = self.log_path.read_text(errors="replace")[-600:] if self.log_path.exists() else ""
        return f"exited with code {self.process.returncode}; its log ends:\n{tail}"

    def stop(self, grace_s: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def openai_adapter(
    triton_grpc: str,
    port: int,
    models: list[str],
    log_path: Path,
    repository: Path | None = None,
) -> HelperProcess:
    """The OpenAI-compatible adapter on loopback ``port``, talking to Triton's gRPC port, and
    reading the models' own files from ``repository`` (tokenize, decode, info, class names)."""
    command = [sys.executable, "-m", "openai_api", f"--listen=127.0.0.1:{port}"]
    command += [f"--triton-grpc={triton_grpc}", *(f"--model={m}" for m in models)]
    if repository is not None:
        command.append(f"--repository={repository}")
    return HelperProcess(
        "the OpenAI adapter", "openai_adapter", command, f"http://127.0.0.1:{port}/health", log_path
    )


def body_check(
    triton_http: str,
    triton_grpc: str,
    http_port: int,
    grpc_port: int,
    stream_port: int,
    max_body_size: str,
    log_path: Path,
    workers: int = 1,
    grpc_bytes_in_progress: str = "1024m",
    body_deadline_s: float = 30.0,
    stream_message_size: str = "256k",
) -> HelperProcess:
    """The body check on loopback ports (HTTP, gRPC, gRPC streams), in front of Triton's HTTP
    and gRPC ports."""
    command = [
        sys.executable,
        "-m",
        "body_check",
        f"--triton-http={triton_http}",
        f"--triton-grpc={triton_grpc}",
        f"--http-listen=127.0.0.1:{http_port}",
        f"--grpc-listen=127.0.0.1:{grpc_port}",
        f"--stream-listen=127.0.0.1:{stream_port}",
        f"--stream-message-size={stream_message_size}",
        f"--max-body-size={max_body_size}",
        f"--workers={workers}",
        f"--grpc-bytes-in-progress={grpc_bytes_in_progress}",
        f"--body-deadline-s={body_deadline_s:g}",
    ]
    return HelperProcess(
        "the body check", "body_check", command, f"http://127.0.0.1:{http_port}/health", log_path
    )
