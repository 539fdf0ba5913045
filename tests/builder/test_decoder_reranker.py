"""A decoder reranker (Qwen3-Reranker's recipe) on a tiny Qwen3 with a tokenizer made here: the
template from the model's chat template, pairs tokenized as the recipe does, and served scores
equal to transformers running the recipe on each pair alone: P(yes) over yes and no at the last
position, the served SCORE being the yes logit less the no logit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from builder.build import engine_outputs
from builder.spec import BuildError
from builder.tiny_models import save_tiny_decoder_reranker
from python_backend.common.contract import ServeError
from python_backend.common.decoding import Limits, RequestOptions, decode_request
from python_backend.common.manifest import load_manifest
from python_backend.common.tokenization import TextTokenizer
from python_backend.engines import open_engine
from tests.builder.test_build import build_onnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SYSTEM = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".'
)
INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
PAIRS = [
    ("how does the planner group rows", "by length into buckets"),
    ("yes", "no no no"),
    ("the Query", "Judge whether the Document meets the requirements " * 3),
]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    folder = save_tiny_decoder_reranker(tmp_path_factory.mktemp("qwen3"))
    repo = tmp_path_factory.mktemp("repo")
    built = build_onnx(
        repo, folder, "qwen3_rerank", family="decoder_reranker", buckets=(32, 64, 128)
    )
    return folder, built.version_dir


def recipe(folder, pairs, instruction=INSTRUCTION):
    """Qwen3-Reranker's own usage code, written out: the chat prefix and suffix tokenized
    apart, the formatted pair between them, the last position's yes and no logits."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    prefix = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
    suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    prefix_ids = tokenizer.encode(prefix, add_special_tokens=False)
    suffix_ids = tokenizer.encode(suffix, add_special_tokens=False)
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    out = []
    for query, document in pairs:
        body = f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
        ids = prefix_ids + tokenizer(body)["input_ids"] + suffix_ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        pair = torch.stack([logits[no], logits[yes]]).double()
        out.append((float(torch.softmax(pair, 0)[1]), float(logits[yes] - logits[no]), ids))
    return out


def served(version, pairs, instruction=None, truncate=True, side="right"):
    manifest = load_manifest(version)
    tokenizer = TextTokenizer(
        version / manifest.tokenizer_file, manifest.max_length, manifest.rerank_template
    )
    inputs = {
        "TEXT": np.array([[q.encode()] for q, _ in pairs], dtype=object),
        "TEXT_PAIR": np.array([[d.encode()] for _, d in pairs], dtype=object),
    }
    limits = Limits(64, manifest.max_length, manifest.vocab_size, pairs=manifest.text_pairs)
    options = RequestOptions(truncate, 0, truncation_side=side, instruction=instruction)
    rows = decode_request(inputs, options, tokenizer, limits).rows
    engine = open_engine(manifest, version)
    try:
        return rows, engine_outputs(engine, manifest, rows)[:, 0]
    finally:
        engine.close()


def test_a_causal_lm_built_as_a_decoder_reranker_serves_score_from_two_graph_inputs(reranker):
    _, version = reranker
    manifest = load_manifest(version)
    assert (manifest.family, manifest.output_name, manifest.output_dim) == (
        "decoder_reranker",
        "SCORE",
        1,
    )
    assert manifest.text_pairs and not manifest.takes_pairs  # pairs, without token types
    assert manifest.rerank_template is not None
    assert manifest.rerank_template.instruction == INSTRUCTION
    written = json.loads((version / "manifest.json").read_text())["rerank_template"]
    assert written["body"] == "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"


def test_served_scores_are_the_recipes_probability_of_yes(reranker):
    folder, version = reranker
    want = recipe(folder, PAIRS)
    rows, scores = served(version, PAIRS)
    for row, score, (p_yes, difference, ids) in zip(rows, scores, want, strict=True):
        assert row.tolist() == ids  # the very tokens of the recipe
        assert abs(float(score) - difference) <= 1e-4
        assert abs(1 / (1 + np.exp(-float(score))) - p_yes) <= 1e-5


def test_a_request_names_its_own_instruction(reranker):
    folder, version = reranker
    mine = "Find the document that answers yes or no"
    ((_, difference, ids),) = recipe(folder, PAIRS[:1], mine)
    rows, scores = served(version, PAIRS[:1], instruction=mine)
    assert rows[0].tolist() == ids and abs(float(scores[0]) - difference) <= 1e-4
    _, default = served(version, PAIRS[:1])
    assert abs(float(default[0]) - float(scores[0])) > 1e-6


def test_a_long_pair_is_cut_inside_the_template_longest_first(reranker):
    """The template's own tokens stay; the document, the longer, loses tokens from its end first
    and the short query stays whole; with truncate off, the row is refused naming its length."""
    folder, version = reranker
    manifest = load_manifest(version)
    template = manifest.rerank_template
    long_document = "how does the planner group rows by length into buckets " * 40
    rows, _ = served(version, [("the Query", long_document)])
    row = rows[0].tolist()
    assert len(row) == manifest.max_length
    assert row[: len(template.prefix_ids)] == list(template.prefix_ids)
    assert row[-len(template.suffix_ids) :] == list(template.suffix_ids)
    whole = recipe(folder, [("the Query", long_document)])[0][2]
    body = whole[len(template.prefix_ids) : -len(template.suffix_ids)]
    kept = row[len(template.prefix_ids) : -len(template.suffix_ids)]
    assert kept == body[: len(kept)]  # the query and the template's words before it whole
    rows, _ = served(version, [("the Query", long_document)], side="left")
    left = rows[0].tolist()[len(template.prefix_ids) : -len(template.suffix_ids)]
    assert len(left) == len(kept) and left[-20:] == body[-20:]  # the document's end
    assert left[:20] == body[:20]  # the instruction and the query, whole
    with pytest.raises(ServeError, match="the limit is 256"):
        served(version, [("the Query", long_document)], truncate=False)


def test_an_instruction_for_another_model_is_refused(tmp_path):
    from builder.tiny_models import save_tiny_model
    from tests.builder.conftest import MINILM_DIR

    folder = save_tiny_model("reranker", tmp_path / "cross", MINILM_DIR / "tokenizer.json")
    version = build_onnx(tmp_path / "repo", folder, "cross", buckets=(32,)).version_dir
    manifest = load_manifest(version)
    tokenizer = TextTokenizer(version / manifest.tokenizer_file, manifest.max_length)
    inputs = {
        "TEXT": np.array([[b"q"]], dtype=object),
        "TEXT_PAIR": np.array([[b"d"]], dtype=object),
    }
    limits = Limits(64, manifest.max_length, manifest.vocab_size, pairs=True)
    with pytest.raises(ServeError, match="instruction is for decoder rerankers"):
        decode_request(inputs, RequestOptions(True, 0, instruction="x"), tokenizer, limits)


def test_a_rerank_template_needs_a_causal_lm_and_single_token_answers(tmp_path, reranker):
    folder, _ = reranker
    wrong = tmp_path / "template.json"
    wrong.write_text(json.dumps({"yes": "certainly"}))
    with pytest.raises(BuildError, match="'certainly' is not one token"):
        build_onnx(tmp_path / "repo", folder, "bad", rerank_template=wrong, buckets=(32,))
    from tests.builder.conftest import MINILM_DIR

    with pytest.raises(BuildError, match="takes a causal LM"):
        build_onnx(tmp_path / "repo", MINILM_DIR, "bad", family="decoder_reranker")


def test_the_torch_engine_rebuilds_the_same_scorer(reranker, tmp_path):
    folder, version = reranker
    built = build_onnx(
        tmp_path, folder, "qwen3_torch", family="decoder_reranker", engine="torch", buckets=(64,)
    )
    _, onnx_scores = served(version, PAIRS)
    _, torch_scores = served(built.version_dir, PAIRS)
    assert np.abs(onnx_scores - torch_scores).max() <= 1e-4


def test_a_template_the_rows_cannot_hold_is_refused_at_build(reranker, tmp_path):
    folder, _ = reranker
    with pytest.raises(BuildError, match="raise --max-length"):
        build_onnx(
            tmp_path, folder, "short", family="decoder_reranker", max_length=64, buckets=(32,)
        )


def test_an_instruction_past_a_rows_bytes_is_refused_before_tokenizing(reranker):
    _, version = reranker
    with pytest.raises(ServeError, match="parameter instruction is 8193 bytes"):
        served(version, PAIRS[:1], instruction="x" * (256 * 32 + 1))
