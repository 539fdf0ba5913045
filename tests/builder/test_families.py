"""The family table: one record per family of the contract, detection by the first test that
holds, and the reference run fed by the family's own graph inputs."""

from __future__ import annotations

import json

import pytest

from builder.families import (
    FALLBACK_FAMILY,
    FAMILY_TABLE,
    detect_family,
    load_model,
)
from python_backend.common.contract import FAMILIES, FAMILY_CONTRACTS


def test_every_family_of_the_contract_has_exactly_one_record():
    assert sorted(f.name for f in FAMILY_TABLE) == sorted(FAMILIES)
    assert FALLBACK_FAMILY in FAMILIES
    for family in FAMILY_TABLE:
        assert family.output_name == FAMILY_CONTRACTS[family.name].output_name
        assert family.input_names == FAMILY_CONTRACTS[family.name].input_names


@pytest.mark.parametrize(
    ("config", "modules", "family"),
    [
        ({"architectures": ["BertModel"]}, None, "embedding"),  # no head: the fallback
        ({"architectures": ["BertForSequenceClassification"], "num_labels": 3}, None, "classifier"),
        ({"architectures": ["BertForSequenceClassification"], "id2label": {"0": "s"}}, None, "reranker"),
        ({"architectures": ["LlamaForCausalLM"]}, None, "decoder"),
        ({"architectures": ["GPT2LMHeadModel"]}, None, "decoder"),
        # a pooling module wins over the architecture: a decoder embedder
        ({"architectures": ["LlamaForCausalLM"]}, [{"type": "Pooling", "path": "1_Pooling"}], "embedding"),
    ],
)  # fmt: skip
def test_detection_takes_the_first_record_whose_test_holds(tmp_path, config, modules, family):
    (tmp_path / "config.json").write_text(json.dumps(config))
    if modules:
        (tmp_path / "modules.json").write_text(json.dumps(modules))
    assert detect_family(tmp_path) == family


def test_score_token_ids_are_refused_for_families_that_take_none(tiny_classifier_dir):
    with pytest.raises(ValueError, match="--score-token-ids applies to decoder models only"):
        load_model(tiny_classifier_dir, score_token_ids=[1])
    with pytest.raises(ValueError, match="--family must be one of"):
        load_model(tiny_classifier_dir, family="seq2seq")
