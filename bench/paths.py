"""Where the benchmarks' files are: the repository root, the bench data and the report."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "data"
INPUT_DATA = DATA / "perf_input.json"  # perf_analyzer's requests: one real-text row each
SAMPLE = DATA / "sample_texts.txt"  # the bench model's length sample
LENGTHS = DATA / "request_lengths.txt"  # the corpus's token lengths (bench.make_data)
DOC = ROOT / "docs" / "PERFORMANCE.md"
# cost tables measured on GPUs (builder.gpu_check --engine torch --table-out ...), one per file
GPU_TABLES = ROOT / "docs" / "gpu_tables"
