"""Fronts per GPU by default: from the cores the server will have."""

from __future__ import annotations

import argparse

import pytest

from builder.cores import default_fronts, fronts_for, quota_cores
from builder.spec import BuildError, BuildSpec, add_cli_args, from_cli_args


@pytest.mark.parametrize(("cores", "fronts"), [(1, 1), (2, 2), (4, 3), (16, 13), (64, 16)])
def test_fronts_take_most_of_the_cores_per_gpu_at_least_one(cores, fronts):
    assert fronts_for(cores) == fronts


def test_a_node_of_8_gpus_and_64_cores_gets_its_fronts_per_gpu(monkeypatch):
    import builder.cores as cores

    monkeypatch.setattr(cores, "visible_gpus", lambda: 8)
    assert cores.default_fronts(True, 64, None, 1) == 6  # 8 cores a GPU
    assert cores.default_fronts(True, 64, (0, 1), 1) == 16  # two of them: 32 cores each, capped


def test_the_default_splits_only_on_a_gpu_and_never_beside_several_instances():
    assert default_fronts(False, 16, None, 1) == 0  # the CPU engine takes the cores
    assert default_fronts(True, 16, (0,), 1) == 13
    assert default_fronts(True, 16, (0, 1), 1) == 6  # per GPU
    assert default_fronts(True, 16, (0,), 2) == 0  # instances each with their own queue


@pytest.mark.parametrize(
    ("v2", "v1", "cores"),
    [("200000 100000\n", None, 2.0), ("max 100000\n", None, None), (None, ("150000", "100000"), 1.5),
     (None, ("-1", "100000"), None), (None, None, None)],
)  # fmt: skip
def test_a_containers_cpu_limit_is_read_from_its_cgroup(tmp_path, v2, v1, cores):
    if v2 is not None:
        (tmp_path / "cpu.max").write_text(v2)
    if v1 is not None:
        (tmp_path / "cpu").mkdir()
        (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(v1[0])
        (tmp_path / "cpu" / "cpu.cfs_period_us").write_text(v1[1])
    assert quota_cores(tmp_path) == cores


def test_the_command_line_takes_auto_or_a_count():
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    assert from_cli_args(parser.parse_args([])).fronts is None
    assert from_cli_args(parser.parse_args(["--fronts", "auto"])).fronts is None
    spec = from_cli_args(parser.parse_args(["--fronts", "3", "--cores", "12"])).validate()
    assert (spec.fronts, spec.cores) == (3, 12)
    with pytest.raises(BuildError, match="--cores"):
        BuildSpec(cores=0).validate()
