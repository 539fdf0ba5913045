"""What quantized vectors cost in retrieval: recall@10 of int8 and of binary (with and without
float rescoring) against float, on the served MiniLM's own vectors.

    python -m bench.quantization_recall [--no-write]

Rows of real English text cut as the benchmark corpus cuts it (``builder.corpus``: the licences,
and the packages' documents under /usr/share/doc), exact and near duplicates removed (cosine above 0.95 to a row kept before), then 200 held
out as queries against 2,000 others. The vectors are the ones ``/v1/embeddings`` answers: the
model built by the builder (ONNX Runtime), normalised as served, quantized by the adapter's own
``quantize`` over the ranges the builder calibrated (its own text sample, not these rows). The
truth is float's top 10 by cosine. int8: top 10 by the dot product of the int8 vectors. Binary:
top 10 by Hamming distance; rescored: the 40 nearest by Hamming distance, re-ranked by the float
query against the documents' bits as +-1 (sentence-transformers' rescoring), so no float
document vector is kept.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from bench.docs import publish, render
from bench.errors import BenchError, reports_errors
from bench.paths import ROOT
from openai_api.protocol import quantize
from python_backend.manifest import Manifest

BEGIN, END = "<!-- quantization:begin -->", "<!-- quantization:end -->"
QUERIES, DOCUMENTS, K, RESCORE = 200, 2000, 10, 40
ROWS = 5000  # cut from the corpus, before duplicates are removed
NEAR_DUPLICATE = 0.95


def built_model(repository: Path) -> tuple[Manifest, Path]:
    """The default MiniLM as `make serve` builds it (ONNX Runtime; its int8 ranges calibrated on
    the builder's own sample): its manifest and version folder."""
    from builder.build import build
    from builder.spec import BuildSpec

    result = build(
        BuildSpec(
            name="minilm", repository=repository, engine="onnxruntime", calibration_repeats=0,
            quiet=True,
        )
    )  # fmt: skip
    return result.manifest, result.version_dir


def distinct(vectors: np.ndarray, texts: list[str]) -> list[int]:
    """Indices of rows that are neither a repeat nor a near duplicate of a row kept before."""
    kept: list[int] = []
    seen: set[str] = set()
    for i, text in enumerate(texts):
        if text in seen:
            continue
        if kept and float(np.max(vectors[kept] @ vectors[i])) > NEAR_DUPLICATE:
            continue
        seen.add(text)
        kept.append(i)
    return kept


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Each row's k best columns (highest score first)."""
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(
        np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)])
    )


def recall_table(
    queries: np.ndarray, documents: np.ndarray, ranges: tuple[Any, Any] | None
) -> list[tuple[str, str, float]]:
    """(vector type, bytes a vector, recall@10) of each way of searching."""
    dim = queries.shape[1]
    truth = top_k(queries @ documents.T, K)
    q8, d8 = (quantize(v, "int8", ranges).astype(np.int32) for v in (queries, documents))
    int8_found = top_k((q8 @ d8.T).astype(np.float64), K)
    assert ranges is not None
    starts = np.asarray(ranges[0], dtype=np.float32)
    steps = (np.asarray(ranges[1], dtype=np.float32) - starts) / 255
    back = [starts + (v + 128 + 0.5) * steps for v in (q8, d8)]  # each level's midpoint
    dequantized_found = top_k(back[0] @ back[1].T, K)
    qb, db = (np.unpackbits(quantize(v, "ubinary"), axis=1)[:, :dim] for v in (queries, documents))
    agree = qb.astype(np.int32) @ db.T.astype(np.int32) + (1 - qb).astype(np.int32) @ (1 - db).T
    hamming_found = top_k(agree.astype(np.float64), K)  # fewest differing bits
    candidates = top_k(agree.astype(np.float64), RESCORE)
    signs = db.astype(np.float32) * 2 - 1
    rescored = np.take_along_axis(
        candidates,
        top_k(np.einsum("qd,qkd->qk", queries, signs[candidates]), K),
        axis=1,
    )
    return [
        ("float32", f"{dim * 4}", 1.0),
        ("int8, dot product of the int8 values", f"{dim}", recall(int8_found, truth)),
        (
            "int8, mapped back through the model's ranges",
            f"{dim}",
            recall(dequantized_found, truth),
        ),
        ("binary", f"{dim // 8}", recall(hamming_found, truth)),
        (
            f"binary, top {RESCORE} rescored with the float query",
            f"{dim // 8}",
            recall(rescored, truth),
        ),
    ]


@reports_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = parser.parse_args(argv)
    from builder.corpus import CORPUS_DIRS, corpus_rows

    # the licences alone hold about 650 distinct paragraphs: the packages' own documents too
    docs = tuple(sorted(p for p in Path("/usr/share/doc").iterdir() if p.is_dir()))
    texts = corpus_rows(ROWS, seed=11, dirs=CORPUS_DIRS + docs)
    from builder.build import served_vectors

    manifest, version_dir = built_model(ROOT / "build" / "quantization-recall")
    vectors = served_vectors(manifest, version_dir, texts)
    unique = distinct(vectors, texts)
    if len(unique) < QUERIES + DOCUMENTS:
        raise BenchError(f"only {len(unique)} distinct rows; {QUERIES + DOCUMENTS} are needed")
    kept = unique[: QUERIES + DOCUMENTS]
    rng = np.random.default_rng(0)
    rng.shuffle(kept)
    queries, documents = vectors[kept[:QUERIES]], vectors[kept[QUERIES:]]
    rows = recall_table(queries, documents, manifest.quantization_ranges)
    table = ["| vectors | bytes a vector | recall@10 against float |", "|---|---|---|"]
    table += [f"| {name} | {size} | {value:.3f} |" for name, size, value in rows]
    text = render(
        "quantization",
        queries=QUERIES,
        documents=len(documents),
        distinct=len(unique),
        rows=len(texts),
        table="\n".join(table),
    )
    return publish(text, BEGIN, END, write=not args.no_write)


if __name__ == "__main__":
    raise SystemExit(main())
