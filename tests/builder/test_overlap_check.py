"""``python -m bench.overlap_check`` in its CPU form: it serves the closed loop both ways with no
error, and imports nothing the lent GPU machine lacks, so that a session lent one runs it as is."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.builder.test_torch_check import ABSENT_THERE, ROOT, RUN_AND_LIST_MODULES


def test_the_cpu_form_serves_both_ways_and_imports_only_what_the_gpu_machine_has():
    runner = RUN_AND_LIST_MODULES.replace("builder.gpu_check", "bench.overlap_check")
    done = subprocess.run(
        [sys.executable, "-c", runner, "--device", "cpu", "--clients", "16", "--seconds", "0.6",
         "--rounds", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rounds = re.findall(
        r"round (\d), overlap (on |off): +(\d+) rows/s, +([\d.]+) rows a forward, "
        r"scheduler thread +([\d.]+) us a row, (\d+) errors",
        done.stdout,
    )
    # alternating: off then on, then on then off
    assert [(r, o.strip()) for r, o, *_ in rounds] == [
        ("1", "off"), ("1", "on"), ("2", "on"), ("2", "off")
    ]  # fmt: skip
    for *_, rows_per_s, per_forward, scheduler_us, errors in rounds:
        assert float(rows_per_s) > 0 and float(per_forward) >= 1 and float(scheduler_us) > 0
        assert errors == "0"
    assert "overlap on / off:" in done.stdout and "FAIL" not in done.stdout
    modules = json.loads(done.stdout.rsplit("MODULES ", 1)[1])
    assert not set(ABSENT_THERE) & set(modules)


def test_the_closed_loop_sends_nothing_to_a_scheduler_that_is_stopping():
    """The feeder answers one request by sending the next; ``stop`` must not race it, or a
    request reaches the stopping scheduler and is refused (the check would report an error)."""
    import threading
    import time

    import numpy as np

    from bench.overlap_check import ClosedLoop
    from python_backend.common.contract import Reason, ServeError
    from python_backend.scheduling.records import Answer

    class Answering:
        """Answers each request a millisecond later, refuses any once stopping, as the
        scheduler does."""

        def __init__(self) -> None:
            self.accepting = True

        def submit(self, request) -> None:
            if not self.accepting:
                request.respond(ServeError(Reason.SHUTDOWN, "the server is shutting down"))
                return
            answer = Answer(np.zeros((1, 4), np.float32), np.ones(1, np.int32), 0.0, 0.0)
            threading.Timer(0.001, request.respond, [answer]).start()

        def stop(self) -> None:
            self.accepting = False
            time.sleep(0.05)  # what was sent in time is answered meanwhile

    class SlowToSend(ClosedLoop):
        def _send(self) -> None:
            if self.feeder.is_alive():
                time.sleep(0.002)  # a wide window between deciding to send and sending
            super()._send()

    for _ in range(5):
        loop = SlowToSend(Answering(), [np.arange(1, 5)], clients=8, rows_per_request=1)  # type: ignore[arg-type]
        time.sleep(0.03)
        loop.stop()
        assert loop.answered_rows > 0 and loop.errors == []
