"""Cost tables: the seconds one forward of B rows at padded length T takes, where the figures
come from, and the layout the forwards run on. The simulator runs on them and the emulated
engine of bench repositories waits their time; no command line, no server.

- ``table:a100``, ``table:a30``: a rule fitted to NVIDIA's published TensorRT BERT-base FP16
  latencies, scaled to MiniLM-L6 (derived, not measured), on a default TensorRT build's layout;
- ``table:FILE``: forward times measured on a GPU by ``builder.gpu_check --engine torch``
  (``builder.cost_table_file``), on the layout they were measured on;
- ``manifest:DIR``: the forward times a built model's calibration measured, on its own layout;
- synthetic tables (``linear_table``) for the simulator's sweeps and tests.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from bench.errors import BenchError
from bench.paths import GPU_TABLES, LENGTHS
from python_backend.common.cost_models import MeasuredCost, cost_model_from_dict
from python_backend.common.manifest import load_manifest
from python_backend.engines.base import BucketLayout

# -- cost tables --------------------------------------------------------------------------------

# NVIDIA's published TensorRT BERT-base FP16 latencies (demo/BERT/README.md in NVIDIA/TensorRT,
# "Inference performance", average ms; the times leave out host-device copies), by GPU:
# {sequence length: {batch size: ms}}
PUBLISHED_BERT_BASE_FP16_MS: dict[str, dict[int, dict[int, float]]] = {
    "a100": {
        128: {1: 0.67, 2: 0.83, 4: 1.02, 8: 1.38, 12: 1.87, 16: 2.18, 24: 3.34, 32: 4.10,
              64: 8.05, 128: 16.14},
        384: {1: 1.31, 2: 1.64, 4: 2.31, 8: 3.62, 12: 5.03, 16: 6.72, 24: 9.79, 32: 13.51,
              64: 26.11, 128: 51.26},
    },
    "a30": {
        128: {1: 0.89, 2: 1.13, 4: 1.54, 8: 2.50, 12: 3.55, 16: 4.44, 24: 6.86, 32: 8.63,
              64: 17.17, 128: 33.58},
        384: {1: 1.70, 2: 2.36, 4: 3.87, 8: 7.53, 12: 10.58, 16: 14.48, 24: 21.17, 32: 28.00,
              64: 54.32, 128: 107.15},
    },
}  # fmt: skip

# BERT-base (12 layers, hidden 768, 12 heads) to the served MiniLM-L6 (6 layers, hidden 384, 12
# heads): the per-token work of projections and feed-forward scales with layers x hidden^2, the
# attention work with layers x hidden (times T), the fixed cost of a forward (kernel launches)
# with layers only. The fixed cost is never scaled by length or width.
SCALE_TO_MINILM = {
    "fixed": 6 / 12,
    "per_token": (6 / 12) * (384 / 768) ** 2,
    "attention": (6 / 12) * (384 / 768),
}


@dataclass(frozen=True)
class GpuRule:
    """t(B, T) = fixed + B*T*per_token + B*T^2*attention, in milliseconds."""

    fixed_ms: float
    per_token_ms: float
    attention_ms: float

    def ms(self, num_rows: int, padded_length: int) -> float:
        bt = num_rows * padded_length
        return self.fixed_ms + bt * self.per_token_ms + bt * padded_length * self.attention_ms


def fit_gpu_rule(table: dict[int, dict[int, float]]) -> tuple[GpuRule, float]:
    """Least squares on relative error over every published point; returns the rule and its
    worst relative error on those points."""
    rows, targets = [], []
    for length, by_batch in table.items():
        for batch, ms in by_batch.items():
            rows.append([1.0, batch * length, batch * length * length])
            targets.append(ms)
    a, y = np.asarray(rows), np.asarray(targets)
    weights = 1.0 / y
    params, *_ = np.linalg.lstsq(a * weights[:, None], y * weights, rcond=None)
    params = np.maximum(params, 0.0)
    rule = GpuRule(*map(float, params))
    worst = float(np.max(np.abs(a @ params - y) / y))
    return rule, worst


@dataclass(frozen=True)
class CostTable:
    """Seconds of one forward of B rows at padded length T, and where the figures come from."""

    name: str
    source: str
    seconds: Callable[[int, int], float]
    fixed_tokens: float  # one forward's fixed cost, in tokens of this table: what the DP trades
    # the buckets and caps forwards run with: a built model's own, or the layout a default build
    # of the engine the table stands for would have (the simulator never plans a forward the
    # server could not run)
    layout: BucketLayout
    version_dir: Path | None = None  # the built model a measured table comes from


@functools.cache
def tensorrt_layout() -> BucketLayout:
    """The layout a default TensorRT build chooses on the bench corpus: its bucket count,
    alignment, token budget, max batch and captured sizes (``builder.build``'s defaults)."""
    from builder.buckets import bucket_rows, choose_buckets
    from builder.build import DEFAULT_ALIGN, DEFAULT_TOKEN_BUDGET
    from builder.spec import BuildSpec

    spec, max_length = BuildSpec(), 256  # MiniLM's limit
    lengths = choose_buckets(
        read_lengths(LENGTHS), spec.num_buckets, max_length, DEFAULT_ALIGN["gpu"]
    )
    buckets = bucket_rows(
        lengths, DEFAULT_TOKEN_BUDGET["gpu"], spec.max_batch, batch_multiple=8, capture=True
    )
    return BucketLayout(tuple(buckets), max_length, spec.max_batch, None)


def gpu_table(name: str) -> CostTable:
    if name not in PUBLISHED_BERT_BASE_FP16_MS:
        raise BenchError(f"no GPU table {name!r}; known: {', '.join(PUBLISHED_BERT_BASE_FP16_MS)}")
    bert, worst = fit_gpu_rule(PUBLISHED_BERT_BASE_FP16_MS[name])
    rule = GpuRule(
        bert.fixed_ms * SCALE_TO_MINILM["fixed"],
        bert.per_token_ms * SCALE_TO_MINILM["per_token"],
        bert.attention_ms * SCALE_TO_MINILM["attention"],
    )
    per_token_at_64 = rule.per_token_ms + 64 * rule.attention_ms
    return CostTable(
        name=f"table:{name}",
        source=(
            f"{name.upper()} BERT-base FP16, NVIDIA TensorRT demo/BERT README (fit worst error "
            f"{worst:.0%}), scaled to MiniLM-L6: fixed {rule.fixed_ms:.3f} ms, "
            f"{rule.per_token_ms * 1e3:.3f} us/token, {rule.attention_ms * 1e6:.3f} ns/token^2"
        ),
        seconds=lambda b, t: rule.ms(b, t) / 1e3,
        fixed_tokens=rule.fixed_ms / per_token_at_64,
        layout=tensorrt_layout(),
    )


def file_table(path: Path) -> CostTable:
    """The forward times a cost table file holds (measured where and when it says)."""
    from builder.cost_table_file import CostTableFileError, read_cost_table_file

    try:
        measured = read_cost_table_file(path)
    except CostTableFileError as err:
        raise BenchError(str(err)) from None
    table = measured.table
    return CostTable(
        name=f"table:{path}",
        source=(
            f"measured on {measured.device} on {measured.date} ({measured.engine}; "
            f"{measured.model}): `{measured.command}`"
        ),
        seconds=lambda b, t: table.time_us(b, t) / 1e6,
        fixed_tokens=measured.fit.overhead_tokens,
        layout=BucketLayout(
            measured.buckets, measured.buckets[-1].length, measured.max_batch, None
        ),
    )


def report_gpu_tables(measured: Path = GPU_TABLES) -> list[tuple[str, CostTable]]:
    """The GPU tables a report shows, by a short label: the derived ones, then every table
    measured on a GPU and committed under ``measured`` (its file name is its label)."""
    tables = [(name, gpu_table(name)) for name in sorted(PUBLISHED_BERT_BASE_FP16_MS)]
    files = sorted(measured.glob("*.json")) if measured.is_dir() else []
    return tables + [(path.stem, file_table(path)) for path in files]


def manifest_table(version_dir: Path) -> CostTable:
    """The forward times a built model's calibration measured (``calibration.table``)."""
    manifest = load_manifest(version_dir)
    raw = manifest.calibration.get("table")
    if not raw:
        raise BenchError(f"{version_dir}: the model was built without calibration")
    table = cost_model_from_dict(raw)
    assert isinstance(table, MeasuredCost)
    fit = manifest.calibration.get("fit", {})
    return CostTable(
        name=f"manifest:{version_dir}",
        source=f"the calibration of {version_dir} (measured on this machine)",
        seconds=lambda b, t: table.time_us(b, t) / 1e6,
        fixed_tokens=float(fit.get("overhead_tokens", 0.0)),
        layout=BucketLayout.from_manifest(manifest),
        version_dir=version_dir,
    )


def cost_table(spec: str) -> CostTable:
    """A table by name (the module's docstring); ``SPEC*F``: that table, every forward F times
    as long."""
    spec, _, factor = spec.partition("*")
    if factor:
        return scaled_table(cost_table(spec), float(factor))
    kind, _, value = spec.partition(":")
    if kind == "table":
        if value in PUBLISHED_BERT_BASE_FP16_MS or not Path(value).suffix:
            return gpu_table(value)
        return file_table(Path(value))
    if kind == "manifest":
        path = Path(value)
        return manifest_table(path / "1" if (path / "1").is_dir() else path)
    raise BenchError(f"--cost takes manifest:DIR, table:NAME or table:FILE, got {spec!r}")


def linear_table(
    fixed_s: float, per_token_s: float, name: str, layout: BucketLayout | None = None
) -> CostTable:
    """A synthetic table: a fixed cost per forward plus a cost per padded token, on ``layout``
    (default: a TensorRT build's, since the fixed costs it stands for are a GPU's)."""

    def seconds(num_rows: int, padded_length: int) -> float:
        return fixed_s + num_rows * padded_length * per_token_s

    fixed_tokens = fixed_s / per_token_s if per_token_s else 0.0
    return CostTable(name, "synthetic", seconds, fixed_tokens, layout or tensorrt_layout())


def scaled_table(table: CostTable, factor: float) -> CostTable:
    """The same table with every forward ``factor`` times as long."""
    return replace(
        table,
        source=f"{table.source}, x{factor:.2f}",
        seconds=lambda rows, length: table.seconds(rows, length) * factor,
    )


def read_lengths(path: Path) -> list[int]:
    try:
        lengths = [int(x) for x in path.read_text().split()]
    except (OSError, ValueError) as err:
        raise BenchError(f"--lengths {path}: {err}") from None
    if not lengths or min(lengths) < 1:
        raise BenchError(f"--lengths {path}: one positive token count a line")
    return lengths
