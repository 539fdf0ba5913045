"""The Triton Python-backend model: thin glue between Triton and an owner (``owners``).

One model class serves every process layout; its role is read from its config once, at
``initialize`` (``role_of``):

- **the one-process model** (no role parameter): decodes its requests and hands them to a
  ``LocalOwner``, the scheduler and the engine in this process;
- **a front** (parameter ``queue_owner``: the owner model's name): decodes its requests and hands
  them to a ``RemoteOwner``, its GPU's queue owner in another process; the split layout runs
  several fronts per owner, so that decoding and tokenizing scale with processes;
- **a queue owner** (parameter ``serves``: the model whose files it runs): a ``LocalOwner`` served
  to the fronts over a socket (``transport.queue_owner.QueueOwner``). It is never meant to be
  asked: a request Triton hands it is refused.

``execute`` decodes each request, answers bad ones at once and submits the rest, then returns
None: the owner answers through each request's response sender, exactly once, with the FINAL
flag (the model is not decoupled, so plain HTTP /infer and unary gRPC work). ``finalize`` stops
the owner, which drains its queue. docs/ARCHITECTURE.md says who owns what and what happens when
a process dies.
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

from python_backend.common.contract import (
    NUM_TOKENS_OUTPUT,
    OWNER_PARAMETER,
    PAIR_INPUT,
    REQUEST_INPUTS,
    SERVES_PARAMETER,
    SHUTDOWN_DRAIN_S,
    TIMINGS_OUTPUT,
    Reason,
    ServeError,
)
from python_backend.common.cost_models import CostModel, LinearCost
from python_backend.common.decoding import (
    Limits,
    Normalization,
    Prompts,
    check_declared_shape,
    decode_request,
    parse_options,
    unit_length,
)
from python_backend.common.manifest import Manifest, load_manifest
from python_backend.common.tokenization import TextTokenizer
from python_backend.engines.base import BucketLayout, Engine
from python_backend.engines.faults import FaultInjectingEngine, load_fault_spec
from python_backend.scheduling.owners import EngineSource, LocalOwner, Owner
from python_backend.scheduling.records import Answer, Outcome, Request
from python_backend.scheduling.scheduler import Scheduler, SchedulerMetrics
from python_backend.settings import Settings, overlaps_forwards, settings_from_parameters
from python_backend.stub.cpu_pinning import Claim, pin_to_free_core, should_pin, with_every_core
from python_backend.stub.metrics import TritonMetrics
from python_backend.stub.stub_python import match_extension_modules
from python_backend.transport.queue_owner import (
    QueueOwner,
    clear_failure,
    failure_file,
    owner_endpoint,
    record_failure,
)
from python_backend.transport.remote_owner import RemoteOwner

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
    priority: int = 1  # its service class (CLASS_PARAMETER), 1 first


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
            options.priority,
        )


def request_decoder(
    instance: InstanceArgs, manifest: Manifest, settings: Settings, longest_row: int
) -> RequestDecoder:
    return RequestDecoder(
        settings=settings,
        tokenizer=TextTokenizer(
            instance.version_dir / manifest.tokenizer_file, longest_row, manifest.rerank_template
        ),
        limits=Limits(
            instance.max_rows_per_request, longest_row, manifest.vocab_size, manifest.text_pairs
        ),
        prompts=Prompts(manifest.prompts, manifest.default_prompt_name),
        normalization=Normalization(
            manifest.normalize if manifest.family == "embedding" else None,
            manifest.graph_normalizes,
        ),
    )


def planning_scheduler(
    settings: Settings,
    manifest: Manifest,
    engine: Engine,
    metrics: SchedulerMetrics,
    log: Callable[[str], None],
) -> tuple[Scheduler, CostModel]:
    """The scheduler (not started) over ``engine``, and the cost it plans with: the manifest's,
    unless a setting overrides it."""
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
        log=log,
        vocab_size=manifest.vocab_size,
        classes=settings.service_classes(),
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


def socket_dir() -> str:
    """Where this Triton server's owners bind: private to the user, one folder per server (the
    stubs' parent is the server), so two servers on one host never share a socket."""
    base = os.environ.get("PLANNER_SOCKET_DIR") or f"/tmp/triton-planner-{os.getuid()}"
    return os.path.join(base, str(os.getppid()))


def pin_if_asked(setting: str, instance_name: str, owner: bool) -> Claim | None:
    """A core of its own for this process where the ``pin_cores`` setting asks for one
    (python_backend.stub.cpu_pinning)."""
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


@dataclass(frozen=True)
class Role:
    """What a model instance is, from its config: a front of the queue owner ``owner``, the
    queue owner of the model ``serves``, or (neither) the one-process model."""

    owner: str = ""
    serves: str = ""


def role_of(parameters: dict[str, Any]) -> Role:
    def value(key: str) -> str:
        return str(parameters.get(key, {}).get("string_value", ""))

    role = Role(owner=value(OWNER_PARAMETER), serves=value(SERVES_PARAMETER))
    if role.owner and role.serves:
        raise ValueError(
            f"the model config sets both {OWNER_PARAMETER!r} (a front) and {SERVES_PARAMETER!r} "
            "(a queue owner): rebuild the repository (make build)"
        )
    return role


class TritonPythonModel:
    # where a local owner's engine comes from; bench repositories emulate a GPU's
    engines = EngineSource()

    def initialize(self, args: dict[str, str]) -> None:
        instance = parse_args(args)
        self.instance_name = instance.instance_name
        role = role_of(instance.parameters)
        self.fronts: QueueOwner | None = None
        self.pinned: Claim | None = None  # this process's own core (pin_cores)
        if role.serves:
            self._serve_fronts(instance, role.serves)
            return
        settings = settings_from_parameters(instance.parameters, instance.model_name)
        manifest = load_manifest(instance.version_dir)
        self.output_name = manifest.output_name
        self.metrics = TritonMetrics(pb_utils, instance.model_name, self.instance_name)
        self.owner: Owner
        if role.owner:
            self.pinned = pin_if_asked(settings.pin_cores, self.instance_name, owner=False)
            endpoint = owner_endpoint(socket_dir(), role.owner, instance.device_id)
            self.owner = RemoteOwner(
                endpoint,
                manifest.output_dim,
                log=pb_utils.Logger.log_warn,
                tick=self.metrics.flush_if_due,
                refused=self.metrics.refused,
                failure_file=failure_file(endpoint),
            )
            longest = BucketLayout.from_manifest(manifest).longest_row
            serves_with = f"a front of {role.owner}, at {endpoint}"
        else:
            local = self._local_owner(instance, instance.version_dir, manifest, settings)
            self.owner = local
            longest = local.engine.layout.longest_row
            serves_with = local.description
        self.decoder = request_decoder(instance, manifest, settings, longest)
        with_every_core(self.pinned, self.decoder.tokenizer.start_workers)
        try:
            self.owner.start()
        except RuntimeError as err:
            raise RuntimeError(f"{self.instance_name} ({role.owner!r}): {err}") from None
        pb_utils.Logger.log_info(f"{self.instance_name}: {serves_with}")

    def _local_owner(
        self,
        instance: InstanceArgs,
        version_dir: Path,
        manifest: Manifest,
        settings: Settings,
        responder: bool = True,
    ) -> LocalOwner:
        """Loads the engine (on the instance's GPU where it runs on one) and builds its owner,
        not started. Where the engine computes elsewhere than on the CPU's cores and
        ``pin_cores`` asks, the process takes a core of its own, after the load, so that the
        engine's threads are pinned too (``self.pinned``, given back at ``finalize``)."""
        name = self.instance_name
        engine = self.engines.open(manifest, version_dir, instance.device_id)
        fault_spec = load_fault_spec(version_dir)  # test repositories only
        if fault_spec:
            engine = FaultInjectingEngine(engine, fault_spec)
        if not self.engines.computes_on_cpu(manifest):
            self.pinned = pin_if_asked(settings.pin_cores, name, owner=True)

        def log(message: str) -> None:
            pb_utils.Logger.log_warn(f"{name}: {message}")

        scheduler, cost = planning_scheduler(settings, manifest, engine, self.metrics, log)
        description = (
            f"{manifest.engine_kind} engine"
            + (f" on GPU {instance.device_id}" if manifest.runs_on_gpu else "")
            + f", buckets {[b.length for b in manifest.buckets]}, planner {settings.planner}, "
            + f"cost {cost}"
            + (", forwards on an engine thread (overlap_forwards)" if scheduler.overlaps else "")
        )
        return LocalOwner(scheduler, engine, log, responder, description)

    def _serve_fronts(self, instance: InstanceArgs, served: str) -> None:
        """The queue owner's role: a local owner of ``served``'s files, served to its fronts.
        Where it fails to start, its fronts (waiting for it) are told why, then the load fails."""
        endpoint = owner_endpoint(socket_dir(), instance.model_name, instance.device_id)
        try:
            # the served model's files, settings and metric labels: to a user, it is that model
            version_dir = instance.version_dir.parent.parent / served / instance.version_dir.name
            settings = settings_from_parameters(instance.parameters, served)
            manifest = load_manifest(version_dir)
            self.metrics = TritonMetrics(pb_utils, served, self.instance_name)
            local = self._local_owner(instance, version_dir, manifest, settings, responder=False)
            self.fronts = QueueOwner(
                local, endpoint, manifest.output_dim, log=pb_utils.Logger.log_warn
            )
            self.fronts.start()
        except Exception as err:
            record_failure(endpoint, f"{type(err).__name__}: {err}")
            raise
        clear_failure(endpoint)
        pb_utils.Logger.log_info(
            f"{self.instance_name}: queue owner of {served} at {endpoint}: {local.description}"
        )

    def execute(self, requests: list[Any]) -> list[Any] | None:
        if self.fronts is not None:
            error = ServeError(
                Reason.BAD_INPUTS,
                f"{self.instance_name} is a queue owner, internal to its model: send requests "
                "to the model it serves",
            )
            return [refusal(error) for _ in requests]
        admit_each(requests, self._admit, self.metrics, self.instance_name)
        return None

    def _admit(self, request: Any, sender: Any) -> None:
        asked = self.decoder.decode(request)
        self.metrics.request_stage("tokenization", asked.tokenization_s)
        self.owner.submit(
            Request(
                rows=asked.rows,
                respond=partial(self._respond, sender, asked),
                deadline=None if asked.timeout_s is None else time.monotonic() + asked.timeout_s,
                is_cancelled=request.is_cancelled,
                client=asked.client,
                priority=asked.priority,
            )
        )

    def _respond(self, sender: Any, asked: Admission, outcome: Outcome) -> None:
        send_final(sender, answer_response(self.output_name, outcome, asked))
        if isinstance(outcome, Answer):
            self.metrics.request_stage("total", time.monotonic() - asked.started)

    def is_model_ready(self) -> bool:
        """Triton's readiness probe, where Triton asks it (later releases than 2.51): a front
        is ready while its queue owner is connected."""
        return self.fronts is not None or self.owner.ready()

    def finalize(self) -> None:
        if self.fronts is not None:
            self.fronts.stop(SHUTDOWN_DRAIN_S)
        else:
            self.owner.stop(SHUTDOWN_DRAIN_S)
            self.metrics.flush()
        if self.pinned is not None:
            self.pinned.release()
