"""A cross-encoder (reranker) family: pairs tokenized with token types as a third graph input,
scores equal to transformers run on each pair alone."""

from __future__ import annotations

import numpy as np
import pytest

from builder.families import detect_family
from builder.tiny_models import save_tiny_model
from builder.triton_config import read_config
from python_backend.common.contract import TOKEN_TYPE_INPUT, ServeError, split_token_types
from python_backend.common.decoding import Limits, RequestOptions, decode_request
from python_backend.common.manifest import load_manifest
from python_backend.common.tokenization import TextTokenizer
from python_backend.engines import open_engine
from python_backend.engines.base import run_rows
from tests.builder.test_build import build_onnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

QUERY = "how does the planner group rows"
DOCUMENTS = [
    "It splits the rows sorted by length into groups with an exact dynamic program.",
    "Bananas are yellow.",
    "Each group runs at the bucket of its longest row, " + "padding " * 30,
]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory, minilm_dir):
    folder = save_tiny_model(
        "reranker", tmp_path_factory.mktemp("reranker"), minilm_dir / "tokenizer.json"
    )
    repo = tmp_path_factory.mktemp("repo")
    return folder, build_onnx(repo, folder, "rerank", buckets=(16, 32, 64)).version_dir


def served_rows(version, texts, pairs):
    manifest = load_manifest(version)
    tokenizer = TextTokenizer(version / manifest.tokenizer_file, manifest.max_length)
    inputs = {"TEXT": np.array([[t.encode()] for t in texts], dtype=object)}
    if pairs is not None:
        inputs["TEXT_PAIR"] = np.array([[t.encode()] for t in pairs], dtype=object)
    limits = Limits(64, manifest.max_length, manifest.vocab_size, pairs=manifest.takes_pairs)
    return decode_request(inputs, RequestOptions(True, 0), tokenizer, limits).rows


def test_a_cross_encoder_is_a_reranker_with_three_graph_inputs(reranker):
    folder, version = reranker
    assert detect_family(folder) == "reranker"
    manifest = load_manifest(version)
    assert (manifest.family, manifest.output_name, manifest.output_dim) == ("reranker", "SCORE", 1)
    assert manifest.takes_pairs
    assert manifest.engine_profiles.input_names[-1] == "token_type_ids"
    import onnx

    graph = onnx.load(str(version / manifest.engine_files[0])).graph
    assert [i.name for i in graph.input] == ["input_ids", "attention_mask", TOKEN_TYPE_INPUT]
    config = read_config(version.parent / "config.pbtxt")
    assert "TEXT_PAIR" in [i.name for i in config.input]
    assert [o.name for o in config.output] == ["SCORE", "NUM_TOKENS", "TIMINGS"]


def test_scores_equal_transformers_on_each_pair_alone(reranker):
    folder, version = reranker
    manifest = load_manifest(version)
    rows = served_rows(version, [QUERY] * len(DOCUMENTS), DOCUMENTS)
    ids, types = split_token_types(rows[0])
    assert set(types.tolist()) == {0, 1}, "the pair's second text has token type 1"
    assert ids.min() >= 0 and ids.max() < manifest.vocab_size
    engine = open_engine(manifest, version)
    # all rows in one padded forward, at the bucket of the longest
    length = manifest.buckets[-1].length
    served = run_rows(engine, rows, length, manifest.pad_token_id)[:, 0]
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = [
            model(**tokenizer(QUERY, doc, return_tensors="pt")).logits[0, 0].item()
            for doc in DOCUMENTS
        ]
    assert np.abs(served - np.array(expected)).max() <= 1e-4
    # the pair order matters: the scores are of (query, document), not the reverse
    swapped = served_rows(version, DOCUMENTS, [QUERY] * len(DOCUMENTS))
    assert not np.allclose(
        run_rows(engine, swapped, length, manifest.pad_token_id)[:, 0], served, atol=1e-4
    )


def test_pairs_are_required_by_pair_models_and_refused_by_others(reranker, tmp_path, minilm_dir):
    _, version = reranker
    with pytest.raises(ServeError, match="send TEXT and TEXT_PAIR"):
        served_rows(version, ["only a query"], None)
    with pytest.raises(ServeError, match="TEXT_PAIR must have TEXT's shape"):
        manifest = load_manifest(version)
        tokenizer = TextTokenizer(version / manifest.tokenizer_file, manifest.max_length)
        decode_request(
            {
                "TEXT": np.array([[b"a"], [b"b"]], dtype=object),
                "TEXT_PAIR": np.array([[b"c"]], dtype=object),
            },
            RequestOptions(True, 0),
            tokenizer,
            Limits(64, manifest.max_length, manifest.vocab_size, pairs=True),
        )
    with pytest.raises(ServeError, match="TEXT_PAIR is for pair models"):
        manifest = load_manifest(version)
        tokenizer = TextTokenizer(version / manifest.tokenizer_file, manifest.max_length)
        decode_request(
            {
                "TEXT": np.array([[b"a"]], dtype=object),
                "TEXT_PAIR": np.array([[b"c"]], dtype=object),
            },
            RequestOptions(True, 0),
            tokenizer,
            Limits(64, manifest.max_length, manifest.vocab_size),
        )
