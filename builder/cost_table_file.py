"""A measured cost table as a file: what ``builder.gpu_check --engine torch`` writes on a GPU and
the simulator reads as ``table:FILE``.

It holds the forward times measured per bucket and batch size (a ``MeasuredCost``, in
token-units), their affine fit (whose overhead is the fixed cost of one forward, in tokens), the
layout the forwards ran on (buckets with their captured sizes, the row cap), and where the
figures come from: the device's name, the date, the engine, the model and the command.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from python_backend.common.cost_models import BucketAffineCost, MeasuredCost, cost_model_from_dict
from python_backend.common.manifest import Bucket, ManifestError, bucket_from_dict

TABLE_FORMAT = 1


class CostTableFileError(ValueError):
    """A table file that cannot be read (the message names the file and what is wrong)."""


@dataclass(frozen=True)
class CostTableFile:
    device: str  # the device the times were measured on, as the driver names it
    date: str  # ISO date of the measurement
    engine: str  # the engine and precision that ran the forwards, e.g. "torch fp16, CUDA graphs"
    model: str  # what was run: the architecture and its size
    command: str  # the command that measured it
    buckets: tuple[Bucket, ...]  # the layout the forwards ran on
    max_batch: int
    table: MeasuredCost  # median forward times, in token-units
    fit: BucketAffineCost  # their affine fit: overhead_tokens is one forward's fixed cost
    worst_relative_error: float  # of the fit over the measured points

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": TABLE_FORMAT,
            "device": self.device,
            "date": self.date,
            "engine": self.engine,
            "model": self.model,
            "command": self.command,
            "buckets": [asdict(b) for b in self.buckets],
            "max_batch": self.max_batch,
            "table": self.table.to_dict(),
            "fit": self.fit.to_dict(),
            "worst_relative_error": self.worst_relative_error,
        }

    def write(self, path: Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path


def read_cost_table_file(path: Path) -> CostTableFile:
    """The table ``path`` holds, or a CostTableFileError naming what is wrong."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        if data.get("format") != TABLE_FORMAT:
            raise ValueError(f"format {data.get('format')!r}; this reads {TABLE_FORMAT}")
        table = cost_model_from_dict(data["table"])
        fit = cost_model_from_dict(data["fit"])
        if not isinstance(table, MeasuredCost) or not isinstance(fit, BucketAffineCost):
            raise ValueError("'table' must be a measured table and 'fit' an affine fit")
        buckets = tuple(bucket_from_dict(b, i) for i, b in enumerate(data["buckets"]))
        if tuple(b.length for b in buckets) != table.lengths:
            raise ValueError("the buckets' lengths are not the table's")
        return CostTableFile(
            device=str(data["device"]),
            date=str(data["date"]),
            engine=str(data["engine"]),
            model=str(data["model"]),
            command=str(data["command"]),
            buckets=buckets,
            max_batch=int(data["max_batch"]),
            table=table,
            fit=fit,
            worst_relative_error=float(data["worst_relative_error"]),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ManifestError) as err:
        raise CostTableFileError(f"cost table {path}: {err}") from None
