"""The routes: ``POST /v1/embeddings``, ``POST /v1/rerank``, ``POST /v1/classify``,
``GET /v1/models``, ``GET /v1/models/{model}``; ``POST /v1/tokenize``, ``POST /v1/decode`` and
``GET /v1/info``, answered from the model's own files (``model_files``); and ``GET /health`` for
the launcher (the front door does not pass it)."""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from openai_api.backend import (
    EMBEDDING_OUTPUT,
    LOGITS_OUTPUT,
    SCORE_OUTPUT,
    ModelInfo,
    TritonBackend,
    callers,
    check_dimensions,
)
from openai_api.errors import OpenAIError, bad_request, error_body, model_refusal
from openai_api.model_files import ModelRepository
from openai_api.protocol import (
    MAX_INPUTS,
    InputLimits,
    classify_response,
    embeddings_response,
    model_card,
    parse_classify,
    parse_decode,
    parse_embeddings,
    parse_rerank,
    parse_tokenize,
    quantize,
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
) -> Starlette:
    limits = limits or InputLimits()
    repository = repository or ModelRepository(None)

    async def model_serving(name: str, output: str, refusal: str) -> ModelInfo:
        """The served model, if it answers ``output``; else a 400 saying what it answers."""
        info = await backend.info(name)
        if info.output_name != output:
            raise bad_request(
                f"model `{info.name}` {refusal} (it answers {info.output_name})", param="model"
            )
        return info

    async def embeddings(request: Request) -> Response:
        started = time.perf_counter()
        query = parse_embeddings(await json_body(request), limits)
        info = await model_serving(query.model, EMBEDDING_OUTPUT, "does not serve embeddings")
        check_dimensions(info, query.dimensions)
        ranges = None
        if query.embedding_type.endswith("int8"):
            ranges = int8_ranges(info, query.dimensions or info.output_dim)
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
        vectors = quantize(vectors, query.embedding_type, ranges)
        return FastJSONResponse(
            embeddings_response(query.model, vectors, query.encoding_format, served.tokens),
            headers=served.headers(started),
        )

    async def rerank(request: Request) -> Response:
        started = time.perf_counter()
        query = parse_rerank(await json_body(request), limits)
        info = await model_serving(query.model, SCORE_OUTPUT, "is not a reranker")
        served = await unless_disconnected(
            request,
            backend.rerank(
                info,
                query.query,
                query.documents,
                caller_of(request),
                query.truncation,
                query.priority,
            ),
        )
        return FastJSONResponse(
            rerank_response(query, served.outputs[:, 0], served.tokens),
            headers=served.headers(started),
        )

    def int8_ranges(info: ModelInfo, dimensions: int) -> Any:
        """The model's calibrated per-dimension ranges at ``dimensions``, or a 400 saying why
        there are none."""
        ranges = repository.files(info.name).quantization_ranges(dimensions)
        if ranges is None:
            raise bad_request(
                f"model `{info.name}` was built without a text sample to calibrate int8 and uint8 "
                "ranges on (build it with --texts-file); binary and ubinary need none",
                param="embedding_type",
            )
        return ranges

    async def classify(request: Request) -> Response:
        started = time.perf_counter()
        query = parse_classify(await json_body(request), limits)
        info = await model_serving(query.model, LOGITS_OUTPUT, "does not classify")
        labels: tuple[str, ...] = ()
        if repository.root is not None:
            manifest = repository.files(info.name).manifest
            if manifest.family != "classifier":
                raise bad_request(
                    f"model `{info.name}` is a {manifest.family} model, not a classifier",
                    param="model",
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
        return FastJSONResponse(
            classify_response(query.model, served.outputs, labels, served.tokens, int(time.time())),
            headers=served.headers(started),
        )

    async def tokenize(request: Request) -> Response:
        query = parse_tokenize(await json_body(request), limits)
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
        rows = await asyncio.to_thread(
            files.tokenizer.spans,
            query.texts,
            truncate,
            query.truncation.side or TRUNCATION_SIDES[0],
            prompt,
        )
        return FastJSONResponse(tokens_response(rows, query.add_special_tokens))

    async def decode(request: Request) -> Response:
        query = parse_decode(await json_body(request), limits)
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
        texts = await asyncio.to_thread(
            files.tokenizer.decode, query.rows, query.skip_special_tokens
        )
        return FastJSONResponse(texts)

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
        info = await backend.info(name)
        files = repository.files(info.name)
        manifest = files.manifest
        family: dict[str, Any] = {}
        if manifest.family == "embedding":
            family = {"pooling": manifest.source.get("pooling"), "dimension": info.output_dim}
        elif manifest.labels or manifest.family == "classifier":
            labels = manifest.labels or tuple(f"LABEL_{i}" for i in range(info.output_dim))
            family = {"id2label": {str(i): label for i, label in enumerate(labels)}}
        return FastJSONResponse(
            {
                "model_id": info.name,
                "model_type": {manifest.family: family},
                "family": manifest.family,
                "max_input_length": files.longest_row,
                "max_client_batch_size": MAX_INPUTS,
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
            }
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
        assert isinstance(exc, OpenAIError)
        return JSONResponse(exc.body(), status_code=exc.status)

    async def client_gone(request: Request, exc: Exception) -> Response:
        # nobody reads it: nginx's 499, for the adapter's own access log
        return Response(status_code=499)

    async def unexpected(request: Request, exc: Exception) -> Response:
        # the client reads no exception text (it may hold the adapter's internals): the log does
        LOG.error("internal error on %s", request.url.path, exc_info=exc)
        return JSONResponse(
            error_body("internal error: the adapter's log says why", kind="server_error"),
            status_code=500,
        )

    async def not_found(request: Request, exc: Exception) -> Response:
        return JSONResponse(
            error_body(f"no route {request.method} {request.url.path}"), status_code=404
        )

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return JSONResponse(
            error_body(f"method {request.method} is not allowed on {request.url.path}"),
            status_code=405,
        )

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
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{model}", model, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ],
        exception_handlers=handlers,
        lifespan=lifespan,
    )
