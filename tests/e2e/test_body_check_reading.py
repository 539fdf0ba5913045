"""What the body check passes, Triton reads as the check read it.

A test model (tests/e2e/echo_repository) answers what Triton read of each request. Each body
below is one the check and Triton 2.51 would read differently if it were passed on as it came:
a key sent twice (the check's JSON reader keeps the last value, Triton's the first), a key
spelled with escapes, a binary header whose sizes repeat. Sent through the check, Triton's
reading equals the check's; sent to Triton directly, it does not (the case is real).
"""

from __future__ import annotations

import http.client
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pytest

from tests.e2e.conftest import _LOGS
from tools.helpers import body_check
from tools.triton_server import TritonServer, free_port

ECHO_REPOSITORY = Path(__file__).parent / "echo_repository"
HEADER_LENGTH = "Inference-Header-Content-Length"
X_INT64 = b'"name":"X","datatype":"INT64"'


@dataclass
class EchoDeployment:
    triton_port: int
    check_port: int


@pytest.fixture(scope="module")
def echo(tmp_path_factory) -> Iterator[EchoDeployment]:
    root = tmp_path_factory.mktemp("echo")
    repository = root / "repository"
    shutil.copytree(ECHO_REPOSITORY, repository)
    log = root / "triton.log"
    _LOGS.append(log)
    server = TritonServer(repository, free_port(), free_port(), free_port(), log_path=log)
    check_http = free_port()
    check = body_check(
        f"127.0.0.1:{server.http_port}",
        f"127.0.0.1:{server.grpc_port}",
        check_http,
        free_port(),
        free_port(),
        "1m",
        root / "body_check.log",
    )
    server.start()
    try:
        server.wait_ready(120)
        check.start()
        yield EchoDeployment(server.http_port, check_http)
    finally:
        check.stop()
        server.stop()


def post(port: int, body: bytes, headers: list[tuple[str, str]] = ()) -> tuple[int, bytes]:
    """One inference POST; headers as a list, so that one may be sent twice."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.putrequest("POST", "/v2/models/echo/infer")
        for name, value in [("Content-Length", str(len(body))), *headers]:
            connection.putheader(name, value)
        connection.endheaders(body)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def triton_read(answer: bytes) -> dict:
    (output,) = json.loads(answer)["outputs"]
    return json.loads(output["data"][0])


def binary_values(datatype: str, raw: bytes) -> list:
    if datatype == "BYTES":
        values, offset = [], 0
        while offset < len(raw):
            length = int.from_bytes(raw[offset : offset + 4], "little")
            values.append(raw[offset + 4 : offset + 4 + length].decode())
            offset += 4 + length
        return values
    dtype = {"INT64": np.int64, "FP32": np.float32}[datatype]
    return np.frombuffer(raw, dtype=dtype).tolist()


def check_reading(body: bytes, header_length: int | None = None) -> dict:
    """What the check read of a body, in the echo model's terms: its own JSON reader (the last
    value of a repeated key), each input's values as the model's datatype holds them."""
    header = body if header_length is None else body[:header_length]
    request = orjson.loads(header)
    binary = body[len(header) :]
    inputs = {}
    for tensor in request["inputs"]:
        size = tensor.get("parameters", {}).get("binary_data_size")
        if size is None:
            flat = np.array(tensor["data"], dtype=object).ravel().tolist()
            if tensor["datatype"] == "FP32":
                flat = np.array(flat, dtype=np.float32).tolist()
        else:
            flat, binary = binary_values(tensor["datatype"], binary[:size]), binary[size:]
        inputs[tensor["name"]] = {"shape": tensor["shape"], "data": flat}
    return {"inputs": inputs, "parameters": request.get("parameters", {})}


def x_input(fields: bytes) -> bytes:
    return b'{"inputs":[{' + fields + b"}]}"


# name -> the body; each reads differently by first and by last value of a key
JSON_CASES = {
    "shape twice": x_input(X_INT64 + b',"shape":[1,3],"shape":[1,2],"data":[1,2]'),
    "data twice": x_input(X_INT64 + b',"shape":[1,2],"data":[7,8],"data":[1,2]'),
    "datatype twice": x_input(
        b'"name":"X","datatype":"FP32","datatype":"INT64","shape":[1,2],"data":[1,2]'
    ),
    "name twice": x_input(b'"name":"F","name":"X","datatype":"INT64","shape":[1,1],"data":[5]'),
    "inputs twice": (
        b'{"inputs":[{"name":"F","datatype":"FP32","shape":[1],"data":[0.5]}],'
        b'"inputs":[{"name":"X","datatype":"INT64","shape":[1,1],"data":[3]}]}'
    ),
    "parameters twice": (
        b'{"parameters":{"tag":"first"},"parameters":{"tag":"last"},'
        b'"inputs":[{"name":"X","datatype":"INT64","shape":[1,1],"data":[1]}]}'
    ),
    "a parameter twice": (
        b'{"parameters":{"tag":"first","tag":"last"},'
        b'"inputs":[{"name":"X","datatype":"INT64","shape":[1,1],"data":[1]}]}'
    ),
    "shape, then shape spelled with escapes": x_input(
        X_INT64 + b',"shape":[1,3],"sh\\u0061pe":[1,2],"data":[1,2]'
    ),
    "data spelled with escapes, twice": x_input(
        X_INT64 + b',"shape":[1,1],"\\u0064ata":[9],"d\\u0061ta":[4]'
    ),
}


@pytest.mark.parametrize("case", sorted(JSON_CASES))
def test_triton_reads_a_passed_json_body_as_the_check_read_it(echo, case):
    body = JSON_CASES[case]
    status, answer = post(echo.check_port, body, [("Content-Type", "application/json")])
    assert status == 200, answer[:300]
    assert triton_read(answer) == check_reading(body)
    # the same body straight to Triton is read otherwise (or refused): the seam was real
    status, direct = post(echo.triton_port, body, [("Content-Type", "application/json")])
    assert status != 200 or triton_read(direct) != check_reading(body), direct[:300]


def test_number_and_string_forms_are_read_alike(echo):
    body = (
        b'{"inputs":[{"name":"F","datatype":"FP32","shape":[4],"data":[1E0,0.5e1,-0,0.1]},'
        b'{"name":"T","datatype":"BYTES","shape":[2],"data":["\\u00e9\\n","\\"q\\""]}]}'
    )
    status, answer = post(echo.check_port, body)
    assert status == 200, answer[:300]
    assert triton_read(answer) == check_reading(body)


def binary_case(header: bytes, payload: bytes) -> tuple[bytes, list[tuple[str, str]]]:
    return header + payload, [
        (HEADER_LENGTH, str(len(header))),
        ("Content-Type", "application/octet-stream"),
    ]


def test_a_binary_header_is_read_as_the_check_read_it_with_its_length_recomputed(echo):
    # binary_data_size twice: the last (16 bytes, two INT64s) is what the check measured
    header = (
        b'{"inputs":[{"name":"X","datatype":"INT64","shape":[1,2],'
        b'"parameters":{"binary_data_size":24,"binary_data_size":16}},'
        b'{"name":"T","datatype":"BYTES","shape":[1],"parameters":{"binary_data_size":6}}]}'
    )
    payload = np.array([11, 12], dtype=np.int64).tobytes() + b"\x02\0\0\0hi"
    body, headers = binary_case(header, payload)
    status, answer = post(echo.check_port, body, headers)
    assert status == 200, answer[:300]
    assert triton_read(answer) == check_reading(body, len(header))
    status, direct = post(echo.triton_port, body, headers)
    assert status != 200, direct[:300]


@pytest.mark.parametrize(
    ("values", "why"),
    [
        (["16", "16"], "sent 2 times"),
        (["+16"], "not a length in plain digits"),
        (["1_6"], "not a length in plain digits"),
        (["\u0661\u0666"], "not a length in plain digits"),  # Arabic-Indic digits: int() takes them
    ],
    ids=["twice", "sign", "underscore", "other digits"],
)
def test_a_header_length_sent_twice_or_not_in_plain_digits_is_refused(echo, values, why):
    header = x_input(X_INT64 + b',"shape":[1,1],"parameters":{"binary_data_size":8}')
    body = header + np.array([1], dtype=np.int64).tobytes()
    headers = [(HEADER_LENGTH, v.encode().decode("latin-1")) for v in values]
    status, answer = post(echo.check_port, body, headers)
    assert status == 400 and why in json.loads(answer)["error"], answer[:300]


@pytest.mark.parametrize(
    "parameters",
    [
        {"priority": "high"},
        {"priority": -1},
        {"timeout": 1.5},
        {"sequence_start": 1},
        {"sequence_id": [1]},
        {"binary_data_output": "yes"},
    ],
    ids=lambda p: next(iter(p)),
)
def test_a_reserved_parameter_of_the_wrong_kind_is_a_400_naming_it(echo, parameters):
    body = orjson.dumps(
        {
            "parameters": parameters,
            "inputs": [{"name": "X", "datatype": "INT64", "shape": [1, 1], "data": [1]}],
        }
    )
    (name,) = parameters
    status, answer = post(echo.check_port, body)
    assert status == 400 and f"parameter '{name}' must be" in json.loads(answer)["error"]
    if not isinstance(parameters[name], list):  # Triton's own answer: an INTERNAL error
        assert post(echo.triton_port, body)[0] == 500


def test_reserved_parameters_of_the_right_kind_pass(echo):
    parameters = {"priority": 0, "timeout": 10_000_000, "sequence_id": 0, "tag": "kept"}
    body = orjson.dumps(
        {
            "parameters": parameters,
            "inputs": [{"name": "X", "datatype": "INT64", "shape": [1, 1], "data": [1]}],
        }
    )
    status, answer = post(echo.check_port, body)
    assert status == 200, answer[:300]
    assert triton_read(answer)["parameters"]["tag"] == "kept"
