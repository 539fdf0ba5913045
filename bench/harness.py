"""The benchmarks' harness: no command lines and no report prose, only what they share.

- bench repositories: ``build_repository`` (the bench model and its variants over one set of
  engine files) and ``add_variant`` (one more, in a layout, over the emulated engine or not);
- measuring: ``measure`` and ``warm_up``, the only callers of perf_analyzer here, and
  ``alternating``, the order every side-by-side comparison measures its variants in.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np

from bench.emulated_engine import EMULATED_MODEL_PY, TABLE_FILE
from bench.errors import BenchError
from bench.paths import INPUT_DATA, SAMPLE
from builder.build import build
from builder.spec import BuildError, BuildSpec
from builder.triton_config import add_model_variant, add_split_variant, write_config
from python_backend.common.contract import OWNER_SUFFIX
from tools.perf_analyzer import PerfPoint, run_perf_analyzer
from tools.triton_server import TritonServer

MODELS = ("planner_dp", "planner_per_bucket", "dynamic_batcher")
PEER = "dynamic_batcher"
PEER_MODEL_PY = '''"""The dynamic-batching peer (bench only): see bench/dynamic_batching_model.py."""

from bench.dynamic_batching_model import TritonPythonModel

__all__ = ["TritonPythonModel"]
'''
PEER_QUEUE_DELAY_US = 2000
V = TypeVar("V")


def build_repository(target: Path, rebuild: bool) -> tuple[Path, list[str]]:
    """The three models over one set of engine files; returns (repository, the build's summary)."""
    version = target / "planner_dp" / "1"
    summary = target / "build-summary.txt"
    if rebuild or not (version / "manifest.json").is_file() or not summary.is_file():
        spec = BuildSpec(
            name="planner_dp",
            repository=target,
            texts_file=SAMPLE,
            engine="onnxruntime",
            force=rebuild or not summary.is_file(),  # the summary needs the sample's figures
        )
        try:
            result = build(spec)
        except BuildError as err:
            raise BenchError(f"the bench model failed to build: {err}") from None
        summary.write_text("\n".join(result.summary()) + "\n")
    add_model_variant(target, "planner_dp", "planner_per_bucket", {"planner": "per_bucket"})
    peer = add_model_variant(target, "planner_dp", PEER, model_py=PEER_MODEL_PY)
    peer.dynamic_batching.max_queue_delay_microseconds = PEER_QUEUE_DELAY_US
    write_config(peer, target / PEER)
    return target, summary.read_text().splitlines()


def request_texts() -> list[str]:
    """The bench's requests' texts (bench/data/perf_input.json), one row each."""
    return [d["TEXT"]["content"][0] for d in json.loads(INPUT_DATA.read_text())["data"]]


def request_rows(version_dir: Path) -> list[np.ndarray]:
    from python_backend.common.manifest import load_manifest
    from python_backend.common.tokenization import TextTokenizer

    manifest = load_manifest(version_dir)
    tokenizer = TextTokenizer(version_dir / manifest.tokenizer_file, manifest.max_length)
    return tokenizer.encode(request_texts(), truncate=True)


def token_id_input_data(version_dir: Path, path: Path) -> Path:
    """perf_analyzer's requests as a client that tokenizes its own texts sends them: the bench's
    texts as INPUT_IDS, one row each, the rows the model makes of them (``request_rows``)."""
    data = [
        {"INPUT_IDS": {"content": row.tolist(), "shape": [len(row)]}}
        for row in request_rows(version_dir)
    ]
    path.write_text(json.dumps({"data": data}))
    return path


class MachineLoad:
    """How loaded the machine was, for a report beside its ratios: the share of its CPU time
    busy in the second before the run started anything (other processes' load), and the share
    the host took from this machine while the run went on (steal, from /proc/stat; 0 on bare
    metal)."""

    def __init__(self, sample_s: float = 1.0) -> None:
        before = cpu_times()
        time.sleep(sample_s)
        self.start = cpu_times()
        spent = [b - a for a, b in zip(before, self.start, strict=True)]
        self.busy_before = 1 - (spent[3] + spent[4]) / max(1, sum(spent))  # idle, iowait

    def describe(self) -> str:
        end = cpu_times()
        spent = [b - a for a, b in zip(self.start, end, strict=True)]
        steal = spent[7] / max(1, sum(spent)) if len(spent) > 7 else 0.0
        return (
            f"The machine was {self.busy_before:.0%} busy in the second before the run; the "
            f"host took {steal:.1%} of its CPU time during it."
        )


def cpu_times() -> list[int]:
    """The machine's CPU time in ticks by kind (user, nice, system, idle, iowait, irq, softirq,
    steal, ...): /proc/stat's first line."""
    with open("/proc/stat") as stat:
        return [int(x) for x in stat.readline().split()[1:]]


def alternating(variants: Sequence[V], rounds: int) -> Iterator[tuple[int, V]]:
    """(round, variant): every variant once a round, in an order that flips every round, so
    that the shared machine's drift falls on all alike."""
    for r in range(rounds):
        yield from ((r, v) for v in (variants if r % 2 == 0 else variants[::-1]))


def measure(
    model: str,
    url: str,
    concurrency: int,
    tmp: Path,
    ms: int,
    rate: float | None = None,
    rows_per_request: int = 1,
    input_data: Path = INPUT_DATA,
) -> tuple[PerfPoint, str]:
    """One point: stable within 30% over 3 windows if the shared machine allows, else the last
    windows as they were, noted "unstable" (the note is "" otherwise). A window in which no
    request finished (a slow peer at high concurrency) is doubled, up to 4x, and noted.
    ``input_data``: the requests, real text by default (``token_id_input_data``: the same as
    token ids)."""
    csv_path = tmp / f"{model}-{concurrency}-{rate}.csv"
    window = ms
    # (windows at most, stability wanted): strict first; the shared machine may not allow it
    attempts = [(6, 30), (3, 1000)]
    while attempts:
        max_trials, stability = attempts[0]
        try:
            row, _ = run_perf_analyzer(
                model,
                url,
                input_data,
                concurrency,
                csv_path,
                measurement_ms=window,
                request_rate=rate,
                max_trials=max_trials,
                stability_percent=stability,
                rows_per_request=rows_per_request,
            )
            notes = ["unstable"] * (stability >= 1000) + [f"{window // ms}x window"] * (window > ms)
            return row, ", ".join(notes)
        except RuntimeError as err:
            if "No valid requests" in str(err) and window < 4 * ms:
                window *= 2
            elif "stable" in str(err) and stability < 1000:
                attempts.pop(0)
            else:
                raise
    raise AssertionError("unreachable: the last attempt accepts any window")


def warm_up(server: TritonServer, tmp: Path, models, concurrency: int = 4) -> None:
    """First forwards allocate (ONNX Runtime, for each new shape): a short unmeasured run per
    model, at the concurrency that will be measured first when that is high."""
    for model in models:
        run_perf_analyzer(
            model,
            server.grpc_url,
            INPUT_DATA,
            concurrency,
            tmp / "w.csv",
            measurement_ms=1500,
            max_trials=3,
            stability_percent=1000,
        )


def add_variant(
    repository: Path,
    source: str,
    name: str,
    table: str | None,
    instances: int | None = None,
    fronts: int = 0,
    parameters: dict[str, str] | None = None,
) -> tuple[str, ...]:
    """A variant of ``source`` over its engine files; returns the models that serve it. Its
    forwards run on the emulated engine with ``table`` (``zero``, or a cost table such as
    ``table:a30``: its own model.py and emulated_table.txt, never the builder's), or, with None,
    on ``source``'s engine. ``fronts`` > 0: the split layout (``fronts`` fronts and
    ``name``_owner; the fronts decode as the project's own); else ``instances``, where given,
    is its instance count. ``parameters``: settings laid over the source's."""
    emulated = {} if table is None else {"model_py": EMULATED_MODEL_PY}
    if fronts:
        add_split_variant(repository, source, name, fronts, parameters, **emulated)
    else:
        config = add_model_variant(repository, source, name, parameters, **emulated)
        if instances is not None:
            config.instance_group[0].count = instances
            write_config(config, repository / name)
    if table is not None:
        (repository / name / "1" / TABLE_FILE).write_text(table + "\n")
    return (name, f"{name}{OWNER_SUFFIX}") if fronts else (name,)
