"""The torch engine's device check: every CUDA graph against the eager forward and against the
same module in FP32 on the CPU, then the forward times the planner's costs come from.

    python -m builder.gpu_check --engine torch [--device auto|cuda|cpu] [--table-out FILE]

It runs where only torch, numpy, tokenizers and transformers are installed, at whatever versions
are there (the lent GPU machine: no TensorRT, no Triton, no tritonclient, no package index), and
imports nothing else: no project pins, no model files. The model is built from a config with a
fixed seed: MiniLM-L6's shape (BERT, 6 layers, hidden 384, 12 heads; mean pooling, normalised,
as the default model is served) on a GPU, the builder tests' tiny BERT on the CPU, where
``make test`` runs it so that it cannot rot. Then:
1. it writes the torch engine's files as the builder does and opens them as the server does:
   FP16 on the GPU with one graph per (bucket, captured size), with the layout a default GPU
   build chooses (buckets from the bench corpus's lengths, captured sizes, row cap) and a
   long-row range above the last bucket; FP32 without graphs on the CPU;
2. compares, per row, by cosine (at least 0.999), every captured size of every bucket, the
   sizes that have no graph, every captured size again, and rows above the last bucket: with
   the eager forward on the same device, and with the module in FP32 on the CPU;
3. times a forward at every bucket and captured size, prints the table and the fixed cost of
   one forward in tokens (the affine fit's overhead), and writes both as a cost table file
   that the simulator reads (``--cost table:FILE``);
4. checks every other wrapper family (classifier, cross-encoder, decoder scorer, decoder
   reranker) on tiny models from configs the same way, each in the precision its build takes
   here (decoders BF16 on a GPU that has it), against its eager forward and FP32 on the CPU;
5. shows the server's finiteness check refuse a decoder whose activations pass FP16's range in
   FP16 and answer it in BF16 and FP32, and measures the CPU a thread spends waiting for the GPU
   on a stream's synchronize (a spin) and on a blocking event (the engine's wait);
6. exits 1 on any mismatch, a size that could not be captured, or an overflow not caught.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from builder.buckets import bucket_rows, choose_buckets, power_of_two_buckets
from builder.calibrate import fit_times, median_seconds
from builder.cost_table_file import CostTableFile
from builder.engine_compare import MIN_COSINE, Comparison, check_engine, random_rows
from builder.tiny_models import TINY, tiny_transformer
from python_backend.common.cost_models import LinearCost
from python_backend.common.manifest import Bucket, LongRows, Manifest
from python_backend.engines.base import pad_rows
from python_backend.engines.torch_engine import TorchEngine
from python_backend.engines.torch_modules import EmbeddingHead, save_torch_model

ROOT = Path(__file__).resolve().parents[1]
CORPUS_LENGTHS = ROOT / "bench" / "data" / "request_lengths.txt"  # the bench corpus's lengths
SEED = 0
# MiniLM-L6 (sentence-transformers/all-MiniLM-L6-v2), served up to 256 tokens
MODELS: dict[str, dict[str, Any]] = {
    "minilm": dict(
        vocab_size=30522,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
    ),
    "tiny": TINY,
}
SERVED_LENGTH = {"minilm": 256, "tiny": 64}  # the last bucket
LONG_ROWS = {"minilm": 320, "tiny": 96}  # rows above the last bucket up to here: eager
# a GPU build's defaults (builder.build): 8 buckets aligned to 8, 65536 tokens, 64 rows
GPU_LAYOUT = {"num_buckets": 8, "align": 8, "token_budget": 65536, "max_batch": 64}
CPU_LAYOUT = {"num_buckets": 3, "align": 8, "token_budget": 256, "max_batch": 8}


@dataclass(frozen=True)
class Target:
    device: str  # cuda | cpu
    model: str  # a key of MODELS
    precision: str  # fp16 on a GPU, fp32 on the CPU

    @property
    def device_name(self) -> str:
        if self.device == "cuda":
            return str(torch.cuda.get_device_name(torch.cuda.current_device()))
        return "CPU"


def target_on(device: str, model: str | None = None) -> Target | None:
    """What a check runs for ``--device`` auto|cuda|cpu: MiniLM's shape in FP16 on a GPU, the
    tiny BERT in FP32 on the CPU (``model``: another of MODELS); None, said on stderr, where
    cuda is asked for and torch sees none."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch sees no CUDA device", file=sys.stderr)
        return None
    model = model or ("minilm" if device == "cuda" else "tiny")
    return Target(device, model, "fp16" if device == "cuda" else "fp32")


def build_module(model: str) -> EmbeddingHead:
    """The model from its config with a fixed seed, mean-pooled and normalised."""
    import transformers

    torch.manual_seed(SEED)
    config = transformers.BertConfig(**MODELS[model])
    encoder = transformers.BertModel(config)  # as AutoModel builds it, pooler and all
    return EmbeddingHead(encoder, "mean", normalize=True).eval()


def layout(target: Target) -> tuple[tuple[Bucket, ...], LongRows, int, int]:
    """(buckets, the long-row range, max length, max batch) the check builds with."""
    shape = GPU_LAYOUT if target.device == "cuda" else CPU_LAYOUT
    last = SERVED_LENGTH[target.model]
    if CORPUS_LENGTHS.is_file():
        lengths = [int(x) for x in CORPUS_LENGTHS.read_text().split()]
        chosen = choose_buckets(lengths, shape["num_buckets"], last, shape["align"])
    else:
        chosen = power_of_two_buckets(last)
    buckets = tuple(
        bucket_rows(chosen, shape["token_budget"], shape["max_batch"], batch_multiple=8)
    )
    max_length = LONG_ROWS[target.model]
    long_rows = LongRows(max_rows=8, opt_length=max_length)
    return buckets, long_rows, max_length, shape["max_batch"]


def write_engine(target: Target, folder: Path) -> Manifest:
    """The torch engine's files, written as the builder writes them, and their manifest."""
    module = build_module(target.model)
    files = save_torch_model(module, folder)
    buckets, long_rows, max_length, max_batch = layout(target)
    return Manifest(
        model_name=f"{target.model}-check",
        family="embedding",
        output_name="EMBEDDING",
        output_dim=int(MODELS[target.model]["hidden_size"]),
        tokenizer_file="tokenizer.json",  # never read: the check feeds token ids
        max_length=max_length,
        vocab_size=int(MODELS[target.model]["vocab_size"]),
        pad_token_id=0,
        buckets=buckets,
        max_batch=max_batch,
        engine_kind="torch",
        engine_files=files,
        precision=target.precision,
        cost_model=LinearCost(0.0),
        long_rows=long_rows,
        engine_version=str(torch.__version__),
    )


class EagerForward:
    """The engine's own eager forward at each group's exact shape, as a reference engine."""

    def __init__(self, engine: TorchEngine) -> None:
        self.engine, self.layout = engine, engine.layout
        self.output_name, self.output_dim = engine.output_name, engine.output_dim

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return self.engine.run_eagerly(input_ids, attention_mask)

    def close(self) -> None:
        pass


def compare(
    engine: TorchEngine, manifest: Manifest, references: dict[str, Any]
) -> list[tuple[str, Comparison]]:
    """Every size the server runs, against each reference, on the same rows."""
    results = []
    for name, reference in references.items():
        rng = np.random.default_rng(SEED)  # the same rows for every reference
        for r in check_engine(
            engine, reference, manifest, MIN_COSINE["embedding"], rng, engine.run_eagerly
        ):
            results.append((name, r))
    return results


def time_grid(engine: TorchEngine, manifest: Manifest) -> tuple[tuple[int, ...], np.ndarray]:
    """Median microseconds of a forward of full rows at every bucket and captured size, as
    served (staging, copies and all): (the batch sizes, times[bucket, size])."""
    rng = np.random.default_rng(SEED)
    sizes = tuple(sorted({s for b in manifest.buckets for s in b.captured_batch_sizes}))
    times = np.full((len(manifest.buckets), len(sizes)), np.nan)
    for i, bucket in enumerate(manifest.buckets):
        for batch in bucket.captured_batch_sizes:
            rows = random_rows(rng, batch, bucket.length, bucket.length, manifest.vocab_size)
            ids, mask = pad_rows(rows, bucket.length, manifest.pad_token_id)
            seconds = median_seconds(lambda: engine.run(ids, mask), 20, 0.05)  # noqa: B023
            times[i, sizes.index(batch)] = seconds * 1e6
    return sizes, times


def print_comparisons(results: list[tuple[str, Comparison]]) -> None:
    print(
        f"{'against':>9} {'phase':>14} {'length':>6} {'batch':>5} {'min cos':>9} {'max|diff|':>10}"
    )
    for name, r in results:
        flag = "" if r.ok else "  MISMATCH"
        print(
            f"{name:>9} {r.phase:>14} {r.length:>6} {r.batch:>5} {r.min_cosine:>9.5f} "
            f"{r.max_abs_diff:>10.2e}{flag}"
        )


def print_table(table: CostTableFile, sizes: tuple[int, ...], times: np.ndarray) -> None:
    print(f"\nforward ms on {table.device} ({table.engine}), by bucket (rows) and batch (columns)")
    print(f"{'bucket':>6} " + " ".join(f"{s:>8}" for s in sizes))
    for bucket, row in zip(table.buckets, times, strict=True):
        cells = " ".join(f"{t / 1e3:>8.3f}" if np.isfinite(t) else f"{'':>8}" for t in row)
        print(f"{bucket.length:>6} {cells}")
    print(
        f"fixed cost of one forward: {table.fit.overhead_tokens:.0f} tokens "
        f"({table.fit.overhead_tokens * table.table.us_per_token:.0f} us at "
        f"{table.table.us_per_token * 1e3:.2f} ns a token); the affine fit's worst relative "
        f"error {table.worst_relative_error:.1%}"
    )


def run_check(target: Target, work_dir: Path, table_out: Path, command: str) -> bool:
    """The whole check (above) with the engine's files in ``work_dir``; True when it passed."""
    work_dir.mkdir(parents=True, exist_ok=True)
    manifest = write_engine(target, work_dir)
    messages: list[str] = []
    engine = TorchEngine(manifest, work_dir, log=messages.append)
    cpu = TorchEngine(replace(manifest, precision="fp32"), work_dir)
    print(
        f"torch {torch.__version__} on {target.device_name}: {target.model} "
        f"{target.precision}, buckets {[b.length for b in manifest.buckets]}, "
        f"{len(engine.graphs)} CUDA graphs"
    )
    for message in messages:
        print(f"capture: {message}")
    references: dict[str, Any] = {"cpu-fp32": cpu}
    if engine.cuda is not None:  # on the CPU the engine's forward is the eager one itself
        references = {"eager": EagerForward(engine), **references}
    results = compare(engine, manifest, references)
    print_comparisons(results)
    sizes, times = time_grid(engine, manifest)
    table, fit, worst = fit_times(tuple(b.length for b in manifest.buckets), sizes, times)
    record = CostTableFile(
        device=target.device_name,
        date=datetime.date.today().isoformat(),
        engine=f"torch {torch.__version__} {target.precision}"
        + (", CUDA graphs" if engine.cuda is not None else ", no graphs"),
        model=f"{target.model}-shaped BERT from a config, seed {SEED}, mean pooling, normalised",
        command=command,
        buckets=manifest.buckets,
        max_batch=manifest.max_batch,
        table=replace(table, captured_batch_sizes=sizes),
        fit=fit,
        worst_relative_error=worst,
    )
    print_table(record, sizes, times)
    print(f"cost table written to {record.write(table_out)}")
    if engine.cuda is not None:
        memory = engine.memory_bytes()
        free, total = torch.cuda.mem_get_info()
        print(
            f"weights {memory['weights'] / 2**20:.1f} MiB, I/O buffers "
            f"{memory['io_buffers'] / 2**20:.1f} MiB; GPU memory in use "
            f"{(total - free) / 2**30:.2f} of {total / 2**30:.1f} GiB"
        )
    engine.close()
    cpu.close()
    ok = all(r.ok for _, r in results) and not engine.eager_sizes
    if engine.eager_sizes:
        print(f"FAIL: {len(engine.eager_sizes)} size(s) could not be captured (see above)")
    return ok


# -- every wrapper family, an FP16 overflow, and how a GPU wait spends the CPU -------------------

# each wrapper family beside the embedding check, with its output's width here
FAMILY_OUTPUT_DIMS = {"classifier": 3, "reranker": 1, "decoder": 2, "decoder_reranker": 1}
WRAPPED_FAMILIES = tuple(FAMILY_OUTPUT_DIMS)
SCORED_IDS = (2023, 2025)  # the decoders' chosen token ids (yes, no for the reranker)


def family_module(family: str) -> torch.nn.Module:
    """The family's wrapper around its tiny model (``tiny_models.tiny_transformer``)."""
    from python_backend.engines.torch_modules import (
        ClassifierHead,
        LastTokenScorer,
        PairScorer,
        YesNoScorer,
    )

    model = tiny_transformer(family, SEED)
    if family == "classifier":
        return ClassifierHead(model).eval()
    if family == "reranker":
        return PairScorer(model).eval()
    if family == "decoder":
        return LastTokenScorer(model, list(SCORED_IDS)).eval()
    return YesNoScorer(model, *SCORED_IDS).eval()


def family_precision(target: Target, family: str) -> str:
    """What a build of the family runs in on the torch engine here (builder.precision)."""
    from builder.precision import default_precision

    gpu = target.device == "cuda"
    bf16 = gpu and torch.cuda.is_bf16_supported()
    return default_precision("torch", family.startswith("decoder"), gpu, bf16)


def check_family(target: Target, family: str, work_dir: Path) -> list[tuple[str, Comparison]]:
    """The family's torch engine (CUDA graphs on a GPU) against its eager forward and against
    the same module in FP32 on the CPU, at every size the server runs."""
    from builder.engine_compare import REFERENCE_MAX_SCORE_DIFF, REFERENCE_MIN_COSINE
    from python_backend.common.contract import FAMILY_CONTRACTS

    folder = work_dir / family
    folder.mkdir(parents=True, exist_ok=True)
    module = family_module(family)
    files = save_torch_model(module, folder)
    buckets, long_rows, max_length, max_batch = layout(target)
    contract = FAMILY_CONTRACTS[family]
    precision = family_precision(target, family)
    manifest = Manifest(
        model_name=f"{family}-check",
        family=family,
        output_name=contract.output_name,
        output_dim=FAMILY_OUTPUT_DIMS[family],
        tokenizer_file="tokenizer.json",
        max_length=max_length,
        vocab_size=int(TINY["vocab_size"]),
        pad_token_id=0,
        buckets=buckets,
        max_batch=max_batch,
        engine_kind="torch",
        engine_files=files,
        precision=precision,
        cost_model=LinearCost(0.0),
        long_rows=long_rows,
        engine_version=str(torch.__version__),
        input_names=contract.input_names,
    )
    engine = TorchEngine(manifest, folder)
    cpu = TorchEngine(replace(manifest, precision="fp32"), folder)
    references: dict[str, tuple[Any, float, float]] = {
        "cpu-fp32": (
            cpu,
            REFERENCE_MIN_COSINE[precision][family],
            REFERENCE_MAX_SCORE_DIFF[precision],
        )
    }
    if engine.cuda is not None:
        references = {"eager": (EagerForward(engine), MIN_COSINE[family], 0.02), **references}
    results = []
    for name, (reference, min_cosine, max_diff) in references.items():
        rng = np.random.default_rng(SEED)
        for r in check_engine(
            engine, reference, manifest, min_cosine, rng, engine.run_eagerly, max_diff
        ):
            results.append((f"{family} {precision} vs {name}", r))
    engine.close()
    cpu.close()
    return results


def overflow_check(target: Target) -> bool:
    """A tiny Llama whose first MLP's activations pass FP16's range (about 4.6e6, as the
    outlier dimensions of real decoders do): the server's finiteness check
    (``runners.finite_rows``) refuses every row in FP16 and none in BF16 or FP32."""
    from python_backend.engines.torch_modules import LastTokenScorer
    from python_backend.scheduling.runners import finite_rows

    model = tiny_transformer("decoder", SEED)
    with torch.no_grad():
        mlp = model.model.layers[0].mlp
        for unit, sign in ((0, 1.0), (1, -1.0)):  # one of the two fires, whatever the input's sign
            mlp.gate_proj.weight[unit].fill_(50.0 * sign)
            mlp.up_proj.weight[unit].fill_(50.0 * sign)
            mlp.down_proj.weight[:, unit].fill_(10.0)
    scorer = LastTokenScorer(model, list(SCORED_IDS)).eval()
    ids = torch.from_numpy(np.random.default_rng(SEED).integers(1000, 29000, (8, 24)))
    device = torch.device(target.device)
    finite = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        with torch.no_grad():
            out = scorer.to(device, dtype)(ids.to(device), torch.ones_like(ids).to(device))
        finite[name] = int(finite_rows(out.float().cpu().numpy()).sum())
    print(f"\nan FP16 overflow ({target.device}): rows answered finite of 8: {finite}")
    return finite == {"fp32": 8, "bf16": 8, "fp16": 0}


def wait_cpu(target: Target) -> None:
    """The CPU a thread spends waiting for the GPU: a stream's synchronize (CUDA's default
    schedule spins) against a blocking event (the engine's wait)."""
    import time

    if target.device != "cuda":
        print("\nGPU waits: no GPU here, nothing to measure")
        return
    stream = torch.cuda.Stream()
    print("\nGPU waits of a 0.2 s kernel: CPU seconds per wall second")
    for name in ("stream.synchronize", "blocking event"):
        shares = []
        for _ in range(3):
            with torch.cuda.stream(stream):
                torch.cuda._sleep(int(2e8))  # about 0.1-0.3 s of GPU clock cycles
            cpu, wall = time.process_time(), time.perf_counter()
            if name == "blocking event":
                done = torch.cuda.Event(blocking=True)
                done.record(stream)
                done.synchronize()
            else:
                stream.synchronize()
            shares.append((time.process_time() - cpu) / max(time.perf_counter() - wall, 1e-9))
        print(f"{name:>20}: {min(shares):.2f} to {max(shares):.2f}")


def check_families(target: Target, work_dir: Path) -> bool:
    """Every wrapper family's engine against its references (one line each: its worst row, and
    any size that is off in full), the FP16 overflow, and the GPU wait's CPU."""
    results = [r for family in WRAPPED_FAMILIES for r in check_family(target, family, work_dir)]
    print(f"\n{'family, precision, against':>36} {'sizes':>5} {'min cos':>9} {'max|diff|':>10}")
    for name in dict.fromkeys(n for n, _ in results):
        mine = [r for n, r in results if n == name]
        worst_cosine = min(r.min_cosine for r in mine)
        worst_diff = max(r.max_abs_diff for r in mine)
        flag = "" if all(r.ok for r in mine) else "  MISMATCH"
        print(f"{name:>36} {len(mine):>5} {worst_cosine:>9.5f} {worst_diff:>10.2e}{flag}")
    off = [(n, r) for n, r in results if not r.ok]
    if off:
        print_comparisons(off)
    overflow = overflow_check(target)
    wait_cpu(target)
    return all(r.ok for _, r in results) and overflow


def main(argv: list[str] | None = None) -> int:
    """``python -m builder.gpu_check --engine torch``'s options (``argv`` without --engine)."""
    parser = argparse.ArgumentParser(prog="python -m builder.gpu_check --engine torch")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument(
        "--model", choices=tuple(MODELS), help="default: minilm on a GPU, tiny on the CPU"
    )
    parser.add_argument(
        "--table-out",
        type=Path,
        default=Path("build/gpu_check/torch-cost-table.json"),
        help="where the measured cost table is written",
    )
    parser.add_argument(
        "--work-dir", type=Path, help="where the engine's files go (default: a temporary folder)"
    )
    args = parser.parse_args(argv)
    target = target_on(args.device, args.model)
    if target is None:
        return 2
    command = " ".join(["python -m builder.gpu_check --engine torch", shlex.join(argv or [])])
    if args.work_dir is not None:
        ok = run_check(target, args.work_dir, args.table_out, command)
        ok = check_families(target, args.work_dir / "families") and ok
    else:
        with tempfile.TemporaryDirectory(prefix="torch-check-") as folder:
            ok = run_check(target, Path(folder), args.table_out, command)
            ok = check_families(target, Path(folder) / "families") and ok
    print("PASS" if ok else "FAIL: see MISMATCH above")
    return 0 if ok else 1
