"""bench.serving's layouts: their names on the command line and in the tables, and its reading
of a process's context switches, from /proc."""

from __future__ import annotations

import argparse
import os
import threading

import pytest

from bench.serving import context_switches, label, parse_layouts, variant_label


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
    assert "floor" in label("floor") and label("fronts:1") == "1 front"
    assert label("one") == "one process" and label("fronts:2") == "2 fronts"
    assert label("instances:2") == "2 instances"


def test_layouts_are_named_one_instances_fronts_or_floor():
    assert parse_layouts("one,instances:2,fronts:1,floor") == [
        "one", "instances:2", "fronts:1", "floor"
    ]  # fmt: skip
    for bad in ("", "two", "fronts:0", "fronts", "instances:x", "one,fronts:-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_layouts(bad)


def test_a_variant_whose_clients_send_token_ids_says_so():
    assert variant_label(("fronts:1", False, "this checkout", "text"), compared=False) == "1 front"
    assert (
        variant_label(("fronts:1", True, "this checkout", "ids"), False)
        == "1 front, pinned, token ids"
    )
    assert (
        variant_label(("one", False, "baseline", "ids"), True) == "one process, token ids, baseline"
    )
