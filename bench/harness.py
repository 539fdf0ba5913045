"""The benchmarks' harness: no command lines and no report prose, only what they share.

- bench repositories: ``build_repository`` (the bench model and its variants over one set of
  engine files) and ``add_emulated_variant`` (a variant over the emulated engine);
- measuring: ``measure`` and ``warm_up``, the only callers of perf_analyzer here;
- the loopback door and the OpenAI adapter, started beside a bench server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.emulated_engine import EMULATED_MODEL_PY, TABLE_FILE
from bench.errors import BenchError
from bench.paths import INPUT_DATA, SAMPLE
from builder.build import build
from builder.spec import BuildError, BuildSpec
from builder.triton_config import add_model_variant, add_split_variant, write_config
from tools.front_door import FrontDoorSettings
from tools.helpers import HelperProcess, body_check, openai_adapter
from tools.perf_analyzer import PerfPoint, run_perf_analyzer
from tools.triton_server import TritonServer, free_port

MODELS = ("planner_dp", "planner_per_bucket", "dynamic_batcher")
PEER = "dynamic_batcher"
PEER_MODEL_PY = '''"""The dynamic-batching peer (bench only): see bench/dynamic_batching_model.py."""

from bench.dynamic_batching_model import TritonPythonModel

__all__ = ["TritonPythonModel"]
'''
PEER_QUEUE_DELAY_US = 2000
OPENAI_MODEL = "planner_dp"  # the model the adapter serves in the benchmarks


def build_repository(target: Path, rebuild: bool) -> tuple[Path, list[str]]:
    """The three models over one set of engine files; returns (repository, the build's summary)."""
    version = target / "planner_dp" / "1"
    summary = target / "build-summary.txt"
    if rebuild or not (version / "manifest.json").is_file() or not summary.is_file():
        spec = BuildSpec(
            name="planner_dp", repository=target, texts_file=SAMPLE, engine="onnxruntime"
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


def request_rows(version_dir: Path) -> list[np.ndarray]:
    from python_backend.common.manifest import load_manifest
    from python_backend.common.tokenization import TextTokenizer

    manifest = load_manifest(version_dir)
    tokenizer = TextTokenizer(version_dir / manifest.tokenizer_file, manifest.max_length)
    texts = [d["TEXT"]["content"][0] for d in json.loads(INPUT_DATA.read_text())["data"]]
    return tokenizer.encode(texts, truncate=True)


def token_id_input_data(version_dir: Path, path: Path) -> Path:
    """perf_analyzer's requests as a client that tokenizes its own texts sends them: the bench's
    texts as INPUT_IDS, one row each, the rows the model makes of them (``request_rows``)."""
    data = [
        {"INPUT_IDS": {"content": row.tolist(), "shape": [len(row)]}}
        for row in request_rows(version_dir)
    ]
    path.write_text(json.dumps({"data": data}))
    return path


@dataclass(frozen=True)
class LoadPoint:
    """One model measured at one concurrency: perf_analyzer's point, and whether its windows
    settled (an unsettled one is marked in the tables)."""

    concurrency: int
    point: PerfPoint
    stable: bool


def measure(
    model: str,
    url: str,
    concurrency: int,
    tmp: Path,
    ms: int,
    rate: float | None = None,
    rows_per_request: int = 1,
    input_data: Path = INPUT_DATA,
) -> tuple[PerfPoint, bool]:
    """One point: stable within 30% over 3 windows if the shared machine allows, else the last
    windows as they were (marked unstable in the table). ``input_data``: the requests, real
    text by default (``token_id_input_data``: the same as token ids)."""
    csv_path = tmp / f"{model}-{concurrency}-{rate}.csv"
    # (windows at most, stability wanted): strict first; the shared machine may not allow it
    for max_trials, stability in ((6, 30), (3, 1000)):
        try:
            row, _ = run_perf_analyzer(
                model,
                url,
                input_data,
                concurrency,
                csv_path,
                measurement_ms=ms,
                request_rate=rate,
                max_trials=max_trials,
                stability_percent=stability,
                rows_per_request=rows_per_request,
            )
            return row, stability < 1000
        except RuntimeError as err:
            if "stable" not in str(err) or stability >= 1000:
                raise
    raise AssertionError("unreachable: the last attempt accepts any window")


def print_point(label: str, point: PerfPoint) -> None:
    print(
        f"{label} {point.rows_per_s:8.1f} rows/s  p50 {point.p50_ms:8.1f}  "
        f"p99 {point.p99_ms:8.1f} ms",
        flush=True,
    )


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


def start_adapter(server: TritonServer, port: int, log: Path) -> HelperProcess:
    """The OpenAI adapter for OPENAI_MODEL on loopback ``port``, as the launcher starts it."""
    return openai_adapter(f"127.0.0.1:{server.grpc_port}", port, [OPENAI_MODEL], log).start()


def start_body_check(server: TritonServer, ports: tuple[int, int], log: Path) -> HelperProcess:
    """The body check on loopback (HTTP, gRPC) ``ports``, as the launcher starts it."""
    triton = (f"127.0.0.1:{server.http_port}", f"127.0.0.1:{server.grpc_port}")
    return body_check(*triton, *ports, FrontDoorSettings.max_body_size, log).start()


def loopback_door(
    server: TritonServer, openai_port: int, check_ports: tuple[int, int] | None = None
) -> FrontDoorSettings:
    """A front door on loopback ports of its own, in front of ``server`` and an adapter; its
    inference calls go to a body check on ``check_ports`` (HTTP, gRPC), or, with None, straight
    to Triton: the door as it was before the check, for a comparison."""
    http, grpc = check_ports or (server.http_port, server.grpc_port)
    return FrontDoorSettings(
        triton_http_address=f"127.0.0.1:{server.http_port}",
        triton_grpc_address=f"127.0.0.1:{server.grpc_port}",
        triton_metrics_address=f"127.0.0.1:{server.metrics_port}",
        openai_address=f"127.0.0.1:{openai_port}",
        check_http_address=f"127.0.0.1:{http}",
        check_grpc_address=f"127.0.0.1:{grpc}",
        public_address="127.0.0.1",
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
    )


def add_emulated_variant(
    repository: Path,
    source: str,
    name: str,
    table: str,
    instances: int | None = None,
    parameters: dict[str, str] | None = None,
) -> None:
    """A variant of ``source`` served over the emulated engine with ``table`` (``zero``, or a
    cost table such as ``table:a30``): its own model.py and emulated_table.txt, never the
    builder's. ``instances``: the instance count, where it differs from the source's;
    ``parameters``: settings laid over the source's."""
    config = add_model_variant(repository, source, name, parameters, model_py=EMULATED_MODEL_PY)
    if instances is not None:
        config.instance_group[0].count = instances
        write_config(config, repository / name)
    (repository / name / "1" / TABLE_FILE).write_text(table + "\n")


def add_emulated_split_variant(
    repository: Path,
    source: str,
    name: str,
    table: str,
    fronts: int,
    parameters: dict[str, str] | None = None,
) -> None:
    """``source`` in the split layout (``fronts`` fronts and ``name``_owner), the owner over the
    emulated engine with ``table`` (the fronts decode as the project's own)."""
    add_split_variant(repository, source, name, fronts, parameters, model_py=EMULATED_MODEL_PY)
    (repository / name / "1" / TABLE_FILE).write_text(table + "\n")
