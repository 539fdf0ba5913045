"""Overload, deadlines, cancellation, failing forwards and hostile input, on the real server.

Nothing accepted is ever lost: every request gets exactly one answer, its own output or an error
that says what went wrong, and the server keeps serving everyone else.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from builder.corpus import corpus_rows
from testkit.triton_clients import PROTOCOLS, client, id_inputs, infer, infer_error, text_inputs
from tests.e2e.conftest import SLOW, repository_of, start_server
from tests.e2e.scenarios import busy, cancel_while_busy, long_texts
from tests.e2e.test_serving import total

TOLERANCE = 1e-4
STATUS = {
    "invalid": {"400", "StatusCode.INVALID_ARGUMENT"},
    "unavailable": {"503", "StatusCode.UNAVAILABLE"},
    "internal": {"500", "StatusCode.INTERNAL"},
}


def status_is(err, kind: str) -> bool:
    return str(err.status()) in STATUS[kind]


def raw_inputs(protocol: str, name: str, array: np.ndarray, datatype: str):
    module = httpclient if protocol == "http" else grpcclient
    inp = module.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return inp


def ids(rows) -> np.ndarray:
    return np.array(rows, dtype=np.int64)


BAD_INPUTS = {
    "missing input": lambda p: [],
    "both TEXT and INPUT_IDS": lambda p: (
        text_inputs(p, ["a"]) + id_inputs(p, [np.array([101, 102])])
    ),
    "wrong datatype": lambda p: [
        raw_inputs(p, "INPUT_IDS", np.array([[1.5]], dtype=np.float32), "FP32")
    ],
    "wrong rank": lambda p: [raw_inputs(p, "INPUT_IDS", ids([[[101, 102]]]), "INT64")],
    "zero rows": lambda p: [raw_inputs(p, "TEXT", np.zeros((0, 1), dtype=object), "BYTES")],
    "more rows than max_batch_size": lambda p: text_inputs(p, ["row"] * 65),
    "an empty string": lambda p: text_inputs(p, ["fine", ""]),
    "non-UTF-8 bytes": lambda p: text_inputs(p, [b"\xff\xfe\xfa"]),
    "an empty row": lambda p: [
        raw_inputs(p, "INPUT_IDS", np.zeros((1, 0), dtype=np.int64), "INT64")
    ],
    "a mask of all zeros": lambda p: [
        raw_inputs(p, "INPUT_IDS", ids([[101, 102]]), "INT64"),
        raw_inputs(p, "ATTENTION_MASK", ids([[0, 0]]), "INT64"),
    ],
    "a mask of another shape": lambda p: [
        raw_inputs(p, "INPUT_IDS", ids([[101, 102]]), "INT64"),
        raw_inputs(p, "ATTENTION_MASK", ids([[1, 1, 0]]), "INT64"),
    ],
    "mask values other than 0 and 1": lambda p: [
        raw_inputs(p, "INPUT_IDS", ids([[101, 102]]), "INT64"),
        raw_inputs(p, "ATTENTION_MASK", ids([[1, 2]]), "INT64"),
    ],
    "a negative token id": lambda p: [raw_inputs(p, "INPUT_IDS", ids([[101, -1, 102]]), "INT64")],
    "a token id past the vocabulary": lambda p: [
        raw_inputs(p, "INPUT_IDS", ids([[101, 30522]]), "INT64")
    ],
    "a row over the max length with truncate off": lambda p: text_inputs(p, long_texts(1)),
    "a request of several MB": lambda p: text_inputs(p, ["x" * 3_000_000]),
}
EXPECTED_MESSAGE = {
    "missing input": ("missing input", "request has 0 inputs"),  # ours, or Triton's own check
    "both TEXT and INPUT_IDS": "exactly one of TEXT or INPUT_IDS",
    "wrong datatype": ("expects 'INT64'", "must be INT64"),
    "wrong rank": ("unexpected shape for input 'INPUT_IDS'", "rank 3"),
    "zero rows": ("got 0", "zero rows"),
    "more rows than max_batch_size": ("batch-size must be <= 64", "the limit is 64"),
    "an empty string": "TEXT row 1 is empty",
    "non-UTF-8 bytes": "not valid UTF-8",
    "an empty row": "has empty rows (zero tokens)",
    "a mask of all zeros": "all zeros",
    "a mask of another shape": "ATTENTION_MASK",
    "mask values other than 0 and 1": "only 0 and 1",
    "a negative token id": "ids must lie in [0, 30522)",
    "a token id past the vocabulary": "ids must lie in [0, 30522)",
    "a row over the max length with truncate off": "the limit is 256",
    "a request of several MB": "3000000 bytes, far over the 256-token limit",
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_gets_invalid_argument_naming_the_problem(server, protocol, case):
    parameters = {"truncate": False}
    err = infer_error(client(server, protocol), "minilm", BAD_INPUTS[case](protocol), parameters)
    assert status_is(err, "invalid"), (case, err.status(), err.message())
    expected = EXPECTED_MESSAGE[case]
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert any(e in err.message() for e in expected), (case, err.message())
    assert server.ready()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_parameter_of_the_wrong_type_is_named(server, protocol):
    err = infer_error(
        client(server, protocol), "minilm", text_inputs(protocol, ["a"]), {"truncate": "yes"}
    )
    assert status_is(err, "invalid") and "parameter truncate must be a bool" in err.message()


def test_bad_requests_do_not_disturb_concurrent_good_ones(server, tokenizer, reference_model):
    texts = corpus_rows(60, seed=21)
    expected = reference_model(tokenizer.encode(texts, truncate=True))
    cases = sorted(BAD_INPUTS)

    def good(i):
        embedding, _ = infer(
            client(server, "grpc"), "minilm", text_inputs("grpc", texts[i : i + 1])
        )
        return float(np.abs(embedding - expected[i : i + 1]).max())

    def bad(i):
        case = cases[i % len(cases)]
        return infer_error(
            client(server, "http"), "minilm", BAD_INPUTS[case]("http"), {"truncate": False}
        )

    with ThreadPoolExecutor(16) as pool:
        good_results = pool.map(good, range(len(texts)))
        bad_results = pool.map(bad, range(48))
        assert max(good_results) <= TOLERANCE
        assert all(status_is(e, "invalid") for e in bad_results)


def test_a_full_queue_refuses_at_once_with_unavailable(server):
    """max_queue_rows is 8 on this model: a burst of 8-row requests overflows it."""
    texts = long_texts(8)
    started = time.monotonic()
    # a client per thread: tritonclient's HTTP client is not shared between threads
    with ThreadPoolExecutor(16) as pool:
        outcomes = list(
            pool.map(lambda _: _try(client(server, "http"), "minilm_small_queue", texts), range(16))
        )
    answered = [o for o in outcomes if not isinstance(o, Exception)]
    refused = [o for o in outcomes if isinstance(o, Exception)]
    assert answered, "the first requests are served"
    assert refused, "a burst past the limit is refused"
    for err in refused:
        assert status_is(err, "unavailable") and "queue full" in err.message(), err.message()
    assert all(a.shape == (8, 384) for a in answered)
    assert time.monotonic() - started < 60
    assert total(server, "planner_refused_total", reason="queue_full") >= len(refused)


def _try(c, model, texts):
    try:
        return infer(c, model, text_inputs("http", texts))[0]
    except Exception as err:
        return err


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_request_past_its_deadline_gets_a_timeout_error_not_a_late_answer(server, protocol):
    before = total(server, "planner_refused_total", reason="timeout")
    load = busy(server)
    err = infer_error(
        client(server, protocol), SLOW, text_inputs(protocol, ["late"]), {"timeout_ms": 1}
    )
    load.join()
    assert status_is(err, "unavailable") and "deadline exceeded" in err.message()
    assert total(server, "planner_refused_total", reason="timeout") == before + 1
    # with room to spare, the same request is answered
    embedding, _ = infer(
        client(server, protocol), SLOW, text_inputs(protocol, ["late"]), {"timeout_ms": 60000}
    )
    assert embedding.shape == (1, 384)


def test_a_cancelled_request_is_dropped_before_compute(server):
    # 1 cancellation counted; only the load's row computed, not the cancelled request's 3
    assert cancel_while_busy(server) == (1, 1)


def test_forwards_that_run_out_of_memory_are_split_and_every_row_is_answered(
    server, tokenizer, reference_model
):
    """minilm_faults fails any forward of more than 1024 padded tokens, like a GPU OOM."""
    texts = corpus_rows(120, seed=31)
    expected = reference_model(tokenizer.encode(texts, truncate=True))
    splits_before = total(server, "planner_split_total", model="minilm_faults")

    def send(k):
        protocol = PROTOCOLS[k % 2]
        embedding, _ = infer(
            client(server, protocol),
            "minilm_faults",
            text_inputs(protocol, texts[4 * k : 4 * k + 4]),
        )
        return float(np.abs(embedding - expected[4 * k : 4 * k + 4]).max())

    with ThreadPoolExecutor(30) as pool:
        assert max(pool.map(send, range(30))) <= TOLERANCE
    assert total(server, "planner_split_total", model="minilm_faults") > splits_before


def test_a_row_that_fails_alone_fails_only_its_request(server, tokenizer, reference_model):
    """Token 29999 breaks any forward it is in: its request fails, the others are answered."""
    texts = corpus_rows(40, seed=41)
    expected = reference_model(tokenizer.encode(texts, truncate=True))

    def good(i):
        embedding, _ = infer(
            client(server, "grpc"), "minilm_faults", text_inputs("grpc", texts[i : i + 1])
        )
        return float(np.abs(embedding - expected[i : i + 1]).max())

    def poisoned(_):
        rows = [np.array([101, 2023, 29999, 102]), np.array([101, 7592, 102])]
        return infer_error(client(server, "http"), "minilm_faults", id_inputs("http", rows))

    with ThreadPoolExecutor(12) as pool:
        bad = list(pool.map(poisoned, range(4)))
        assert max(pool.map(good, range(len(texts)))) <= TOLERANCE
    for err in bad:
        assert status_is(err, "internal"), err.status()
        assert "row 0 (4 tokens) failed even alone" in err.message()
        assert "injected engine fault" in err.message()
    assert server.ready()


def test_sigterm_with_requests_in_flight_answers_each_of_them(
    repository, tmp_path, tokenizer, reference_model
):
    own = start_server(repository_of(repository, (SLOW,), tmp_path), tmp_path / "sigterm.log")
    texts = corpus_rows(24, seed=51)
    expected = reference_model(tokenizer.encode(texts, truncate=True))
    results: dict[int, object] = {}

    def send(k):
        try:
            embedding, _ = infer(client(own, "grpc"), SLOW, text_inputs("grpc", texts[k : k + 1]))
            results[k] = float(np.abs(embedding - expected[k : k + 1]).max())
        except Exception as err:
            results[k] = err

    try:
        threads = [threading.Thread(target=send, args=(k,)) for k in range(len(texts))]
        load = threading.Thread(target=lambda: _try(client(own, "http"), SLOW, ["busy"]))
        load.start()
        for t in threads:
            t.start()
        time.sleep(0.3)
        pid = own.process.pid
    finally:
        code = own.stop()
    for t in threads:
        t.join(30)
    load.join(30)
    assert code == 0
    assert len(results) == len(texts), "every request got an answer or an error"
    for k, outcome in results.items():
        if isinstance(outcome, Exception):
            # refused cleanly at the door once shutdown began: never a wrong answer
            assert (
                "shut" in str(outcome).lower()
                or "unavailable" in str(outcome).lower()
                or "connect" in str(outcome).lower()
            ), outcome
        else:
            assert outcome <= TOLERANCE, k
    served = sum(1 for o in results.values() if not isinstance(o, Exception))
    assert served >= 1
    from tests.e2e.test_serving import _processes

    assert not [p for p in _processes() if f" {pid} " in p or p.lstrip().startswith(f"{pid} ")]
