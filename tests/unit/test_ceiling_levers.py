"""The ceiling's levers are bench-only variants of the emulated model: each lever names what it
changes, and an unknown one is refused with the known ones named."""

from __future__ import annotations

import pytest

from bench.ceiling_levers import lever_model
from bench.emulated_engine import EMULATED_MODEL_PY
from bench.errors import BenchError


def test_instances_change_the_count_and_nothing_else():
    assert lever_model("instances:3") == (EMULATED_MODEL_PY, 3)


@pytest.mark.parametrize(
    ("lever", "expected"),
    [
        ("switch-interval:0.5", "sys.setswitchinterval(0.0005)"),
        ("no-cancel-check-at-admit", "pull('no-cancel-check-at-admit')"),
        ("no-cancel-check", "pull('no-cancel-check')"),
    ],
)
def test_each_other_lever_is_one_stub_of_the_emulated_model(lever, expected):
    model_py, count = lever_model(lever)
    assert count == 1 and expected in model_py
    compile(model_py, "model.py", "exec")  # Triton's stub must be able to load it
    assert "EmulatedEngineModel as TritonPythonModel" in model_py


@pytest.mark.parametrize("lever", ["instances:0", "instances:x", "switch-interval:", "faster"])
def test_an_unknown_lever_is_refused_naming_the_known_ones(lever):
    with pytest.raises(BenchError, match="known: instances:N, switch-interval:MS"):
        lever_model(lever)


def test_pulling_a_patch_lever_changes_the_scheduler_it_names(monkeypatch):
    from bench.levers import pull
    from python_backend.scheduler import Scheduler

    monkeypatch.setattr(Scheduler, "admit", Scheduler.admit)  # restored after the test
    monkeypatch.setattr(Scheduler, "_without_unwanted", Scheduler._without_unwanted)
    admit, without = Scheduler.admit, Scheduler._without_unwanted
    pull("no-cancel-check-at-admit")
    assert Scheduler.admit is not admit and Scheduler._without_unwanted is without
    pull("no-cancel-check")
    assert Scheduler._without_unwanted is not without
