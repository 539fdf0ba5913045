"""The one reader of Prometheus text in the project: Triton's /metrics as samples, with labels
parsed, for the benchmarks and the end-to-end tests alike."""

from __future__ import annotations

import re
import urllib.request
from collections import defaultdict
from dataclasses import dataclass

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_samples(text: str) -> list[Sample]:
    """Every sample line of Prometheus text exposition (comments and blank lines skipped)."""
    out = []
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if not match or line.startswith("#"):
            continue
        name, labels, value = match.groups()
        out.append(Sample(name, dict(_LABEL.findall(labels or "")), float(value)))
    return out


def scrape(url: str, timeout_s: float = 5.0) -> list[Sample]:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return parse_samples(response.read().decode())


def samples_of(samples: list[Sample], name: str, **labels: str) -> list[Sample]:
    """The samples of one metric whose labels include ``labels``."""
    return [
        s
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def sum_by(samples: list[Sample], label: str) -> dict[str, float]:
    """Sample values added up per value of ``label`` ("?" where a sample lacks it)."""
    totals: dict[str, float] = defaultdict(float)
    for s in samples:
        totals[s.labels.get(label, "?")] += s.value
    return dict(totals)
