"""The body check's rules: what tritonclient sends passes; every declared size that disagrees
with what was sent, or structure that is too deep, is refused with a message naming it."""

from __future__ import annotations

import asyncio

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import serialize_byte_tensor

from body_check.proxy import read_infer_request, stream_refusal
from body_check.rules import (
    BodyLimits,
    Refused,
    check_grpc_request,
    check_json_request,
)

LIMITS = BodyLimits()


def http_body(arrays: dict[str, np.ndarray], binary: bool, outputs=()) -> tuple[bytes, int | None]:
    """A request body exactly as tritonclient's HTTP client writes it."""
    inputs = []
    for name, array in arrays.items():
        datatype = "BYTES" if array.dtype == object else None
        tensor = httpclient.InferInput(
            name, list(array.shape), datatype or httpclient.np_to_triton_dtype(array.dtype)
        )
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    wanted = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in outputs]
    body, header_length = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs=wanted or None
    )
    return body, header_length


def json_body(*inputs: dict, **extra) -> bytes:
    return orjson.dumps({"inputs": list(inputs), **extra})


TEXTS = np.array([[b"hello"], ["wörld".encode()], [b""]], dtype=object)
IDS = np.arange(12, dtype=np.int64).reshape(3, 4)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_what_tritonclient_sends_over_http_passes(binary):
    for arrays in ({"TEXT": TEXTS}, {"INPUT_IDS": IDS, "ATTENTION_MASK": IDS}):
        body, header_length = http_body(arrays, binary, outputs=("EMBEDDING",))
        check_json_request(body, header_length, LIMITS)


def grpc_request(arrays: dict[str, np.ndarray], raw: bool = True):
    """A ModelInferRequest as tritonclient's gRPC client builds one (raw contents), or with
    typed contents."""
    request = service_pb2.ModelInferRequest(model_name="minilm")
    for name, array in arrays.items():
        tensor = request.inputs.add(name=name, shape=list(array.shape))
        if array.dtype == object:
            tensor.datatype = "BYTES"
            if raw:
                request.raw_input_contents.append(serialize_byte_tensor(array).item())
            else:
                tensor.contents.bytes_contents.extend(array.ravel().tolist())
        else:
            tensor.datatype = "INT64"
            if raw:
                request.raw_input_contents.append(array.tobytes())
            else:
                tensor.contents.int64_contents.extend(array.ravel().tolist())
    return request


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "typed"])
def test_what_a_grpc_client_sends_passes(raw):
    for arrays in ({"TEXT": TEXTS}, {"INPUT_IDS": IDS, "ATTENTION_MASK": IDS}):
        message = grpc_request(arrays, raw).SerializeToString()
        read_infer_request(message, LIMITS)


def refused(body: bytes, header_length: int | None = None) -> str:
    with pytest.raises(Refused) as info:
        check_json_request(body, header_length, LIMITS)
    return str(info.value)


def text_input(shape, data=None, **fields) -> dict:
    out = {"name": "TEXT", "datatype": "BYTES", "shape": shape, **fields}
    if data is not None:
        out["data"] = data
    return out


@pytest.mark.parametrize(
    ("shape", "why"),
    [
        ([1 << 40, 1 << 40], "declares 1208925819614629174706176 elements"),
        ([1 << 32, 1 << 32], "declares 18446744073709551616 elements"),  # wraps to 0 in 64 bits
        ([1 << 63, 1], "outside [0, 2^63-1]"),
        ([-1, 1], "outside [0, 2^63-1]"),
        ([1, True], "a list of integers"),
        ("11", "a list of integers"),
        ([1] * 17, "17 dimensions, at most 16"),
    ],
)
def test_a_declared_shape_that_is_huge_wraps_or_is_not_integers_is_refused(shape, why):
    message = refused(json_body(text_input(shape, ["x"])))
    assert "'TEXT'" in message and why in message


def test_an_int64_shape_allocating_past_the_body_is_refused_before_its_data_is_read():
    body = json_body({"name": "INPUT_IDS", "datatype": "INT64", "shape": [1, 1 << 28], "data": [1]})
    assert f"more than a {len(body)}-byte body can hold" in refused(body)


def test_brackets_alone_and_deep_data_are_refused():
    assert "not valid JSON" in refused(b"[" * 1_000_000)
    deep = b'{"inputs":[{"name":"TEXT","datatype":"BYTES","shape":[1,1],"data":' + (
        b"[" * 300_000 + b'"x"' + b"]" * 300_000 + b"}]}"
    )
    assert "not valid JSON" in refused(deep)  # past orjson's 1024 levels
    deeper_than_shape = json_body(text_input([1, 1], [[["x"]]]))
    assert "nested deeper than its shape's 2 dimensions" in refused(deeper_than_shape)


@pytest.mark.parametrize(
    ("tensor", "why"),
    [
        (text_input([2, 1], ["x"]), "data has 1 elements, shape [2, 1] declares 2"),
        (text_input([1, 1], [1]), "BYTES data holds values of type int"),
        (text_input([2, 1], [["x"], "y"]), "mixes lists and values"),
        (text_input([1, 1], "x"), "data must be a list"),
        (text_input([1, 1]), "neither data nor binary_data_size"),
        (text_input([1, 1], ["x"], datatype="STRING"), "unknown datatype 'STRING'"),
        (text_input([1, 1], ["x"], extra=[[[]]]), "unknown field(s) 'extra'"),
        (
            {"name": "IDS", "datatype": "INT64", "shape": [2], "data": [1, 2.5]},
            "INT64 data holds values of type float",
        ),
    ],
)
def test_json_data_against_its_shape_and_type(tensor, why):
    assert why in refused(json_body(tensor))


def test_an_integer_past_64_bits_is_refused_not_wrapped():
    # orjson reads it as a float
    body = (
        b'{"inputs":[{"name":"IDS","datatype":"INT64","shape":[1],"data":[18446744073709551616]}]}'
    )
    assert "INT64 data holds values of type float" in refused(body)


def test_request_structure_limits():
    valid = text_input([1, 1], ["x"])
    assert "101 inputs, at most 64" in refused(json_body(*[valid] * 101))
    outputs = [{"name": "EMBEDDING"}] * 300_000
    assert "outputs must be a list of at most 64" in refused(json_body(valid, outputs=outputs))
    nested = {"parameters": {"p": {"q": [1]}}}
    assert "parameter 'p' must be a string, number or boolean" in refused(
        json_body(valid, **nested)
    )
    shm = text_input([1, 1], parameters={"shared_memory_region": "r"})
    assert "shared memory is not served" in refused(json_body(shm))
    assert "non-empty list of inputs" in refused(b'{"inputs": []}')
    assert "must be a JSON object" in refused(b"[1]")


def binary_request(datatype: str, shape: list[int], payload: bytes) -> tuple[bytes, int]:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "X",
                    "datatype": datatype,
                    "shape": shape,
                    "parameters": {"binary_data_size": len(payload)},
                }
            ]
        }
    )
    return header + payload, len(header)


@pytest.mark.parametrize(
    ("datatype", "shape", "payload", "why"),
    [
        ("INT64", [1, 2], b"\0" * 8, "8 bytes of data, but INT64 of 2 elements takes 16"),
        ("BYTES", [2], b"\x02\0\0\0abcd", "BYTES data ends inside a length prefix"),
        ("BYTES", [1], b"\xff\xff\xff\xffab", "runs past the end of its data"),
        ("BYTES", [1], b"\x01\0\0\0ab", "1 bytes of BYTES data past its 1 elements"),
        ("BYTES", [3], b"\0" * 8, "8 bytes cannot hold 3 BYTES elements"),
    ],
)
def test_binary_tensors_against_their_shape(datatype, shape, payload, why):
    body, header_length = binary_request(datatype, shape, payload)
    assert why in refused(body, header_length)


def test_bytes_elements_are_bounded_by_the_rows_a_request_may_carry_before_any_walk():
    """A served model's BYTES input holds one element a row, at most MAX_ROWS_PER_REQUEST rows:
    more is refused from the declared shape, before the check reads a single length prefix (an
    8 MB body of two million empty elements costs no walk)."""
    from python_backend.common.contract import MAX_ROWS_PER_REQUEST as rows

    texts = np.array([[b"row"]] * rows, dtype=object)
    for binary in (True, False):
        check_json_request(*http_body({"TEXT": texts}, binary), LIMITS)
    for raw in (True, False):
        read_infer_request(grpc_request({"TEXT": texts}, raw).SerializeToString(), LIMITS)
    why = f"{rows + 1} BYTES elements, at most {rows}"
    over = np.array([[b"row"]] * (rows + 1), dtype=object)
    for binary in (True, False):
        assert why in refused(*http_body({"TEXT": over}, binary))
    for raw in (True, False):
        assert why in grpc_refused(grpc_request({"TEXT": over}, raw))
    empty = 2_000_000
    body, header_length = binary_request("BYTES", [empty, 1], b"\0" * (4 * empty))
    assert f"{empty} BYTES elements, at most {rows}" in refused(body, header_length)


def test_binary_sizes_against_the_body():
    body, header_length = binary_request("INT64", [1], b"\0" * 8)
    assert "runs past the end of the body" in refused(body[:-1], header_length)
    assert "2 bytes after the last binary input" in refused(body + b"..", header_length)
    assert "outside this" in refused(body, len(body) + 1)
    assert "outside this" in refused(body, 0)


def grpc_refused(request) -> str:
    with pytest.raises(Refused) as info:
        read_infer_request(request.SerializeToString(), LIMITS)
    return str(info.value)


def test_a_grpc_shape_whose_byte_size_wraps_to_zero_is_refused():
    request = service_pb2.ModelInferRequest(model_name="minilm")
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[1 << 32, 1 << 32])
    request.raw_input_contents.append(b"")
    assert "declares 18446744073709551616 elements" in grpc_refused(request)
    request.inputs[0].shape[:] = [-1, 1]
    assert "outside [0, 2^63-1]" in grpc_refused(request)


def test_grpc_contents_against_the_shape():
    request = grpc_request({"INPUT_IDS": IDS}, raw=False)
    del request.inputs[0].contents.int64_contents[-1]
    assert "contents has 11 elements, shape [3, 4] declares 12" in grpc_refused(request)
    request = grpc_request({"INPUT_IDS": IDS, "ATTENTION_MASK": IDS})
    del request.raw_input_contents[-1]
    assert "1 entries for 2 inputs" in grpc_refused(request)
    request = grpc_request({"INPUT_IDS": IDS})
    request.raw_input_contents[0] = request.raw_input_contents[0][:-8]
    assert "88 bytes of data, but INT64 of 12 elements takes 96" in grpc_refused(request)
    request = grpc_request({"TEXT": TEXTS})
    request.inputs[0].parameters["shared_memory_region"].string_param = "r"
    assert "shared memory is not served" in grpc_refused(request)
    request = grpc_request({"TEXT": TEXTS})
    for _ in range(65):
        request.outputs.add(name="EMBEDDING")
    assert "65 outputs, at most 64" in grpc_refused(request)
    assert "at least one input" in grpc_refused(service_pb2.ModelInferRequest())


def test_a_message_that_is_not_a_request_is_refused_and_a_stream_refusal_keeps_the_id():
    with pytest.raises(Refused, match="not a ModelInferRequest"):
        read_infer_request(b"\xff\xff\xff", LIMITS)
    request = grpc_request({"TEXT": TEXTS})
    request.id = "row-7"
    request.inputs[0].shape[:] = [1 << 32, 1 << 32]
    message = request.SerializeToString()
    with pytest.raises(Refused) as info:
        read_infer_request(message, LIMITS)
    answer = service_pb2.ModelStreamInferResponse.FromString(stream_refusal(message, info.value))
    assert answer.infer_response.id == "row-7" and "18446744073709551616" in answer.error_message


def test_check_grpc_request_takes_the_message_size_as_the_bound():
    request = grpc_request({"INPUT_IDS": IDS})
    size = len(request.SerializeToString())
    check_grpc_request(request, size, LIMITS)
    with pytest.raises(Refused, match="more than a 11-byte body"):
        check_grpc_request(request, 11, LIMITS)


def test_a_request_parameter_naming_the_client_is_the_doors_alone():
    body = json_body(text_input([1, 1], ["x"]), parameters={"x-planner-client": "me"})
    assert "set by the front door" in refused(body)
    request = grpc_request({"TEXT": TEXTS})
    request.parameters["x-planner-client"].string_param = "me"
    assert "set by the front door" in grpc_refused(request)


@pytest.mark.parametrize(
    ("key", "field", "value", "why"),
    [
        ("priority", "string_param", "high", "set as int64_param or uint64_param"),
        ("priority", "int64_param", -1, "must not be negative"),
        ("timeout", "int64_param", -5, "must not be negative"),  # Triton: a huge unsigned one
        ("timeout", "uint64_param", 5, "set as int64_param, not uint64_param"),
        ("sequence_start", "int64_param", 1, "set as bool_param"),
        ("triton_internal", "bool_param", True, "names starting triton_ are Triton's"),
    ],
)
def test_a_grpc_reserved_parameter_in_a_field_triton_does_not_take_is_refused(
    key, field, value, why
):
    request = grpc_request({"TEXT": TEXTS})
    setattr(request.parameters[key], field, value)
    message = grpc_refused(request)
    assert repr(key) in message and why in message


def test_grpc_reserved_parameters_triton_takes_pass():
    request = grpc_request({"TEXT": TEXTS})
    request.parameters["priority"].uint64_param = 2
    request.parameters["timeout"].int64_param = 1000
    request.parameters["sequence_id"].string_param = "s"
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    read_infer_request(request.SerializeToString(), LIMITS)


def test_json_parameters_of_triton_own_names_are_refused_at_every_level():
    assert "'classification' must be an integer" in refused(
        json_body(
            text_input([1, 1], ["x"]),
            outputs=[{"name": "SCORES", "parameters": {"classification": "3"}}],
        )
    )
    assert "'triton_x': names starting triton_" in refused(
        json_body(text_input([1, 1], ["x"]), parameters={"triton_x": 1})
    )


def test_the_passed_json_is_the_checked_object_written_again():
    body = (
        b'{"inputs":[{"name":"TEXT","datatype":"BYTES","shape":[1,9],"shape":[1,1],"data":["x"]}]}'
    )
    passed = check_json_request(body, None, LIMITS)
    assert orjson.loads(passed.body()) == orjson.loads(body)
    assert passed.body().count(b'"shape"') == 1 and not passed.binary_extension


def test_a_parameter_name_holding_a_nul_is_refused():
    # Triton cuts member names at a NUL: "priority\0" would be read as Triton's priority
    body = json_body(text_input([1, 1], ["x"]), parameters={"priority\0": "high"})
    assert "holds a NUL character" in refused(body)
    request = grpc_request({"TEXT": TEXTS})
    request.parameters["x-planner-client\0"].string_param = "me"
    assert "holds a NUL character" in grpc_refused(request)


class FakeStreamCall:
    """Triton's side of a ModelStreamInfer call: answers each message written, at once."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.answers: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def write(self, message: bytes) -> None:
        self.written.append(message)
        await self.answers.put(b"answer to " + message[-8:])

    async def done_writing(self) -> None:
        await self.answers.put(None)

    def __aiter__(self):
        return self

    async def __anext__(self) -> bytes:
        answer = await self.answers.get()
        if answer is None:
            raise StopAsyncIteration
        return answer

    def done(self) -> bool:
        return self.answers.empty()

    def cancel(self) -> None:
        pass

    async def code(self):
        import grpc

        return grpc.StatusCode.OK


class FakeContext:
    def time_remaining(self) -> None:
        return None

    def invocation_metadata(self) -> tuple:
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5"


def test_a_stream_whose_client_stops_reading_stops_being_read():
    """ModelStreamInfer: messages are read and sent to Triton only while fewer than
    UNREAD_ANSWERS answers wait for the client; a client that reads nothing gets no more of its
    requests computed and held. Refused messages hold a slot like answered ones; every message
    is answered once the client reads."""
    from body_check.proxy import UNREAD_ANSWERS, CheckSettings, GrpcCheck

    good = grpc_request({"TEXT": TEXTS}).SerializeToString()
    messages = [good if k % 5 else b"\xff not a request" for k in range(64)]
    read = []

    async def client_messages():
        for message in messages:
            read.append(message)
            yield message

    async def scenario() -> tuple[int, int, int]:
        check = GrpcCheck(CheckSettings("127.0.0.1:1", "127.0.0.1:1", 1 << 20))
        upstream = FakeStreamCall()
        check.stream_call = lambda **_: upstream
        answers = check.stream_infer(client_messages(), FakeContext())
        first = await anext(answers)  # the client reads one answer, then stops reading
        assert first
        await asyncio.sleep(0.2)
        held = len(read)
        got = 1 + len([a async for a in answers])  # then reads them all
        await check.channel.close()
        return held, got, len(upstream.written)

    held, got, written = asyncio.run(scenario())
    assert held <= UNREAD_ANSWERS + 1, f"{held} messages read while the client read one answer"
    assert got == len(messages)
    assert written == sum(1 for m in messages if m == good)


def test_a_clients_stream_messages_and_answers_in_flight_stay_within_its_share():
    """Messages read and answers not yet sent back are held to the client's share: a message
    passes on while they hold under half of it, Triton's next answer is read while under all of
    it. A client that reads no answer gets a few messages read, not UNREAD_ANSWERS' worth of
    large ones; once it reads, every message is answered and nothing stays held."""
    from body_check.proxy import UNREAD_ANSWERS, CheckSettings, GrpcCheck

    big = np.array([[b"x" * 600_000]], dtype=object)
    message = grpc_request({"TEXT": big}).SerializeToString()
    read = []

    class Echo(FakeStreamCall):
        async def write(self, message: bytes) -> None:
            self.written.append(message)
            await self.answers.put(message)  # an answer as large as its message

    async def client_messages():
        for _ in range(3 * UNREAD_ANSWERS):
            read.append(1)
            yield message

    async def scenario() -> tuple[int, int, int, int]:
        settings = CheckSettings(
            "127.0.0.1:1", "127.0.0.1:1", 1 << 20, stream_message_bytes=1 << 20
        )
        check = GrpcCheck(settings)
        check.stream_call = lambda **_: Echo()
        answers = check.stream_infer(client_messages(), FakeContext())
        assert await anext(answers) == message  # the client reads one answer, then stops
        await asyncio.sleep(0.2)
        held, flowing = len(read), check.budget.flowing.get("ipv4:127.0.0.1:5", 0)
        got = 1 + len([a async for a in answers])
        await check.channel.close()
        return held, flowing, got, check.budget.total + sum(check.budget.flowing.values())

    held, flowing, got, left = asyncio.run(scenario())
    share = 2 << 20
    assert held <= 4, f"{held} messages of 600 kB read while the client read one answer"
    assert flowing <= share + len(message)
    assert got == 3 * UNREAD_ANSWERS and left == 0


def stalled_worker(settings, listen, stamp) -> None:
    """A body-check worker whose event loop beats once, then answers nothing (a wedged loop)."""
    import time

    stamp.value = time.monotonic()
    time.sleep(60)


def test_several_workers_end_the_command_when_one_stops_beating():
    """With CHECK_WORKERS > 1 the launcher's /health probe reaches one worker, at random: the
    command itself watches each worker's beat, and one silent for too long ends it (exit 1),
    so the launcher starts the check again, as when a worker dies."""
    import signal
    import time

    from body_check.proxy import CheckSettings
    from body_check.server import Listen, serve_many

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    started = time.monotonic()
    try:
        code = serve_many(
            CheckSettings("127.0.0.1:1", "127.0.0.1:1", 1 << 20),
            Listen("127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"),
            workers=2,
            target=stalled_worker,
            wedged_after_s=1.0,
        )
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert code == 1 and time.monotonic() - started < 30


class Aborted(Exception):
    def __init__(self, code, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code, self.details = code, details


class ClientContext(FakeContext):
    """A unary call's context as the front door hands it on: the client's name in metadata."""

    def __init__(self, client: str) -> None:
        self.client = client

    def invocation_metadata(self) -> tuple:
        return (("x-planner-client", self.client),)

    async def abort(self, code, details: str):
        raise Aborted(code, details)


def test_slow_grpc_messages_hold_only_their_clients_share_and_end_at_the_body_deadline():
    """ModelInfer messages are read only while the bytes being received fit: two messages' worth
    a client, a bound in all. A client that opens calls and never sends their messages holds its
    own share until the body deadline ends them, and its next call waits for that; another
    client is served at once, unless the bound in all is what the parked calls hold."""
    import time

    import grpc

    from body_check.proxy import CheckSettings, GrpcCheck

    good = grpc_request({"TEXT": TEXTS}).SerializeToString()
    deadline_s = 0.5

    async def parked():
        await asyncio.Event().wait()  # the message never comes
        yield b""

    async def sent():
        yield good

    async def upstream(message, metadata=None, timeout=None):
        return b"answer to " + message[-8:]

    async def outcome(call) -> tuple[str | bytes, float]:
        started = time.monotonic()
        try:
            answer = await call
        except Aborted as aborted:
            answer = aborted.code.name
        return answer, time.monotonic() - started

    async def scenario(in_all: int) -> list:
        settings = CheckSettings(
            "127.0.0.1:1",
            "127.0.0.1:1",
            1 << 20,
            grpc_bytes_in_progress=in_all,
            body_deadline_s=deadline_s,
        )
        check = GrpcCheck(settings)
        check.infer_call = upstream
        parked_calls = [
            asyncio.ensure_future(outcome(check.infer(parked(), ClientContext("slow"))))
            for _ in range(2)
        ]
        await asyncio.sleep(0.05)
        waiting = asyncio.ensure_future(outcome(check.infer(sent(), ClientContext("slow"))))
        other = await outcome(check.infer(sent(), ClientContext("other")))
        results = [other, await waiting, *await asyncio.gather(*parked_calls)]
        await check.channel.close()
        return results

    answer = b"answer to " + good[-8:]
    expired = grpc.StatusCode.DEADLINE_EXCEEDED.name
    other, waiting, *parked_ends = asyncio.run(scenario(in_all=1 << 30))
    assert other[0] == answer and other[1] < 0.2, "another client is served at once"
    assert waiting[0] == answer and waiting[1] > 0.3, "the slow client's next call waits its turn"
    assert [end for end, _ in parked_ends] == [expired, expired]
    assert all(deadline_s - 0.05 < took < deadline_s + 0.3 for _, took in parked_ends)
    # in all: the two parked messages fill a bound of two, so another client waits too
    other, waiting, *parked_ends = asyncio.run(scenario(in_all=2 << 20))
    assert other[0] == answer and other[1] > 0.3
    assert waiting[0] == answer
    assert [end for end, _ in parked_ends] == [expired, expired]


def test_each_open_stream_holds_its_largest_message_and_a_client_has_a_share_of_streams():
    """A stream always waits for its next message, so each open stream holds the largest a
    stream message may be, for its life: a client may open as many as fit in its share (two
    ModelInfer messages' worth, apart from its calls' share), within the bound in all; one past
    that is refused at once, naming the bound, and the share comes back when a stream ends."""
    import grpc

    from body_check.proxy import CheckSettings, GrpcCheck

    async def idle():
        await asyncio.Event().wait()  # an open stream that sends nothing
        yield b""

    async def first_answer(check: GrpcCheck, client: str) -> str:
        stream = check.stream_infer(idle(), ClientContext(client))
        try:
            await asyncio.wait_for(anext(stream), 0.1)
        except Aborted as aborted:
            return f"{aborted.code.name}: {aborted.details}"
        except TimeoutError:
            return "open"
        return "answered"

    class Upstream(FakeStreamCall):
        """Triton's stream, open until the check cancels it."""

        cancelled = False

        def done(self) -> bool:
            return self.cancelled

        def cancel(self) -> None:
            self.cancelled = True
            self.answers.put_nowait(None)

    async def scenario(in_all: int) -> tuple[list[str], ...]:
        settings = CheckSettings(
            "127.0.0.1:1",
            "127.0.0.1:1",
            1 << 20,
            grpc_bytes_in_progress=in_all,
            stream_message_bytes=256 << 10,
        )
        check = GrpcCheck(settings)
        check.stream_call = lambda **_: Upstream()
        opened = [asyncio.ensure_future(first_answer(check, "a")) for _ in range(8)]
        await asyncio.sleep(0.02)
        past = await first_answer(check, "a")
        other = await first_answer(check, "b")
        # a stream that ends gives its room back (wait_for cancelled the first ones: ended)
        again = await first_answer(check, "a")
        held = check.budget.total
        await check.channel.close()
        return await asyncio.gather(*opened), [past, other, again], [str(held)]

    opened, (past, other, again), (held,) = asyncio.run(scenario(in_all=1 << 30))
    assert opened == ["open"] * 8  # 2 MiB a client: eight streams of 256 KiB
    assert past.startswith(grpc.StatusCode.RESOURCE_EXHAUSTED.name)
    assert "has 8 streams open" in past and "262144 bytes" in past and "end one" in past
    assert other == "open" and again == "open"
    assert held == "0", "every stream's room is given back when it ends"
    # the bound in all (two messages' worth: 2 MiB), half of it for streams: four streams, so
    # the fifth of any client is refused, saying so
    opened, (past, other, again), _ = asyncio.run(scenario(in_all=1 << 20))
    assert opened[:4] == ["open"] * 4 and set(opened[4:]) == {past} and other == past
    assert past.startswith(grpc.StatusCode.RESOURCE_EXHAUSTED.name)
    assert "holds its most for streams" in past and "retry later" in past


def test_a_modelinfer_message_holds_its_own_size_of_the_clients_room_until_its_call_ends():
    """Read, a ModelInfer message holds its size (not the largest a message may be) until
    Triton answers: many small calls of one client reach Triton side by side, while a client
    whose large calls are still at Triton waits before its next message is read."""
    from body_check.proxy import CheckSettings, GrpcCheck

    small = grpc_request({"TEXT": TEXTS}).SerializeToString()
    large = grpc_request({"TEXT": np.array([[b"x" * 700_000]], dtype=object)}).SerializeToString()
    at_triton: list[bytes] = []
    answer_now = asyncio.Event()

    async def upstream(message, metadata=None, timeout=None):
        at_triton.append(message)
        await answer_now.wait()
        return b"answer"

    async def one(message: bytes):
        yield message

    async def scenario() -> tuple[int, int, int, int]:
        check = GrpcCheck(CheckSettings("127.0.0.1:1", "127.0.0.1:1", 1 << 20))
        check.infer_call = upstream
        calls = [check.infer(one(small), ClientContext("many")) for _ in range(20)]
        calls += [check.infer(one(large), ClientContext("large")) for _ in range(3)]
        tasks = [asyncio.ensure_future(call) for call in calls]
        await asyncio.sleep(0.2)
        small_there = sum(m == small for m in at_triton)
        large_there = sum(m == large for m in at_triton)
        answer_now.set()
        answers = await asyncio.gather(*tasks)
        await check.channel.close()
        return small_there, large_there, answers.count(b"answer"), check.budget.total

    small_there, large_there, answered, left = asyncio.run(scenario())
    assert small_there == 20, "small calls are not held to two at a time"
    # two held at Triton (1.4 MB) leave no room for a third read of up to 1 MiB in 2 MiB
    assert large_there == 2
    assert answered == 23 and left == 0


def test_priority_becomes_the_models_class_parameter_and_a_client_may_not_send_that():
    """Triton keeps a request's priority to itself; the check writes it again as the model's
    class parameter, over HTTP and gRPC; a request naming that parameter itself is refused."""
    from body_check.proxy import read_infer_request
    from python_backend.common.contract import CLASS_PARAMETER

    body = json_body(text_input([1, 1], ["x"]), parameters={"priority": 2})
    passed = orjson.loads(check_json_request(body, None, LIMITS).body())
    assert passed["parameters"] == {"priority": 2, CLASS_PARAMETER: 2}
    plain = json_body(text_input([1, 1], ["x"]), parameters={"priority": 0})
    assert (
        CLASS_PARAMETER
        not in orjson.loads(check_json_request(plain, None, LIMITS).body())["parameters"]
    )
    huge = json_body(text_input([1, 1], ["x"]), parameters={"priority": (1 << 64) - 1})
    assert (
        orjson.loads(check_json_request(huge, None, LIMITS).body())["parameters"][CLASS_PARAMETER]
        == (1 << 63) - 1
    )
    forged = json_body(text_input([1, 1], ["x"]), parameters={CLASS_PARAMETER: 1})
    assert "written from priority" in refused(forged)

    request = grpc_request({"TEXT": TEXTS})
    message = request.SerializeToString()
    assert read_infer_request(message, LIMITS) == message  # no priority: byte for byte
    for field_name in ("int64_param", "uint64_param"):
        request = grpc_request({"TEXT": TEXTS})
        setattr(request.parameters["priority"], field_name, 3)
        passed = service_pb2.ModelInferRequest.FromString(
            read_infer_request(request.SerializeToString(), LIMITS)
        )
        assert passed.parameters[CLASS_PARAMETER].int64_param == 3
        assert passed.parameters["priority"] == request.parameters["priority"]
        assert list(passed.raw_input_contents) == list(request.raw_input_contents)
    request = grpc_request({"TEXT": TEXTS})
    request.parameters[CLASS_PARAMETER].int64_param = 1
    assert "written from priority" in grpc_refused(request)
