"""A decoder reranker's prompt template (``contract.RerankTemplate``), from ``--rerank-template``
and the model's own files.

A causal LM judges a (query, document) pair as Qwen3-Reranker's recipe does: a system message
that asks for "yes" or "no", a user message holding the instruction, the query and the
document (``body``), the model's generation prompt; the score is the "yes" logit less the "no"
logit at the last position. The prefix and suffix around the body come from the model's chat
template (``tokenizer_config.json``), rendered with the system message and without thinking;
``--rerank-template FILE`` (JSON) may set any of ``system``, ``body``, ``instruction``, ``yes``,
``no``, and ``prefix`` with ``suffix`` for a model without a chat template.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from python_backend.common.contract import RerankTemplate

# Qwen3-Reranker's own recipe (its model card), the defaults
DEFAULTS = {
    "system": "Judge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".',
    "body": "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",
    "instruction": "Given a web search query, retrieve relevant passages that answer the query",
    "yes": "yes",
    "no": "no",
}
KEYS = (*DEFAULTS, "prefix", "suffix")
MARK = "\x00BODY\x00"  # where the body goes in the rendered chat template


def read_overrides(path: Path | None) -> dict[str, str]:
    """``--rerank-template``'s settings (a JSON object of strings), checked."""
    if path is None:
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"--rerank-template {path}: {err}") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ValueError(f"--rerank-template {path} must be a JSON object of strings")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ValueError(f"--rerank-template {path}: unknown keys {unknown}; known: {list(KEYS)}")
    if ("prefix" in data) != ("suffix" in data):
        raise ValueError(f"--rerank-template {path}: give prefix and suffix together")
    return data


def resolve(model_dir: Path, overrides: dict[str, str]) -> RerankTemplate:
    """The template for the model in ``model_dir`` (its tokenizer, its chat template)."""
    from transformers import AutoTokenizer

    settings = {**DEFAULTS, **overrides}
    tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
    if "prefix" in settings:
        prefix, suffix = settings["prefix"], settings["suffix"]
    else:
        prefix, suffix = around_body(tokenizer, settings["system"])
    ids = {}
    for answer in ("yes", "no"):
        token = settings[answer]
        found = tokenizer.convert_tokens_to_ids(token)
        if found is None or found == tokenizer.unk_token_id or found < 0:
            raise ValueError(
                f"the answer {token!r} is not one token of this model's vocabulary: name the "
                f"token in --rerank-template's {answer!r}"
            )
        ids[answer] = int(found)
    if ids["yes"] == ids["no"]:
        raise ValueError(f"the answers yes and no are the same token ({ids['yes']})")
    return RerankTemplate(
        prefix_ids=tuple(tokenizer.encode(prefix, add_special_tokens=False)),
        body=settings["body"],
        suffix_ids=tuple(tokenizer.encode(suffix, add_special_tokens=False)),
        instruction=settings["instruction"],
        yes_id=ids["yes"],
        no_id=ids["no"],
    )


def around_body(tokenizer: Any, system: str) -> tuple[str, str]:
    """The chat template rendered around the user message: (before it, after it), the
    assistant's turn opened without thinking."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the model has no chat template to place the pair in: give prefix and suffix in "
            "--rerank-template"
        )
    rendered = tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": MARK}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    if not isinstance(rendered, str) or rendered.count(MARK) != 1:
        raise ValueError("the model's chat template did not place the user message once")
    prefix, suffix = rendered.split(MARK)
    return prefix, suffix
