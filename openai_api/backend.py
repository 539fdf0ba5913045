"""The Triton side: a served model's config read once, inputs split into requests the model
takes (at most its ``max_batch_size`` rows each), sent concurrently over gRPC, answered in input
order. The model's planner merges the pieces again into its own forwards."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from openai_api.errors import OpenAIError, bad_request, from_triton, model_not_found
from openai_api.protocol import MODEL_DEFAULT, Truncation
from python_backend.common.contract import (
    CLASS_PARAMETER,
    CLIENT_PARAMETER,
    FAMILY_OUTPUTS,
    KEY_CLASS_PARAMETER,
    NUM_TOKENS_OUTPUT,
    PAIR_INPUT,
    REQUEST_INPUTS,
    TIMINGS_OUTPUT,
    TIMINGS_PARAMETER,
    TIMINGS_STAGES,
    TOO_LONG_ROW,
)
from python_backend.settings import settings_from_parameters

T = TypeVar("T")

EMBEDDING_OUTPUT = FAMILY_OUTPUTS["embedding"]
SCORE_OUTPUT = FAMILY_OUTPUTS["reranker"]
LOGITS_OUTPUT = FAMILY_OUTPUTS["classifier"]
# a model config parameter: the vector sizes `dimensions` may ask for (comma-separated), for
# models trained to be shortened (Matryoshka); without it, `dimensions` is refused
DIMENSIONS_PARAMETER = "matryoshka_dimensions"


NO_CALLER: Mapping[str, str] = {}
# the front door's headers about the caller, forwarded to Triton as they came
CALLER_HEADERS = (CLIENT_PARAMETER, KEY_CLASS_PARAMETER)


def callers(headers: Mapping[str, str]) -> dict[str, str]:
    """The front door's headers naming who sent a request (its client name, its key's class),
    to pass on to the model."""
    return {name: headers[name] for name in CALLER_HEADERS if headers.get(name)}


def class_parameter(priority: int) -> dict[str, int]:
    """The model's class parameter for a ``/v1`` request's ``priority`` (none for 0)."""
    return {CLASS_PARAMETER: priority} if priority else {}


@dataclass(frozen=True)
class ModelInfo:
    name: str
    output_name: str
    output_dim: int
    max_rows: int  # rows one request takes (the config's max_batch_size)
    dimensions: tuple[int, ...]  # sizes `dimensions` may ask for; empty: none
    created: int  # when the adapter first saw it (OpenAI's `created`)
    truncate_default: bool = True  # what the model does with rows over its limit by default
    max_queue_rows: int = 4096  # rows its queue holds before it refuses more

    @property
    def embeds(self) -> bool:
        return self.output_name == EMBEDDING_OUTPUT


def model_info_from_config(config: dict[str, Any], created: int) -> ModelInfo:
    output = config["output"][0]
    raw = config.get("parameters", {}).get(DIMENSIONS_PARAMETER, {}).get("string_value", "")
    dimensions = tuple(sorted({int(x) for x in raw.replace(" ", "").split(",") if x}))
    settings = settings_from_parameters(config.get("parameters", {}), config["name"])
    return ModelInfo(
        name=config["name"],
        output_name=output["name"],
        output_dim=int(output["dims"][0]),
        max_rows=int(config.get("max_batch_size") or 1),
        dimensions=dimensions,
        created=created,
        truncate_default=settings.truncate_default,
        max_queue_rows=settings.max_queue_rows,
    )


async def gather_or_cancel(*calls: Awaitable[T]) -> list[T]:
    """Every call's result, in order; when one fails, the others still queued or running are
    cancelled before the failure is raised (a gRPC call cancelled reaches the model, which drops
    its rows before their forward): a refused request leaves no work behind."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


@dataclass(frozen=True)
class Served:
    """What the model answered for a request: its outputs in input order, the tokens it ran, and
    the seconds it spent queued, tokenizing and computing (TIMINGS_STAGES; over several chunks,
    the longest of each: the chunks run side by side)."""

    outputs: np.ndarray
    tokens: int
    seconds: tuple[float, ...]

    @classmethod
    def of(cls, parts: list[Served], order: list[int] | None = None) -> Served:
        """The parts' outputs in turn; with ``order``, they answer inputs ``order[0]``,
        ``order[1]``, ... and are put back in input order."""
        outputs = np.concatenate([p.outputs for p in parts], axis=0)
        if order is not None:
            in_order = np.empty_like(outputs)
            in_order[np.asarray(order)] = outputs
            outputs = in_order
        return cls(
            outputs,
            sum(p.tokens for p in parts),
            tuple(max(column) for column in zip(*(p.seconds for p in parts), strict=True)),
        )

    def headers(self, started: float) -> dict[str, str]:
        """TEI's timing headers, in milliseconds; the total is the adapter's own wall time
        since ``started`` (time.perf_counter)."""
        out = {
            f"x-{stage}-time": f"{s * 1e3:.0f}"
            for stage, s in zip(TIMINGS_STAGES, self.seconds, strict=True)
        }
        out["x-total-time"] = f"{(time.perf_counter() - started) * 1e3:.0f}"
        return out


# the query's copies a rerank request may have in flight to Triton at once (its chunks wait)
RERANK_QUERY_BYTES_IN_FLIGHT = 8 << 20


class TritonBackend:
    """One gRPC channel to Triton, shared by every request of the adapter."""

    def __init__(self, url: str, models: list[str], timeout_s: float = 60.0) -> None:
        self.url = url
        self.models = list(models)
        self.timeout_s = timeout_s
        self._client: grpcclient.InferenceServerClient | None = None
        self._info: dict[str, ModelInfo] = {}

    @property
    def client(self) -> grpcclient.InferenceServerClient:
        if self._client is None:  # made inside the running event loop
            self._client = grpcclient.InferenceServerClient(self.url)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    async def info(self, model: str) -> ModelInfo:
        """The served model's facts; a model this adapter does not serve is a 404."""
        if model not in self.models:
            raise model_not_found(model)
        known = self._info.get(model)
        if known is not None:
            return known
        try:
            config = await self.client.get_model_config(model, as_json=True)
        except InferenceServerException as err:
            if "StatusCode.NOT_FOUND" in str(err.status()) or "unknown model" in str(err):
                raise model_not_found(model) from None
            raise from_triton(err.status(), err.message()) from None
        info = model_info_from_config(config["config"], int(time.time()))
        self._info[model] = info
        return info

    async def ready_models(self) -> list[ModelInfo]:
        out = []
        for model in self.models:
            try:
                if await self.client.is_model_ready(model):
                    out.append(await self.info(model))
            except (InferenceServerException, OpenAIError):
                continue
        return out

    async def embed(
        self,
        info: ModelInfo,
        texts: list[str] | None,
        token_rows: list[list[int]] | None,
        prompt_name: str | None = None,
        caller: Mapping[str, str] = NO_CALLER,
        truncation: Truncation = MODEL_DEFAULT,
        normalize: bool | None = None,
        priority: int = 0,
    ) -> Served:
        """[inputs, D] float32 in input order, the tokens the model ran (prompts included) and
        where the time went. ``caller``: the front door's headers naming who sent it (``callers``);
        ``priority``: its service class (0: the default), kept by every chunk."""
        parameters = {**truncation.parameters(), **class_parameter(priority)}
        if normalize is not None:
            parameters["normalize"] = normalize
        if prompt_name is not None:
            parameters["prompt_name"] = prompt_name
        items: list[Any] = texts if texts is not None else list(token_rows or [])
        order = list(range(len(items)))
        regrouped = texts is None and len(items) > info.max_rows
        if regrouped:
            # each request is padded to its longest row: token-id rows go longest first, so
            # long rows share requests with each other, not with every chunk's short ones
            order.sort(key=lambda i: -len(items[i]))
            items = [items[i] for i in order]
        starts = range(0, len(items), info.max_rows)
        parts = await gather_or_cancel(
            *(
                self._infer(
                    info,
                    items[a : a + info.max_rows],
                    texts is not None,
                    order[a : a + info.max_rows],
                    parameters,
                    caller,
                )
                for a in starts
            )
        )
        return Served.of(parts, order if regrouped else None)

    async def rerank(
        self,
        info: ModelInfo,
        query: str | list[str],
        documents: list[str],
        caller: Mapping[str, str] = NO_CALLER,
        truncation: Truncation = MODEL_DEFAULT,
        priority: int = 0,
        field: str = "documents",
        instruction: str | None = None,
    ) -> Served:
        """The score of (query, document) for each document, in their order ([documents, 1]),
        the tokens and where the time went; ``query``: one for every document, or each its own;
        ``field``: the request's name for the documents, to name one in an error."""
        parameters = {**truncation.parameters(), **class_parameter(priority)}
        if instruction is not None:
            parameters["instruction"] = instruction
        queries = [query] * len(documents) if isinstance(query, str) else query
        # each chunk carries the query once per document: Triton's core refuses a request whose
        # batched inputs differ in rows, so a one-row query cannot pair with many documents.
        # What those copies take is bounded instead: chunks run at most as many at once as fit
        # RERANK_QUERY_BYTES_IN_FLIGHT (all of them for a short query)
        longest = max(len(q.encode("utf-8", "surrogatepass")) for q in set(queries))
        chunk_bytes = longest * info.max_rows
        at_once = asyncio.Semaphore(max(1, RERANK_QUERY_BYTES_IN_FLIGHT // max(1, chunk_bytes)))

        async def chunk(a: int) -> Served:
            async with at_once:
                return await self._infer(
                    info,
                    documents[a : a + info.max_rows],
                    True,
                    list(range(a, min(a + info.max_rows, len(documents)))),
                    parameters,
                    caller,
                    queries[a : a + info.max_rows],
                    inputs_field=field,
                )

        parts = await gather_or_cancel(*(chunk(a) for a in range(0, len(documents), info.max_rows)))
        return Served.of(parts)

    async def _infer(
        self,
        info: ModelInfo,
        rows: list[Any],
        as_text: bool,
        positions: list[int],
        parameters: dict[str, Any] | None = None,
        caller: Mapping[str, str] = NO_CALLER,
        queries: list[str] | None = None,
        inputs_field: str = "input",
    ) -> Served:
        """One request of ``rows``: texts, or token-id rows; with ``queries``, a reranker's
        (query, document) pairs, the rows being the documents. ``positions``: each row's index
        among the request's inputs, to name it in an error."""
        text_name, ids_name, mask_name = REQUEST_INPUTS
        if as_text:
            columns = [(text_name, [t.encode("utf-8") for t in rows])]
            if queries is not None:  # a reranker's (query, document) pairs; each query encoded once
                once = {q: q.encode("utf-8") for q in set(queries)}
                columns = [
                    (text_name, [once[q] for q in queries]),
                    (PAIR_INPUT, columns[0][1]),
                ]
            inputs = []
            for name, encoded in columns:
                data = np.array([[t] for t in encoded], dtype=np.object_)
                tensor = grpcclient.InferInput(name, list(data.shape), "BYTES")
                tensor.set_data_from_numpy(data)
                inputs.append(tensor)
        else:
            longest = max(len(r) for r in rows)
            ids = np.zeros((len(rows), longest), dtype=np.int64)
            mask = np.zeros((len(rows), longest), dtype=np.int64)
            for i, row in enumerate(rows):
                ids[i, : len(row)] = row
                mask[i, : len(row)] = 1
            inputs = [
                grpcclient.InferInput(ids_name, list(ids.shape), "INT64"),
                grpcclient.InferInput(mask_name, list(mask.shape), "INT64"),
            ]
            inputs[0].set_data_from_numpy(ids)
            inputs[1].set_data_from_numpy(mask)
        outputs = [
            grpcclient.InferRequestedOutput(info.output_name),
            grpcclient.InferRequestedOutput(NUM_TOKENS_OUTPUT),
            grpcclient.InferRequestedOutput(TIMINGS_OUTPUT),
        ]
        parameters = {**(parameters or {}), TIMINGS_PARAMETER: True}
        try:
            result = await self.client.infer(
                info.name,
                inputs,
                outputs=outputs,
                client_timeout=self.timeout_s,
                parameters=parameters or None,
                # Triton forwards them to the model as request parameters (tools/serve.py)
                headers=dict(caller) or None,
            )
        except InferenceServerException as err:
            too_long = TOO_LONG_ROW.match(err.message() or "")
            if too_long:  # name the input as the client sent it, not the model's row
                row, tokens, limit = (int(x) for x in too_long.groups())
                raise bad_request(
                    f"`{inputs_field}[{positions[row]}]` is {tokens} tokens; the model's limit is "
                    f"{limit} (`truncate` cuts it)",
                    param=inputs_field,
                ) from None
            raise from_triton(err.status(), err.message(), inputs_named(positions)) from None
        vectors = result.as_numpy(info.output_name)
        tokens = result.as_numpy(NUM_TOKENS_OUTPUT)
        times = result.as_numpy(TIMINGS_OUTPUT)
        if vectors is None or tokens is None or vectors.shape[0] != len(rows):
            raise OpenAIError(500, "the model answered without its outputs", kind="server_error")
        seconds = times[0] if times is not None and len(times) else np.zeros(len(TIMINGS_STAGES))
        return Served(vectors, int(tokens.sum()), tuple(float(x) for x in seconds))


def inputs_named(positions: list[int]) -> str:
    """Which of a request's inputs one chunk held, as an error's prefix ("" for input 0 alone)."""
    first, last = positions[0], positions[-1]
    if positions == list(range(first, last + 1)):
        return f"inputs {first}..{last}: " if first or last else ""
    shown = ", ".join(map(str, positions[:8]))
    return f"inputs {shown}{', ...' if len(positions) > 8 else ''}: "


def check_dimensions(info: ModelInfo, dimensions: int | None) -> None:
    if dimensions is None or dimensions == info.output_dim:
        return
    if not info.dimensions:
        raise bad_request(
            f"model `{info.name}` does not support `dimensions`: its vectors have "
            f"{info.output_dim} dimensions",
            param="dimensions",
        )
    if dimensions not in info.dimensions:
        allowed = ", ".join(str(d) for d in info.dimensions)
        raise bad_request(
            f"model `{info.name}` allows `dimensions` of {allowed}, not {dimensions}",
            param="dimensions",
        )
