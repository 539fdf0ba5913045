"""The Triton model config, built as Triton's own protobuf message and written as text.

The interface is fixed so that clients can rely on it: up to 64 rows a request; exactly one of
TEXT (strings, with TEXT_PAIR for rerankers) or INPUT_IDS (+ optional ATTENTION_MASK); the
family's one output (EMBEDDING, LOGITS or SCORE) and NUM_TOKENS out.
No `dynamic_batching` block: the model batches for itself. Not decoupled: plain HTTP /infer and
unary gRPC work, while the model still answers from its own thread.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from python_backend.common.contract import (
    MAX_ROWS_PER_REQUEST,
    NUM_TOKENS_OUTPUT,
    OWNER_PARAMETER,
    OWNER_SUFFIX,
    PAIR_INPUT,
    REQUEST_INPUTS,
    SERVES_PARAMETER,
    TIMINGS_OUTPUT,
    TIMINGS_STAGES,
)
from python_backend.settings import CONFIG_DEFAULTS

MAX_BATCH_SIZE = MAX_ROWS_PER_REQUEST

# every model of the deployment, whatever its role (one process, front, queue owner: read from
# its config's parameters at initialize)
MODEL_PY = '''"""Triton entry point: the logic lives in python_backend (queue, planner, engines)."""

from python_backend.triton_model import TritonPythonModel

__all__ = ["TritonPythonModel"]
'''

# model parameters: every setting at its declared default; each can be changed in config.pbtxt,
# or for one model by an environment variable (python_backend/settings.py declares them)
DEFAULT_PARAMETERS = CONFIG_DEFAULTS


def cpu_instance() -> mc.ModelInstanceGroup:
    """One instance on the CPU (ONNX Runtime): one queue plans across every request."""
    return mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU, count=1)


def gpu_instances(gpus: tuple[int, ...] | None = None, per_gpu: int = 1) -> mc.ModelInstanceGroup:
    """``per_gpu`` instances on each GPU, each with its own queue, engine and stub process on its
    device (Triton passes the device as ``model_instance_device_id``). Without ``gpus``, on every
    GPU the server sees. More than one per GPU where the server's own work per request, one
    Python process per instance, is what holds the GPU back (docs/PERFORMANCE.md, the ceiling);
    each planner then sees only its share of the rows."""
    group = mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_GPU, count=per_gpu)
    if gpus is not None:
        group.gpus.extend(gpus)
    return group


def model_config(
    name: str,
    output_name: str,
    output_dim: int,
    parameters: dict[str, str] | None = None,
    instances: mc.ModelInstanceGroup | None = None,
    takes_pairs: bool = False,
) -> mc.ModelConfig:
    config = mc.ModelConfig(name=name, backend="python", max_batch_size=MAX_BATCH_SIZE)
    text, input_ids, attention_mask = REQUEST_INPUTS
    config.input.append(mc.ModelInput(name=text, data_type=mc.TYPE_STRING, dims=[1], optional=True))
    config.input.append(
        mc.ModelInput(name=input_ids, data_type=mc.TYPE_INT64, dims=[-1], optional=True)
    )
    config.input.append(
        mc.ModelInput(name=attention_mask, data_type=mc.TYPE_INT64, dims=[-1], optional=True)
    )
    if takes_pairs:  # cross-encoders: the second text of each row
        config.input.append(
            mc.ModelInput(name=PAIR_INPUT, data_type=mc.TYPE_STRING, dims=[1], optional=True)
        )
    config.output.append(
        mc.ModelOutput(name=output_name, data_type=mc.TYPE_FP32, dims=[output_dim])
    )
    config.output.append(mc.ModelOutput(name=NUM_TOKENS_OUTPUT, data_type=mc.TYPE_INT32, dims=[1]))
    config.output.append(
        mc.ModelOutput(name=TIMINGS_OUTPUT, data_type=mc.TYPE_FP32, dims=[len(TIMINGS_STAGES)])
    )
    config.instance_group.append(instances if instances is not None else cpu_instance())
    for key, value in {**DEFAULT_PARAMETERS, **(parameters or {})}.items():
        config.parameters[key].string_value = value
    return config


def owner_name(model: str) -> str:
    """The queue owner of ``model`` (the split layout)."""
    return model + OWNER_SUFFIX


def front_instances(
    fronts: int, on_gpu: bool, gpus: tuple[int, ...] | None = None
) -> mc.ModelInstanceGroup:
    """``fronts`` front instances per GPU (each its own stub process; they decode, tokenize and
    answer): on the CPU they all feed the one owner; on GPUs, each front feeds its GPU's owner."""
    if not on_gpu:
        return mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU, count=fronts)
    return gpu_instances(gpus, fronts)


def owner_config(model: str, on_gpu: bool, gpus: tuple[int, ...] | None = None) -> mc.ModelConfig:
    """The queue owner of ``model``: one instance per GPU (one on the CPU), no inputs of its own
    (it is fed by the fronts' socket, and refuses any request Triton hands it), the same
    parameters block, which sets its scheduler."""
    config = mc.ModelConfig(name=owner_name(model), backend="python", max_batch_size=0)
    config.instance_group.append(gpu_instances(gpus, 1) if on_gpu else cpu_instance())
    for key, value in {**DEFAULT_PARAMETERS, SERVES_PARAMETER: model}.items():
        config.parameters[key].string_value = value
    return config


def write_owner(
    repository: Path,
    model: str,
    on_gpu: bool,
    gpus: tuple[int, ...] | None,
    model_py: str = MODEL_PY,
) -> Path:
    """``model``'s queue owner entry: its config and its model.py (it runs ``model``'s files)."""
    owner_dir = Path(repository) / owner_name(model)
    (owner_dir / "1").mkdir(parents=True, exist_ok=True)
    write_config(owner_config(model, on_gpu, gpus), owner_dir)
    (owner_dir / "1" / "model.py").write_text(model_py)
    return owner_dir


def write_config(config: mc.ModelConfig, model_dir: Path) -> Path:
    path = Path(model_dir) / "config.pbtxt"
    path.write_text(text_format.MessageToString(config))
    return path


def read_config(path: Path) -> mc.ModelConfig:
    return text_format.Parse(Path(path).read_text(), mc.ModelConfig())


def add_model_variant(
    repository: Path,
    source: str,
    name: str,
    parameters: dict[str, str] | None = None,
    model_py: str | None = None,
) -> mc.ModelConfig:
    """A second model entry over ``source``'s engine files (linked, not copied).

    It takes ``source``'s config with ``parameters`` laid over its parameters, and ``source``'s
    model.py unless ``model_py`` is given. Returns the config written, for callers that add to it.
    """
    source_version = Path(repository) / source / "1"
    target = Path(repository) / name / "1"
    target.mkdir(parents=True, exist_ok=True)
    for item in source_version.iterdir():
        link = target / item.name
        # files only: a __pycache__ left by Triton belongs to the source's model.py
        if item.is_file() and item.name != "model.py" and not link.exists():
            link.symlink_to(item.resolve())
    (target / "model.py").write_text(model_py or (source_version / "model.py").read_text())
    base = read_config(Path(repository) / source / "config.pbtxt")
    inherited = {k: v.string_value for k, v in base.parameters.items()}
    output = base.output[0]
    config = model_config(
        name,
        output.name,
        int(output.dims[0]),
        inherited | (parameters or {}),
        instances=base.instance_group[0] if base.instance_group else None,
        takes_pairs=any(i.name == PAIR_INPUT for i in base.input),
    )
    write_config(config, target.parent)
    return config


def add_split_variant(
    repository: Path,
    source: str,
    name: str,
    fronts: int,
    parameters: dict[str, str] | None = None,
    model_py: str = MODEL_PY,
) -> mc.ModelConfig:
    """A variant of ``source`` in the split layout: ``fronts`` front instances named ``name`` and
    its queue owner (``name``_owner) over ``source``'s engine files, on the CPU. ``model_py``:
    the entry point of both (bench repositories: one over the emulated engine)."""
    config = add_model_variant(
        repository,
        source,
        name,
        {**(parameters or {}), OWNER_PARAMETER: owner_name(name)},
        model_py=model_py,
    )
    del config.instance_group[:]
    config.instance_group.append(front_instances(fronts, on_gpu=False))
    write_config(config, Path(repository) / name)
    owner_dir = write_owner(repository, name, on_gpu=False, gpus=None, model_py=model_py)
    owner = read_config(owner_dir / "config.pbtxt")
    for key, value in (parameters or {}).items():
        owner.parameters[key].string_value = value
    write_config(owner, owner_dir)
    return config
