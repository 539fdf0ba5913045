"""The two Triton models of the split layout: many fronts, one queue owner per GPU.

- ``FrontModel`` keeps the public name (``minilm``): K instances, each its own stub process,
  decode, validate and tokenize their requests, send the rows to their GPU's owner
  (``owner_client``) and answer Triton when the outputs come back. Nothing a front does needs
  another request's rows, so adding fronts adds the CPU that work needs.
- ``OwnerModel`` (``minilm_owner``, one instance per GPU) holds the engine and the scheduler and
  serves them to the fronts (``queue_owner``): the one place that sees every row, so the
  planner plans across all of them. It is never meant to be asked: a request that reaches it
  is refused.

Both are ordinary Triton models, so Triton starts them, loads them in parallel and reports them
ready. docs/ARCHITECTURE.md says who owns what and what happens when either dies.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import triton_python_backend_utils as pb_utils

from python_backend.contract import (
    OWNER_PARAMETER,
    SERVES_PARAMETER,
    SHUTDOWN_DRAIN_S,
    Reason,
    ServeError,
)
from python_backend.cpu_pinning import with_every_core
from python_backend.engines.base import BucketLayout
from python_backend.manifest import load_manifest
from python_backend.metrics import TritonMetrics
from python_backend.owner_client import OwnerClient, StalledDrop
from python_backend.queue_owner import (
    QueueOwner,
    clear_failure,
    failure_file,
    owner_endpoint,
    record_failure,
)
from python_backend.scheduler import Answer, Outcome
from python_backend.settings import settings_from_parameters
from python_backend.triton_model import (
    Admission,
    EngineHost,
    admit_each,
    answer_response,
    parse_args,
    pin_if_asked,
    planner_scheduler,
    refusal,
    request_decoder,
    send_final,
    socket_dir,
)

OWNER_WAIT_S = 600.0  # a front's initialize waits this long for its owner (a TensorRT load)


def _parameter(parameters: dict[str, Any], key: str) -> str:
    value = parameters.get(key, {}).get("string_value", "")
    if not value:
        raise ValueError(f"the model config has no parameter {key!r}")
    return str(value)


class FrontModel:
    def initialize(self, args: dict[str, str]) -> None:
        instance = parse_args(args)
        self.model_name, self.instance_name = instance.model_name, instance.instance_name
        settings = settings_from_parameters(instance.parameters, instance.model_name)
        self.pinned = pin_if_asked(settings.pin_cores, self.instance_name, owner=False)
        manifest = load_manifest(instance.version_dir)
        self.output_name = manifest.output_name
        longest = BucketLayout.from_manifest(manifest).longest_row
        self.decoder = request_decoder(instance, manifest, settings, longest)
        with_every_core(self.pinned, self.decoder.tokenizer.start_workers)
        self.metrics = TritonMetrics(pb_utils, self.model_name, self.instance_name)
        owner = _parameter(instance.parameters, OWNER_PARAMETER)
        endpoint = owner_endpoint(socket_dir(), owner, instance.device_id)
        self.client = OwnerClient(
            endpoint,
            manifest.output_dim,
            log=pb_utils.Logger.log_warn,
            tick=self.metrics.flush_if_due,
        )
        self.client.start()
        try:
            self.client.wait_for_owner(OWNER_WAIT_S, failure_file(endpoint))
        except RuntimeError as err:
            self.client.stop()
            raise RuntimeError(f"{self.instance_name} ({owner!r}): {err}") from None
        pb_utils.Logger.log_info(f"{self.instance_name}: a front of {owner}, at {endpoint}")

    def execute(self, requests: list[Any]) -> None:
        admit_each(requests, self._admit, self.metrics, self.instance_name)
        return None

    def _admit(self, request: Any, sender: Any) -> None:
        asked = self.decoder.decode(request)
        self.metrics.request_stage("tokenization", asked.tokenization_s)
        self.client.submit(
            asked.rows,
            partial(self._respond, sender, asked),
            asked.timeout_s,
            is_cancelled=request.is_cancelled,
            client=asked.client,
        )

    def _respond(self, sender: Any, asked: Admission, outcome: Outcome) -> None:
        if (
            isinstance(outcome, ServeError)
            and outcome.reason is Reason.OWNER_LOST
            and not isinstance(outcome, StalledDrop)  # the owner counted that one
        ):
            self.metrics.refused(outcome.reason)  # the owner never saw it, or is gone
        send_final(sender, answer_response(self.output_name, outcome, asked))
        if isinstance(outcome, Answer):
            self.metrics.request_stage("total", time.monotonic() - asked.started)

    def is_model_ready(self) -> bool:
        """Triton's readiness probe, where Triton asks it (later releases than 2.51): a front
        is ready while its queue owner is connected."""
        return self.client.wait_connected(0)

    def finalize(self) -> None:
        self.client.stop()
        self.metrics.flush()
        if self.pinned is not None:
            self.pinned.release()


class OwnerModel(EngineHost):
    def initialize(self, args: dict[str, str]) -> None:
        instance = parse_args(args)
        endpoint = owner_endpoint(socket_dir(), instance.model_name, instance.device_id)
        try:
            self._start(instance, endpoint)
        except Exception as err:  # its fronts are waiting: tell them why, then fail the load
            record_failure(endpoint, f"{type(err).__name__}: {err}")
            raise
        clear_failure(endpoint)

    def _start(self, instance: Any, endpoint: str) -> None:
        served = _parameter(instance.parameters, SERVES_PARAMETER)
        self.instance_name = instance.instance_name
        # the served model's files, settings and metric labels: to a user, this is that model
        version_dir = Path(instance.version_dir).parent.parent / served / instance.version_dir.name
        settings = settings_from_parameters(instance.parameters, served)
        manifest = load_manifest(version_dir)
        engine = self.load_engine(manifest, version_dir, instance.device_id)
        self.pin_engine_host(manifest, settings.pin_cores)
        self.metrics = TritonMetrics(pb_utils, served, self.instance_name)
        scheduler, cost = planner_scheduler(
            settings, manifest, engine, self.metrics, self.instance_name
        )
        self.owner = QueueOwner(
            scheduler,
            endpoint,
            manifest.output_dim,
            log=pb_utils.Logger.log_warn,
        )
        self.owner.start()
        pb_utils.Logger.log_info(
            f"{self.instance_name}: queue owner of {served} at {endpoint}: "
            + self.engine_line(
                manifest, instance.device_id, settings.planner, cost, scheduler.overlaps
            )
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        error = ServeError(
            Reason.BAD_INPUTS,
            f"{self.instance_name} is a queue owner, internal to its model: send requests to the "
            "model it serves",
        )
        return [refusal(error) for _ in requests]

    def finalize(self) -> None:
        self.close_engine(self.owner.stop(SHUTDOWN_DRAIN_S))
