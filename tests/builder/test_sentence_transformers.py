"""sentence-transformers models are served exactly as sentence-transformers' own pipeline
computes them: Dense layers after pooling, last-token pooling for decoder embedders, max
pooling, prompts; a module that cannot be exported is refused by name, never skipped. The
adapter's quantized vectors are sentence-transformers' own too."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from builder.families import detect_family
from builder.spec import BuildError
from builder.tiny_models import TINY
from python_backend.common.decoding import (
    Limits,
    Normalization,
    Prompts,
    RequestOptions,
    decode_request,
    unit_length,
)
from python_backend.common.manifest import load_manifest
from python_backend.common.tokenization import TextTokenizer
from python_backend.engines import open_engine
from tests.builder.test_build import build_onnx

st = pytest.importorskip("sentence_transformers")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from sentence_transformers.sentence_transformer.modules import (  # noqa: E402
    Dense,
    Normalize,
    Pooling,
    Transformer,
)

TEXTS = ["a short one", "a somewhat longer sentence about batching rows", "x y z " * 9]
PROMPTS = {"query": "query: ", "passage": "passage: "}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)


def base_model(kind: str, folder: Path, minilm_dir: Path) -> Path:
    torch.manual_seed(0)
    if kind == "bert":
        model = transformers.BertModel(transformers.BertConfig(**TINY))
    else:
        model = transformers.LlamaModel(
            transformers.LlamaConfig(**TINY, num_key_value_heads=2, pad_token_id=0)
        )
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (minilm_dir / name).is_file():
            shutil.copyfile(minilm_dir / name, folder / name)
    return folder


def sentence_model(tmp: Path, minilm_dir: Path, kind: str, pooling: str, dense: bool):
    base = base_model(kind, tmp / f"{kind}-base", minilm_dir)
    modules = [Transformer(str(base), max_seq_length=64), Pooling(32, pooling)]
    if dense:
        torch.manual_seed(1)
        modules.append(Dense(32, 16))  # tanh, as sentence-transformers defaults
    modules.append(Normalize())
    model = st.SentenceTransformer(modules=modules, prompts=PROMPTS, device="cpu")
    folder = tmp / f"st-{kind}-{pooling}-{int(dense)}"
    model.save(str(folder))
    return model, folder


def served(
    version_dir: Path, texts: list[str], prompt_name: str | None, normalize: bool | None = None
) -> np.ndarray:
    """The rows as the server decodes them (prompt included), through the built engine, and
    at unit length where the server scales them (the model's default, or ``normalize``)."""
    manifest = load_manifest(version_dir)
    tokenizer = TextTokenizer(version_dir / manifest.tokenizer_file, manifest.max_length)
    options = RequestOptions(
        truncate=True, timeout_ms=0, prompt_name=prompt_name, normalize=normalize
    )
    scale = Normalization(manifest.normalize, manifest.graph_normalizes).applies(normalize)
    decoded = decode_request(
        {"TEXT": np.array([[t.encode()] for t in texts], dtype=object)},
        options,
        tokenizer,
        Limits(64, manifest.max_length, manifest.vocab_size),
        Prompts(manifest.prompts, manifest.default_prompt_name),
    )
    engine = open_engine(manifest, version_dir)
    from python_backend.engines.base import run_rows

    outputs = np.concatenate(
        [
            run_rows(engine, [row], manifest.buckets[-1].length, manifest.pad_token_id)
            for row in decoded.rows
        ]
    )
    return unit_length(outputs) if scale else outputs


@pytest.mark.parametrize(
    ("kind", "pooling", "dense"),
    [("bert", "mean", True), ("bert", "max", False), ("llama", "lasttoken", True)],
)
def test_served_vectors_equal_sentence_transformers_own(tmp_path, minilm_dir, kind, pooling, dense):
    model, folder = sentence_model(tmp_path, minilm_dir, kind, pooling, dense)
    assert detect_family(folder) == "embedding", "a decoder embedder is an embedding model"
    version = build_onnx(tmp_path / "repo", folder, "st", buckets=(32, 64)).version_dir
    manifest = load_manifest(version)
    assert manifest.output_dim == (16 if dense else 32)
    saved = json.loads((folder / "config_sentence_transformers.json").read_text())["prompts"]
    assert manifest.prompts == saved and PROMPTS.items() <= saved.items()
    for prompt in (None, "query"):
        expected = model.encode(TEXTS, prompt_name=prompt, convert_to_numpy=True)
        got = served(version, TEXTS, prompt)
        assert got.shape == expected.shape
        assert np.abs(got - expected).max() <= 1e-5, f"prompt {prompt}"
    # normalize false: the pipeline's vector before its Normalize module, computed by
    # sentence-transformers itself; true: the default
    assert manifest.normalize
    pooled = st.SentenceTransformer(modules=list(model)[:-1], device="cpu").encode(
        TEXTS, convert_to_numpy=True
    )
    raw = served(version, TEXTS, None, normalize=False)
    assert np.abs(raw - pooled).max() <= 1e-5
    assert np.abs(np.linalg.norm(raw, axis=1) - 1).max() > 1e-2  # not unit vectors
    assert np.abs(served(version, TEXTS, None, normalize=True) - model.encode(TEXTS)).max() <= 1e-5


def test_a_prompt_changes_the_vector_and_an_unknown_one_is_refused(tmp_path, minilm_dir):
    _, folder = sentence_model(tmp_path, minilm_dir, "bert", "mean", False)
    version = build_onnx(tmp_path / "repo", folder, "st", buckets=(32, 64)).version_dir
    plain, query = served(version, TEXTS, None), served(version, TEXTS, "query")
    assert np.abs(plain - query).max() > 1e-3
    from python_backend.common.contract import ServeError

    with pytest.raises(ServeError, match="'summary' is not a prompt of this model"):
        served(version, TEXTS, "summary")


def edit_modules(folder: Path, change) -> None:
    path = folder / "modules.json"
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def test_a_module_that_cannot_be_exported_is_refused_by_name(tmp_path, minilm_dir):
    _, folder = sentence_model(tmp_path, minilm_dir, "bert", "mean", True)
    edit_modules(
        folder,
        lambda mods: [
            *mods,
            {
                "idx": 9,
                "name": "9",
                "path": "9_LayerNorm",
                "type": "sentence_transformers.models.LayerNorm",
            },
        ],
    )
    with pytest.raises(BuildError, match="LayerNorm"):
        build_onnx(tmp_path / "repo", folder, "st", buckets=(32,))


def test_a_dense_activation_that_cannot_be_exported_is_refused_by_name(tmp_path, minilm_dir):
    _, folder = sentence_model(tmp_path, minilm_dir, "bert", "mean", True)
    config = folder / "2_Dense" / "config.json"
    data = json.loads(config.read_text())
    data["activation_function"] = "my_package.Swish"
    config.write_text(json.dumps(data))
    with pytest.raises(BuildError, match=r"my_package\.Swish"):
        build_onnx(tmp_path / "repo", folder, "st", buckets=(32,))


def test_classifier_labels_reach_the_manifest_and_triton(tmp_path, tiny_classifier_dir):
    result = build_onnx(tmp_path / "repo", tiny_classifier_dir, "clf", buckets=(32,))
    assert load_manifest(result.version_dir).labels == ("negative", "neutral", "positive")
    model_dir = result.version_dir.parent
    assert (model_dir / "labels.txt").read_text().split() == ["negative", "neutral", "positive"]
    assert 'label_filename: "labels.txt"' in (model_dir / "config.pbtxt").read_text()


@pytest.mark.parametrize("embedding_type", ["int8", "uint8", "binary", "ubinary", "float"])
def test_quantized_vectors_are_sentence_transformers_own(embedding_type):
    """The /v1 adapter's int8, uint8 and binary vectors, against sentence-transformers'
    ``quantize_embeddings`` over the same ranges."""
    from sentence_transformers.util.quantization import quantize_embeddings

    from openai_api.protocol import encode_vector, quantize

    rng = np.random.default_rng(0)
    calibration = rng.normal(size=(200, 20)).astype(np.float32)
    vectors = rng.normal(size=(5, 20)).astype(np.float32) * 1.3  # some past the ranges: clipped
    ranges = np.stack([calibration.min(axis=0), calibration.max(axis=0)])
    ours = quantize(vectors, embedding_type, (ranges[0].tolist(), ranges[1].tolist()))
    theirs = quantize_embeddings(
        vectors, "float32" if embedding_type == "float" else embedding_type, ranges=ranges
    )
    assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)
    if embedding_type.endswith("binary"):
        assert ours.shape == (5, 3)  # 20 dimensions in 3 bytes
    # base64 carries the raw bytes of that type
    packed = encode_vector(ours[0], "base64")
    assert np.array_equal(np.frombuffer(base64.b64decode(packed), dtype=ours.dtype), ours[0])
