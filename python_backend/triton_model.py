"""The Triton Python-backend model: thin glue between Triton and the scheduler.

``initialize`` parses what Triton passes (``parse_args``), loads the manifest and the engine,
builds everything else from them with the pure ``wire`` and starts the scheduler; ``execute`` decodes
each request, answers bad ones at once and queues the rest, then returns None (the scheduler
thread answers through each request's response sender, exactly once, with the FINAL flag; the
model is not decoupled, so plain HTTP /infer and unary gRPC work); ``finalize`` drains the queue.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import triton_python_backend_utils as pb_utils

from python_backend.contract import (
    NUM_TOKENS_OUTPUT,
    PAIR_INPUT,
    REQUEST_INPUTS,
    SHUTDOWN_DRAIN_S,
    Reason,
    ServeError,
)
from python_backend.cost_models import CostModel, LinearCost
from python_backend.decoding import Limits, Prompts, decode_request, parse_options
from python_backend.engines import open_engine
from python_backend.engines.base import Engine
from python_backend.faults import FaultInjectingEngine, load_fault_spec
from python_backend.manifest import Manifest, load_manifest
from python_backend.metrics import TritonMetrics
from python_backend.scheduler import Answer, Outcome, Request, Scheduler
from python_backend.settings import Settings, settings_from_parameters
from python_backend.tokenization import TextTokenizer


def _error_response(message: str, code_name: str) -> Any:
    code = getattr(pb_utils.TritonError, code_name, pb_utils.TritonError.INTERNAL)
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


def _send_final(sender: Any, response: Any) -> None:
    """The one response of a request (the model is not decoupled: it closes the request)."""
    sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


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
class Wiring:
    """What one instance serves with, built from its manifest and engine by ``wire``."""

    settings: Settings
    cost: CostModel  # the planner's: the manifest's, unless a setting overrides it
    tokenizer: TextTokenizer
    limits: Limits
    prompts: Prompts
    scheduler: Scheduler  # not started


def wire(instance: InstanceArgs, manifest: Manifest, engine: Engine, metrics: Any) -> Wiring:
    """The instance's settings, tokenizer, limits and scheduler: no Triton call, no I/O beyond
    reading the tokenizer, so tests call it with a real manifest and a fake engine."""
    settings = settings_from_parameters(instance.parameters, instance.model_name)
    cost = (
        LinearCost(settings.overhead_tokens)
        if settings.overhead_tokens is not None
        else manifest.planner_cost()
    )
    longest = engine.layout.longest_row
    scheduler = Scheduler(
        engine,
        pad_token_id=manifest.pad_token_id,
        cost=cost,
        max_batch=settings.max_batch or manifest.max_batch,
        max_queue_rows=settings.max_queue_rows,
        policy=settings.planner,
        metrics=metrics,
    )
    return Wiring(
        settings=settings,
        cost=cost,
        tokenizer=TextTokenizer(instance.version_dir / manifest.tokenizer_file, longest),
        limits=Limits(
            instance.max_rows_per_request, longest, manifest.vocab_size, manifest.takes_pairs
        ),
        prompts=Prompts(manifest.prompts, manifest.default_prompt_name),
        scheduler=scheduler,
    )


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        instance = parse_args(args)
        self.model_name, self.instance_name = instance.model_name, instance.instance_name
        manifest = load_manifest(instance.version_dir)
        engine = self.open_engine(manifest, instance.version_dir, instance.device_id)
        fault_spec = load_fault_spec(instance.version_dir)  # test repositories only
        if fault_spec:
            engine = FaultInjectingEngine(engine, fault_spec)
        self.engine = engine
        self.output_name = manifest.output_name
        self.metrics = TritonMetrics(pb_utils, self.model_name, self.instance_name)
        wiring = wire(instance, manifest, engine, self.metrics)
        self.settings, self.tokenizer = wiring.settings, wiring.tokenizer
        self.limits, self.prompts, self.scheduler = wiring.limits, wiring.prompts, wiring.scheduler
        self.scheduler.start()
        pb_utils.Logger.log_info(
            f"{self.instance_name}: {manifest.engine_kind} engine"
            + (f" on GPU {instance.device_id}" if manifest.engine_kind == "tensorrt" else "")
            + f", buckets {[b.length for b in manifest.buckets]}, planner "
            f"{self.settings.planner}, cost {wiring.cost}"
        )

    def open_engine(self, manifest: Any, version_dir: Path, device_id: int) -> Any:
        """The model's engine on GPU ``device_id`` where it runs on one; bench repositories
        override it with an emulated one."""
        return open_engine(manifest, version_dir, device_id=device_id)

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                pending = self._decode(request, sender)
            except ServeError as err:
                self._refuse(sender, err)
                continue
            except Exception as err:  # a bug must cost one request, never the batch of them
                # the client reads no exception text (it may hold the server's internals)
                pb_utils.Logger.log_error(f"{self.instance_name}: decoding failed: {err!r}")
                self._refuse(
                    sender, ServeError(Reason.INTERNAL, "the server could not decode this request")
                )
                continue
            self.scheduler.submit(pending)
        return None

    def _refuse(self, sender: Any, error: ServeError) -> None:
        """Answers a request refused before it reached the queue."""
        self.metrics.refused(error.reason)
        _send_final(sender, _error_response(str(error), error.kind.triton_code))

    def _decode(self, request: Any, sender: Any) -> Request:
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
                inputs[name] = tensor.as_numpy()
        decoded = decode_request(inputs, options, self.tokenizer, self.limits, self.prompts)
        deadline = None
        if options.timeout_ms:
            deadline = time.monotonic() + options.timeout_ms / 1000.0
        return Request(
            rows=decoded.rows,
            respond=partial(self._respond, sender),
            deadline=deadline,
            is_cancelled=request.is_cancelled,
        )

    def _respond(self, sender: Any, outcome: Outcome) -> None:
        if isinstance(outcome, Answer):
            response = pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor(self.output_name, outcome.outputs),
                    pb_utils.Tensor(NUM_TOKENS_OUTPUT, outcome.num_tokens.reshape(-1, 1)),
                ]
            )
        else:
            response = _error_response(str(outcome), outcome.kind.triton_code)
        _send_final(sender, response)

    def finalize(self) -> None:
        if self.scheduler.stop(SHUTDOWN_DRAIN_S):
            self.engine.close()
        else:  # a forward still runs: closing the engine under it could crash the process
            pb_utils.Logger.log_warn(
                f"{self.model_name}: a forward was still running {SHUTDOWN_DRAIN_S:.0f} s into "
                "shutdown; the engine is left to the process exit"
            )
