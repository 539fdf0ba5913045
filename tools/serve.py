"""What `make serve` runs: Triton on loopback, the front door in front of it, and a watchdog.

    python -m tools.serve --repository model_repository --model minilm

- Triton listens on 127.0.0.1 only, on ports of its own (TRITON_HTTP_PORT, TRITON_GRPC_PORT,
  TRITON_METRICS_PORT; 18000-18002). Its management APIs (shared memory, repository, logging,
  trace) are restricted to requests carrying the header `admin-key: $TRITON_ADMIN_KEY`; when that
  variable is unset, a random key is made for this start, so the routes are unusable, not open.
- The front door (nginx, tools/front_door.py) is the only public entry: HTTP_PORT (8000) and
  GRPC_PORT (8001) on PUBLIC_ADDRESS, metrics on METRICS_PORT (8002) on loopback unless
  METRICS_PUBLIC=1. API_KEY, when set, is required for inference.
- The watchdog sends a real one-row inference to each probed model every PROBE_INTERVAL_S (on a
  thread of its own: a probe queued behind long forwards holds up nothing) and watches the
  model stubs. A Python-backend stub that died leaves Triton answering "ready" while
  every request fails; on that signal Triton is restarted (the front door answers 503 meanwhile
  and the requests the dead stub held end with an error). A dead queue owner of the split layout
  is reloaded alone instead (Triton runs with explicit model control, every model loaded): its
  fronts answer its requests 503 at once and reconnect when it is back, and nothing else stops.
  Triton exiting on its own (a request that crashes Triton 2.51, say) is restarted too, and
  so are the OpenAI adapter and the body check when they exit or miss three /health probes in
  a row: a part that was ever ready is always brought back, after a backoff (PartRestarts), each
  restart logged with its cause and counted (serve_restarts_total on SERVE_METRICS_PORT, which
  the front door appends to Triton's /metrics). Only RESTART_LIMIT (5) starts of one part in a
  row that never became ready, or nginx exiting, end the launcher with code 1 and a message;
  nothing of any part is left running.
- The OpenAI-compatible adapter (openai_api) listens on 127.0.0.1:OPENAI_PORT (18003); the
  front door serves it at /v1 on the public HTTP port. The body check (body_check) listens on
  127.0.0.1:CHECK_HTTP_PORT, CHECK_GRPC_PORT and CHECK_STREAM_PORT (18004, 18005, 18009): the
  front door sends it every KServe inference call, which it checks and passes to Triton.
- `--no-front-door` runs Triton and the watchdog only, on `--triton-address`: the compose
  deployment, whose front door and adapter are containers of their own.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from python_backend.common.contract import CLIENT_PARAMETER, KEY_CLASS_PARAMETER, OWNER_SUFFIX
from python_backend.common.values import BadValue, int_at_least, number_at_least, parse_bool
from tools.front_door import (
    FrontDoor,
    FrontDoorError,
    FrontDoorSettings,
    from_env,
    parse_api_key,
    parse_positive_size,
    parse_size,
    random_key,
    read_env,
)
from tools.helpers import HelperProcess, body_check, openai_adapter
from tools.triton_server import ROOT, TritonServer, answers_ok, child_processes

RESTRICTED_APIS = "shared-memory,model-repository,trace,logging"
STUB_BINARY = "triton_python_backend_stub"


def client_forward_args() -> list[str]:
    """Triton passes the front door's client header on to the model as a request parameter of
    the same name, over HTTP and gRPC: the queue's shares are by client (fair_queue)."""
    pattern = f"^({CLIENT_PARAMETER}|{KEY_CLASS_PARAMETER})$"
    return [f"--http-header-forward-pattern={pattern}", f"--grpc-header-forward-pattern={pattern}"]


def restricted_api_args(admin_key: str) -> list[str]:
    """Triton's own restriction of its management APIs, over HTTP and gRPC."""
    return [
        f"--http-restricted-api={RESTRICTED_APIS}:admin-key={admin_key}",
        f"--grpc-restricted-protocol={RESTRICTED_APIS}:admin-key={admin_key}",
    ]


def stub_model(pid: int) -> str | None:
    """The model a Python-backend stub serves: its first argument is <repository>/<model>/<version>/
    model.py (None when it is gone)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return Path(args[1].decode(errors="replace")).parent.parent.name if len(args) > 1 else None


def reload_model(base_url: str, model: str, admin_key: str, timeout_s: float) -> str | None:
    """Unloads ``model`` and loads it again through Triton's repository API (explicit model
    control): new stub processes, the rest of the server untouched. None when it is back, else
    why not."""

    def post(path: str) -> tuple[int, bytes]:
        request = urllib.request.Request(
            f"{base_url}/v2/repository{path}", data=b"{}", headers={"admin-key": admin_key}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()
        except OSError as err:
            return 0, str(err).encode()

    code, body = post(f"/models/{model}/unload")
    if code != 200:
        return f"unload answered {code}: {body[:200]!r}"
    deadline = time.monotonic() + timeout_s
    while True:  # unloading ends once the old instances are finalized
        code, body = post("/index")
        if code == 200:
            states = {m.get("name"): m.get("state") for m in json.loads(body or b"[]")}
            state = states.get(model)
            if state not in ("READY", "UNLOADING"):
                break
        else:  # an index that failed says nothing of the model: ask again until the deadline
            state = f"unknown (index answered {code}: {body[:120]!r})"
        if time.monotonic() > deadline:
            return f"still {state} after {timeout_s:.0f} s"
        time.sleep(0.2)
    code, body = post(f"/models/{model}/load")
    return None if code == 200 else f"load answered {code}: {body[:200]!r}"


def child_stubs(pid: int) -> set[int]:
    """Pids of the live Python-backend stubs whose parent is `pid`."""
    return {
        child
        for child, comm, state in child_processes(pid)
        if state != "Z" and STUB_BINARY.startswith(comm)
    }


PROBE_BODY = json.dumps(
    {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["probe"]}]}
).encode()


class ModelProbe:
    """One real one-row inference of each model, on a thread of its own. A probe queued behind
    long forwards can wait its whole timeout; meanwhile the watch loop goes on seeing dead stubs,
    a Triton that exited and failing helpers. ``outcome``: None while running or when every
    model answered, else (cause, what was seen). ``close()`` ends the probe in flight: Triton
    stopping would otherwise wait for its connection."""

    def __init__(self, triton: TritonServer, models: list[str], timeout_s: float) -> None:
        self.triton = triton  # the server probed: what it says about an earlier one is dropped
        self.outcome: tuple[str, str] | None = None
        self.finished = threading.Event()
        self.closed = False
        self.connection: http.client.HTTPConnection | None = None
        self.lock = threading.Lock()  # close() against a connection being made
        args = (models, timeout_s)
        threading.Thread(target=self._run, args=args, name="model-probe", daemon=True).start()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            sock = self.connection.sock if self.connection is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _run(self, models: list[str], timeout_s: float) -> None:
        try:
            for model in models:
                if self.closed:
                    return
                healthy, detail = self.probe(model, timeout_s)
                if not healthy:
                    self.outcome = "probe_failed", f"probe of {model} failed: {detail}"
                    return
        finally:
            self.finished.set()

    def probe(self, model: str, timeout_s: float) -> tuple[bool, str]:
        """(healthy, what was seen): a stub that died answers 500 '... not healthy'; "queue
        full", a refused input and the like mean the model is alive and answering."""
        connection = http.client.HTTPConnection(
            self.triton.loopback, self.triton.http_port, timeout=timeout_s
        )
        try:
            connection.connect()
            with self.lock:
                if self.closed:
                    return True, "closed"
                self.connection = connection
            connection.request(
                "POST",
                f"/v2/models/{model}/infer",
                PROBE_BODY,
                {"Content-Type": "application/json"},
            )
            response = connection.getresponse()
            text = response.read(300).decode(errors="replace")
            if response.status == 200:
                return True, "HTTP 200"
            return "not healthy" not in text, f"HTTP {response.status}: {text}"
        except (OSError, http.client.HTTPException) as err:
            # a timeout under load is no failure; a dead Triton is seen apart
            return True, f"no answer in {timeout_s:.0f} s ({err!r})"
        finally:
            connection.close()


HEALTHY_RESET_S = 60.0  # a part up this long starts its next backoff from 1 s again
MAX_BACKOFF_S = 30.0
HELPER_MISSES = 3  # /health probes a helper misses in a row before it is restarted


@dataclass
class PartRestarts:
    """When the launcher brings one part back (Triton, a queue owner, the adapter, the body
    check). A part that was ever ready is always brought back, whatever a client did to it: after
    a backoff that doubles from 1 s to 30 s while it keeps failing, and starts from 1 s again once
    it stayed up ``HEALTHY_RESET_S``. Only starts that fail in a row (the part never became ready
    again) are limited: ``start_limit`` of them end the launcher, since then something outside it
    is broken."""

    start_limit: int = 5
    streak: int = 0  # failures since the part last stayed up HEALTHY_RESET_S
    failed_starts: int = 0  # starts in a row that never became ready
    up_since: float | None = None

    def up(self, now: float) -> None:
        self.up_since = now
        self.failed_starts = 0

    def failed(self, now: float) -> float:
        """A failure at ``now``; the backoff before the next start."""
        if self.up_since is not None and now - self.up_since >= HEALTHY_RESET_S:
            self.streak = 0
        self.up_since = None
        self.streak += 1
        return min(MAX_BACKOFF_S, 2.0 ** (self.streak - 1))

    def start_failed(self) -> bool:
        """Counts a start that never became ready; False once ``start_limit`` came in a row."""
        self.failed_starts += 1
        return self.failed_starts < self.start_limit


class RestartCounts:
    """``serve_restarts_total{part,cause}``, served on the launcher's metrics port (the front
    door appends it to Triton's /metrics)."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def add(self, part: str, cause: str) -> None:
        with self._lock:
            self._counts[(part, cause)] += 1

    def exposition(self) -> str:
        with self._lock:
            counts = sorted(self._counts.items())
        lines = [
            "# HELP serve_restarts_total Parts of the deployment the launcher brought back, by cause",
            "# TYPE serve_restarts_total counter",
            *(f'serve_restarts_total{{part="{p}",cause="{c}"}} {n}' for (p, c), n in counts),
        ]
        return "\n".join(lines) + "\n"


def serve_metrics(counts: RestartCounts, address: str, port: int) -> ThreadingHTTPServer:
    """``GET /metrics`` on ``address:port``, in a thread of its own, until ``shutdown()``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = counts.exposition().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="serve-metrics", daemon=True).start()
    return server


@dataclass
class ServeSettings:
    """The launcher's settings; those an environment variable sets are declared here once, with
    their variable, default and parser (``front_door.read_env``)."""

    repository: Path
    models: list[str]  # probed by the watchdog; the first is named in the ready line
    triton_address: str = "127.0.0.1"
    triton_http_port: int = field(
        default=18000, metadata=from_env("TRITON_HTTP_PORT", int_at_least(1))
    )
    triton_grpc_port: int = field(
        default=18001, metadata=from_env("TRITON_GRPC_PORT", int_at_least(1))
    )
    triton_metrics_port: int = field(
        default=18002, metadata=from_env("TRITON_METRICS_PORT", int_at_least(1))
    )
    front_door: FrontDoorSettings | None = None
    # the helpers' ports on loopback (tools.helpers; only behind the front door): the adapter's,
    # and the body check's HTTP, gRPC and gRPC-stream ports
    openai_port: int = field(default=18003, metadata=from_env("OPENAI_PORT", int_at_least(1)))
    check_http_port: int = field(
        default=18004, metadata=from_env("CHECK_HTTP_PORT", int_at_least(1))
    )
    check_grpc_port: int = field(
        default=18005, metadata=from_env("CHECK_GRPC_PORT", int_at_least(1))
    )
    check_stream_port: int = field(
        default=18009, metadata=from_env("CHECK_STREAM_PORT", int_at_least(1))
    )
    # body-check processes sharing its ports: its CPU per request is Python's (docs/SECURITY.md)
    check_workers: int = field(default=1, metadata=from_env("CHECK_WORKERS", int_at_least(1)))
    # in each of them: the gRPC messages being received, counted at MAX_BODY_SIZE each, the
    # seconds a call's message has to arrive whole, and the largest stream message, which each
    # open stream holds (docs/SECURITY.md#the-body-check)
    check_grpc_bytes_in_progress: str = field(
        default="1024m", metadata=from_env("CHECK_GRPC_BYTES_IN_PROGRESS", parse_size)
    )
    check_stream_message_size: str = field(
        default="256k", metadata=from_env("CHECK_STREAM_MESSAGE_SIZE", parse_positive_size)
    )
    check_body_deadline_s: float = field(
        default=30.0, metadata=from_env("CHECK_BODY_DEADLINE_S", number_at_least(0.1))
    )
    admin_key: str = field(default="", metadata=from_env("TRITON_ADMIN_KEY", parse_api_key))
    probe_interval_s: float = field(
        default=2.0, metadata=from_env("PROBE_INTERVAL_S", number_at_least(0.05))
    )
    probe_timeout_s: float = field(
        default=10.0, metadata=from_env("PROBE_TIMEOUT_S", number_at_least(0.05))
    )
    exit_timeout_s: int = field(default=30, metadata=from_env("EXIT_TIMEOUT_S", int_at_least(1)))
    # a Triton start that is not ready by then is a failed start (stopped, and counted against
    # RESTART_LIMIT): one that hangs would otherwise hold the launcher for good
    start_timeout_s: float = field(
        default=900.0, metadata=from_env("START_TIMEOUT_S", number_at_least(1))
    )
    # starts of one part in a row that never became ready, past which the launcher exits 1; a
    # part that was ready is always brought back (PartRestarts)
    restart_limit: int = field(default=5, metadata=from_env("RESTART_LIMIT", int_at_least(1)))
    # the adapter's and the body check's /health, probed this often: three misses in a row and
    # the helper is restarted as if it had died (a wedged event loop)
    helper_probe_interval_s: float = field(
        default=5.0, metadata=from_env("HELPER_PROBE_INTERVAL_S", number_at_least(0.05))
    )
    # Triton's log (its stubs' included) also on the launcher's output, each line after
    # "[triton] ": a container's log, where nobody reads the file (compose and Kubernetes)
    log_to_stdout: bool = field(default=False, metadata=from_env("LOG_TO_STDOUT", parse_bool))
    # the launcher's own metrics (serve_restarts_total), on Triton's address
    serve_metrics_port: int = field(
        default=18008, metadata=from_env("SERVE_METRICS_PORT", int_at_least(1))
    )
    state_dir: Path = ROOT / "build" / "serve"


class Launcher:
    """Triton, the front door and the watchdog loop; `run()` returns the exit code."""

    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.admin_key = settings.admin_key or random_key()
        self.triton: TritonServer | None = None
        self.front_door: FrontDoor | None = None
        self.helpers: list[HelperProcess] = []  # the adapter and the body check
        self.stopping = False
        self.expected_stubs: dict[int, str | None] = {}  # pid -> the model it serves
        self.parts: dict[str, PartRestarts] = {}  # by part: see part()
        self.counts = RestartCounts()
        self.metrics_server: ThreadingHTTPServer | None = None
        self.helper_misses: dict[str, int] = {}  # by helper name: /health probes missed in a row
        self.probe: ModelProbe | None = None  # the models' inference probe in flight

    def log(self, message: str) -> None:
        print(f"[serve] {message}", flush=True)

    def new_triton(self) -> TritonServer:
        s = self.settings
        s.state_dir.mkdir(parents=True, exist_ok=True)
        return TritonServer(
            s.repository,
            s.triton_http_port,
            s.triton_grpc_port,
            s.triton_metrics_port,
            log_path=s.state_dir / "triton.log",
            echo_prefix="[triton] " if s.log_to_stdout else None,
            # explicit model control, every model loaded: a dead queue owner is reloaded alone
            extra_args=[
                *restricted_api_args(self.admin_key),
                "--model-control-mode=explicit",
                "--load-model=*",
                *client_forward_args(),
            ],
            exit_timeout_s=s.exit_timeout_s,
            address=s.triton_address,
        )

    def start_triton(self) -> bool:
        """Starts Triton and waits until it is ready; False if asked to stop meanwhile. A
        RuntimeError when it exits first or is not ready within ``start_timeout_s``."""
        self.triton = self.new_triton().start()
        deadline = time.monotonic() + self.settings.start_timeout_s
        while not self.stopping:
            if not self.triton_running():
                raise RuntimeError(self.triton_exit_message("while starting"))
            if time.monotonic() > deadline:
                self.triton.stop(grace_s=5.0)
                raise RuntimeError(
                    f"tritonserver was not ready {self.settings.start_timeout_s:g} s after it "
                    "started (START_TIMEOUT_S); stopped"
                )
            if self.triton.ready():
                assert self.triton.process is not None
                self.expected_stubs = self.stubs_now()
                return True
            time.sleep(0.1)
        return False

    def triton_running(self) -> bool:
        return (
            self.triton is not None
            and self.triton.process is not None
            and self.triton.process.poll() is None
        )

    def triton_exit_message(self, when: str) -> str:
        assert self.triton is not None and self.triton.process is not None
        code = self.triton.process.returncode
        log = self.settings.state_dir / "triton.log"
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
        return f"tritonserver exited {when} (code {code}); its log ends:\n{tail}"

    def stubs_now(self) -> dict[int, str | None]:
        assert self.triton is not None and self.triton.process is not None
        return {pid: stub_model(pid) for pid in child_stubs(self.triton.process.pid)}

    def dead_stubs(self) -> dict[int, str | None]:
        assert self.triton is not None and self.triton.process is not None
        alive = child_stubs(self.triton.process.pid)
        return {pid: m for pid, m in self.expected_stubs.items() if pid not in alive}

    def part(self, name: str) -> PartRestarts:
        return self.parts.setdefault(name, PartRestarts(self.settings.restart_limit))

    def bring_back(self, part: str, cause: str, detail: str, start: Callable[[], object]) -> bool:
        """Brings a failed part back with ``start`` (which raises RuntimeError when the part does
        not become ready), after its backoff; each attempt counted by part and cause. False
        when asked to stop, or when the part failed to start ``RESTART_LIMIT`` times in a row."""
        rule = self.part(part)
        while True:
            wait = rule.failed(time.monotonic())
            self.counts.add(part, cause)
            self.log(f"{part} failed ({detail}); restarting it in {wait:.0f} s")
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and not self.stopping:
                time.sleep(0.1)
            if self.stopping:
                return False
            try:
                start()
            except RuntimeError as err:
                self.log(str(err))
                if not rule.start_failed():
                    n = rule.failed_starts
                    times = f" {n} times in a row" if n > 1 else ""
                    self.log(f"{part} did not start{times}: giving up, stopping everything")
                    return False
                cause, detail = "start_failed", "it did not start"
                continue
            rule.up(time.monotonic())
            return not self.stopping

    def bring_owners_back(self, owners: list[str]) -> bool:
        """Reloads dead queue owners alone: their fronts answer 503 meanwhile and reconnect by
        themselves, Triton and every other model keep serving. A reload that fails restarts
        Triton. False when asked to stop or when Triton no longer starts."""
        assert self.triton is not None
        base = f"http://{self.triton.loopback}:{self.settings.triton_http_port}"
        failed: list[str] = []

        def reload() -> None:
            started = time.monotonic()
            for owner in owners:
                self.log(f"reloading {owner} (its stub died)")
                failure = reload_model(base, owner, self.admin_key, timeout_s=120.0)
                if failure is not None:
                    failed.append(f"reloading {owner} failed: {failure}")
                    return
            self.expected_stubs = self.stubs_now()
            self.log(f"{', '.join(owners)} back after {time.monotonic() - started:.1f} s")

        if not self.bring_back("queue_owner", "stub_died", ", ".join(owners), reload):
            return False
        return not failed or self.bring_triton_back("reload_failed", failed[0])

    def bring_triton_back(self, cause: str, detail: str) -> bool:
        """Restarts Triton until it is ready (``bring_back``'s rule)."""
        return self.bring_back("triton", cause, detail, lambda: self.restart_triton(detail))

    def restart_triton(self, reason: str) -> None:
        assert self.triton is not None
        started = time.monotonic()
        self.log(f"restarting Triton ({reason})")
        if self.probe is not None:  # its connection would hold the stop below
            self.probe.close()
        # a dead stub makes a clean shutdown wait out its whole exit timeout: do not wait for it
        self.triton.stop(grace_s=2.0)
        log = self.settings.state_dir / "triton.log"
        if log.exists():  # the failed server's log stays readable beside the new one
            log.replace(log.with_name("triton.previous.log"))
        if self.start_triton():
            self.log(f"Triton is back after {time.monotonic() - started:.1f} s")

    def ready_banner(self) -> str:
        model = self.settings.models[0]
        door = self.settings.front_door
        if door is None:
            return f"ready: {model}; Triton on {self.settings.triton_address}"
        auth = ' -H "Authorization: Bearer $API_KEY"' if door.api_key else ""
        metrics_host = door.public_address if door.metrics_public else "127.0.0.1"
        return (
            f"\nready: {model} behind the front door on {door.public_address}: "
            f"HTTP :{door.http_port}, gRPC :{door.grpc_port}; metrics {metrics_host}:"
            f"{door.metrics_port}; Triton itself on 127.0.0.1 only\n"
            f"  curl -s localhost:{door.http_port}/v2/models/{model}/infer{auth} -d "
            '\'{"inputs":[{"name":"TEXT","datatype":"BYTES","shape":[1,1],'
            '"data":["Triton plans its own batches"]}]}\'\n'
            f"  curl -s localhost:{door.http_port}/v1/embeddings{auth} -H 'Content-Type: "
            f'application/json\' -d \'{{"model":"{model}","input":"hello"}}\'\n'
            "Ctrl-C stops it."
        )

    def run(self) -> int:
        def on_signal(signum: int, _frame: object) -> None:
            self.stopping = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        try:
            # first: a liveness probe asks it while Triton's models still load
            self.metrics_server = serve_metrics(
                self.counts, self.settings.triton_address, self.settings.serve_metrics_port
            )
            if not self.start_triton():
                return 0
            self.part("triton").up(time.monotonic())
            if self.settings.front_door is not None:
                self.helpers = self.new_helpers()
                for helper in self.helpers:
                    helper.start()
                    self.part(helper.part).up(time.monotonic())
                self.front_door = FrontDoor(
                    self.settings.front_door, self.settings.state_dir / "nginx"
                ).start()
            self.log(self.ready_banner())
            return self.watch()
        except (RuntimeError, FrontDoorError, OSError) as err:  # OSError: a port taken
            self.log(f"error: {err}")
            return 1
        finally:
            self.shutdown()

    def watch(self) -> int:
        """Brings back whatever fails until asked to stop (0); 1 when the front door exits or a
        part no longer starts."""
        next_probe = time.monotonic() + self.settings.probe_interval_s
        next_helper_probe = time.monotonic() + self.settings.helper_probe_interval_s
        while not self.stopping:
            time.sleep(0.1)
            if not self.triton_running():
                self.log(self.triton_exit_message("unexpectedly"))
                if not self.bring_triton_back("exited", "it exited"):
                    return 1 if not self.stopping else 0
                continue
            if self.front_door is not None and not self.front_door.running():
                self.log("the front door (nginx) exited unexpectedly; stopping everything")
                return 1
            probe_helpers = time.monotonic() >= next_helper_probe
            failing = self.failed_helper(probe_helpers)
            if probe_helpers:
                next_helper_probe = time.monotonic() + self.settings.helper_probe_interval_s
            if failing is not None:
                helper, cause, detail = failing
                helper.stop(grace_s=2.0)
                self.helper_misses[helper.name] = 0
                if not self.bring_back(helper.part, cause, detail, helper.start):
                    return 1 if not self.stopping else 0
                continue
            if self.probe is not None and self.probe.triton is not self.triton:
                self.probe.close()  # Triton was restarted meanwhile: its answer is stale
                self.probe = None
            if time.monotonic() >= next_probe:
                next_probe = time.monotonic() + self.settings.probe_interval_s
                dead = self.dead_stubs()
                if dead and not self.triton_running():
                    continue  # Triton itself exited, its stubs with it: seen as that, above
                if dead and all((m or "").endswith(OWNER_SUFFIX) for m in dead.values()):
                    if not self.bring_owners_back(sorted({m for m in dead.values() if m})):
                        return 1 if not self.stopping else 0
                    continue
                if dead and not self.stopping:
                    if not self.bring_triton_back(
                        "stub_died", f"model stub process(es) {sorted(dead)} died"
                    ):
                        return 1 if not self.stopping else 0
                    continue
                if self.probe is None:
                    assert self.triton is not None
                    self.probe = ModelProbe(
                        self.triton, self.settings.models, self.settings.probe_timeout_s
                    )
            if self.probe is not None and self.probe.finished.is_set():
                failed, self.probe = self.probe.outcome, None
                if failed is not None and not self.stopping and not self.bring_triton_back(*failed):
                    return 1 if not self.stopping else 0
        return 0

    def failed_helper(self, probe: bool) -> tuple[HelperProcess, str, str] | None:
        """A helper that exited, or (when ``probe``) missed its third /health probe in a row:
        with the cause and what was seen."""
        for helper in self.helpers:
            if not helper.running():
                return helper, "exited", helper.exit_reason()
        if not probe:
            return None
        timeout_s = min(5.0, self.settings.helper_probe_interval_s)
        for helper in self.helpers:
            if answers_ok(helper.health_url, timeout_s):
                self.helper_misses[helper.name] = 0
                continue
            misses = self.helper_misses.get(helper.name, 0) + 1
            self.helper_misses[helper.name] = misses
            if misses >= HELPER_MISSES:
                return helper, "unresponsive", f"{misses} health probes missed in a row"
        return None

    def new_helpers(self) -> list[HelperProcess]:
        """The adapter and the body check, on loopback, in front of Triton's own ports."""
        s = self.settings
        assert s.front_door is not None
        triton_http = f"127.0.0.1:{s.triton_http_port}"
        triton_grpc = f"127.0.0.1:{s.triton_grpc_port}"
        return [
            openai_adapter(
                triton_grpc,
                s.openai_port,
                s.models,
                s.state_dir / "openai.log",
                s.repository.resolve(),
            ),
            body_check(
                triton_http,
                triton_grpc,
                s.check_http_port,
                s.check_grpc_port,
                s.check_stream_port,
                s.front_door.max_body_size,
                s.state_dir / "body_check.log",
                workers=s.check_workers,
                grpc_bytes_in_progress=s.check_grpc_bytes_in_progress,
                body_deadline_s=s.check_body_deadline_s,
                stream_message_size=s.check_stream_message_size,
            ),
        ]

    def shutdown(self) -> None:
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
        # the front door first: no new requests, then Triton answers what it holds
        if self.front_door is not None:
            self.front_door.stop()
        for helper in self.helpers:
            helper.stop()
        if self.probe is not None:
            self.probe.close()
        if self.triton is not None:
            self.triton.stop()


def settings_from_args(argv: list[str] | None = None) -> ServeSettings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument(
        "--model",
        action="append",
        help="a model the watchdog probes (repeatable); the first is named in the ready line",
    )
    parser.add_argument(
        "--no-front-door",
        action="store_true",
        help="Triton and the watchdog only (compose runs the front door as its own service)",
    )
    parser.add_argument(
        "--triton-address",
        default=os.environ.get("TRITON_ADDRESS", "127.0.0.1"),
        help="where Triton listens: loopback, or the internal network's interface",
    )
    parser.add_argument("--state-dir", type=Path, default=ROOT / "build" / "serve")
    args = parser.parse_args(argv)
    try:
        env = read_env(ServeSettings)
        settings = ServeSettings(
            repository=args.repository,
            models=args.model or ["minilm"],
            triton_address=args.triton_address,
            state_dir=args.state_dir,
            **env,  # type: ignore[arg-type]
        )
        if args.no_front_door:
            return settings
        if args.triton_address in ("0.0.0.0", "::"):
            sys.exit("behind the front door, Triton listens on loopback: drop --triton-address")
        address = args.triton_address
        settings.front_door = FrontDoorSettings(
            triton_http_address=f"{address}:{settings.triton_http_port}",
            triton_grpc_address=f"{address}:{settings.triton_grpc_port}",
            triton_metrics_address=f"{address}:{settings.triton_metrics_port}",
            openai_address=f"127.0.0.1:{settings.openai_port}",
            check_http_address=f"127.0.0.1:{settings.check_http_port}",
            check_grpc_address=f"127.0.0.1:{settings.check_grpc_port}",
            check_stream_address=f"127.0.0.1:{settings.check_stream_port}",
            serve_metrics_address=f"{address}:{settings.serve_metrics_port}",
            **FrontDoorSettings.env_overrides(),  # type: ignore[arg-type]
        )
    except (BadValue, FrontDoorError) as err:
        sys.exit(str(err))
    return settings


def main(argv: list[str] | None = None) -> int:
    return Launcher(settings_from_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
