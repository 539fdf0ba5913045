"""Bench only: the served model over an emulated engine (see bench/emulated_engine.py). Imported
only inside Triton's Python-backend stub, where triton_python_backend_utils exists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.emulated_engine import TABLE_FILE, EmulatedEngine, table_seconds
from python_backend.scheduling.owners import EngineSource
from python_backend.triton_model import TritonPythonModel


def emulated_engine(manifest: Any, version_dir: Path) -> EmulatedEngine:
    spec = (Path(version_dir) / TABLE_FILE).read_text().strip()
    return EmulatedEngine(manifest, table_seconds(spec))


class EmulatedEngines(EngineSource):
    """The emulated engine, which stands for a GPU's: its forwards only wait, so ``pin_cores``
    applies to its process as to a GPU instance's."""

    def open(self, manifest: Any, version_dir: Path, device_id: int) -> Any:
        return emulated_engine(manifest, version_dir)

    def computes_on_cpu(self, manifest: Any) -> bool:
        return False


class EmulatedEngineModel(TritonPythonModel):
    """The project's model, in any role, with its local owner over the emulated engine."""

    engines = EmulatedEngines()


class PythonBackendFloorModel:
    """Bench only, not the project's model: the least a Python-backend model that tokenizes does
    for each request. It reads TEXT, tokenizes it with the model's tokenizer (as a front does;
    or reads INPUT_IDS, one row a request, where the client tokenized),
    and answers zeros of the output's shape from a thread of its own through the request's
    response sender (as the fronts answer). No queue, no owner, no planner: what it costs per
    request, in its stub and in Triton, is what any design built on this backend pays at least
    (``python -m bench.serving --layouts floor``). Its process is pinned to a core where
    ``pin_cores`` asks, as a front's is."""

    def initialize(self, args: dict[str, str]) -> None:
        import queue
        import threading

        import triton_python_backend_utils as pb_utils

        from python_backend.common.manifest import load_manifest
        from python_backend.common.tokenization import TextTokenizer
        from python_backend.engines.base import BucketLayout
        from python_backend.settings import settings_from_parameters
        from python_backend.stub.cpu_pinning import with_every_core
        from python_backend.triton_model import parse_args, pin_if_asked

        self.pb_utils = pb_utils
        instance = parse_args(args)
        # pinned as a front is, where its pin_cores setting asks (bench.serving --pin-cores)
        settings = settings_from_parameters(instance.parameters, instance.model_name)
        self.pinned = pin_if_asked(settings.pin_cores, instance.instance_name, owner=False)
        manifest = load_manifest(instance.version_dir)
        longest = BucketLayout.from_manifest(manifest).longest_row  # as the fronts truncate
        self.tokenizer = TextTokenizer(instance.version_dir / manifest.tokenizer_file, longest)
        with_every_core(self.pinned, self.tokenizer.start_workers)  # as a front's workers float
        self.output_name, self.width = manifest.output_name, manifest.output_dim
        self.answers: queue.SimpleQueue[tuple[Any, list[Any]]] = queue.SimpleQueue()
        threading.Thread(target=self._answer, name="floor-answers", daemon=True).start()

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            text = self.pb_utils.get_input_tensor_by_name(request, "TEXT")
            if text is None:  # token ids: the rows as sent
                rows = list(self.pb_utils.get_input_tensor_by_name(request, "INPUT_IDS").as_numpy())
            else:
                texts = [t.decode("utf-8") for t in text.as_numpy()[:, 0]]
                rows = self.tokenizer.encode(texts, truncate=True)
            self.answers.put((sender, rows))

    def _answer(self) -> None:
        import numpy as np

        from python_backend.common.contract import NUM_TOKENS_OUTPUT

        pb = self.pb_utils
        while True:
            sender, rows = self.answers.get()
            outputs = np.zeros((len(rows), self.width), np.float32)
            tokens = np.asarray([[len(r)] for r in rows], np.int32)
            response = pb.InferenceResponse(
                output_tensors=[
                    pb.Tensor(self.output_name, outputs),
                    pb.Tensor(NUM_TOKENS_OUTPUT, tokens),
                ]
            )
            sender.send(response, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
