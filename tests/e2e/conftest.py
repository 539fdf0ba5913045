"""End-to-end fixtures: a model repository built by the builder, served by the real Triton server.

The server runs on free ports with its log in a file; when a test fails, the log's tail is added
to the report, so a server-side error is visible next to the client-side symptom.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from builder.triton_config import add_model_variant, add_split_variant
from python_backend.engines.faults import write_fault_spec
from testkit.samples import sample_texts_file
from tools.triton_server import TritonServer, free_port

pytest.importorskip("pytriton")
torch = pytest.importorskip("torch")

BUCKETS = (16, 32, 64, 128, 256)
# MiniLM whose every forward first waits this long without the CPU (a delay_ms fault)
SLOW, SLOW_FORWARD_MS = "minilm_slow", 1000
_LOGS: list[Path] = []


def build_repository(root: Path) -> Path:
    from builder.build import build
    from builder.spec import BuildSpec

    repository = root / "repository"
    texts = sample_texts_file(root)
    build(
        BuildSpec(
            name="minilm",
            repository=repository,
            engine="onnxruntime",
            buckets=BUCKETS,
            calibration_repeats=0,
            cost_model="linear",
            overhead_tokens=64,
            texts_file=texts,
            quiet=True,
        )
    )
    # the same model on the torch engine (FP32 on the CPU): served like any other engine
    build(
        BuildSpec(
            name="minilm_torch",
            repository=repository,
            engine="torch",
            buckets=BUCKETS,
            calibration_repeats=0,
            cost_model="linear",
            overhead_tokens=64,
            texts_file=texts,
            quiet=True,
        )
    )
    # small models built from configs with a fixed seed: a classifier with class names
    # (Triton's classification extension), a cross-encoder (/v1/rerank), and an encoder whose
    # forwards cost next to nothing (for the adapter's memory under large requests)
    from builder.build import default_model_dir
    from builder.tiny_models import save_tiny_decoder_reranker, save_tiny_model

    tokenizer = default_model_dir() / "tokenizer.json"
    for family, name in (
        ("classifier", "classifier"),
        ("reranker", "reranker"),
        ("embedding", "tiny_embedder"),
    ):
        build(
            BuildSpec(
                model_dir=save_tiny_model(family, root / f"tiny-{family}", tokenizer),
                name=name,
                repository=repository,
                engine="onnxruntime",
                buckets=(32, 64, 128),
                calibration_repeats=0,
                quiet=True,
            )
        )
    # a decoder reranker (Qwen3-Reranker's recipe on a tiny Qwen3 with a tokenizer of its own)
    build(
        BuildSpec(
            model_dir=save_tiny_decoder_reranker(root / "tiny-qwen3"),
            name="qwen3_reranker",
            family="decoder_reranker",
            repository=repository,
            engine="onnxruntime",
            buckets=(64, 128, 256),
            calibration_repeats=0,
            quiet=True,
        )
    )
    return repository


@pytest.fixture(scope="session")
def repository(tmp_path_factory) -> Path:
    """Built once for the whole run: the test processes of `make test` (pytest-xdist) share it,
    the first to need it builds it under a lock, the others wait and read it."""
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # each worker's base folder is inside the run's
    root = shared / "e2e-shared"
    with FileLock(shared / "e2e-shared.lock"):
        if not (root / "built").is_file():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            variants(build_repository(root))
            (root / "built").touch()
    return root / "repository"


def variants(repo: Path) -> None:
    """The built models' variants the tests serve."""
    # for the reliability tests: failures on purpose, a small queue
    add_model_variant(repo, "minilm", "minilm_faults")
    write_fault_spec(repo / "minilm_faults" / "1", "oom_above_tokens=1024,poison_token=29999")
    add_model_variant(repo, "minilm", "minilm_small_queue", {"max_queue_rows": "8"})
    # every forward a second long without using the CPU: what queues behind it waits
    add_model_variant(repo, "minilm", SLOW)
    write_fault_spec(repo / SLOW / "1", f"delay_ms={SLOW_FORWARD_MS}")
    # the split layout: two fronts and a queue owner over the same engine files
    add_split_variant(repo, "minilm", "minilm_split", fronts=2)
    # for the OpenAI adapter: a model that declares the sizes `dimensions` may ask for
    add_model_variant(repo, "minilm", "minilm_matryoshka", {"matryoshka_dimensions": "128,256"})
    # ... and one with sentence-transformers prompts in its manifest
    add_model_variant(repo, "minilm", "minilm_prompts")
    manifest = repo / "minilm_prompts" / "1" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["prompts"] = {"query": "query: ", "passage": "passage: "}
    manifest.unlink()  # a link to the base model's manifest: this one is its own
    manifest.write_text(json.dumps(data))


def repository_of(repository: Path, models: tuple[str, ...], root: Path) -> Path:
    """A repository holding only ``models`` of ``repository`` (linked): a server over it starts,
    and restarts, without loading the others."""
    subset = root / "repository"
    subset.mkdir(parents=True)
    for model in models:
        (subset / model).symlink_to(repository / model)
    return subset


def start_server(repository: Path, log: Path, exit_timeout_s: int = 20) -> TritonServer:
    server = TritonServer(
        repository,
        free_port(),
        free_port(),
        free_port(),
        log_path=log,
        exit_timeout_s=exit_timeout_s,
    )
    _LOGS.append(log)
    server.start()
    try:
        server.wait_ready(180)
    except Exception:
        server.stop()
        raise
    return server


@pytest.fixture(scope="session")
def server(repository, tmp_path_factory):
    """Triton alone, over the models its tests call (the adapter's models are the stack's)."""
    models = (
        "minilm",
        "minilm_torch",
        "classifier",
        "reranker",
        "minilm_faults",
        "minilm_small_queue",
        SLOW,
        "minilm_split",
        "minilm_split_owner",
    )
    root = tmp_path_factory.mktemp("server")
    # its exit is no test's subject: the suite's idle keep-alive connections need not be waited out
    server = start_server(repository_of(repository, models, root), root / "triton.log", 3)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def reference_model():
    """MiniLM in torch, run on each row alone: the reference served outputs must match."""
    from builder.build import default_model_dir
    from builder.families import load_model, run_rows_served

    model = load_model(default_model_dir())
    assert model.normalize  # MiniLM's pipeline ends in Normalize: served vectors are unit length

    def embed(rows: list[np.ndarray]) -> np.ndarray:
        return run_rows_served(model, rows)

    return embed


@pytest.fixture(scope="session")
def tokenizer():
    from builder.build import default_model_dir
    from python_backend.common.tokenization import TextTokenizer

    return TextTokenizer(default_model_dir() / "tokenizer.json", 256)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        for log in _LOGS:
            if log.is_file():
                tail = log.read_text(errors="replace")[-6000:]
                report.sections.append((f"server log {log.name}", tail))


def pytest_collection_modifyitems(items):
    for item in items:
        if "e2e" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def stack(repository, tmp_path_factory):
    """The deployment as `make serve` runs it, with an API key and short limits."""
    from tests.e2e.stack import API_KEY, BULK_KEY, Stack

    models = (
        "minilm",
        "minilm_matryoshka",
        "minilm_prompts",
        "reranker",
        "classifier",
        "tiny_embedder",
        "qwen3_reranker",
    )
    root = tmp_path_factory.mktemp("stack")
    keys = root / "api-keys"  # beside API_KEY: a named key whose clients are in class 2
    keys.write_text(f"bulk {BULK_KEY} 2\n")
    own = Stack(
        repository_of(repository, (*models, "minilm_small_queue", SLOW), root),
        root / "state",
        {"API_KEY": API_KEY, "API_KEYS": str(keys)},
        models=models,
    )
    _LOGS.append(own.log_path)
    own.start()
    yield own
    own.stop()
