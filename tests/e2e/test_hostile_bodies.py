"""Inference bodies that end Triton 2.51 or its model's stub, sent through the front door: the
body check refuses each before Triton parses it, with a message naming the input and the limit.

Each case is followed by a valid request over HTTP and gRPC whose answer is checked against the
model run on that row alone, and no process of the deployment was restarted (the same pids).
The first test shows the cases are real: sent to an unguarded Triton 2.51, they end it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from testkit.triton_clients import PROTOCOLS, client, infer, text_inputs
from tests.e2e.stack import API_KEY, SHORT_LIMITS

TOLERANCE = 1e-4
MODEL = "minilm"
AUTH_METADATA = (("authorization", f"Bearer {API_KEY}"),)
BODY_LIMIT = 1 << 20  # SHORT_LIMITS' MAX_BODY_SIZE
assert SHORT_LIMITS["MAX_BODY_SIZE"] == "1m"


def kserve_json(*inputs: dict) -> bytes:
    return json.dumps({"inputs": list(inputs)}).encode()


def nested(levels: int) -> bytes:
    inner = b"[" * levels + b'"x"' + b"]" * levels
    return b'{"inputs":[{"name":"TEXT","datatype":"BYTES","shape":[1,1],"data":' + inner + b"}]}"


# body -> (what it is, what the refusal names); each ends Triton 2.51 when sent to it directly
HTTP_CASES = {
    "an INT64 shape of 2^40 elements": (
        kserve_json({"name": "INPUT_IDS", "datatype": "INT64", "shape": [1, 1 << 40], "data": [1]}),
        "declares 1099511627776 elements",
    ),
    "a shape whose byte size wraps 2^64": (
        kserve_json({"name": "INPUT_IDS", "datatype": "INT64", "shape": [1 << 61, 1], "data": [1]}),
        "declares 2305843009213693952 elements",  # 8 bytes each: 2^64 bytes, 0 once wrapped
    ),
    "900 kB of opening brackets": (b"[" * 900_000, "not valid JSON"),
    "TEXT data nested 300,000 levels deep": (nested(300_000), "not valid JSON"),
    "TEXT data nested deeper than its shape": (nested(40), "nested deeper than its shape"),
}


def post(port: int, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/models/{MODEL}/infer",
        data=body,
        headers={"Authorization": f"Bearer {API_KEY}", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@pytest.fixture
def nothing_restarted(stack, tokenizer, reference_model):
    """After the test: the same processes, and a valid request over each protocol is right."""
    before = stack.server_processes()
    yield
    text = "The body check kept the server serving."
    expected = reference_model(tokenizer.encode([text], truncate=True))
    for protocol in PROTOCOLS:
        embedding, _ = infer(
            client(stack, protocol),
            MODEL,
            text_inputs(protocol, [text]),
            headers=dict(AUTH_METADATA),
        )
        assert np.abs(embedding - expected).max() <= TOLERANCE, protocol
    assert stack.server_processes() == before, "a process of the deployment was restarted"


def test_the_cases_end_an_unguarded_triton(repository, tmp_path):
    """Sent to Triton 2.51's own port (no door), the first case aborts the server."""
    from tests.e2e.conftest import repository_of, start_server

    only_minilm = repository_of(repository, ("minilm",), tmp_path)
    server = start_server(only_minilm, tmp_path / "unguarded.log")
    try:
        body, _ = HTTP_CASES["an INT64 shape of 2^40 elements"]
        with pytest.raises(Exception):  # noqa: B017 - the connection dies with the server
            post(server.http_port, body)
        server.process.wait(timeout=30)
        assert server.process.returncode != 0
    finally:
        server.stop()


@pytest.mark.parametrize("case", sorted(HTTP_CASES))
def test_a_hostile_kserve_http_body_is_refused_before_triton(stack, nothing_restarted, case):
    body, why = HTTP_CASES[case]
    assert len(body) < BODY_LIMIT
    status, answer = post(stack.http_port, body)
    assert status == 400, answer[:300]
    assert why in json.loads(answer)["error"]


def binary_body(payload: bytes, declared: int, shape: list[int]) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "TEXT",
                    "datatype": "BYTES",
                    "shape": shape,
                    "parameters": {"binary_data_size": declared},
                }
            ]
        }
    ).encode()
    headers = {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }
    return header + payload, headers


@pytest.mark.parametrize(
    ("payload", "declared", "shape", "why"),
    [
        (b"\xff\xff\xff\x7f" + b"x" * 8, 12, [1, 1], "runs past the end of its data"),
        (b"\x02\0\0\0hi", 6, [1 << 32, 1 << 32], "declares 18446744073709551616 elements"),
        (b"\x02\0\0\0hi", 600, [1, 1], "runs past the end of the body"),
        # 200,000 empty elements: refused from the shape, before any length prefix is walked
        (b"\0" * 800_000, 800_000, [200_000, 1], "200000 BYTES elements, at most 64"),
    ],
    ids=["element past its data", "wrapping shape", "size past the body", "many elements"],
)
def test_a_binary_tensor_that_disagrees_with_its_header_is_refused(
    stack, nothing_restarted, payload, declared, shape, why
):
    body, headers = binary_body(payload, declared, shape)
    status, answer = post(stack.http_port, body, headers)
    assert status == 400 and why in json.loads(answer)["error"], answer[:300]


def grpc_stub(stack):
    channel = grpc.insecure_channel(stack.grpc_url)
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def wrapping_request(request_id: str = "") -> service_pb2.ModelInferRequest:
    """Its byte size wraps to zero in 64 bits: Triton 2.51's stub dies building its array."""
    request = service_pb2.ModelInferRequest(model_name=MODEL, id=request_id)
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[1 << 32, 1 << 32])
    request.raw_input_contents.append(b"")
    return request


def valid_request(request_id: str) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=MODEL, id=request_id)
    tensor = request.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 1])
    tensor.contents.bytes_contents.append(b"a valid row in the same stream")
    return request


def test_a_grpc_shape_that_wraps_to_zero_bytes_is_invalid_argument(stack, nothing_restarted):
    channel, stub = grpc_stub(stack)
    with channel, pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(wrapping_request(), metadata=AUTH_METADATA, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'TEXT'" in info.value.details() and "18446744073709551616" in info.value.details()


def test_grpc_contents_that_disagree_with_the_shape_are_invalid_argument(stack, nothing_restarted):
    request = valid_request("short")
    request.inputs[0].shape[:] = [4, 1]  # one element sent for four
    channel, stub = grpc_stub(stack)
    with channel, pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, metadata=AUTH_METADATA, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "contents has 1 elements, shape [4, 1] declares 4" in info.value.details()


def test_a_bad_message_in_a_stream_gets_an_error_and_the_stream_goes_on(stack, nothing_restarted):
    messages = [valid_request("before"), wrapping_request("bad"), valid_request("after")]
    channel, stub = grpc_stub(stack)
    with channel:
        answers = list(stub.ModelStreamInfer(iter(messages), metadata=AUTH_METADATA, timeout=60))
    by_id = {a.infer_response.id: a for a in answers}
    assert set(by_id) == {"before", "bad", "after"}
    assert "18446744073709551616" in by_id["bad"].error_message
    for good in ("before", "after"):
        assert not by_id[good].error_message
        assert by_id[good].infer_response.outputs[0].name


def test_a_stream_of_more_messages_than_wait_unread_is_answered_whole(stack, nothing_restarted):
    """The check reads a stream's messages only while few answers wait for the client
    (UNREAD_ANSWERS): a client that reads them gets every one, bad messages refused in place."""
    from body_check.proxy import UNREAD_ANSWERS

    count = 5 * UNREAD_ANSWERS
    messages = [
        wrapping_request(f"m{k}") if k % 7 == 3 else valid_request(f"m{k}") for k in range(count)
    ]
    channel, stub = grpc_stub(stack)
    with channel:
        answers = list(stub.ModelStreamInfer(iter(messages), metadata=AUTH_METADATA, timeout=60))
    by_id = {a.infer_response.id: a for a in answers}
    assert set(by_id) == {f"m{k}" for k in range(count)} and len(answers) == count
    for k in range(count):
        answer = by_id[f"m{k}"]
        assert bool(answer.error_message) == (k % 7 == 3), answer.error_message


def long_request(request_id: str, size: int) -> service_pb2.ModelInferRequest:
    request = valid_request(request_id)
    request.inputs[0].contents.bytes_contents[0] = b"long text " * (size // 10)
    return request


def test_a_stream_carries_more_than_the_body_limit_in_messages_each_under_its_own(
    stack, nothing_restarted
):
    """MAX_BODY_SIZE bounds each message of a stream, not the stream's life; a message over
    CHECK_STREAM_MESSAGE_SIZE ends its stream RESOURCE_EXHAUSTED, refused by gRPC from its
    length prefix, before it is buffered."""
    from tools.serve import ServeSettings

    stream_limit = ServeSettings.check_stream_message_size  # the launcher's default: 256k
    assert stream_limit == "256k"
    messages = [long_request(f"m{k}", 200_000) for k in range(8)]
    assert sum(m.ByteSize() for m in messages) > BODY_LIMIT
    channel, stub = grpc_stub(stack)
    with channel:
        answers = list(stub.ModelStreamInfer(iter(messages), metadata=AUTH_METADATA, timeout=60))
        assert sorted(a.infer_response.id for a in answers) == sorted(f"m{k}" for k in range(8))
        assert not any(a.error_message for a in answers)
        with pytest.raises(grpc.RpcError) as info:
            list(
                stub.ModelStreamInfer(
                    iter([long_request("over", 300_000)]), metadata=AUTH_METADATA, timeout=60
                )
            )
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in info.value.details()


def test_a_client_opens_as_many_streams_as_its_share_holds_and_one_more_is_refused(
    stack, nothing_restarted
):
    """Each open stream holds the largest stream message: a client gets two bodies' worth
    (2 x 1 MiB / 256 KiB: 8 streams); the ninth is refused at once, naming the bound, and the
    eight go on serving."""
    import threading

    release = threading.Event()

    def held_open(request_id: str):
        yield valid_request(request_id)
        release.wait(60)

    channel, stub = grpc_stub(stack)
    with channel:
        streams = [
            stub.ModelStreamInfer(held_open(f"s{k}"), metadata=AUTH_METADATA, timeout=60)
            for k in range(8)
        ]
        try:
            firsts = [next(stream) for stream in streams]  # all eight open and answered
            with pytest.raises(grpc.RpcError) as info:
                next(stub.ModelStreamInfer(held_open("s8"), metadata=AUTH_METADATA, timeout=60))
        finally:
            release.set()
        rest = [list(stream) for stream in streams]
    assert [a.infer_response.id for a in firsts] == [f"s{k}" for k in range(8)]
    assert not any(a.error_message for a in firsts) and rest == [[]] * 8
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "this client has 8 streams open" in info.value.details()
