"""Hostile traffic on the public ports: the front door takes it, Triton never sees it.

Every case runs against the deployment `make serve` runs (tests/e2e/stack.py) and ends with a
valid request whose answer is checked against the model run on that row alone.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from testkit.triton_clients import PROTOCOLS, client, infer, infer_error, text_inputs
from tests.e2e.scenarios import cancel_while_busy
from tests.e2e.stack import API_KEY, SHORT_LIMITS

TOLERANCE = 1e-4


def auth() -> dict[str, str]:
    """A fresh dict each call: tritonclient's HTTP client adds its own headers to the one given.
    The key is lowercase, as gRPC metadata keys must be."""
    return {"authorization": f"Bearer {API_KEY}"}


CLIENT_TIMEOUT_S = float(SHORT_LIMITS["CLIENT_TIMEOUT_S"])
MAX_CONNECTIONS = int(SHORT_LIMITS["MAX_CONNECTIONS_PER_CLIENT"])
INFER_PATH = "/v2/models/minilm/infer"
VALID_BODY = b'{"inputs":[{"name":"TEXT","datatype":"BYTES","shape":[1,1],"data":["hi"]}]}'


def exchange(port: int, data: bytes, wait_s: float = 5.0, source: str = "127.0.0.1") -> bytes:
    """Sends raw bytes, returns whatever comes back until the server closes or goes quiet."""
    with socket.create_connection(
        ("127.0.0.1", port), timeout=wait_s, source_address=(source, 0)
    ) as s:
        # the server may close mid-send; what it answered is still readable
        with contextlib.suppress(OSError):
            s.sendall(data)
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except (TimeoutError, ConnectionResetError):
            pass
        return b"".join(chunks)


def read_until_closed(s: socket.socket) -> bytes:
    """What the server sent before it closed (a reset after a timeout counts as closed)."""
    try:
        return s.recv(4096)
    except ConnectionResetError:
        return b""


def status_of(response: bytes) -> int:
    assert response.startswith(b"HTTP/1.1 "), response[:200]
    return int(response[9:12])


def request_bytes(
    body: bytes = VALID_BODY, path: str = INFER_PATH, extra: bytes = b"", keep_alive: bool = False
) -> bytes:
    """One request; unless ``keep_alive``, it asks the server to close after answering, so an
    exchange ends with the answer instead of waiting out its timeout."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n".encode()
        + (b"" if keep_alive else b"Connection: close\r\n")
        + extra
        + b"\r\n"
        + body
    )


@pytest.fixture
def still_serving(stack, tokenizer, reference_model):
    """After the test: a valid request over each protocol gets the right output."""
    yield
    text = "The front door kept the server serving."
    expected = reference_model(tokenizer.encode([text], truncate=True))
    for protocol in PROTOCOLS:
        embedding, _ = infer(
            client(stack, protocol), "minilm", text_inputs(protocol, [text]), headers=auth()
        )
        assert np.abs(embedding - expected).max() <= TOLERANCE, protocol
    assert stack.ready()


def test_inference_through_the_front_door_matches_the_reference(
    stack, still_serving, tokenizer, reference_model
):
    from builder.corpus import corpus_rows

    texts = corpus_rows(10, seed=3)
    expected = reference_model(tokenizer.encode(texts, truncate=True))
    for protocol in PROTOCOLS:
        embedding, _ = infer(
            client(stack, protocol), "minilm", text_inputs(protocol, texts), headers=auth()
        )
        assert np.abs(embedding - expected).max() <= TOLERANCE


# ---- hostile HTTP, one kind per case ------------------------------------------------------


def chunked(port: int, chunk: bytes, count: int) -> bytes:
    head = (
        f"POST {INFER_PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    ).encode()
    framed = b"%x\r\n%s\r\n" % (len(chunk), chunk)
    return exchange(port, head + framed * count + b"0\r\n\r\n", wait_s=20)


def test_a_chunked_flood_reaches_triton_only_as_one_whole_body(stack, still_serving):
    """3.6 MB of 6-byte chunks: the request that ends Triton 2.51 when it reaches it. The door
    reads it whole and passes 600 kB with a Content-Length; Triton refuses the JSON and serves on."""
    response = chunked(stack.http_port, b"a", 600_000)
    assert status_of(response) in (400, 500) and b"JSON" in response, response[:300]


def test_a_chunked_body_over_the_limit_gets_413(stack, still_serving):
    assert status_of(chunked(stack.http_port, b"aaaa", 300_000)) == 413


def test_a_chunked_body_under_the_limit_reaches_triton_whole(stack, still_serving):
    head = (
        f"POST {INFER_PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    ).encode()
    body = b"".join(b"%x\r\n%s\r\n" % (1, VALID_BODY[i : i + 1]) for i in range(len(VALID_BODY)))
    response = exchange(stack.http_port, head + body + b"0\r\n\r\n")
    assert status_of(response) == 200 and b'"EMBEDDING"' in response


def test_a_body_over_the_limit_gets_413(stack, still_serving):
    body = (
        b'{"inputs":[{"name":"TEXT","datatype":"BYTES","shape":[1,1],"data":["'
        + b"x" * (2 << 20)
        + b'"]}]}'
    )
    response = exchange(stack.http_port, request_bytes(body))
    assert status_of(response) == 413 and b"limit" in response


def test_a_huge_header_is_refused(stack, still_serving):
    response = exchange(stack.http_port, request_bytes(extra=b"X-Big: " + b"a" * 65536 + b"\r\n"))
    assert status_of(response) in (400, 431)


def test_many_headers_are_refused(stack, still_serving):
    extra = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(2000))
    response = exchange(stack.http_port, request_bytes(extra=extra))
    assert status_of(response) in (400, 431)


def test_slow_headers_are_cut_off_at_the_header_timeout(stack, still_serving):
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", stack.http_port), timeout=30) as s:
        s.sendall(b"POST " + INFER_PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n")
        # ... and never the rest
        response = read_until_closed(s)
    elapsed = time.monotonic() - started
    assert response == b"" or status_of(response) == 408
    assert CLIENT_TIMEOUT_S - 0.5 <= elapsed <= CLIENT_TIMEOUT_S + 5


def test_a_slow_body_is_cut_off_at_the_body_timeout(stack, still_serving):
    head = request_bytes(body=b"")
    head = head.replace(b"Content-Length: 0", b"Content-Length: 1000")
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", stack.http_port), timeout=30) as s:
        s.sendall(head + b'{"inputs"')
        response = read_until_closed(s)
    elapsed = time.monotonic() - started
    assert response == b"" or status_of(response) == 408
    assert elapsed <= CLIENT_TIMEOUT_S + 5


@pytest.mark.parametrize(
    "raw",
    [
        b"GARBAGE\r\n\r\n",
        b"POST /v2/models/minilm/infer HTTP/9.9\r\nHost: x\r\n\r\n",
        b"POST  HTTP/1.1\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,  # a TLS hello
        b"POST /v2/models/minilm%2F..%2F..%2Frepository/index HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v2/models/minilm/../../repository/index HTTP/1.1\r\nHost: x\r\n\r\n",
    ],
    ids=["no method", "bad version", "no path", "tls hello", "escaped path", "dot segments"],
)
def test_malformed_request_lines_get_400(stack, still_serving, raw):
    response = exchange(stack.http_port, raw)
    assert response == b"" or status_of(response) in (400, 403, 404, 505)


@pytest.mark.parametrize("length", [b"-1", b"99999999999999999999999", b"12, 13", b"abc"], ids=str)
def test_a_bad_content_length_is_refused(stack, still_serving, length):
    raw = request_bytes().replace(
        f"Content-Length: {len(VALID_BODY)}".encode(), b"Content-Length: " + length
    )
    assert status_of(exchange(stack.http_port, raw)) in (400, 413)


def test_a_content_length_longer_than_the_body_times_out(stack, still_serving):
    raw = request_bytes().replace(
        f"Content-Length: {len(VALID_BODY)}".encode(),
        f"Content-Length: {len(VALID_BODY) + 50}".encode(),
    )
    started = time.monotonic()
    response = exchange(stack.http_port, raw, wait_s=CLIENT_TIMEOUT_S + 10)
    assert response == b"" or status_of(response) == 408
    assert time.monotonic() - started <= CLIENT_TIMEOUT_S + 6


def test_a_content_length_shorter_than_the_body_leaves_garbage_that_is_refused(
    stack, still_serving
):
    raw = request_bytes(body=VALID_BODY + b"TRAILING GARBAGE\r\n\r\n", keep_alive=True)
    raw = raw.replace(
        f"Content-Length: {len(VALID_BODY) + 20}".encode(),
        f"Content-Length: {len(VALID_BODY)}".encode(),
    )
    response = exchange(stack.http_port, raw)
    _, _, rest = response.partition(b"HTTP/1.1 ")[2].partition(b"HTTP/1.1 ")
    assert response.startswith(b"HTTP/1.1 200") and b'"EMBEDDING"' in response
    assert rest.startswith(b"400"), response[-300:]


def test_garbage_pipelined_after_a_valid_request_is_refused_alone(stack, still_serving):
    response = exchange(
        stack.http_port, request_bytes(keep_alive=True) + b"\x00\xff NOT HTTP \r\n\r\n"
    )
    answers = response.split(b"HTTP/1.1 ")[1:]
    assert answers[0].startswith(b"200") and b'"EMBEDDING"' in answers[0]
    assert answers[1].startswith(b"400")


MANAGEMENT_ROUTES = [
    ("GET", "/v2/systemsharedmemory/status"),
    ("POST", "/v2/systemsharedmemory/region/r/register"),
    ("GET", "/v2/cudasharedmemory/status"),
    ("POST", "/v2/cudasharedmemory/region/r/unregister"),
    ("POST", "/v2/repository/index"),
    ("POST", "/v2/repository/models/minilm/load"),
    ("POST", "/v2/repository/models/minilm/unload"),
    ("GET", "/v2/logging"),
    ("POST", "/v2/logging"),
    ("GET", "/v2/trace/setting"),
    ("POST", "/v2/models/minilm/trace/setting"),
]


@pytest.mark.parametrize(("method", "path"), MANAGEMENT_ROUTES, ids=lambda x: str(x))
def test_every_management_route_is_refused_over_http(stack, still_serving, method, path):
    for headers in (auth(), {**auth(), "admin-key": "guess"}):
        request = urllib.request.Request(
            f"http://127.0.0.1:{stack.http_port}{path}",
            data=b"{}" if method == "POST" else None,
            method=method,
            headers=headers,
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 403
        assert b"not served on the public port" in refused.value.read()


def test_triton_itself_restricts_management_routes_with_a_key_nobody_was_told(stack):
    """Behind the door, on loopback, Triton still refuses them: the admin key is random."""
    port = stack.ports["TRITON_HTTP"]
    for headers in ({}, {"admin-key": ""}, {"admin-key": "admin"}):
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v2/repository/index", data=b"{}", headers=headers
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 403 and b"restricted" in refused.value.read()


GRPC_MANAGEMENT = {
    "repository index": lambda c: c.get_model_repository_index(headers=auth()),
    "load model": lambda c: c.load_model("minilm", headers=auth()),
    "unload model": lambda c: c.unload_model("minilm", headers=auth()),
    "log settings": lambda c: c.get_log_settings(headers=auth()),
    "update log settings": lambda c: c.update_log_settings(
        {"log_verbose_level": 1}, headers=auth()
    ),
    "trace settings": lambda c: c.get_trace_settings(headers=auth()),
    "system shm status": lambda c: c.get_system_shared_memory_status(headers=auth()),
    "system shm register": lambda c: c.register_system_shared_memory("r", "/k", 64, headers=auth()),
    "cuda shm status": lambda c: c.get_cuda_shared_memory_status(headers=auth()),
    "cuda shm unregister": lambda c: c.unregister_cuda_shared_memory(headers=auth()),
}


@pytest.mark.parametrize("call", sorted(GRPC_MANAGEMENT))
def test_every_management_method_is_refused_over_grpc(stack, still_serving, call):
    with pytest.raises(InferenceServerException) as refused:
        GRPC_MANAGEMENT[call](grpcclient.InferenceServerClient(stack.grpc_url))
    assert refused.value.status() == "StatusCode.PERMISSION_DENIED", refused.value
    assert "not served on the public port" in refused.value.message()


@pytest.mark.parametrize(
    "method",
    ["/inference.GRPCInferenceService/NoSuchMethod", "/grpc.reflection.v1.ServerReflection/X"],
)
def test_an_unknown_grpc_method_is_unimplemented(stack, still_serving, method):
    with grpc.insecure_channel(stack.grpc_url) as channel, pytest.raises(grpc.RpcError) as refused:
        channel.unary_unary(method)(
            b"", timeout=5, metadata=[("authorization", auth()["authorization"])]
        )
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_connection_flood_past_the_bound_is_refused_and_others_are_served(
    stack, tokenizer, reference_model
):
    """127.0.0.2 opens twice the bound in slow requests; 127.0.0.1 is served meanwhile."""
    flood = []
    try:
        for _ in range(2 * MAX_CONNECTIONS):
            s = socket.create_connection(
                ("127.0.0.1", stack.http_port), source_address=("127.0.0.2", 0)
            )
            # headers complete, body pending: a request in progress, which the bound counts
            s.sendall(request_bytes(body=b"").replace(b"Content-Length: 0", b"Content-Length: 100"))
            flood.append(s)
        answers = []
        for s in flood:
            s.settimeout(0.2)
            try:
                answers.append(read_until_closed(s)[:12])
            except TimeoutError:
                answers.append(b"(waiting)")
        # the bound's worth wait for their bodies; the rest were refused at once
        assert answers.count(b"HTTP/1.1 429") >= MAX_CONNECTIONS - 2, answers
        assert answers.count(b"(waiting)") <= MAX_CONNECTIONS, answers
        text = "served during a flood from another client"
        embedding, _ = infer(
            client(stack, "http"), "minilm", text_inputs("http", [text]), headers=auth()
        )
        expected = reference_model(tokenizer.encode([text], truncate=True))
        assert np.abs(embedding - expected).max() <= TOLERANCE
    finally:
        for s in flood:
            s.close()


# ---- the API key --------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Bearer wrong-key-0123456789"},
        {"authorization": API_KEY},
        {"authorization": f"Bearer {API_KEY.upper()}"},  # the key with its letters' case changed
        {"authorization": f"Bearer {API_KEY}x"},
    ],
    ids=["none", "wrong", "not bearer", "case changed", "longer"],
)
def test_inference_without_the_api_key_is_unauthenticated(stack, still_serving, protocol, headers):
    err = infer_error(
        client(stack, protocol), "minilm", text_inputs(protocol, ["x"]), headers=dict(headers)
    )
    assert str(err.status()) in ("401", "StatusCode.UNAUTHENTICATED"), err.status()
    assert "API key" in err.message()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_scheme_is_case_insensitive_and_the_key_exact(stack, protocol):
    # "bearer" as well as "Bearer" (HTTP's schemes ignore case); the key itself exactly
    embedding, _ = infer(
        client(stack, protocol),
        "minilm",
        text_inputs(protocol, ["x"]),
        headers={"authorization": f"bearer {API_KEY}"},
    )
    assert embedding.shape == (1, 384)


def test_health_routes_stay_open_without_the_key(stack):
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/minilm/ready", "/health"):
        with urllib.request.urlopen(f"http://127.0.0.1:{stack.http_port}{path}", timeout=5) as r:
            assert r.status == 200
            assert path != "/health" or r.read() == b"", "TEI's health check: no body"
    c = grpcclient.InferenceServerClient(stack.grpc_url)
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("minilm")


@pytest.mark.parametrize(
    "raw",
    [
        b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
        b"DELETE /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET /health/../v2/repository/index HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ],
)
def test_teis_health_route_takes_gets_only_and_reaches_nothing_else(stack, still_serving, raw):
    answer = exchange(stack.http_port, raw)
    assert status_of(answer) in (400, 403, 404), answer[:200]


def test_an_instruction_beside_token_ids_is_refused_through_the_door(stack, still_serving):
    body = (
        b'{"inputs":[{"name":"INPUT_IDS","datatype":"INT64","shape":[1,2],"data":[101,102]}],'
        b'"parameters":{"instruction":"Judge."}}'
    )
    answer = exchange(stack.http_port, request_bytes(body))
    assert status_of(answer) == 400, answer[:300]
    assert b"parameter instruction applies to TEXT input" in answer


def test_metrics_are_on_loopback_only_and_never_on_the_public_ports(stack):
    with urllib.request.urlopen(f"http://127.0.0.1:{stack.metrics_port}/metrics", timeout=5) as r:
        assert b"nv_inference_request_success" in r.read()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://127.0.0.1:{stack.http_port}/metrics", timeout=5)
    assert refused.value.code == 404


def test_a_cancelled_grpc_call_reaches_the_model_through_the_front_door(stack):
    # 1 cancellation counted; only the load's row computed, not the cancelled request's 3
    assert cancel_while_busy(stack, headers=auth()) == (1, 1)


def test_concurrent_clients_through_the_front_door_all_get_their_own_answer(
    stack, tokenizer, reference_model
):
    from builder.corpus import corpus_rows

    texts = corpus_rows(48, seed=17)
    expected = reference_model(tokenizer.encode(texts, truncate=True))

    def one(i: int) -> float:
        protocol = PROTOCOLS[i % 2]
        embedding, _ = infer(
            client(stack, protocol),
            "minilm",
            text_inputs(protocol, texts[i : i + 1]),
            headers=auth(),
        )
        return float(np.abs(embedding - expected[i : i + 1]).max())

    with ThreadPoolExecutor(16) as pool:
        assert max(pool.map(one, range(len(texts)))) <= TOLERANCE


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_compressed_requests_are_refused_before_anything_inflates_them(
    stack, still_serving, protocol
):
    """A small compressed body can inflate past every limit (CVE-2026-24264)."""
    algorithm = {"http": "gzip", "grpc": "gzip"}[protocol]
    kw = {
        "request_compression_algorithm"
        if protocol == "http"
        else "compression_algorithm": algorithm
    }
    err = infer_error(
        client(stack, protocol), "minilm", text_inputs(protocol, ["x" * 1000]), headers=auth(), **kw
    )
    assert str(err.status()) in ("415", "StatusCode.UNIMPLEMENTED"), err.status()
    assert "compressed" in err.message()


@pytest.mark.parametrize("path", [INFER_PATH, "/v1/embeddings", "/v2/models/minilm"])
@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (b"Content-Encoding: identity\r\nContent-Encoding: gzip\r\n", b"content-encoding"),
        (b"content-encoding: identity\r\nContent-Encoding: identity\r\n", b"content-encoding"),
        (f"Authorization: Bearer {API_KEY}\r\n".encode(), b"uthorization"),
    ],
    ids=["encodings", "same encoding twice", "authorization"],
)
def test_a_repeated_header_is_refused_on_every_route(stack, still_serving, path, extra, named):
    """nginx 1.22 reads the first of several lines, a server behind it may read the last: a
    gzip body behind `identity` would be inflated there. The door refuses the request instead
    (a second Authorization: nginx's own 400; the encodings: the door's, naming the header)."""
    import gzip

    body = VALID_BODY if path != "/v1/embeddings" else b'{"model":"minilm","input":"hi"}'
    answer = exchange(stack.http_port, request_bytes(gzip.compress(body), path=path, extra=extra))
    assert status_of(answer) == 400, answer[:300]
    if named == b"content-encoding":
        assert b"the content-encoding header is sent more than once" in answer


def grpc_call_with_headers(stack, lines: list[str], message: bool = True) -> dict[str, str]:
    """A ModelInfer call whose HTTP/2 headers are exactly ``lines`` (plus gRPC's own), sent by
    curl: gRPC libraries refuse to send their reserved headers twice. Its answer's headers.
    Without ``message`` the call carries none: a call refused on its headers is answered while
    curl may still be sending, and curl then sometimes drops the answer."""
    import struct
    import subprocess

    call = grpcclient.service_pb2.ModelInferRequest(model_name="minilm")
    for one in text_inputs("grpc", ["x"]):
        call.inputs.extend([one._get_tensor()])
        call.raw_input_contents.extend([one._get_content()])
    payload = call.SerializeToString()
    framed = b"\x00" + struct.pack(">I", len(payload)) + payload if message else b""
    command = ["curl", "-s", "--http2-prior-knowledge", "-D", "-", "-o", "/dev/null"]
    for line in ["content-type: application/grpc", "te: trailers", *lines]:
        command += ["-H", line]
    command += ["--data-binary", "@-", f"http://{stack.grpc_url}{GRPC_INFER}"]
    out = subprocess.run(command, input=framed, capture_output=True, timeout=10)
    headers = {}
    for line in out.stdout.decode().splitlines():
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return headers


GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"


def test_a_grpc_call_that_repeats_its_encoding_or_key_is_refused(stack, still_serving):
    key = f"authorization: Bearer {API_KEY}"
    # the same call with each header once is served: the refusals below are the repetition's
    assert grpc_call_with_headers(stack, [key, "grpc-encoding: identity"])["grpc-status"] == "0"
    twice = [key, "grpc-encoding: identity", "grpc-encoding: gzip"]
    refused = grpc_call_with_headers(stack, twice, message=False)
    assert refused["grpc-status"] == "3"  # INVALID_ARGUMENT
    assert "grpc-encoding header is sent more than once" in refused["grpc-message"]
    keys = grpc_call_with_headers(stack, [key, key], message=False)
    assert keys.get("grpc-status") != "0", keys  # nginx's own 400, or the door's refusal


# what each public port answers first: HTTP/1.1 a health request; HTTP/2 (gRPC) its preface and
# an empty SETTINGS frame, which the server answers with its own SETTINGS frame
OPENING = {
    "http": (b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 200"),
    "grpc": (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00", b""),
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_idle_connections_past_the_bound_are_closed_and_the_rest_still_served(
    stack, tokenizer, reference_model, protocol
):
    """Idle keep-alive connections hold a worker connection each, and nginx's own limit counts
    only requests in progress: 127.0.0.3 opens connections one by one, each opens its protocol
    and then stays open, idle. Past the bound, a new one is closed before it is answered;
    those within it still serve; 127.0.0.1 is served meanwhile."""
    bound = int(SHORT_LIMITS["MAX_OPEN_CONNECTIONS_PER_CLIENT"])
    port = stack.http_port if protocol == "http" else stack.grpc_port
    opening, answer = OPENING[protocol]
    held = []
    try:
        answered = []
        for _ in range(bound + 4):
            s = socket.create_connection(
                ("127.0.0.1", port), timeout=5, source_address=("127.0.0.3", 0)
            )
            held.append(s)
            with contextlib.suppress(OSError):
                s.sendall(opening)
            first = read_until_closed(s)
            answered.append(first.startswith(answer) and first != b"")
        assert answered == [True] * bound + [False] * 4
        text = "served beside idle connections"
        embedding, _ = infer(
            client(stack, "http"), "minilm", text_inputs("http", [text]), headers=auth()
        )
        expected = reference_model(tokenizer.encode([text], truncate=True))
        assert np.abs(embedding - expected).max() <= TOLERANCE
        if protocol == "http":  # the first, idle all this while, is still open and serves
            held[0].sendall(request_bytes(keep_alive=True))
            assert read_until_closed(held[0]).startswith(b"HTTP/1.1 200")
    finally:
        for s in held:
            s.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_client_header_is_the_doors_own_and_reaches_the_model(stack, protocol):
    """Sent to Triton's own port, a client header of 300 characters reaches the model as a
    request parameter (Triton forwards it) and is refused there by name; through the door the
    same header is replaced by the door's own (the client's address), and the request is served."""
    from python_backend.common.contract import CLIENT_PARAMETER

    forged = {CLIENT_PARAMETER: "x" * 300}
    inputs = text_inputs(protocol, ["who sent this"])

    class Direct:
        http_url = f"127.0.0.1:{stack.ports['TRITON_HTTP']}"
        grpc_url = f"127.0.0.1:{stack.ports['TRITON_GRPC']}"

    err = infer_error(client(Direct(), protocol), "minilm", inputs, headers=dict(forged))
    assert CLIENT_PARAMETER in err.message() and "at most 256" in err.message()
    embedding, _ = infer(client(stack, protocol), "minilm", inputs, headers={**forged, **auth()})
    assert embedding.shape == (1, 384)


def test_a_body_parameter_naming_the_client_is_refused_at_the_door(stack, still_serving):
    body = (
        b'{"parameters":{"x-planner-client":"someone else"},'
        b'"inputs":[{"name":"TEXT","datatype":"BYTES","shape":[1,1],"data":["hi"]}]}'
    )
    answer = exchange(stack.http_port, request_bytes(body))
    assert status_of(answer) == 400 and b"set by the front door" in answer


def test_a_full_queue_refuses_the_client_over_its_share_and_serves_another(stack, still_serving):
    """minilm_small_queue holds 8 rows. One client (127.0.0.1) sends six 8-row requests of long
    rows at once: one runs, one waits in the queue, the others are refused (queue full, one
    client). A second client (127.0.0.2, another address: another name at the door) then sends
    one row while the queue is still full: it is under its share (8 / 2), so it is admitted
    and answered, not refused as it would be with one queue for everyone."""
    long_text = "the planner groups rows by their padded length " * 30
    heavy_body = json.dumps(
        {
            "inputs": [
                {"name": "TEXT", "datatype": "BYTES", "shape": [8, 1], "data": [long_text] * 8}
            ]
        }
    ).encode()
    path = "/v2/models/minilm_small_queue/infer"
    with ThreadPoolExecutor(6) as pool:
        heavy = [
            pool.submit(exchange, stack.http_port, request_bytes(heavy_body, path), 60.0)
            for _ in range(6)
        ]
        time.sleep(0.3)  # the heavy client's requests have arrived: one runs, one queues
        light = exchange(stack.http_port, request_bytes(path=path), wait_s=60.0, source="127.0.0.2")
        heavy_answers = [f.result() for f in heavy]
    assert status_of(light) == 200, light[-300:]
    statuses = sorted(status_of(a) for a in heavy_answers)
    assert statuses.count(503) >= 1 and statuses.count(200) >= 2, statuses
    refused = next(a for a in heavy_answers if status_of(a) == 503)
    assert b"queue full" in refused


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_requests_priority_reaches_the_model_as_its_class(
    stack, protocol, tokenizer, reference_model
):
    """Triton keeps `priority` to itself; through the door the body check hands it on as the
    model's class: the row is served right and counted in its class; a class the model does not
    have is a 400 naming priority."""
    from tests.e2e.test_serving import total

    text = "a bulk row in the second class"
    labels = {"model": "minilm", "class": "2"}
    before = total(stack, "planner_class_rows_total", **labels)
    inputs = text_inputs(protocol, [text])
    embedding, _ = infer(client(stack, protocol), "minilm", inputs, priority=2, headers=auth())
    expected = reference_model(tokenizer.encode([text], truncate=True))
    assert np.abs(embedding - expected).max() <= 1e-4
    assert total(stack, "planner_class_rows_total", **labels) - before == 1
    err = infer_error(client(stack, protocol), "minilm", inputs, priority=3, headers=auth())
    assert "priority is 3, not a class of this model (1 to 2" in err.message()
    assert err.status() in ("400", "StatusCode.INVALID_ARGUMENT")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_keys_class_is_its_clients_default_and_the_highest_they_may_ask(stack, protocol):
    """The stack's keys file gives one key class 2: its requests are counted in class 2 without
    a priority, may ask for a later class, and asking for class 1 is a 400 naming priority."""
    from tests.e2e.stack import BULK_KEY
    from tests.e2e.test_serving import total

    bulk = {"authorization": f"Bearer {BULK_KEY}"}
    inputs = text_inputs(protocol, ["a row of the bulk key"])
    labels = {"model": "minilm", "class": "2"}
    before = total(stack, "planner_class_rows_total", **labels)
    infer(client(stack, protocol), "minilm", inputs, headers=bulk)
    assert total(stack, "planner_class_rows_total", **labels) - before == 1
    err = infer_error(client(stack, protocol), "minilm", inputs, priority=1, headers=bulk)
    assert "priority is 1; this API key may ask for class 2 at most" in err.message()
