"""What a KServe inference body may declare before Triton 2.51 parses it.

Pure: bytes or a parsed message in, nothing out, or ``Refused`` naming the input and the limit.
Triton 2.51 (the CPU default's server) trusts what a body declares: it allocates from a declared
shape before it reads the data (an abort on a huge or wrapping shape), it parses JSON recursively
(a stack overflow on deep nesting), and its Python-backend stub builds an array from a gRPC shape
whose byte size wrapped to zero (the stub dies). These rules make every declared size agree with
the bytes actually sent, in exact integer arithmetic, and keep every structure flat enough.
docs/SECURITY.md has the table of what each rule covers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from python_backend.common.contract import (
    CLASS_PARAMETER,
    CLIENT_PARAMETER,
    KEY_CLASS_PARAMETER,
    MAX_ROWS_PER_REQUEST,
)

# bytes per element of each KServe datatype; BYTES is variable (a 4-byte length, then the bytes)
DTYPE_BYTES: dict[str, int] = {
    "BOOL": 1,
    "UINT8": 1,
    "UINT16": 2,
    "UINT32": 4,
    "UINT64": 8,
    "INT8": 1,
    "INT16": 2,
    "INT32": 4,
    "INT64": 8,
    "FP16": 2,
    "BF16": 2,
    "FP32": 4,
    "FP64": 8,
}
BYTES = "BYTES"
BYTES_LENGTH_PREFIX = 4  # each BYTES element of a binary tensor: a little-endian uint32 length
INT64_MAX = (1 << 63) - 1

# the JSON value types a `data` leaf of each datatype may have
_INTEGER = frozenset({int})
_LEAF_TYPES: dict[str, frozenset[type]] = {
    "BOOL": frozenset({bool}),
    "FP16": frozenset({int, float}),
    "BF16": frozenset({int, float}),
    "FP32": frozenset({int, float}),
    "FP64": frozenset({int, float}),
    BYTES: frozenset({str}),
}

# the keys each part of a KServe JSON request may carry; anything else is refused, not passed
REQUEST_KEYS = frozenset({"id", "parameters", "inputs", "outputs"})
INPUT_KEYS = frozenset({"name", "shape", "datatype", "parameters", "data"})
OUTPUT_KEYS = frozenset({"name", "parameters"})
# parameters that point Triton at shared memory: registration is closed at the door, so a
# request naming a region is refused here too rather than left for Triton to resolve
SHARED_MEMORY_PARAMETERS = frozenset(
    {"shared_memory_region", "shared_memory_offset", "shared_memory_byte_size"}
)


UINT64_MAX = (1 << 64) - 1


def _is_uint64(value: object) -> bool:
    return type(value) is int and 0 <= value <= UINT64_MAX  # bool is an int subclass: not one


def _is_bool(value: object) -> bool:
    return type(value) is bool


def _is_sequence_id(value: object) -> bool:
    return _is_uint64(value) or type(value) is str


# The parameters Triton reads itself, with what each must be in JSON (what Triton 2.51's
# ParseJsonTritonParams asks its reader for). Any other value gets HTTP 500 from it, since its
# reader's type error is INTERNAL: here a 400 naming the parameter. Names of its own, `triton_*`,
# it refuses; so does the check, with the same reason, before it parses anything else.
_UINT64 = ("an integer in [0, 2^64-1]", _is_uint64)
_BOOL = ("true or false", _is_bool)
RESERVED_REQUEST_PARAMETERS: dict[str, tuple[str, Callable[[object], bool]]] = {
    "sequence_id": ("an integer in [0, 2^64-1] or a string", _is_sequence_id),
    "sequence_start": _BOOL,
    "sequence_end": _BOOL,
    "binary_data_output": _BOOL,
    "priority": _UINT64,
    "timeout": _UINT64,
}
RESERVED_OUTPUT_PARAMETERS: dict[str, tuple[str, Callable[[object], bool]]] = {
    "binary_data": _BOOL,
    "classification": _UINT64,
}
# gRPC: the InferParameter fields Triton 2.51 takes for each (SetInferenceRequestMetadata), and
# whether a negative int64 is refused (Triton takes a negative timeout as a huge unsigned one)
RESERVED_GRPC_PARAMETERS: dict[str, tuple[frozenset[str], bool]] = {
    "sequence_id": (frozenset({"int64_param", "string_param"}), False),
    "sequence_start": (frozenset({"bool_param"}), False),
    "sequence_end": (frozenset({"bool_param"}), False),
    "priority": (frozenset({"int64_param", "uint64_param"}), True),
    "timeout": (frozenset({"int64_param"}), True),
}
GRPC_OWN_PARAMETERS = frozenset({"triton_enable_empty_final_response"})
TRITON_PREFIX = "triton_"


class Refused(ValueError):
    """A body the door does not pass on; the message names what and which limit."""


@dataclass(frozen=True)
class BodyLimits:
    """Bounds on the structure of one request; sizes are bounded by the body itself."""

    max_inputs: int = 64  # the project's models take 1-4 inputs
    max_outputs: int = 64  # CVE-2026-24146: a crash from a request naming very many outputs
    max_rank: int = 16  # dimensions of one declared shape
    max_parameters: int = 64  # parameters of one request, input or output
    # a BYTES input of a served model is one element a row ([rows, 1]), at most this many rows a
    # request: the check's walk over length prefixes stays that short whatever a body declares
    max_bytes_elements: int = MAX_ROWS_PER_REQUEST


def count_shape(name: str, shape: object, limits: BodyLimits, body_bytes: int) -> int:
    """The elements a shape declares. Each dimension an integer in [0, 2^63 - 1]; their product,
    exact, at most the body's size, since every element sent takes at least one byte of it."""
    if not isinstance(shape, (list, tuple)) or not all(
        type(d) is int for d in shape
    ):  # bool is an int subclass: refused by the exact type
        raise Refused(f"input {name!r}: shape must be a list of integers")
    if len(shape) > limits.max_rank:
        raise Refused(
            f"input {name!r}: shape has {len(shape)} dimensions, at most {limits.max_rank}"
        )
    elements = 1
    for d in shape:
        if d < 0 or d > INT64_MAX:
            raise Refused(f"input {name!r}: shape dimension {d} is outside [0, 2^63-1]")
        elements *= d  # Python integers: no wrap-around
    if elements > body_bytes:
        raise Refused(
            f"input {name!r}: shape {list(shape)} declares {elements} elements, more than a "
            f"{body_bytes}-byte body can hold"
        )
    return elements


def check_bytes_elements(name: str, datatype: str, elements: int, limits: BodyLimits) -> None:
    if datatype == BYTES and elements > limits.max_bytes_elements:
        raise Refused(
            f"input {name!r}: {elements} BYTES elements, at most {limits.max_bytes_elements} (one "
            "a row, and a served model takes at most that many rows a request)"
        )


def check_datatype(name: str, datatype: object) -> str:
    if datatype != BYTES and datatype not in DTYPE_BYTES:
        raise Refused(f"input {name!r}: unknown datatype {datatype!r}")
    return str(datatype)


def check_binary_size(name: str, datatype: str, elements: int, raw: bytes | memoryview) -> None:
    """A binary tensor's bytes against its declared shape: exact for fixed-size types; for
    BYTES, each length prefix read in turn, none past the end, nothing left over."""
    size = len(raw)
    if datatype != BYTES:
        expected = elements * DTYPE_BYTES[datatype]
        if size != expected:
            raise Refused(
                f"input {name!r}: {size} bytes of data, but {datatype} of {elements} elements "
                f"takes {expected}"
            )
        return
    if size < elements * BYTES_LENGTH_PREFIX:
        raise Refused(f"input {name!r}: {size} bytes cannot hold {elements} BYTES elements")
    offset = 0
    view = memoryview(raw)
    for _ in range(elements):
        if offset + BYTES_LENGTH_PREFIX > size:
            raise Refused(f"input {name!r}: BYTES data ends inside a length prefix")
        length = int.from_bytes(view[offset : offset + BYTES_LENGTH_PREFIX], "little")
        offset += BYTES_LENGTH_PREFIX + length
        if offset > size:
            raise Refused(f"input {name!r}: a BYTES element runs past the end of its data")
    if offset != size:
        raise Refused(
            f"input {name!r}: {size - offset} bytes of BYTES data past its {elements} elements"
        )


def count_data(name: str, datatype: str, data: object, max_depth: int) -> int:
    """Leaves of a JSON `data` value (flat, or nested no deeper than its shape), each of the
    datatype's JSON type. One pass over each list at C speed (`map(type, ...)`)."""
    allowed = _LEAF_TYPES.get(datatype, _INTEGER)
    if not isinstance(data, list):
        raise Refused(f"input {name!r}: data must be a list")
    count = 0
    level: list[list[Any]] = [data]
    for _depth in range(max_depth):
        nested: list[list[Any]] = []
        for items in level:
            kinds = set(map(type, items))
            if list in kinds:
                if kinds != {list}:
                    raise Refused(f"input {name!r}: data mixes lists and values at one level")
                nested.extend(items)
            elif not kinds <= allowed:
                bad = sorted(k.__name__ for k in kinds - allowed)
                raise Refused(
                    f"input {name!r}: {datatype} data holds values of type {', '.join(bad)}"
                )
            else:
                count += len(items)
        if not nested:
            return count
        level = nested
    raise Refused(f"input {name!r}: data is nested deeper than its shape's {max_depth} dimensions")


def check_parameters(
    where: str,
    parameters: object,
    limits: BodyLimits,
    reserved: Mapping[str, tuple[str, Callable[[object], bool]]] | None = None,
) -> Mapping[str, Any]:
    """Parameters are flat: names to a string, number or boolean; no shared memory; each of
    Triton's own (``reserved``) of the kind Triton reads it as."""
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise Refused(f"{where}: parameters must be an object")
    if len(parameters) > limits.max_parameters:
        raise Refused(f"{where}: {len(parameters)} parameters, at most {limits.max_parameters}")
    for key, value in parameters.items():
        check_parameter_name(where, key)
        if not isinstance(value, (str, int, float, bool)):
            raise Refused(f"{where}: parameter {key!r} must be a string, number or boolean")
        if reserved is None:
            continue
        if key in reserved:
            kind, holds = reserved[key]
            if not holds(value):
                raise Refused(f"{where}: parameter {key!r} must be {kind}, not {value!r:.60}")
        elif key.startswith(TRITON_PREFIX):
            raise Refused(
                f"{where}: parameter {key!r}: names starting {TRITON_PREFIX} are Triton's"
            )
    return parameters


def check_parameter_name(where: str, key: str) -> None:
    if "\0" in key:  # Triton's reader cuts a name at a NUL: it would read another name
        raise Refused(f"{where}: parameter name {key[:64]!r} holds a NUL character")
    if key in SHARED_MEMORY_PARAMETERS:
        raise Refused(f"{where}: shared memory is not served on the public port ({key})")
    if key in (CLIENT_PARAMETER, KEY_CLASS_PARAMETER):  # the door's headers, nothing else
        raise Refused(f"{where}: parameter {key} is set by the front door, not by a request")
    if key == CLASS_PARAMETER:  # written here from `priority`, which Triton keeps to itself
        raise Refused(f"{where}: parameter {key} is written from priority; send priority")


def _unknown(where: str, keys: Iterable[str], allowed: frozenset[str]) -> None:
    extra = sorted(set(keys) - allowed)
    if extra:
        raise Refused(f"{where}: unknown field(s) {', '.join(map(repr, extra))}")


@dataclass(frozen=True)
class PassedBody:
    """What goes on to Triton: the JSON the check judged, written again from the object it read,
    so that Triton reads exactly that (one value per key where the body repeated one, keys
    unescaped, numbers in one form), then the binary tensors as they came."""

    header: bytes
    binary: bytes | memoryview
    binary_extension: bool  # the body came with an Inference-Header-Content-Length

    def body(self) -> bytes:
        return b"".join((self.header, self.binary)) if self.binary else self.header


def check_json_request(body: bytes, header_length: int | None, limits: BodyLimits) -> PassedBody:
    """A KServe HTTP inference body: all JSON (``header_length`` None), or a JSON header of that
    many bytes followed by the binary tensors it declares (the binary-tensor extension). Returns
    what Triton is to read: the JSON re-serialized from what was checked, the binary unchanged."""
    binary: bytes | memoryview
    if header_length is None:
        header, binary = body, b""
    elif not 0 < header_length <= len(body):
        raise Refused(
            f"Inference-Header-Content-Length {header_length} is outside this {len(body)}-byte body"
        )
    else:
        header, binary = body[:header_length], memoryview(body)[header_length:]
    try:
        request = orjson.loads(header)  # orjson is not recursive, and stops at 1024 levels
    except orjson.JSONDecodeError as err:
        raise Refused(f"the request is not valid JSON: {err}") from None
    if not isinstance(request, dict):
        raise Refused("the request must be a JSON object")
    _unknown("the request", request, REQUEST_KEYS)
    if "id" in request and not isinstance(request["id"], str):
        raise Refused("the request's id must be a string")
    check_parameters("the request", request.get("parameters"), limits, RESERVED_REQUEST_PARAMETERS)
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise Refused("the request must have a non-empty list of inputs")
    if len(inputs) > limits.max_inputs:
        raise Refused(f"the request has {len(inputs)} inputs, at most {limits.max_inputs}")
    outputs = request.get("outputs", [])
    if not isinstance(outputs, list) or len(outputs) > limits.max_outputs:
        raise Refused(f"outputs must be a list of at most {limits.max_outputs}")
    for i, output in enumerate(outputs):
        if not isinstance(output, dict) or not isinstance(output.get("name"), str):
            raise Refused(f"output {i} must be an object with a name")
        _unknown(f"output {output['name']!r}", output, OUTPUT_KEYS)
        check_parameters(
            f"output {output['name']!r}",
            output.get("parameters"),
            limits,
            RESERVED_OUTPUT_PARAMETERS,
        )
    offset = 0
    for i, tensor in enumerate(inputs):
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
            raise Refused(f"input {i} must be an object with a name")
        name = tensor["name"]
        _unknown(f"input {name!r}", tensor, INPUT_KEYS)
        datatype = check_datatype(name, tensor.get("datatype"))
        elements = count_shape(name, tensor.get("shape"), limits, len(body))
        check_bytes_elements(name, datatype, elements, limits)
        parameters = check_parameters(f"input {name!r}", tensor.get("parameters"), limits)
        size = parameters.get("binary_data_size")
        if size is None:
            if "data" not in tensor:
                raise Refused(f"input {name!r} has neither data nor binary_data_size")
            got = count_data(name, datatype, tensor["data"], max(1, len(tensor["shape"])))
            if got != elements:
                raise Refused(
                    f"input {name!r}: data has {got} elements, shape {tensor['shape']} "
                    f"declares {elements}"
                )
            continue
        if type(size) is not int or size < 0:
            raise Refused(f"input {name!r}: binary_data_size must be a non-negative integer")
        if "data" in tensor:
            raise Refused(f"input {name!r} has both data and binary_data_size")
        if offset + size > len(binary):
            raise Refused(
                f"input {name!r}: binary_data_size {size} runs past the end of the body "
                f"({len(binary) - offset} bytes left)"
            )
        check_binary_size(name, datatype, elements, binary[offset : offset + size])
        offset += size
    if offset != len(binary):
        raise Refused(f"{len(binary) - offset} bytes after the last binary input")
    priority = (request.get("parameters") or {}).get("priority", 0)
    if priority:  # an integer in [0, 2^64-1] (checked above): the model's class parameter
        request["parameters"][CLASS_PARAMETER] = min(priority, INT64_MAX)
    return PassedBody(orjson.dumps(request), binary, header_length is not None)


INT64_MAX = (1 << 63) - 1


def with_class(request: Any) -> bytes | None:
    """A checked gRPC request with a ``priority`` above 0, written again with the model's class
    parameter (Triton consumes ``priority`` itself); None where it has none."""
    parameter = request.parameters.get("priority")
    if parameter is None:
        return None
    field_name = parameter.WhichOneof("parameter_choice")
    priority = getattr(parameter, field_name) if field_name else 0
    if not priority:
        return None
    request.parameters[CLASS_PARAMETER].int64_param = min(priority, INT64_MAX)
    return bytes(request.SerializeToString())


def check_grpc_request(request: Any, message_bytes: int, limits: BodyLimits) -> None:
    """A KServe gRPC ``ModelInferRequest``, already read by the protobuf library: declared shapes
    against the raw or typed contents actually sent."""
    inputs = request.inputs
    if not inputs:
        raise Refused("the request must have at least one input")
    if len(inputs) > limits.max_inputs:
        raise Refused(f"the request has {len(inputs)} inputs, at most {limits.max_inputs}")
    if len(request.outputs) > limits.max_outputs:
        raise Refused(
            f"the request names {len(request.outputs)} outputs, at most {limits.max_outputs}"
        )
    raw = request.raw_input_contents
    if raw and len(raw) != len(inputs):
        raise Refused(
            f"raw_input_contents has {len(raw)} entries for {len(inputs)} inputs: all or none"
        )
    check_grpc_parameters("the request", request.parameters, limits)
    check_grpc_reserved(request.parameters)
    for output in request.outputs:
        check_grpc_parameters(f"output {output.name!r}", output.parameters, limits)
    for i, tensor in enumerate(inputs):
        name = tensor.name
        datatype = check_datatype(name, tensor.datatype)
        elements = count_shape(name, list(tensor.shape), limits, message_bytes)
        check_bytes_elements(name, datatype, elements, limits)
        check_grpc_parameters(f"input {name!r}", tensor.parameters, limits)
        if raw:
            if tensor.HasField("contents"):
                raise Refused(f"input {name!r} has both contents and raw_input_contents")
            check_binary_size(name, datatype, elements, raw[i])
            continue
        got = typed_contents_count(tensor.contents)
        if got != elements:
            raise Refused(
                f"input {name!r}: contents has {got} elements, shape {list(tensor.shape)} "
                f"declares {elements}"
            )


def typed_contents_count(contents: Any) -> int:
    """Elements of an ``InferTensorContents``, over all its typed fields."""
    return sum(len(getattr(contents, f.name)) for f in contents.DESCRIPTOR.fields)


def check_grpc_parameters(where: str, parameters: Mapping[str, Any], limits: BodyLimits) -> None:
    if len(parameters) > limits.max_parameters:
        raise Refused(f"{where}: {len(parameters)} parameters, at most {limits.max_parameters}")
    for key in parameters:
        check_parameter_name(where, key)


def check_grpc_reserved(parameters: Mapping[str, Any]) -> None:
    """A request's parameters that Triton reads itself, each in a field it takes."""
    for key, parameter in parameters.items():
        field_name = parameter.WhichOneof("parameter_choice")
        if key in RESERVED_GRPC_PARAMETERS:
            fields, unsigned = RESERVED_GRPC_PARAMETERS[key]
            if field_name not in fields:
                raise Refused(
                    f"the request: parameter {key!r} must be set as {' or '.join(sorted(fields))}, "
                    f"not {field_name}"
                )
            if unsigned and field_name == "int64_param" and parameter.int64_param < 0:
                raise Refused(f"the request: parameter {key!r} must not be negative")
        elif key.startswith(TRITON_PREFIX) and key not in GRPC_OWN_PARAMETERS:
            raise Refused(
                f"the request: parameter {key!r}: names starting {TRITON_PREFIX} are Triton's"
            )
