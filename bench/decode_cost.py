"""What decoding a request's BYTES rows costs a front, beside a numpy form of the same work.

    python -m bench.decode_cost [--rounds 3]

The front's per-row loop (``python_backend.decoding._text_rows``: each row's bytes decoded as
UTF-8, checked non-empty and against the byte cap) against numpy's vectorized string functions
on the same rows (``astype("S")``, then ``np.char.decode``; numpy 1.26), on one-row and 64-row inputs of
real request texts, alternating, the best of each round. Printed beside a front's CPU per request
(bench/data/cpu_costs.json), so the table says what the lever could give at most.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import timeit

import numpy as np

from bench.errors import reports_errors
from bench.paths import ROOT
from builder.corpus import corpus_rows
from python_backend.decoding import Limits, RequestOptions, _text_rows


def numpy_rows(text: np.ndarray, max_bytes: int) -> list[str]:
    """The same rows by numpy's string functions: decode, empty and size checks vectorized."""
    raw = text[:, 0].astype("S")
    decoded = np.char.decode(raw, "utf-8")
    if np.any(np.char.str_len(np.char.strip(decoded)) == 0):
        raise ValueError("an empty row")
    if np.any(np.char.str_len(raw) > max_bytes):
        raise ValueError("a row over the cap")
    return list(decoded.tolist())


@reports_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    limits = Limits(max_rows=4096, max_length=256, vocab_size=30522)
    options = RequestOptions(truncate=True, timeout_ms=0)
    data = json.loads((ROOT / "bench" / "data" / "cpu_costs.json").read_text())
    texts = corpus_rows(64, seed=5)
    print("| rows | round | loop us | numpy us | numpy / loop | loop, share of a front's CPU |")
    print("|---|---|---|---|---|---|")
    for rows in (1, 64):
        text = np.array([[t.encode()] for t in texts[:rows]], dtype=np.object_)
        front_us = float(
            np.mean(
                [
                    p["cpu_us_per_request"]["front"]
                    for p in data["points"]
                    if p["fronts"] == 1 and p["rows"] == rows
                ]
            )
        )
        assert numpy_rows(text, 256 * 32) == _text_rows("TEXT", text, limits, options)
        calls = {
            "loop": functools.partial(_text_rows, "TEXT", text, limits, options),
            "numpy": functools.partial(numpy_rows, text, 256 * 32),
        }
        for r in range(args.rounds):
            timed = {}
            for name in ("loop", "numpy") if r % 2 == 0 else ("numpy", "loop"):
                timed[name] = min(timeit.repeat(calls[name], number=2000, repeat=5)) / 2000 * 1e6
            print(
                f"| {rows} | {r + 1} | {timed['loop']:.1f} | {timed['numpy']:.1f} | "
                f"{timed['numpy'] / timed['loop']:.2f} | {timed['loop'] / front_us:.1%} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
