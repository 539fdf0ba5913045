"""bench.fronts' reading of a process's context switches, from /proc."""

from __future__ import annotations

import os
import threading

from bench.fronts import FLOOR, context_switches, label


def test_context_switches_count_every_thread_of_a_process():
    before = context_switches(os.getpid())
    handed = threading.Event()
    done = threading.Event()

    def ping_pong() -> None:  # each wait blocks this thread: a voluntary switch each time
        for _ in range(50):
            handed.wait()
            handed.clear()
        done.set()

    thread = threading.Thread(target=ping_pong)
    thread.start()
    while not done.is_set():
        handed.set()
        done.wait(0.001)
    thread.join()
    assert context_switches(os.getpid()) - before >= 50


def test_a_process_that_is_gone_has_no_switches_to_read():
    assert context_switches(2**22 + 12345) == 0  # above Linux's largest pid


def test_the_floor_is_labelled_as_no_layout_of_the_project():
    assert "floor" in label(FLOOR) and label(1) == "1 front" and label(0) == "one process"


def test_a_variant_whose_clients_send_token_ids_says_so():
    from bench.fronts import variant_label

    assert variant_label((1, False, "this checkout", "text"), compared=False) == "1 front"
    assert variant_label((1, True, "this checkout", "ids"), False) == "1 front, pinned, token ids"
    assert variant_label((0, False, "baseline", "ids"), True) == "one process, token ids, baseline"
