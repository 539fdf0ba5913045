"""The peer: what a user would write instead. Triton's dynamic batcher, one forward per batch.

Triton's `dynamic_batching` collects requests (up to max_batch_size rows, waiting at most the
max queue delay) and hands them to ``execute`` together; the model tokenizes them (or reads their
token ids), pads every row to the batch's longest row and runs one forward on the same engine
files as the planner model, or on the emulated engine where the bench repository names a table.
Used only by bench/serving.py and bench/fairness.py; never served by default.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from bench.emulated_engine import TABLE_FILE
from bench.emulated_model import emulated_engine
from python_backend.common.manifest import load_manifest
from python_backend.common.tokenization import TextTokenizer
from python_backend.engines import open_engine
from python_backend.engines.base import pad_rows


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        version_dir = Path(args["model_repository"]) / args["model_version"]
        manifest = load_manifest(version_dir)
        emulated = (version_dir / TABLE_FILE).is_file()
        self.engine = (emulated_engine if emulated else open_engine)(manifest, version_dir)
        self.pad = manifest.pad_token_id
        self.output_name = manifest.output_name
        self.max_rows = int(config["max_batch_size"])
        self.tokenizer = TextTokenizer(version_dir / manifest.tokenizer_file, manifest.max_length)

    def rows(self, request: Any) -> list[np.ndarray]:
        """The request's rows: its texts tokenized, or its token ids up to its mask's end."""
        text = pb_utils.get_input_tensor_by_name(request, "TEXT")
        if text is not None:
            texts = [t.decode("utf-8") for t in text.as_numpy()[:, 0]]
            return self.tokenizer.encode(texts, truncate=True)
        ids = pb_utils.get_input_tensor_by_name(request, "INPUT_IDS").as_numpy()
        mask = pb_utils.get_input_tensor_by_name(request, "ATTENTION_MASK")
        lengths = mask.as_numpy().sum(axis=1) if mask is not None else [ids.shape[1]] * len(ids)
        return [row[:n] for row, n in zip(ids, lengths, strict=True)]

    def execute(self, requests: list[Any]) -> list[Any]:
        rows_per_request = [self.rows(r) for r in requests]
        rows = [row for request_rows in rows_per_request for row in request_rows]
        outputs = []
        for start in range(0, len(rows), self.max_rows):
            chunk = rows[start : start + self.max_rows]
            ids, mask = pad_rows(chunk, max(len(r) for r in chunk), self.pad)  # longest row
            outputs.append(self.engine.run(ids, mask))
        values = np.concatenate(outputs)
        responses, offset = [], 0
        for request_rows in rows_per_request:
            n = len(request_rows)
            tokens = np.array([[len(r)] for r in rows[offset : offset + n]], dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor(self.output_name, values[offset : offset + n]),
                        pb_utils.Tensor("NUM_TOKENS", tokens),
                    ]
                )
            )
            offset += n
        return responses

    def finalize(self) -> None:
        self.engine.close()
