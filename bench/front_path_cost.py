"""What a front's own Python costs for a one-row request, outside the server.

    python -m bench.front_path_cost [--rounds 3]

Times, on the bench's real request texts (bench/data/perf_input.json), each request one row:
- decoding a request as a front does (``RequestDecoder.decode``: parameters, the input's shape,
  its rows, tokenizing);
- tokenizing alone (the model's tokenizer, as the front calls it);
- building its answer (``answer_response``: one response with the output and token counts);
- scaling an output row to unit length (``unit_length``, what an embedding model's answer does).
Triton's objects are the unit tests' recording stand-in (``testkit.recording_pb_utils``), so the
figures are the project's Python alone: what the stub and Triton add is in ``bench.fronts``. The
best pass of each round, the calls alternating between rounds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.errors import reports_errors
from bench.harness import build_repository
from bench.paths import INPUT_DATA, ROOT
from testkit.recording_pb_utils import RecordingPbUtils, text_request


def _best_us(call: Callable[[Any], object], items: list[Any], passes: int = 3) -> float:
    best = float("inf")
    for _ in range(passes):
        started = time.perf_counter()
        for item in items:
            call(item)
        best = min(best, (time.perf_counter() - started) / len(items))
    return best * 1e6


@reports_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    repository, _ = build_repository(ROOT / "build" / "bench-repository", rebuild=False)
    pb = RecordingPbUtils()
    sys.modules["triton_python_backend_utils"] = pb  # type: ignore[assignment]
    from python_backend import triton_model
    from python_backend.decoding import unit_length
    from python_backend.engines.base import BucketLayout
    from python_backend.manifest import load_manifest
    from python_backend.scheduler import Answer
    from python_backend.settings import settings_from_parameters

    version = repository / "planner_dp" / "1"
    manifest = load_manifest(version)
    instance = triton_model.InstanceArgs("bench", "bench", version, 0, 64, {})
    decoder = triton_model.request_decoder(
        instance,
        manifest,
        settings_from_parameters({}, "bench"),
        BucketLayout.from_manifest(manifest).longest_row,
    )
    texts = [d["TEXT"]["content"][0] for d in json.loads(INPUT_DATA.read_text())["data"]]
    requests = [text_request(t) for t in texts]
    asked = decoder.decode(requests[0])
    outputs = np.random.default_rng(0).random((1, manifest.output_dim), np.float32)
    answer = Answer(outputs, np.array([len(asked.rows[0])], np.int32))
    calls: dict[str, tuple[Callable[[Any], object], list[Any]]] = {
        "decode (tokenizing included)": (decoder.decode, requests),
        "tokenize alone": (lambda t: decoder.tokenizer.encode([t], truncate=True), texts),
        "the answer": (
            lambda _: triton_model.answer_response(manifest.output_name, answer, asked),
            texts,
        ),
        "unit length": (lambda _: unit_length(outputs), texts),
    }
    timed: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(args.rounds):
        for name in calls if r % 2 == 0 else list(calls)[::-1]:
            call, items = calls[name]
            timed[name].append(_best_us(call, items))
    print(f"{len(texts)} one-row requests, best of 3 passes, {args.rounds} rounds:\n")
    print("| work | us per request (each round) |")
    print("|---|---|")
    for name, runs in timed.items():
        print(f"| {name} | {', '.join(f'{x:.1f}' for x in runs)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
