"""Writes the benchmark's input data from real text (the licence texts every Debian host has).

    python -m bench.make_data [--rows 1000] [--requests 500]

- bench/data/sample_texts.txt: one row of text a line; the builder chooses buckets from it;
- bench/data/perf_input.json: perf_analyzer --input-data, one row (TEXT [1]) per request, the
  same requests for every model measured;
- bench/data/request_lengths.txt: those requests' MiniLM token counts (truncated at 256), one a
  line: what the simulator (bench.simulate) replays.
The rows are cut with builder.corpus (sentences, paragraphs, runs of paragraphs), so their token
lengths spread like real traffic: many short rows and a long tail.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.errors import BenchError, reports_errors
from bench.paths import DATA
from builder.corpus import corpus_rows


@reports_errors
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000, help="rows in sample_texts.txt")
    parser.add_argument("--requests", type=int, default=500, help="requests in perf_input.json")
    args = parser.parse_args()
    DATA.mkdir(parents=True, exist_ok=True)
    sample = corpus_rows(args.rows, seed=1)
    (DATA / "sample_texts.txt").write_text("\n".join(sample) + "\n")
    requests = corpus_rows(args.requests, seed=2)
    data = {"data": [{"TEXT": {"content": [text], "shape": [1]}} for text in requests]}
    (DATA / "perf_input.json").write_text(json.dumps(data, indent=0) + "\n")
    write_request_lengths(requests)
    print(f"wrote {len(sample)} sample rows and {len(requests)} requests to {DATA}")
    return 0


def write_request_lengths(requests: list[str]) -> Path:
    from builder.build import default_model_dir
    from python_backend.common.tokenization import TextTokenizer

    model_dir = default_model_dir()
    if model_dir is None:
        raise BenchError("the MiniLM package is not installed: run `make setup`")
    tokenizer = TextTokenizer(model_dir / "tokenizer.json", 256)
    lengths = [len(ids) for ids in tokenizer.encode(requests, truncate=True)]
    path = DATA / "request_lengths.txt"
    path.write_text("\n".join(map(str, lengths)) + "\n")
    return path


if __name__ == "__main__":
    sys.exit(main())
