"""Run by build/clients' Python: each client package, with its default settings, against the
server whose address, API key and inputs come as JSON on stdin; prints what each answered as
JSON on stdout (tests/e2e/test_client_packages.py compares it with KServe's answers)."""

from __future__ import annotations

import json
import sys

import cohere
from langchain_openai import OpenAIEmbeddings
from llama_index.core.schema import NodeWithScore, TextNode
from llama_index.embeddings.openai import OpenAIEmbedding
from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference
from llama_index.postprocessor.tei_rerank import TextEmbeddingInference as TEIRerank


def main() -> None:
    given = json.load(sys.stdin)
    base, key, texts = given["base"], given["key"], given["texts"]
    query, documents = given["query"], given["documents"]
    out = {}
    # OpenAI's API at /v1 (LangChain's own token-id chunking off: it tokenizes with tiktoken)
    out["langchain_openai"] = OpenAIEmbeddings(
        model="minilm", base_url=f"{base}/v1", api_key=key, check_embedding_ctx_length=False
    ).embed_documents(texts)
    out["llama_index_openai"] = OpenAIEmbedding(
        model_name="minilm", api_base=f"{base}/v1", api_key=key
    ).get_text_embedding_batch(texts)
    # TEI's routes: /embed of the default model, /rerank of a model named in the address
    out["llama_index_tei"] = TextEmbeddingsInference(
        model_name="minilm", base_url=base, auth_token=key
    ).get_text_embedding_batch(texts)
    nodes = [NodeWithScore(node=TextNode(text=d)) for d in documents]
    ranked = TEIRerank(
        base_url=f"{base}/models/reranker", auth_token=f"Bearer {key}", top_n=2
    ).postprocess_nodes(nodes, query_str=query)
    out["llama_index_tei_rerank"] = [[n.node.get_content(), n.score] for n in ranked]
    # Cohere's v2 API
    co = cohere.ClientV2(api_key=key, base_url=base)
    embedded = co.embed(
        model="minilm",
        texts=texts,
        input_type="search_document",
        embedding_types=["float", "ubinary"],
    )
    out["cohere_embed"] = {
        "float": embedded.embeddings.float_,
        "ubinary": embedded.embeddings.ubinary,
        "input_tokens": embedded.meta.billed_units.input_tokens,
    }
    reranked = co.rerank(model="reranker", query=query, documents=documents, top_n=2)
    out["cohere_rerank"] = [[r.index, r.relevance_score] for r in reranked.results]
    try:
        co.embed(model="nope", texts=["x"], input_type="search_query", embedding_types=["float"])
    except cohere.errors.NotFoundError as err:
        out["cohere_not_found"] = [err.status_code, err.body]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
