"""The launcher's pieces that talk to Triton, against a small HTTP server standing in for
Triton's repository API (the real server's reload is covered in tests/e2e/test_split_faults.py)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tools.serve import Launcher, ServeSettings, reload_model


class StandIn(BaseHTTPRequestHandler):
    """A route of Triton's, stood in for: answers with ``reply``, logs nothing."""

    def reply(self, code: int, data: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def serve(handler: type[StandIn]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class Repository(StandIn):
    """Answers unload and load with 200; /index with the next of ``index_answers``."""

    calls: list[str]
    index_answers: list[tuple[int, object]]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        path = self.path.removeprefix("/v2/repository")
        self.calls.append(path)
        code, body = (200, {})
        if path == "/index":
            code, body = self.index_answers.pop(0) if self.index_answers else (200, [])
        self.reply(code, json.dumps(body).encode())


@pytest.fixture
def repository():
    handler = type("Handler", (Repository,), {"calls": [], "index_answers": []})
    server = serve(handler)
    yield handler, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_a_failed_index_is_asked_again_and_the_model_is_loaded_only_once_unloaded(repository):
    handler, base = repository
    handler.index_answers = [
        (500, {"error": "busy"}),
        (200, [{"name": "m_owner", "state": "UNLOADING"}]),
        (200, [{"name": "m_owner", "state": "UNAVAILABLE"}]),
    ]
    assert reload_model(base, "m_owner", "key", timeout_s=5) is None
    assert handler.calls == [
        "/models/m_owner/unload",
        "/index",
        "/index",
        "/index",
        "/models/m_owner/load",
    ]


def test_an_index_that_keeps_failing_ends_at_the_deadline_without_loading(repository):
    handler, base = repository
    handler.index_answers = [(500, {"error": "busy"})] * 1000
    failure = reload_model(base, "m_owner", "key", timeout_s=0.5)
    assert failure is not None and "index answered 500" in failure
    assert "/models/m_owner/load" not in handler.calls


def test_the_compose_liveness_probe_stops_the_container_at_the_third_miss_in_a_row(tmp_path):
    import subprocess

    from tools.liveness import probe
    from tools.triton_server import free_port

    nobody = f"http://127.0.0.1:{free_port()}/health"  # nothing listens there
    # stands for the container's init and the helper it runs
    init = subprocess.Popen(["sh", "-c", "sleep 60 & wait $!"])
    state = tmp_path / "misses"
    try:
        time.sleep(0.2)  # the helper started
        assert probe(nobody, 3, 0.2, state, init.pid) == 1
        assert probe(nobody, 3, 0.2, state, init.pid) == 1
        assert init.poll() is None, "two misses: the container keeps running"
        assert probe(nobody, 3, 0.2, state, init.pid) == 1
        assert init.wait(timeout=5) == 137, "the third miss in a row kills the helper (SIGKILL)"
        assert not state.exists(), "the next container starts counting from zero"
    finally:
        init.kill()
        init.wait()


def test_a_childs_log_is_echoed_to_the_launchers_output_and_kept_in_its_file(tmp_path, capfd):
    """LOG_TO_STDOUT: Triton's output goes to its log file, as always, and each line also to
    the launcher's output after a prefix (a container's log); a child that writes much is never
    held up by the copy."""
    import subprocess
    import sys

    from tools.triton_server import echo

    lines = [f"line {i}" for i in range(5000)]
    child = subprocess.Popen(
        [sys.executable, "-c", f"print('\\n'.join({lines!r}))"], stdout=subprocess.PIPE
    )
    assert child.stdout is not None
    with (tmp_path / "triton.log").open("wb") as log:
        thread = echo(child.stdout, log, "[triton] ")
        assert child.wait(timeout=30) == 0
        thread.join(10)
    assert (tmp_path / "triton.log").read_text().splitlines() == lines
    echoed = capfd.readouterr().out.splitlines()
    assert echoed == [f"[triton] {line}" for line in lines]


def test_a_triton_that_never_becomes_ready_is_a_failed_start_at_its_deadline(tmp_path):
    """A Triton that hangs while starting (alive, never ready) would hold the launcher for
    good: past START_TIMEOUT_S it is stopped, and the start counts as failed (RuntimeError,
    which bring_back counts against RESTART_LIMIT)."""
    from tools.serve import Launcher, ServeSettings

    stopped = []

    class Hanging:
        process = type("Alive", (), {"poll": lambda self: None, "pid": 0})()

        def start(self):
            return self

        def ready(self):
            return False

        def stop(self, grace_s=None):
            stopped.append(grace_s)

    settings = ServeSettings(tmp_path, ["m"], state_dir=tmp_path, start_timeout_s=0.3)
    launcher = Launcher(settings)
    launcher.new_triton = Hanging  # type: ignore[method-assign,assignment]
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"not ready 0\.3 s after it started"):
        launcher.start_triton()
    assert 0.3 <= time.monotonic() - started < 5 and len(stopped) == 1


def test_the_body_checks_budget_deadline_and_stream_settings_come_from_the_environment(tmp_path):
    from python_backend.common.values import BadValue
    from tools.front_door import FrontDoorSettings, read_env

    env = {
        "CHECK_GRPC_BYTES_IN_PROGRESS": "256m",
        "CHECK_BODY_DEADLINE_S": "7.5",
        "CHECK_STREAM_MESSAGE_SIZE": "64k",
        "CHECK_STREAM_PORT": "18123",
    }
    settings = ServeSettings(
        tmp_path,
        ["m"],
        front_door=FrontDoorSettings(*(f"127.0.0.1:{port}" for port in range(18000, 18007))),
        state_dir=tmp_path,
        **read_env(ServeSettings, env),
    )
    (check,) = [h for h in Launcher(settings).new_helpers() if h.part == "body_check"]
    assert "--grpc-bytes-in-progress=256m" in check.command
    assert "--body-deadline-s=7.5" in check.command
    assert "--stream-message-size=64k" in check.command
    assert "--stream-listen=127.0.0.1:18123" in check.command
    # a stream message of no bytes would end the check at its start, restarted for ever
    with pytest.raises(BadValue, match="CHECK_STREAM_MESSAGE_SIZE must be above 0"):
        read_env(ServeSettings, {"CHECK_STREAM_MESSAGE_SIZE": "0k"})


class Infer(StandIn):
    """Triton's inference route: holds every probe ``hold_s`` (a probe queued behind long
    forwards), then answers ``answer``."""

    hold_s: float
    answer: tuple[int, bytes]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        code, body = self.answer  # what the server it reached says, however late
        time.sleep(self.hold_s)
        self.reply(code, body)


class Process:
    returncode: int | None = None
    pid = 0

    def poll(self) -> int | None:
        return self.returncode


def watched(
    tmp_path,
    hold_s: float,
    answer: tuple[int, bytes],
    dead_after_s: float | None,
    triton_dies_too: bool = False,
    watch_on_s: float | None = None,
):
    """A launcher watching a stand-in Triton whose one stub dies ``dead_after_s`` into the
    watch (None: never), with Triton itself when ``triton_dies_too``, just before the launcher
    looks at the stubs: (what it restarted Triton for, seconds into the watch). The first
    restart stops the watch, unless ``watch_on_s``: then it brings a new, healthy Triton, and
    the watch goes on until then."""
    handler = type("Handler", (Infer,), {"hold_s": hold_s, "answer": answer})
    server = serve(handler)
    settings = ServeSettings(
        tmp_path,
        ["m"],
        state_dir=tmp_path,
        probe_interval_s=0.1,
        probe_timeout_s=30.0,
        triton_http_port=server.server_port,
    )
    launcher = Launcher(settings)

    def new_triton():
        attributes = {
            "process": Process(),
            "loopback": "127.0.0.1",
            "http_port": server.server_port,
        }
        return type("Triton", (), attributes)()

    launcher.triton = new_triton()
    started = time.monotonic()
    restarts: list[tuple[str, float]] = []

    def dead_stubs():
        dead = dead_after_s is not None and time.monotonic() - started > dead_after_s
        dead = dead and not restarts
        if dead and triton_dies_too:
            launcher.triton.process.returncode = -9  # type: ignore[union-attr]
        return {4242: "m"} if dead else {}

    def bring_triton_back(cause: str, detail: str) -> bool:
        restarts.append((cause, time.monotonic() - started))
        if watch_on_s is None:
            launcher.stopping = True
            return False
        handler.answer = (200, b"{}")
        launcher.triton = new_triton()
        return True

    launcher.dead_stubs = dead_stubs  # type: ignore[method-assign]
    launcher.bring_triton_back = bring_triton_back  # type: ignore[method-assign]
    watcher = threading.Thread(target=launcher.watch, daemon=True)
    watcher.start()
    if watch_on_s is not None:
        time.sleep(watch_on_s)
        launcher.stopping = True
    watcher.join(10)
    alive = watcher.is_alive()
    launcher.stopping = True
    server.shutdown()
    assert not alive, "the watch loop ended"
    return restarts


def test_a_stub_that_dies_while_a_probe_waits_is_seen_at_the_next_interval(tmp_path):
    """A probe queued behind long forwards can wait its whole timeout (30 s here): the stub's
    death is seen meanwhile, not after it."""
    restarts = watched(tmp_path, hold_s=30.0, answer=(200, b"{}"), dead_after_s=0.5)
    assert len(restarts) == 1
    cause, seconds = restarts[0]
    assert cause == "stub_died" and seconds < 5


def test_a_probe_that_finds_the_model_not_healthy_restarts_triton(tmp_path):
    not_healthy = b'{"error":"Stub process \'m_0_0\' is not healthy."}'
    restarts = watched(tmp_path, hold_s=0.2, answer=(500, not_healthy), dead_after_s=None)
    assert [cause for cause, _ in restarts] == ["probe_failed"]


def test_a_triton_that_dies_with_its_stubs_is_restarted_for_exiting(tmp_path):
    """Killed Triton's stubs are gone from its children at once: that is Triton exiting, not a
    dead stub, even when the launcher looks at the stubs first."""
    restarts = watched(tmp_path, 0.0, (200, b"{}"), dead_after_s=0.3, triton_dies_too=True)
    assert [cause for cause, _ in restarts] == ["exited"]


def test_what_a_probe_finds_on_a_triton_restarted_meanwhile_is_dropped(tmp_path):
    """A probe sent before Triton was restarted (for a dead stub) answers "not healthy" after
    the restart: that is the old server's answer, not the new one's, and restarts nothing."""
    not_healthy = b'{"error":"Stub process \'m_0_0\' is not healthy."}'
    restarts = watched(
        tmp_path, hold_s=1.0, answer=(500, not_healthy), dead_after_s=0.3, watch_on_s=2.5
    )
    assert [cause for cause, _ in restarts] == ["stub_died"]
