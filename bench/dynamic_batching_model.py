"""The peer: what a user would write instead. Triton's dynamic batcher, one forward per batch.

Triton's `dynamic_batching` collects requests (up to max_batch_size rows, waiting at most the
max queue delay) and hands them to ``execute`` together; the model tokenizes them, pads every row
to the batch's longest row and runs one forward on the same engine files as the planner model.
Used only by bench/serving.py to measure what the planner gains; never served by default.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from python_backend.common.manifest import load_manifest
from python_backend.common.tokenization import TextTokenizer
from python_backend.engines import open_engine
from python_backend.engines.base import pad_rows


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        version_dir = Path(args["model_repository"]) / args["model_version"]
        manifest = load_manifest(version_dir)
        self.engine = open_engine(manifest, version_dir)
        self.pad = manifest.pad_token_id
        self.output_name = manifest.output_name
        self.max_rows = int(config["max_batch_size"])
        self.tokenizer = TextTokenizer(version_dir / manifest.tokenizer_file, manifest.max_length)

    def execute(self, requests: list[Any]) -> list[Any]:
        texts_per_request = [
            [
                t.decode("utf-8")
                for t in pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy()[:, 0]
            ]
            for r in requests
        ]
        rows = self.tokenizer.encode(
            [t for texts in texts_per_request for t in texts], truncate=True
        )
        outputs = []
        for start in range(0, len(rows), self.max_rows):
            chunk = rows[start : start + self.max_rows]
            ids, mask = pad_rows(chunk, max(len(r) for r in chunk), self.pad)  # longest row
            outputs.append(self.engine.run(ids, mask))
        values = np.concatenate(outputs)
        responses, offset = [], 0
        for texts in texts_per_request:
            n = len(texts)
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
