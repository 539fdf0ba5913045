"""The body check's servers: KServe HTTP ``infer``, gRPC ``ModelInfer`` and gRPC
``ModelStreamInfer`` (a port of its own), each body checked (``rules``) and, when it passes, sent
on to Triton: an HTTP body's JSON as the check wrote it again from what it judged (binary tensors
unchanged), so Triton reads exactly what was judged; a gRPC message byte for byte, since Triton
reads it with the same protobuf rules, unless it has a ``priority`` (then written again with the
model's class parameter, ``rules.with_class``). Triton's answer comes back as it came.

The front door routes only these inference calls here; everything else it sends to Triton
directly. A refused body never reaches Triton: HTTP 400 in Triton's error shape, gRPC
INVALID_ARGUMENT (on a stream: an error response in the stream, as Triton answers a bad message
there, and the stream goes on).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import sys
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import grpc
import grpc.aio
import orjson
from aiohttp import web
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from body_check.rules import (
    BodyLimits,
    Refused,
    check_grpc_request,
    check_json_request,
    with_class,
)
from python_backend.common.contract import CLIENT_PARAMETER

LOG = logging.getLogger("body_check")

HEADER_LENGTH = "Inference-Header-Content-Length"
# request headers not passed on: the connection's own, the length (the body is passed whole),
# and any encoding (the body was checked as it is: Triton must read it the same way)
HOP_HEADERS = frozenset(
    {
        "content-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "upgrade",
        "host",
        "content-length",
    }
)
# ... and the header length, which the check sets to that of the JSON it writes
PASSED_ANEW = HOP_HEADERS | {HEADER_LENGTH.lower()}
# Triton's answer headers the client needs
ANSWER_HEADERS = ("Content-Type", HEADER_LENGTH, "Content-Encoding")

SERVICE = "/inference.GRPCInferenceService/"
INFER = SERVICE + "ModelInfer"
STREAM_INFER = SERVICE + "ModelStreamInfer"
# gRPC metadata the library sets itself; the rest (a client's own keys) is passed on
RESERVED_METADATA = frozenset({"user-agent", "content-type", "te", "grpc-timeout"})


@dataclass(frozen=True)
class CheckSettings:
    triton_http: str  # host:port of Triton's HTTP server
    triton_grpc: str
    max_body_bytes: int  # the front door's MAX_BODY_SIZE: the largest body or message
    limits: BodyLimits = field(default_factory=BodyLimits)
    # gRPC messages being received, counted at the largest a message may be: in all, and per
    # client (twice the largest message); and the time a ModelInfer message has to arrive whole
    grpc_bytes_in_progress: int = 1 << 30
    body_deadline_s: float = 30.0
    # the largest ModelStreamInfer message (its own port, so gRPC refuses a larger one from its
    # length prefix): a stream is always reading, so each open stream holds this much
    stream_message_bytes: int = 256 << 10

    @property
    def stream_bytes(self) -> int:
        return min(self.stream_message_bytes, self.max_body_bytes)


def header_length_of(values: list[str]) -> int | None:
    """The binary-tensor header's length: absent, or once, in plain ASCII digits (Python's
    ``int`` would also take a sign, underscores and other scripts' digits, which Triton does
    not); the check forwards the length of the JSON it writes, never this value."""
    if not values:
        return None
    if len(values) > 1:
        raise Refused(f"{HEADER_LENGTH} is sent {len(values)} times; send it once")
    value = values[0]
    if not (value.isascii() and value.isdigit()) or len(value) > 19:
        raise Refused(f"{HEADER_LENGTH} {value[:40]!r} is not a length in plain digits")
    return int(value)


def error_answer(status: int, message: str) -> web.Response:
    """An answer in Triton's error shape."""
    return web.Response(
        status=status, body=orjson.dumps({"error": message}), content_type="application/json"
    )


class HttpCheck:
    """``POST /v2/models/{model}[/versions/{version}]/infer``, checked, then Triton's."""

    def __init__(self, settings: CheckSettings) -> None:
        self.settings = settings
        self.session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.max_body_bytes)
        app.router.add_post("/v2/models/{model}/infer", self.infer)
        app.router.add_post("/v2/models/{model}/versions/{version}/infer", self.infer)
        app.router.add_get("/health", self.health)
        app.on_startup.append(self.open)
        app.on_cleanup.append(self.close)
        return app

    async def open(self, _app: web.Application) -> None:
        self.session = aiohttp.ClientSession(
            f"http://{self.settings.triton_http}",
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
            auto_decompress=False,  # Triton's answer passes as it was encoded
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            timeout=aiohttp.ClientTimeout(total=None),  # the door's upstream timeout bounds it
        )

    async def close(self, _app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def infer(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            header_length = header_length_of(request.headers.getall(HEADER_LENGTH, []))
            passed = check_json_request(body, header_length, self.settings.limits)
        except Refused as refused:
            return error_answer(400, str(refused))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in PASSED_ANEW}
        if passed.binary_extension:
            headers[HEADER_LENGTH] = str(len(passed.header))
        assert self.session is not None
        try:
            async with self.session.post(
                request.path_qs, data=passed.body(), headers=headers
            ) as answer:
                payload = await answer.read()
                kept = {h: answer.headers[h] for h in ANSWER_HEADERS if h in answer.headers}
                return web.Response(status=answer.status, body=payload, headers=kept)
        except aiohttp.ClientError as err:  # Triton is restarting, say
            LOG.warning("Triton did not answer: %s", err)
            return error_answer(503, "the model server is unavailable; retry shortly")


def passed_metadata(context: grpc.aio.ServicerContext) -> list[tuple[str, str | bytes]]:
    return [
        (key, value)
        for key, value in (context.invocation_metadata() or ())
        if key not in RESERVED_METADATA and not key.startswith(":")
    ]


def read_infer_request(message: bytes, limits: BodyLimits) -> bytes:
    """The message read by the protobuf library, then checked (``Refused`` if it is not one);
    returns what goes on to Triton: the message, or with a ``priority`` the message with the
    model's class parameter."""
    try:
        request = service_pb2.ModelInferRequest.FromString(message)
    except DecodeError as err:
        raise Refused(f"not a ModelInferRequest: {err}") from None
    check_grpc_request(request, len(message), limits)
    return with_class(request) or message


def stream_refusal(message: bytes, refused: Refused) -> bytes:
    """A stream's answer to a bad message, as Triton gives one: an error response carrying the
    request's id when it could be read."""
    response = service_pb2.ModelStreamInferResponse(error_message=str(refused))
    with contextlib.suppress(DecodeError):
        request = service_pb2.ModelInferRequest.FromString(message)
        response.infer_response.id = request.id
        response.infer_response.model_name = request.model_name
    return bytes(response.SerializeToString())


class ReadBudget:
    """The gRPC message bytes a body-check process holds, per client and in all. gRPC core
    buffers a message whole before the handler sees it, and reads one only when the handler asks
    for it, refusing one longer than its server's bound from the length prefix. So a ModelInfer
    call first reserves the largest a message may be (it waits for room; its caller bounds the
    wait), then, once the message is read, its size until the call ends; an open stream, which
    always waits for its next message, holds the largest a stream message may be for its whole
    life (a stream past the room is refused at once). A client holds at most twice the largest
    ModelInfer message for each of the two; streams hold at most half of the bound in all, so
    calls always have the other half. Besides, a client's stream messages read and the answers
    to them not yet sent back are held to that share again (``hold``): its streams pass a
    message on to Triton while those hold under half the share, and read Triton's next answer
    while under all of it, so messages never take the room their answers need, and each stream's
    last answer read is the most it goes over."""

    def __init__(self, message_bytes: int, in_all: int, stream_bytes: int) -> None:
        self.message_bytes = message_bytes
        self.stream_bytes = stream_bytes
        self.per_client = 2 * message_bytes
        self.in_all = max(in_all, 2 * message_bytes)
        self.streams_in_all = self.in_all // 2
        self.held: dict[tuple[str, bool], int] = {}  # (client, for a stream): bytes
        self.total = 0
        self.streams_total = 0
        # streams' messages read and answers not yet sent back, per client (``hold``)
        self.flowing: dict[str, int] = {}
        self.changed = asyncio.Event()  # set and replaced whenever room is given back

    @property
    def streams_per_client(self) -> int:
        return self.per_client // self.stream_bytes

    def fits(self, client: str, stream: bool) -> bool:
        size = self.stream_bytes if stream else self.message_bytes
        return (
            self.held.get((client, stream), 0) + size <= self.per_client
            and self.total + size <= self.in_all
            and (not stream or self.streams_total + size <= self.streams_in_all)
        )

    def take(self, client: str, stream: bool, size: int | None = None) -> None:
        if size is None:
            size = self.stream_bytes if stream else self.message_bytes
        self.held[(client, stream)] = self.held.get((client, stream), 0) + size
        self.total += size
        self.streams_total += size if stream else 0

    async def reserve(self, client: str) -> None:
        """Room for one ModelInfer message, once there is some."""
        while not self.fits(client, stream=False):
            await self.changed.wait()
        self.take(client, stream=False)

    def open_stream(self, client: str) -> str | None:
        """Room for one more stream's message now; else why not."""
        if self.fits(client, stream=True):
            self.take(client, stream=True)
            return None
        if self.held.get((client, True), 0) + self.stream_bytes > self.per_client:
            return (
                f"this client has {self.streams_per_client} streams open, the most it may in "
                f"one body-check process (each holds {self.stream_bytes} bytes, its largest "
                "message); end one, or send ModelInfer calls"
            )
        return (
            f"the body check holds its most for streams ({self.streams_total} of "
            f"{self.streams_in_all} bytes); retry later"
        )

    async def hold(self, client: str, size: int, within: int) -> None:
        """Waits until ``size`` more bytes of a client's stream messages and answers in flight
        fit ``within`` (or it holds none), then holds them."""
        while (held := self.flowing.get(client, 0)) and held + size > within:
            await self.changed.wait()
        self.flowing[client] = held + size

    def let_go(self, client: str, size: int) -> None:
        left = self.flowing.pop(client) - size
        if left:
            self.flowing[client] = left
        self.wake()

    def wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def release(self, client: str, stream: bool = False, size: int | None = None) -> None:
        """Gives room back (synchronous: it runs whole, even in a cancelled task's cleanup);
        ``size``: what it holds, if not the largest message."""
        if size is None:
            size = self.stream_bytes if stream else self.message_bytes
        if not size:
            return
        left = self.held.pop((client, stream)) - size
        if left:
            self.held[(client, stream)] = left
        self.total -= size
        self.streams_total -= size if stream else 0
        self.wake()


def client_of(context: grpc.aio.ServicerContext) -> str:
    """The name the front door gives the client (its key's name, else its address)."""
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_PARAMETER:
            return value if isinstance(value, str) else value.decode(errors="replace")
    return str(context.peer())


# a stream's messages read ahead of its answers: each answer the client has not yet taken holds one
UNREAD_ANSWERS = 8


class GrpcCheck:
    """``ModelInfer`` and ``ModelStreamInfer``, checked, then Triton's; messages stay bytes."""

    def __init__(self, settings: CheckSettings) -> None:
        self.settings = settings
        size = settings.max_body_bytes
        self.channel = grpc.aio.insecure_channel(
            settings.triton_grpc,
            options=[
                ("grpc.max_send_message_length", size),
                ("grpc.max_receive_message_length", -1),
                ("grpc.http2.bdp_probe", 0),
            ],
        )
        self.infer_call = self.channel.unary_unary(INFER)
        self.stream_call = self.channel.stream_stream(STREAM_INFER)
        self.budget = ReadBudget(size, settings.grpc_bytes_in_progress, settings.stream_bytes)

    def infer_handler(self) -> grpc.GenericRpcHandler:
        """``ModelInfer`` alone (any other method: UNIMPLEMENTED); its message is read by the
        handler, when the budget has room for it."""
        return grpc.method_handlers_generic_handler(
            SERVICE.strip("/"), {"ModelInfer": grpc.stream_unary_rpc_method_handler(self.infer)}
        )

    def stream_handler(self) -> grpc.GenericRpcHandler:
        """``ModelStreamInfer`` alone, on a server of its own whose messages are smaller."""
        return grpc.method_handlers_generic_handler(
            SERVICE.strip("/"),
            {"ModelStreamInfer": grpc.stream_stream_rpc_method_handler(self.stream_infer)},
        )

    async def receive(
        self, messages: AsyncIterator[bytes], context: grpc.aio.ServicerContext, client: str
    ) -> bytes:
        """A unary call's one message, read once the budget has room for it, within the body
        deadline from the call's start; the room stays reserved (the caller releases it) unless
        this raises."""
        deadline_s = self.settings.body_deadline_s
        reserved = False
        try:
            try:
                async with asyncio.timeout(deadline_s):
                    await self.budget.reserve(client)
                    reserved = True
                    message = await anext(aiter(messages), None)
            except TimeoutError:
                if not reserved:
                    await context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"too many request messages in progress (at most "
                        f"{self.budget.per_client} bytes a client, {self.budget.in_all} in all, "
                        "in one body-check process); retry later",
                    )
                await context.abort(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"the request message did not arrive whole within {deadline_s:g} s",
                )
            if message is None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no request message was sent")
                raise AssertionError("abort raises")
            return message
        except BaseException:
            if reserved:
                self.budget.release(client)
            raise

    async def infer(
        self, messages: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> bytes:
        """Once read, the message holds its own size of the client's room (not the largest a
        message may be) until the call ends: many small calls pass side by side, a client's
        large ones wait."""
        client = client_of(context)
        message = await self.receive(messages, context, client)
        size = len(message)
        self.budget.release(client, size=self.budget.message_bytes - size)
        try:
            message = read_infer_request(message, self.settings.limits)
        except Refused as refused:
            self.budget.release(client, size=size)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(refused))
        try:
            answer: bytes = await self.infer_call(
                message, metadata=passed_metadata(context), timeout=context.time_remaining()
            )
        except grpc.aio.AioRpcError as err:
            await context.abort(err.code(), err.details() or "")
        finally:
            self.budget.release(client, size=size)
        return answer

    async def stream_infer(
        self, messages: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """Client messages are checked and written to Triton's stream in order; refusals join
        Triton's answers on the way back."""
        client = client_of(context)
        refused = self.budget.open_stream(client)
        if refused is not None:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
        try:
            relayed = self.relay_stream(messages, context, client)
            async with contextlib.aclosing(relayed) as answers:
                async for answer in answers:
                    yield answer
        finally:
            self.budget.release(client, stream=True)

    async def relay_stream(
        self, messages: AsyncIterator[bytes], context: grpc.aio.ServicerContext, client: str
    ) -> AsyncGenerator[bytes, None]:
        upstream = self.stream_call(
            metadata=passed_metadata(context), timeout=context.time_remaining()
        )
        answers: asyncio.Queue[bytes | None] = asyncio.Queue()
        # one slot per message read and not yet answered to the client: a client that stops
        # reading its answers stops the reading of its requests, so none is computed and held
        unanswered = asyncio.Semaphore(UNREAD_ANSWERS)
        # bytes in flight, charged to the client's share (``ReadBudget.hold``): a message from
        # when it is read (until then the stream's own room holds it) until Triton answers it;
        # an answer until it is sent back
        share = self.budget.per_client
        flowing = 0
        sent: collections.deque[int] = collections.deque()  # sizes of messages Triton has

        async def hold(size: int, within: int) -> None:
            nonlocal flowing
            await self.budget.hold(client, size, within)
            flowing += size

        def let_go(size: int) -> None:
            nonlocal flowing
            self.budget.let_go(client, size)
            flowing -= size

        async def forward() -> None:
            incoming = aiter(messages)
            while True:
                await unanswered.acquire()
                message = await anext(incoming, None)
                if message is None:
                    break
                await hold(len(message), share // 2)
                try:
                    passed = read_infer_request(message, self.settings.limits)
                except Refused as refused:
                    let_go(len(message))
                    refusal = stream_refusal(message, refused)
                    await hold(len(refusal), share)
                    await answers.put(refusal)
                    continue
                sent.append(len(message))
                await upstream.write(passed)
            await upstream.done_writing()

        async def relay() -> None:
            answered = aiter(upstream)
            try:
                while True:
                    await hold(0, share - 1)  # room for the next answer, whatever its size
                    answer = await anext(answered, None)
                    if answer is None:
                        break
                    if sent:
                        let_go(sent.popleft())
                    await hold(len(answer), sys.maxsize)  # read already: held at once
                    await answers.put(answer)
            finally:
                await answers.put(None)

        writer = asyncio.ensure_future(forward())
        reader = asyncio.ensure_future(relay())
        try:
            while (answer := await answers.get()) is not None:
                yield answer  # returns once gRPC took it for the client
                let_go(len(answer))
                unanswered.release()
        finally:  # the client went away, or Triton's stream ended: nothing is left running
            writer.cancel()
            reader.cancel()
            if not upstream.done():
                upstream.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await reader
            if flowing:
                self.budget.let_go(client, flowing)
        code = await upstream.code()
        if code != grpc.StatusCode.OK:
            await context.abort(code, await upstream.details() or "")
