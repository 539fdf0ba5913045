"""What the adapter reads from the model repository itself: each model's manifest and tokenizer.

``/v1/tokenize``, ``/v1/decode`` and ``/v1/info`` answer from the same files the model serves
with (compose and Kubernetes mount the repository read-only into the adapter), so the tokens it
shows are counted exactly as the model counts them, and ``/v1/classify`` names the classes the
manifest names. Read once per model, then kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from openai_api.errors import OpenAIError
from python_backend.common.decoding import Prompts
from python_backend.common.manifest import Manifest, ManifestError, load_manifest
from python_backend.common.tokenization import TextTokenizer
from python_backend.engines.base import BucketLayout

VERSION = "1"  # the version folder the builder writes


@dataclass(frozen=True)
class ModelFiles:
    manifest: Manifest
    tokenizer: TextTokenizer  # cuts rows at the longest row the model takes, as the model does
    prompts: Prompts
    version_dir: Path
    _ranges: dict[int, tuple[Any, Any]] = field(default_factory=dict)

    def quantization_ranges(self, dimensions: int) -> tuple[Any, Any] | None:
        """Per-dimension (min, max) of the builder's sample vectors at ``dimensions`` (shortened
        as ``dimensions`` shortens them: renormalised where the model normalises); None for a
        model built without a text sample."""
        manifest = self.manifest
        if dimensions == manifest.output_dim or manifest.quantization_ranges is None:
            return manifest.quantization_ranges
        if manifest.quantization_sample is None:
            return None
        known = self._ranges.get(dimensions)
        if known is None:
            from openai_api.protocol import shorten

            sample = np.load(self.version_dir / manifest.quantization_sample)
            head = shorten(sample, dimensions, manifest.normalize)
            known = (head.min(axis=0).tolist(), head.max(axis=0).tolist())
            self._ranges[dimensions] = known
        return known

    @property
    def longest_row(self) -> int:
        return self.tokenizer.max_length


class ModelRepository:
    """The served models' files, read from ``root`` (None: the adapter was given none)."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self._files: dict[str, ModelFiles] = {}

    def files(self, model: str) -> ModelFiles:
        """The files of ``model`` (a model the adapter serves: the caller checked the name)."""
        known = self._files.get(model)
        if known is not None:
            return known
        if self.root is None:
            raise OpenAIError(
                501,
                "this route reads the model's own files: start the adapter with --repository",
                kind="server_error",
            )
        version_dir = self.root / model / VERSION
        try:
            manifest = load_manifest(version_dir)
        except (ManifestError, OSError) as err:
            raise OpenAIError(
                503, f"model `{model}`'s files cannot be read: {err}", kind="server_error"
            ) from None
        longest = BucketLayout.from_manifest(manifest).longest_row
        files = ModelFiles(
            version_dir=version_dir,
            manifest=manifest,
            tokenizer=TextTokenizer(version_dir / manifest.tokenizer_file, longest),
            prompts=Prompts(manifest.prompts, manifest.default_prompt_name),
        )
        self._files[model] = files
        return files
