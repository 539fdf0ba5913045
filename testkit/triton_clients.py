"""tritonclient helpers over both protocols: one call shape, HTTP or gRPC underneath."""

from __future__ import annotations

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

PROTOCOLS = ("http", "grpc")


def client(server, protocol: str, concurrency: int = 1):
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url, concurrency=concurrency)
    return grpcclient.InferenceServerClient(server.grpc_url)


def _module(protocol: str):
    return httpclient if protocol == "http" else grpcclient


def text_inputs(protocol: str, texts: list[str | bytes]):
    data = np.array([[t.encode() if isinstance(t, str) else t] for t in texts], dtype=object)
    inp = _module(protocol).InferInput("TEXT", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data)
    return [inp]


def id_inputs(protocol: str, rows: list[np.ndarray], pad: int = 0, with_mask: bool = True):
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        mask[i, : len(r)] = 1
    m = _module(protocol)
    out = [m.InferInput("INPUT_IDS", list(ids.shape), "INT64")]
    out[0].set_data_from_numpy(ids)
    if with_mask:
        out.append(m.InferInput("ATTENTION_MASK", list(mask.shape), "INT64"))
        out[1].set_data_from_numpy(mask)
    return out


def infer(c, model: str, inputs, parameters=None, **kw):
    """(EMBEDDING, NUM_TOKENS) of one request."""
    result = c.infer(model, inputs, parameters=parameters, **kw)
    return result.as_numpy("EMBEDDING"), result.as_numpy("NUM_TOKENS")


def infer_error(c, model: str, inputs, parameters=None, **kw) -> InferenceServerException:
    try:
        c.infer(model, inputs, parameters=parameters, **kw)
    except InferenceServerException as err:
        return err
    raise AssertionError("the request was expected to fail")
