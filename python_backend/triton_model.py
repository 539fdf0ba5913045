"""The Triton Python-backend model: thin glue between Triton and the scheduler.

``initialize`` parses what Triton passes (``parse_args``), loads the manifest and the engine,
builds everything else from them with the pure ``wire`` and starts the scheduler; ``execute`` decodes
each request, answers bad ones at once and queues the rest, then returns None (the scheduler
thread answers through each request's response sender, exactly once, with the FINAL flag; the
model is not decoupled, so plain HTTP /infer and unary gRPC work); ``finalize`` drains the queue.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from python_backend.contract import (
    NUM_TOKENS_OUTPUT,
    PAIR_INPUT,
    REQUEST_INPUTS,
    SHUTDOWN_DRAIN_S,
    TIMINGS_OUTPUT,
    Reason,
    ServeError,
)
from python_backend.cost_models import CostModel, LinearCost
from python_backend.cpu_pinning import Claim, pin_to_free_core, should_pin, with_every_core
from python_backend.decoding import (
    Limits,
    Normalization,
    Prompts,
    check_declared_shape,
    decode_request,
    parse_options,
    unit_length,
)
from python_backend.engines import open_engine
from python_backend.engines.base import Engine
from python_backend.faults import FaultInjectingEngine, load_fault_spec
from python_backend.manifest import Manifest, load_manifest
from python_backend.metrics import TritonMetrics
from python_backend.scheduler import Answer, Outcome, Request, Scheduler
from python_backend.settings import Settings, overlaps_forwards, settings_from_parameters
from python_backend.stub_python import match_extension_modules
from python_backend.tokenization import TextTokenizer

# before anything imports ssl (transformers does, for the torch engine): see stub_python
match_extension_modules()


def _error_response(message: str, code_name: str) -> Any:
    """An error response with the TritonError code ``code_name`` names (contract's closed set,
    each seen on Triton 2.51's stub: an unknown name is a bug, raised, never sent as INTERNAL)."""
    return pb_utils.InferenceResponse(
        error=pb_utils.TritonError(message, getattr(pb_utils.TritonError, code_name))
    )


def send_final(sender: Any, response: Any) -> None:
    """The one response of a request (the model is not decoupled: it closes the request)."""
    sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def refuse(metrics: TritonMetrics, sender: Any, error: ServeError) -> None:
    """Answers a request refused before it reached a queue, counted by its reason."""
    metrics.refused(error.reason)
    send_final(sender, refusal(error))


def admit_each(
    requests: list[Any],
    admit: Callable[[Any, Any], None],
    metrics: TritonMetrics,
    instance_name: str,
) -> None:
    """``admit(request, sender)`` for each request Triton hands ``execute``: it decodes the
    request and queues it, or raises the ServeError it is refused with, answered at once. A bug
    while decoding costs that one request, never the others."""
    for request in requests:
        sender = request.get_response_sender()
        try:
            admit(request, sender)
        except ServeError as err:
            refuse(metrics, sender, err)
        except Exception as err:
            # the client reads no exception text (it may hold the server's internals)
            pb_utils.Logger.log_error(f"{instance_name}: decoding failed: {err!r}")
            refuse(
                metrics,
                sender,
                ServeError(Reason.INTERNAL, "the server could not decode this request"),
            )


@dataclass(frozen=True)
class InstanceArgs:
    """What Triton tells a model instance at ``initialize``, parsed once."""

    model_name: str
    instance_name: str  # one instance per GPU (KIND_GPU): each has its own metrics labels
    version_dir: Path
    device_id: int  # the GPU Triton gives the instance (0 on CPU)
    max_rows_per_request: int  # the config's max_batch_size
    parameters: dict[str, Any]  # the config's parameters block


def parse_args(args: dict[str, str]) -> InstanceArgs:
    config = json.loads(args["model_config"])
    return InstanceArgs(
        model_name=config["name"],
        instance_name=args.get("model_instance_name") or config["name"],
        version_dir=Path(args["model_repository"]) / args["model_version"],
        device_id=int(args.get("model_instance_device_id") or 0),
        max_rows_per_request=int(config["max_batch_size"]),
        parameters=config.get("parameters", {}),
    )


@dataclass(frozen=True)
class Admission:
    """A decoded request: its rows, how long it may wait (None: no deadline), who sent it, and
    whether its answer is scaled to unit length."""

    rows: list[Any]
    timeout_s: float | None
    client: str
    normalize: bool = False
    timings: bool = False  # answer TIMINGS too
    started: float = 0.0  # time.monotonic() when its decoding began: the request's own clock
    tokenization_s: float = 0.0  # how long decoding it took


@dataclass(frozen=True)
class RequestDecoder:
    """What turns a Triton request into token-id rows: the in-process model's and each front's."""

    settings: Settings
    tokenizer: TextTokenizer
    limits: Limits
    prompts: Prompts
    normalization: Normalization

    def decode(self, request: Any) -> Admission:
        """What one request asks for, or a ServeError saying why not."""
        started = time.monotonic()
        try:
            parameters = json.loads(request.parameters() or "{}")
        except json.JSONDecodeError:
            raise ServeError(
                Reason.BAD_PARAMETER,
                "request parameters are not valid JSON",
            ) from None
        options = parse_options(
            parameters, self.settings.truncate_default, self.settings.default_timeout_ms
        )
        inputs = {}
        for name in (*REQUEST_INPUTS, PAIR_INPUT):
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                # the declared shape first: nothing of a tensor is read or copied past a limit
                check_declared_shape(name, tensor.shape(), self.limits)
                inputs[name] = tensor.as_numpy()
        normalize = self.normalization.applies(options.normalize)
        decoded = decode_request(inputs, options, self.tokenizer, self.limits, self.prompts)
        timeout_s = options.timeout_ms / 1000.0 if options.timeout_ms else None
        return Admission(
            decoded.rows,
            timeout_s,
            options.client,
            normalize,
            options.timings,
            started,
            time.monotonic() - started,
        )


def request_decoder(
    instance: InstanceArgs, manifest: Manifest, settings: Settings, longest_row: int
) -> RequestDecoder:
    return RequestDecoder(
        settings=settings,
        tokenizer=TextTokenizer(instance.version_dir / manifest.tokenizer_file, longest_row),
        limits=Limits(
            instance.max_rows_per_request, longest_row, manifest.vocab_size, manifest.takes_pairs
        ),
        prompts=Prompts(manifest.prompts, manifest.default_prompt_name),
        normalization=Normalization(
            manifest.normalize if manifest.family == "embedding" else None,
            manifest.graph_normalizes,
        ),
    )


def planner_scheduler(
    settings: Settings, manifest: Manifest, engine: Engine, metrics: Any, name: str
) -> tuple[Scheduler, CostModel]:
    """The scheduler (not started) over ``engine``, and the cost it plans with: the manifest's,
    unless a setting overrides it. ``name``: the instance, in what the scheduler logs."""
    cost = (
        LinearCost(settings.overhead_tokens)
        if settings.overhead_tokens is not None
        else manifest.planner_cost()
    )
    scheduler = Scheduler(
        engine,
        pad_token_id=manifest.pad_token_id,
        cost=cost,
        max_batch=settings.max_batch or manifest.max_batch,
        max_queue_rows=settings.max_queue_rows,
        policy=settings.planner,
        metrics=metrics,
        overlap=overlaps_forwards(settings.overlap_forwards, manifest.runs_on_gpu),
        log=lambda message: pb_utils.Logger.log_warn(f"{name}: {message}"),
        vocab_size=manifest.vocab_size,
    )
    return scheduler, cost


def refusal(error: ServeError) -> Any:
    return _error_response(str(error), error.kind.triton_code)


def answer_response(output_name: str, outcome: Outcome, asked: Admission | None = None) -> Any:
    """The Triton response of an outcome: its outputs (at unit length where the request asks),
    token counts and, where asked, its timings; or its error."""
    if isinstance(outcome, Answer):
        normalize = asked is not None and asked.normalize
        outputs = unit_length(outcome.outputs) if normalize else outcome.outputs
        tensors = [
            pb_utils.Tensor(output_name, outputs),
            pb_utils.Tensor(NUM_TOKENS_OUTPUT, outcome.num_tokens.reshape(-1, 1)),
        ]
        if asked is not None and asked.timings:
            times = [outcome.queue_s, asked.tokenization_s, outcome.inference_s]
            per_row = np.tile(np.asarray(times, np.float32), (len(outputs), 1))
            tensors.append(pb_utils.Tensor(TIMINGS_OUTPUT, per_row))
        return pb_utils.InferenceResponse(output_tensors=tensors)
    return refusal(outcome)


@dataclass(frozen=True)
class Wiring:
    """What one instance serves with, built from its manifest and engine by ``wire``."""

    settings: Settings
    cost: CostModel  # the planner's: the manifest's, unless a setting overrides it
    decoder: RequestDecoder
    scheduler: Scheduler  # not started


def wire(instance: InstanceArgs, manifest: Manifest, engine: Engine, metrics: Any) -> Wiring:
    """The instance's settings, tokenizer, limits and scheduler: no Triton call, no I/O beyond
    reading the tokenizer, so tests call it with a real manifest and a fake engine."""
    settings = settings_from_parameters(instance.parameters, instance.model_name)
    scheduler, cost = planner_scheduler(settings, manifest, engine, metrics, instance.instance_name)
    decoder = request_decoder(instance, manifest, settings, engine.layout.longest_row)
    return Wiring(settings=settings, cost=cost, decoder=decoder, scheduler=scheduler)


def socket_dir() -> str:
    """Where this Triton server's owners bind: private to the user, one folder per server (the
    stubs' parent is the server), so two servers on one host never share a socket."""
    base = os.environ.get("PLANNER_SOCKET_DIR") or f"/tmp/triton-planner-{os.getuid()}"
    return os.path.join(base, str(os.getppid()))


def pin_if_asked(setting: str, instance_name: str, owner: bool) -> Claim | None:
    """A core of its own for this process where the ``pin_cores`` setting asks for one
    (python_backend.cpu_pinning)."""
    if not should_pin(setting):
        return None
    claim = pin_to_free_core(socket_dir(), owner)
    pb_utils.Logger.log_info(
        f"{instance_name}: pinned to core {claim.core}"
        if claim is not None
        else f"{instance_name}: every core is claimed by another of this server's model "
        "processes: not pinned"
    )
    return claim


class EngineHost:
    """What a model instance that holds the engine does with it: the one-process model and the
    split layout's queue owner."""

    instance_name: str
    engine: Engine
    pinned: Claim | None = None

    def computes_on_cpu(self, manifest: Manifest) -> bool:
        """Whether the engine's forwards take the CPU's cores (ONNX Runtime on the CPU): such a
        process is never pinned to one of them, nor are its engine's threads."""
        return not manifest.runs_on_gpu

    def pin_engine_host(self, manifest: Manifest, setting: str) -> None:
        """A core of its own for a process whose engine computes elsewhere (a GPU), where the
        ``pin_cores`` setting asks. Called after the engine's load, so that the threads it
        started are pinned too; claimed from the end of the cores, as the owners' are."""
        if not self.computes_on_cpu(manifest):
            self.pinned = pin_if_asked(setting, self.instance_name, owner=True)

    def open_engine(self, manifest: Any, version_dir: Path, device_id: int) -> Any:
        """The model's engine on GPU ``device_id`` where it runs on one; bench repositories
        override it with an emulated one."""
        return open_engine(manifest, version_dir, device_id=device_id)

    def load_engine(self, manifest: Manifest, version_dir: Path, device_id: int) -> Engine:
        engine = self.open_engine(manifest, version_dir, device_id)
        fault_spec = load_fault_spec(version_dir)  # test repositories only
        if fault_spec:
            engine = FaultInjectingEngine(engine, fault_spec)
        self.engine = engine
        return engine

    def engine_line(
        self, manifest: Manifest, device_id: int, planner: str, cost: Any, overlap: bool
    ) -> str:
        """The log line that says what this instance serves with."""
        return (
            f"{manifest.engine_kind} engine"
            + (f" on GPU {device_id}" if manifest.runs_on_gpu else "")
            + f", buckets {[b.length for b in manifest.buckets]}, planner {planner}, cost {cost}"
            + (", forwards on an engine thread (overlap_forwards)" if overlap else "")
        )

    def close_engine(self, drained: bool) -> None:
        """After the scheduler stopped (``drained``: its verdict); gives its core back."""
        if self.pinned is not None:
            self.pinned.release()
        if drained:
            self.engine.close()
        else:  # a forward still runs: closing the engine under it could crash the process
            pb_utils.Logger.log_warn(
                f"{self.instance_name}: a forward was still running {SHUTDOWN_DRAIN_S:.0f} s "
                "into shutdown; the engine is left to the process exit"
            )


class TritonPythonModel(EngineHost):
    def initialize(self, args: dict[str, str]) -> None:
        instance = parse_args(args)
        self.model_name, self.instance_name = instance.model_name, instance.instance_name
        manifest = load_manifest(instance.version_dir)
        engine = self.load_engine(manifest, instance.version_dir, instance.device_id)
        self.output_name = manifest.output_name
        self.metrics = TritonMetrics(pb_utils, self.model_name, self.instance_name)
        wiring = wire(instance, manifest, engine, self.metrics)
        self.settings, self.decoder, self.scheduler = (
            wiring.settings,
            wiring.decoder,
            wiring.scheduler,
        )
        self.pin_engine_host(manifest, self.settings.pin_cores)
        with_every_core(self.pinned, self.decoder.tokenizer.start_workers)
        self.scheduler.start()
        pb_utils.Logger.log_info(
            f"{self.instance_name}: "
            + self.engine_line(
                manifest,
                instance.device_id,
                self.settings.planner,
                wiring.cost,
                wiring.scheduler.overlaps,
            )
        )

    def execute(self, requests: list[Any]) -> None:
        admit_each(requests, self._admit, self.metrics, self.instance_name)
        return None

    def _admit(self, request: Any, sender: Any) -> None:
        self.scheduler.submit(self._decode(request, sender))

    def _decode(self, request: Any, sender: Any) -> Request:
        asked = self.decoder.decode(request)
        self.metrics.request_stage("tokenization", asked.tokenization_s)
        return Request(
            rows=asked.rows,
            respond=partial(self._respond, sender, asked),
            deadline=None if asked.timeout_s is None else time.monotonic() + asked.timeout_s,
            is_cancelled=request.is_cancelled,
            client=asked.client,
        )

    def _respond(self, sender: Any, asked: Admission, outcome: Outcome) -> None:
        send_final(sender, answer_response(self.output_name, outcome, asked))
        if isinstance(outcome, Answer):
            self.metrics.request_stage("total", time.monotonic() - asked.started)

    def finalize(self) -> None:
        self.close_engine(self.scheduler.stop(SHUTDOWN_DRAIN_S))
