"""What `make serve` runs: Triton on loopback, the front door in front of it, and a watchdog.

    python -m tools.serve --repository model_repository --model minilm

- Triton listens on 127.0.0.1 only, on ports of its own (TRITON_HTTP_PORT, TRITON_GRPC_PORT,
  TRITON_METRICS_PORT; 18000-18002). Its management APIs (shared memory, repository, logging,
  trace) are restricted to requests carrying the header `admin-key: $TRITON_ADMIN_KEY`; when that
  variable is unset, a random key is made for this start, so the routes are unusable, not open.
- The front door (nginx, tools/front_door.py) is the only public entry: HTTP_PORT (8000) and
  GRPC_PORT (8001) on PUBLIC_ADDRESS, metrics on METRICS_PORT (8002) on loopback unless
  METRICS_PUBLIC=1. API_KEY, when set, is required for inference.
- The watchdog sends a real one-row inference to each probed model every PROBE_INTERVAL_S and
  watches the model stubs. A Python-backend stub that died leaves Triton answering "ready" while
  every request fails; on that signal Triton is restarted (the front door answers 503 meanwhile
  and the requests the dead stub held end with an error). A dead queue owner of the split layout
  is reloaded alone instead (Triton runs with explicit model control, every model loaded): its
  fronts answer its requests 503 at once and reconnect when it is back, and nothing else stops.
  Triton exiting on its own (a request that crashes Triton 2.51, say) is restarted too, after a
  backoff that doubles from 1 s, and the reason is logged; so are the OpenAI adapter and the
  body check. Past RESTART_LIMIT (5) failures within
  RESTART_WINDOW_S (300 s), or when nginx exits, the launcher ends with code 1 and a message;
  nothing of any part is left running.
- The OpenAI-compatible adapter (openai_api) listens on 127.0.0.1:OPENAI_PORT (18003); the
  front door serves it at /v1 on the public HTTP port. The body check (body_check) listens on
  127.0.0.1:CHECK_HTTP_PORT and CHECK_GRPC_PORT (18004, 18005): the front door sends it every
  KServe inference call, which it checks and passes to Triton. Both are brought back like
  Triton when they exit.
- `--no-front-door` runs Triton and the watchdog only, on `--triton-address`: the compose
  deployment, whose front door and adapter are containers of their own.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from python_backend.contract import CLIENT_PARAMETER, OWNER_SUFFIX
from python_backend.values import BadValue, int_at_least, number_at_least
from tools.front_door import (
    FrontDoor,
    FrontDoorError,
    FrontDoorSettings,
    from_env,
    parse_api_key,
    random_key,
    read_env,
)
from tools.helpers import HelperProcess, body_check, openai_adapter
from tools.triton_server import ROOT, TritonServer

RESTRICTED_APIS = "shared-memory,model-repository,trace,logging"
STUB_BINARY = "triton_python_backend_stub"


def client_forward_args() -> list[str]:
    """Triton passes the front door's client header on to the model as a request parameter of
    the same name, over HTTP and gRPC: the queue's shares are by client (fair_queue)."""
    pattern = f"^{CLIENT_PARAMETER}$"
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
    """Pids of the Python-backend stubs whose parent is `pid` (read from /proc)."""
    found = set()
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
        if int(ppid) == pid and state != "Z" and STUB_BINARY.startswith(comm):
            found.add(int(entry.name))
    return found


@dataclass
class ProbeResult:
    healthy: bool  # False: the model cannot serve and will not recover by itself
    detail: str


def probe_model(base_url: str, model: str, timeout_s: float) -> ProbeResult:
    """One real inference of one short row; a stub that died answers 500 '... not healthy'."""
    body = json.dumps(
        {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["probe"]}]}
    ).encode()
    request = urllib.request.Request(
        f"{base_url}/v2/models/{model}/infer",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return ProbeResult(True, f"HTTP {response.status}")
    except urllib.error.HTTPError as err:
        text = err.read().decode(errors="replace")[:300]
        # "queue full", a refused input and the like mean the model is alive and answering
        return ProbeResult("not healthy" not in text, f"HTTP {err.code}: {text}")
    except OSError as err:  # a timeout under load is not a failure; a dead Triton is seen apart
        return ProbeResult(True, f"no answer in {timeout_s:.0f} s ({err})")


@dataclass
class RestartBudget:
    """How often the launcher brings a failed part back: at most ``limit`` failures within
    ``window_s`` (then it gives up, since something keeps killing it), each restart after a
    backoff that doubles from 1 s to 30 s while failures come close together."""

    limit: int = 5
    window_s: float = 300.0
    failures: list[float] = field(default_factory=list)  # monotonic times, inside the window

    def record(self, now: float) -> bool:
        """Counts a failure at ``now``; False when the budget is spent (the launcher exits)."""
        self.failures = [t for t in self.failures if now - t < self.window_s] + [now]
        return len(self.failures) < self.limit

    def backoff_s(self) -> float:
        return min(30.0, 2.0 ** max(0, len(self.failures) - 1))


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
    # and the body check's HTTP and gRPC ports
    openai_port: int = field(default=18003, metadata=from_env("OPENAI_PORT", int_at_least(1)))
    check_http_port: int = field(
        default=18004, metadata=from_env("CHECK_HTTP_PORT", int_at_least(1))
    )
    check_grpc_port: int = field(
        default=18005, metadata=from_env("CHECK_GRPC_PORT", int_at_least(1))
    )
    # body-check processes sharing its ports: its CPU per request is Python's (docs/SECURITY.md)
    check_workers: int = field(default=1, metadata=from_env("CHECK_WORKERS", int_at_least(1)))
    admin_key: str = field(default="", metadata=from_env("TRITON_ADMIN_KEY", parse_api_key))
    probe_interval_s: float = field(
        default=2.0, metadata=from_env("PROBE_INTERVAL_S", number_at_least(0.05))
    )
    probe_timeout_s: float = field(
        default=10.0, metadata=from_env("PROBE_TIMEOUT_S", number_at_least(0.05))
    )
    exit_timeout_s: int = field(default=30, metadata=from_env("EXIT_TIMEOUT_S", int_at_least(1)))
    # failures (Triton, a model stub, the adapter) within RESTART_WINDOW_S past which the
    # launcher stops bringing them back and exits 1
    restart_limit: int = field(default=5, metadata=from_env("RESTART_LIMIT", int_at_least(1)))
    restart_window_s: float = field(
        default=300.0, metadata=from_env("RESTART_WINDOW_S", number_at_least(1.0))
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
        self.restarts = 0
        self.expected_stubs: dict[int, str | None] = {}  # pid -> the model it serves
        self.budget = RestartBudget(settings.restart_limit, settings.restart_window_s)

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
        """Starts Triton and waits until it is ready; False if asked to stop meanwhile."""
        self.triton = self.new_triton().start()
        while not self.stopping:
            if not self.triton_running():
                raise RuntimeError(self.triton_exit_message("while starting"))
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

    def bring_owners_back(self, owners: list[str]) -> bool:
        """Reloads dead queue owners alone: their fronts answer 503 meanwhile and reconnect by
        themselves, Triton and every other model keep serving. A reload that fails restarts
        Triton. False when the budget is spent or a stop was asked."""
        if not self.spend_restart(f"queue owner(s) {', '.join(owners)}", "a stub died", False):
            return False
        assert self.triton is not None
        base = f"http://{self.triton.loopback}:{self.settings.triton_http_port}"
        started = time.monotonic()
        for owner in owners:
            self.log(f"reloading {owner} (its stub died)")
            failure = reload_model(base, owner, self.admin_key, timeout_s=120.0)
            if failure is not None:
                return self.bring_triton_back(f"reloading {owner} failed: {failure}")
        self.expected_stubs = self.stubs_now()
        self.log(f"{', '.join(owners)} back after {time.monotonic() - started:.1f} s")
        return True

    def unhealthy_reason(self) -> str | None:
        """Why the model cannot serve, or None; cheap checks first."""
        assert self.triton is not None and self.triton.process is not None
        missing = self.dead_stubs()
        if missing:
            return f"model stub process(es) {sorted(missing)} died"
        base = f"http://{self.triton.loopback}:{self.settings.triton_http_port}"
        for model in self.settings.models:
            result = probe_model(base, model, self.settings.probe_timeout_s)
            if not result.healthy:
                return f"probe of {model} failed: {result.detail}"
        return None

    def bring_triton_back(self, reason: str, backoff: bool = True) -> bool:
        """Restarts Triton until it is ready, each failure (one that dies while starting too)
        counted against the budget; False when the budget is spent or a stop was asked."""
        while True:
            if not self.spend_restart("Triton", reason, backoff):
                return False
            try:
                self.restart_triton(reason)
                return not self.stopping
            except RuntimeError as err:  # it died again before it was ready
                self.log(str(err))
                reason = "it exited while starting"

    def spend_restart(self, what: str, reason: str, backoff: bool = True) -> bool:
        """Counts a failure; waits out the backoff (False: the budget is spent, or asked to
        stop meanwhile)."""
        if not self.budget.record(time.monotonic()):
            self.log(
                f"{what} failed ({reason}); {len(self.budget.failures)} failures within "
                f"{self.budget.window_s:.0f} s: giving up, stopping everything"
            )
            return False
        wait = self.budget.backoff_s() if backoff else 0.0
        self.log(f"{what} failed ({reason}); restarting it in {wait:.0f} s")
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not self.stopping:
            time.sleep(0.1)
        return not self.stopping

    def restart_triton(self, reason: str) -> None:
        assert self.triton is not None
        self.restarts += 1
        started = time.monotonic()
        self.log(f"restarting Triton ({reason})")
        # a dead stub makes a clean shutdown wait out its whole exit timeout: do not wait for it
        self.triton.stop(grace_s=2.0)
        log = self.settings.state_dir / "triton.log"
        if log.exists():  # the failed server's log stays readable beside the new one
            log.replace(log.with_name(f"triton.{self.restarts}.log"))
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
            if not self.start_triton():
                return 0
            if self.settings.front_door is not None:
                self.helpers = self.new_helpers()
                for helper in self.helpers:
                    helper.start()
                self.front_door = FrontDoor(
                    self.settings.front_door, self.settings.state_dir / "nginx"
                ).start()
            self.log(self.ready_banner())
            return self.watch()
        except (RuntimeError, FrontDoorError) as err:
            self.log(f"error: {err}")
            return 1
        finally:
            self.shutdown()

    def watch(self) -> int:
        next_probe = time.monotonic() + self.settings.probe_interval_s
        while not self.stopping:
            time.sleep(0.1)
            if not self.triton_running():
                self.log(self.triton_exit_message("unexpectedly"))
                if not self.bring_triton_back("it exited"):
                    return 1 if not self.stopping else 0
                continue
            if self.front_door is not None and not self.front_door.running():
                self.log("the front door (nginx) exited unexpectedly; stopping everything")
                return 1
            exited = next((h for h in self.helpers if not h.running()), None)
            if exited is not None:
                if not self.spend_restart(exited.name, exited.exit_reason()):
                    return 1 if not self.stopping else 0
                exited.start()
                continue
            if time.monotonic() >= next_probe:
                dead = self.dead_stubs()
                if dead and all((m or "").endswith(OWNER_SUFFIX) for m in dead.values()):
                    if not self.bring_owners_back(sorted({m for m in dead.values() if m})):
                        return 1 if not self.stopping else 0
                    next_probe = time.monotonic() + self.settings.probe_interval_s
                    continue
                unhealthy = self.unhealthy_reason()
                # a dead stub is restarted at once: requests in flight already failed
                if (
                    unhealthy is not None
                    and not self.stopping
                    and not self.bring_triton_back(unhealthy, backoff=False)
                ):
                    return 1 if not self.stopping else 0
                next_probe = time.monotonic() + self.settings.probe_interval_s
        return 0

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
                s.front_door.max_body_size,
                s.state_dir / "body_check.log",
                workers=s.check_workers,
            ),
        ]

    def shutdown(self) -> None:
        # the front door first: no new requests, then Triton answers what it holds
        if self.front_door is not None:
            self.front_door.stop()
        for helper in self.helpers:
            helper.stop()
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
            **FrontDoorSettings.env_overrides(),  # type: ignore[arg-type]
        )
    except (BadValue, FrontDoorError) as err:
        sys.exit(str(err))
    return settings


def main(argv: list[str] | None = None) -> int:
    return Launcher(settings_from_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
