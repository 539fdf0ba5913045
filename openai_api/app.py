"""The routes: ``POST /v1/embeddings``, ``POST /v1/rerank``, ``POST /v1/classify``,
``GET /v1/models``, ``GET /v1/models/{model}``; ``POST /v1/tokenize``, ``POST /v1/decode`` and
``GET /v1/info``, answered from the model's own files (``model_files``); TEI's routes in TEI's
shapes (``openai_api.tei``), each the same operation as its ``/v1`` route; and ``GET /health``
for the launcher (the front door does not pass it)."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from openai_api import cohere_v2, tei
from openai_api.backend import (
    EMBEDDING_OUTPUT,
    LOGITS_OUTPUT,
    SCORE_OUTPUT,
    ModelInfo,
    Served,
    TritonBackend,
    callers,
    check_dimensions,
)
from openai_api.errors import WRONG_MODEL, OpenAIError, bad_request, model_refusal
from openai_api.model_files import ModelRepository
from openai_api.protocol import (
    MAX_INPUTS,
    RANKING_NAMES,
    ClassifyQuery,
    DecodeQuery,
    EmbeddingsQuery,
    InputLimits,
    RerankQuery,
    TokenizeQuery,
    classify_response,
    embeddings_response,
    model_card,
    named_as_sent,
    parse_classify,
    parse_decode,
    parse_embeddings,
    parse_instruction,
    parse_priority,
    parse_ranking,
    parse_rerank,
    parse_tokenize,
    parse_truncation,
    quantize,
    ranking_response,
    rerank_response,
    shorten,
    tokens_response,
)
from python_backend.common.contract import TRUNCATION_SIDES, ServeError

# /v1/tokenize with truncation off: a text of more characters than this many per token of the
# model's limit is refused before it is tokenized (TEI's bound: 250 x max_input_length)
UNTRUNCATED_CHARS_PER_TOKEN = 250


class FastJSONResponse(JSONResponse):
    """JSON written by orjson: vectors go out straight from numpy, several times faster than
    the standard library's float formatting, which dominates a large embeddings answer."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


# TEI's defaults where they differ from /v1's: /embed normalizes, /tokenize cuts nothing
TEI_NORMALIZE = {"normalize": True}
TEI_WHOLE = {"truncate": False}
TEI_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
# the model's kind as TEI's /info names it, by family
TEI_KINDS = {"classifier": "classifier", "reranker": "reranker", "decoder_reranker": "reranker"}


def class_names(labels: tuple[str, ...], classes: int) -> tuple[str, ...]:
    """The model's class names, ``LABEL_i`` where it names none (as transformers does)."""
    return labels or tuple(f"LABEL_{i}" for i in range(classes))


async def json_body(request: Request) -> Any:
    try:
        return orjson.loads(await request.body())
    except orjson.JSONDecodeError as err:
        raise bad_request(f"the request body is not valid JSON: {err}") from None


LOG = logging.getLogger("openai_api")


def caller_of(request: Request) -> dict[str, str]:
    """Who sent it, as the front door named them (its headers, set over the client's own)."""
    return callers(request.headers)


T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def unless_disconnected(request: Any, work: Awaitable[T]) -> T:
    """``work``'s result, unless the client disconnects first: then the work is cancelled (its
    gRPC calls with it, so the model drops their rows before they cost a forward)."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise ClientGone()
    return task.result()


def project_version() -> str:
    try:
        return importlib.metadata.version("triton-batch-planner")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def create_app(
    backend: TritonBackend,
    limits: InputLimits | None = None,
    repository: ModelRepository | None = None,
    default_model: str | None = None,
) -> Starlette:
    limits = limits or InputLimits()
    repository = repository or ModelRepository(None)

    async def model_serving(name: str, output: str, refusal: str) -> ModelInfo:
        """The served model, if it answers ``output``; else a 400 saying what it answers."""
        info = await backend.info(name)
        if info.output_name != output:
            raise bad_request(
                f"model `{info.name}` {refusal} (it answers {info.output_name})",
                param="model",
                code=WRONG_MODEL,
            )
        return info

    async def embedded(request: Request, query: EmbeddingsQuery) -> tuple[Any, Served]:
        """The query's vectors, shortened and quantized as it asks, and what the model served."""
        vectors, served = await embedded_as(request, query, (query.embedding_type,))
        return vectors[query.embedding_type], served

    async def embedded_as(
        request: Request,
        query: EmbeddingsQuery,
        types: tuple[str, ...],
        types_field: str = "embedding_type",
    ) -> tuple[dict[str, Any], Served]:
        """The query's vectors, shortened as it asks, as each of ``types`` (EMBEDDING_TYPES;
        base64 is the float vectors; ``types_field`` asked for them), from one forward."""
        info = await model_serving(query.model, EMBEDDING_OUTPUT, "does not serve embeddings")
        check_dimensions(info, query.dimensions)
        ranges = None
        if any(t.endswith("int8") for t in types):
            ranges = int8_ranges(info, query.dimensions or info.output_dim, types_field)
        served = await unless_disconnected(
            request,
            backend.embed(
                info,
                query.texts,
                query.token_rows,
                query.prompt_name,
                caller_of(request),
                query.truncation,
                query.normalize,
                query.priority,
            ),
        )
        vectors = served.outputs
        if query.dimensions is not None and query.dimensions != info.output_dim:
            normalized = query.normalize
            if normalized is None:  # the model's default: its manifest's
                normalized = (
                    repository.files(info.name).manifest.normalize
                    if repository.root is not None
                    else True
                )
            vectors = shorten(vectors, query.dimensions, normalized)
        typed = {t: quantize(vectors, "float" if t == "base64" else t, ranges) for t in types}
        return typed, served

    async def embeddings(request: Request) -> Response:
        started = time.perf_counter()
        query = parse_embeddings(await json_body(request), limits)
        vectors, served = await embedded(request, query)
        return FastJSONResponse(
            embeddings_response(query.model, vectors, query.encoding_format, served.tokens),
            headers=served.headers(started),
        )

    async def reranked(
        request: Request, query: RerankQuery, refusal: str = "is not a reranker"
    ) -> Served:
        info = await model_serving(query.model, SCORE_OUTPUT, refusal)
        return await unless_disconnected(
            request,
            backend.rerank(
                info,
                query.query,
                query.documents,
                caller_of(request),
                query.truncation,
                query.priority,
                query.field,
                query.instruction,
            ),
        )

    async def rerank(request: Request) -> Response:
        started = time.perf_counter()
        query = parse_rerank(await json_body(request), limits)
        served = await reranked(request, query)
        return FastJSONResponse(
            rerank_response(query, served.outputs[:, 0], served.tokens),
            headers=served.headers(started),
        )

    def int8_ranges(info: ModelInfo, dimensions: int, field: str) -> Any:
        """The model's calibrated per-dimension ranges at ``dimensions``, or a 400 saying why
        there are none."""
        ranges = repository.files(info.name).quantization_ranges(dimensions)
        if ranges is None:
            raise bad_request(
                f"model `{info.name}` was built without a text sample to calibrate int8 and uint8 "
                "ranges on (build it with --texts-file); binary and ubinary need none",
                param=field,
            )
        return ranges

    async def classified(request: Request, query: ClassifyQuery) -> tuple[Served, tuple[str, ...]]:
        """The model's logits for each input, and its class names."""
        info = await model_serving(query.model, LOGITS_OUTPUT, "does not classify")
        labels: tuple[str, ...] = ()
        if repository.root is not None:
            manifest = repository.files(info.name).manifest
            if manifest.family != "classifier":
                raise bad_request(
                    f"model `{info.name}` is a {manifest.family} model, not a classifier",
                    param="model",
                    code=WRONG_MODEL,
                )
            labels = manifest.labels
        served = await unless_disconnected(
            request,
            backend.embed(
                info,
                query.texts,
                query.token_rows,
                caller=caller_of(request),
                truncation=query.truncation,
                priority=query.priority,
            ),
        )
        return served, labels

    async def classify(request: Request) -> Response:
        started = time.perf_counter()
        query = parse_classify(await json_body(request), limits)
        served, labels = await classified(request, query)
        return FastJSONResponse(
            classify_response(query.model, served.outputs, labels, served.tokens, int(time.time())),
            headers=served.headers(started),
        )

    async def tokenize(request: Request) -> Response:
        return FastJSONResponse(await tokens(parse_tokenize(await json_body(request), limits)))

    async def tokens(query: TokenizeQuery) -> list[Any]:
        info = await backend.info(query.model)
        files = repository.files(info.name)
        try:
            prompt = files.prompts.prefix(query.prompt_name)
        except ServeError as err:
            raise model_refusal(str(err)) from None
        truncate = query.truncation.truncate
        truncate = info.truncate_default if truncate is None else truncate
        if not truncate:  # every token answered: bounded before tokenizing, as TEI bounds it
            bound = UNTRUNCATED_CHARS_PER_TOKEN * files.tokenizer.max_length
            for i, text in enumerate(query.texts):
                if len(text) > bound:
                    raise bad_request(
                        f"`inputs[{i}]` has {len(text)} characters; with truncation off at most "
                        f"{bound} ({UNTRUNCATED_CHARS_PER_TOKEN} per token of the model's "
                        f"{files.tokenizer.max_length})",
                        param="inputs",
                    )
        # tokenizing runs off the event loop: every other route keeps answering meanwhile
        try:
            rows = await asyncio.to_thread(
                files.tokenizer.spans,
                query.texts,
                truncate,
                query.truncation.side or TRUNCATION_SIDES[0],
                prompt,
                limits.max_tokens_per_request,
            )
        except ValueError as err:
            raise bad_request(f"`inputs` hold {err}", param="inputs") from None
        return tokens_response(rows, query.add_special_tokens)

    async def decode(request: Request) -> Response:
        return FastJSONResponse(await decoded(parse_decode(await json_body(request), limits)))

    async def decoded(query: DecodeQuery) -> list[str]:
        info = await backend.info(query.model)
        files = repository.files(info.name)
        vocab = files.manifest.vocab_size
        for i, row in enumerate(query.rows):
            bad = next((t for t in row if t >= vocab), None)
            if bad is not None:
                raise bad_request(
                    f"`ids[{i}]` holds the token id {bad}; this model's ids lie in [0, {vocab})",
                    param="ids",
                )
        return list(
            await asyncio.to_thread(files.tokenizer.decode, query.rows, query.skip_special_tokens)
        )

    async def model_info(request: Request) -> Response:
        name = request.query_params.get("model")
        if name is None:
            if len(backend.models) != 1:
                raise bad_request(
                    "name the model: /v1/info?model=NAME (this adapter serves "
                    f"{len(backend.models)})",
                    param="model",
                )
            name = backend.models[0]
        return FastJSONResponse(await info_of(name))

    async def info_of(name: str) -> dict[str, Any]:
        """The model's facts in TEI's ``/info`` shape, and this project's beside them."""
        info = await backend.info(name)
        files = repository.files(info.name)
        manifest = files.manifest
        family: dict[str, Any] = {}
        if manifest.family == "embedding":
            pooling = str(manifest.source.get("pooling") or "mean")
            family = {"pooling": pooling, "dimension": info.output_dim}
        elif manifest.labels or manifest.family in TEI_KINDS:
            labels = class_names(manifest.labels, info.output_dim)
            family = {
                "id2label": {str(i): label for i, label in enumerate(labels)},
                "label2id": {label: i for i, label in enumerate(labels)},
            }
        return {
            "model_id": info.name,
            "served_model_name": info.name,
            "model_sha": None,
            "model_dtype": TEI_DTYPES.get(manifest.precision, manifest.precision),
            "model_type": {TEI_KINDS.get(manifest.family, manifest.family): family},
            "family": manifest.family,
            "max_input_length": files.longest_row,
            "max_client_batch_size": MAX_INPUTS,
            "max_batch_requests": manifest.max_batch,
            "max_batch_tokens": manifest.max_batch * files.longest_row,
            "max_concurrent_requests": info.max_queue_rows,
            "tokenization_workers": os.cpu_count() or 1,
            "auto_truncate": info.truncate_default,
            "max_rows_per_request": info.max_rows,
            "max_tokens_per_input": limits.max_tokens_per_input,
            "max_tokens_per_request": limits.max_tokens_per_request,
            "buckets": [b.length for b in manifest.buckets],
            "max_batch_rows": manifest.max_batch,
            "truncate_default": info.truncate_default,
            "prompts": sorted(manifest.prompts),
            "normalize": manifest.normalize,
            # int8 and uint8 vectors are cut from these (min, max) per dimension
            "quantization_ranges": manifest.quantization_ranges,
            "engine": manifest.engine_kind,
            "precision": manifest.precision,
            "version": project_version(),
            "sha": None,
            "docker_label": None,
        }

    # -- TEI's routes (openai_api.tei): the same operations, in TEI's shapes ----------------------

    def tei_model(request: Request) -> str:
        """The route's model; the bare routes serve the default one (the first served)."""
        return str(request.path_params.get("model") or default_model or backend.models[0])

    async def tei_embed(request: Request) -> Response:
        started = time.perf_counter()
        with tei.named_as_sent("embed"):
            body = await json_body(request)
            body = tei.as_v1(body, tei_model(request), "embed", TEI_NORMALIZE)
            query = parse_embeddings(body, limits)
            vectors, served = await embedded(request, query)
        return FastJSONResponse(vectors, headers=served.headers(started))

    async def tei_rerank(request: Request) -> Response:
        started = time.perf_counter()
        with tei.named_as_sent("rerank"):
            body = tei.as_v1(await json_body(request), tei_model(request), "rerank")
            query = parse_rerank(body, limits)
            served = await reranked(request, query)
        return FastJSONResponse(
            tei.rerank_response(query, served.outputs[:, 0]), headers=served.headers(started)
        )

    async def tei_predict(request: Request) -> Response:
        """A classifier's classes for texts, or a reranker's score for (text, text) pairs."""
        started = time.perf_counter()
        model = tei_model(request)
        with tei.named_as_sent("predict"):
            body = await json_body(request)
            inputs = tei.parse_predict(body, MAX_INPUTS, limits)
            v1 = tei.as_v1(body, model, "predict")
            if inputs.pairs:
                pairs = RerankQuery(
                    model,
                    [row[0] for row in inputs.rows],
                    [row[1] for row in inputs.rows],
                    None,
                    False,
                    inputs.raw_scores,
                    parse_truncation(v1),
                    parse_priority(v1),
                    "inputs",
                    parse_instruction(v1, limits),
                )
                served = await reranked(request, pairs, "scores single texts, not pairs")
                labels = repository.files(model).manifest.labels if repository.root else ()
            else:
                v1["input"] = [row[0] for row in inputs.rows]
                served, labels = await classified(request, parse_classify(v1, limits))
        return FastJSONResponse(
            tei.predictions(served.outputs, labels, inputs.raw_scores, inputs.single),
            headers=served.headers(started),
        )

    async def tei_tokenize(request: Request) -> Response:
        with tei.named_as_sent("tokenize"):
            body = tei.as_v1(await json_body(request), tei_model(request), "tokenize", TEI_WHOLE)
            return FastJSONResponse(await tokens(parse_tokenize(body, limits)))

    async def tei_decode(request: Request) -> Response:
        with tei.named_as_sent("decode"):
            body = tei.as_v1(await json_body(request), tei_model(request), "decode")
            return FastJSONResponse(await decoded(parse_decode(body, limits)))

    async def tei_info(request: Request) -> Response:
        return FastJSONResponse(await info_of(tei_model(request)))

    async def tei_similarity(request: Request) -> Response:
        """Each sentence's cosine with the source sentence, from one forward of them all."""
        started = time.perf_counter()
        with tei.named_as_sent("similarity"):
            body = tei.similarity_body(
                await json_body(request), tei_model(request), limits, MAX_INPUTS
            )
            vectors, served = await embedded(request, parse_embeddings(body, limits))
        cosines = np.asarray(vectors[1:], dtype=np.float64) @ np.asarray(vectors[0])
        return FastJSONResponse(cosines.astype(np.float32), headers=served.headers(started))

    async def tei_unserved(request: Request) -> Response:
        raise bad_request(
            "token embeddings (/embed_all) and sparse vectors (/embed_sparse) are not served "
            "here: the models answer pooled vectors (/embed)",
            code=WRONG_MODEL,
        )

    async def tei_root(request: Request) -> Response:
        """``POST /``: what TEI answers there for the model's kind."""
        info = await backend.info(tei_model(request))
        route = {EMBEDDING_OUTPUT: tei_embed, SCORE_OUTPUT: tei_rerank}.get(info.output_name)
        return await (route or tei_predict)(request)

    # -- Cohere's v2 routes (openai_api.cohere_v2) and NIM's ranking -----------------------------

    async def cohere_embed(request: Request) -> Response:
        started = time.perf_counter()
        body = await json_body(request)
        with cohere_v2.named_as_sent("embed"):
            query = parse_embeddings(cohere_v2.as_v1(body, "embed"), limits)
            info = await backend.info(query.model)
            prompts = repository.files(info.name).manifest.prompts if repository.root else {}
            types, prompt = cohere_v2.embed_options(body, prompts)
            query = dataclasses.replace(query, prompt_name=prompt)
            if query.texts is None:
                raise bad_request("`texts` must be a non-empty list of strings", param="texts")
            vectors, served = await embedded_as(request, query, types, "embedding_types")
        return FastJSONResponse(
            cohere_v2.embed_response(query.texts, vectors, served.tokens),
            headers=served.headers(started),
        )

    async def cohere_rerank(request: Request) -> Response:
        started = time.perf_counter()
        with cohere_v2.named_as_sent("rerank"):
            query = parse_rerank(cohere_v2.as_v1(await json_body(request), "rerank"), limits)
            served = await reranked(request, query)
        return FastJSONResponse(
            cohere_v2.rerank_response(query, served.outputs[:, 0]),
            headers=served.headers(started),
        )

    async def ranking(request: Request) -> Response:
        started = time.perf_counter()
        with named_as_sent(RANKING_NAMES):
            query = parse_ranking(await json_body(request), limits)
            served = await reranked(request, query)
        return FastJSONResponse(
            ranking_response(query, served.outputs[:, 0], served.tokens),
            headers=served.headers(started),
        )

    async def models(request: Request) -> Response:
        ready = await backend.ready_models()
        return JSONResponse(
            {"object": "list", "data": [model_card(m.name, m.created) for m in ready]}
        )

    async def model(request: Request) -> Response:
        info = await backend.info(request.path_params["model"])
        return JSONResponse(model_card(info.name, info.created))

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def openai_error(request: Request, exc: Exception) -> Response:
        """The adapter's refusal, in the error shape of the route's API."""
        assert isinstance(exc, OpenAIError)
        path = request.url.path
        status, body = (
            cohere_v2.error(exc)
            if path.startswith("/v2/")
            else tei.error(exc)
            if tei.is_tei(path)
            else (exc.status, exc.body())
        )
        return JSONResponse(body, status_code=status)

    async def client_gone(request: Request, exc: Exception) -> Response:
        # nobody reads it: nginx's 499, for the adapter's own access log
        return Response(status_code=499)

    async def unexpected(request: Request, exc: Exception) -> Response:
        # the client reads no exception text (it may hold the adapter's internals): the log does
        LOG.error("internal error on %s", request.url.path, exc_info=exc)
        message = "internal error: the adapter's log says why"
        return await openai_error(request, OpenAIError(500, message, kind="server_error"))

    async def not_found(request: Request, exc: Exception) -> Response:
        message = f"no route {request.method} {request.url.path}"
        return await openai_error(request, OpenAIError(404, message))

    async def not_allowed(request: Request, exc: Exception) -> Response:
        message = f"method {request.method} is not allowed on {request.url.path}"
        return await openai_error(request, OpenAIError(405, message))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await backend.close()

    handlers: dict[Any, Any] = {
        OpenAIError: openai_error,
        ClientGone: client_gone,
        404: not_found,
        405: not_allowed,
        Exception: unexpected,
    }
    return Starlette(
        routes=[
            Route("/v1/embeddings", embeddings, methods=["POST"]),
            Route("/v1/rerank", rerank, methods=["POST"]),
            Route("/v1/classify", classify, methods=["POST"]),
            Route("/v1/tokenize", tokenize, methods=["POST"]),
            Route("/v1/decode", decode, methods=["POST"]),
            Route("/v1/info", model_info, methods=["GET"]),
            Route("/v1/ranking", ranking, methods=["POST"]),
            Route("/v2/embed", cohere_embed, methods=["POST"]),
            Route("/v2/rerank", cohere_rerank, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{model}", model, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            *(
                Route(prefix + path, endpoint, methods=[method])
                for prefix in ("", "/models/{model}")
                for path, endpoint, method in (
                    ("/embed", tei_embed, "POST"),
                    ("/rerank", tei_rerank, "POST"),
                    ("/predict", tei_predict, "POST"),
                    ("/tokenize", tei_tokenize, "POST"),
                    ("/decode", tei_decode, "POST"),
                    ("/info", tei_info, "GET"),
                    ("/similarity", tei_similarity, "POST"),
                    ("/invocations", tei_root, "POST"),  # SageMaker's name for POST /
                    ("/embed_all", tei_unserved, "POST"),
                    ("/embed_sparse", tei_unserved, "POST"),
                )
            ),
            Route("/", tei_root, methods=["POST"]),
            Route("/", health, methods=["GET"]),  # TEI's health check
            Route("/models/{model}", tei_root, methods=["POST"]),
        ],
        exception_handlers=handlers,
        lifespan=lifespan,
    )
