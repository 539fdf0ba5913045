"""A precision per family that holds: decoders (whose activations overflow FP16) default to BF16 or
FP32 and encoders keep FP16 on GPU engines; pooling and L2 normalisation accumulate in FP32
whatever the model runs in, in the torch wrappers and in the exported graph; and a GPU build whose
engine answers non-finite or distant outputs against the model in FP32 is refused, naming the
precision to build with. The GPU itself is stood in for: these run on the CPU."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

import builder.build as build_module
import python_backend.engines as engines
from builder.build import Progress, Resolved, build, check_built_engine, resolve
from builder.engine_compare import compare_with_reference
from builder.families import decoder_architecture, load_model
from builder.precision import default_precision, fp32_layers, in_fp32_scope
from builder.spec import BuildError, BuildSpec
from python_backend.common.manifest import MANIFEST_FILE
from python_backend.engines.torch_engine import TorchEngine
from python_backend.engines.torch_modules import EmbeddingHead
from tests.builder.test_build import build_onnx

# -- defaults by architecture and engine ---------------------------------------------------------


def machine(monkeypatch, gpu: bool, bf16: bool = False, tensorrt: bool = False) -> None:
    """What resolve sees: a CUDA GPU (computing BF16 or not), TensorRT importable."""
    monkeypatch.setattr(build_module, "cuda_ready", lambda: gpu)
    monkeypatch.setattr(build_module, "bf16_ready", lambda: gpu and bf16)
    monkeypatch.setattr(build_module, "tensorrt_ready", lambda: gpu and tensorrt)
    monkeypatch.setattr(build_module, "require_tensorrt_major", lambda: None)


@pytest.mark.parametrize(
    ("engine", "gpu", "bf16", "decoder_precision", "encoder_precision"),
    [
        ("tensorrt", True, True, "fp32", "fp16"),  # TensorRT 10 here: FP16 or FP32 networks
        ("tensorrt", True, False, "fp32", "fp16"),
        ("torch", True, True, "bf16", "fp16"),  # an Ampere or later GPU
        ("torch", True, False, "fp32", "fp16"),  # a GPU without BF16 (T4, V100)
        ("torch", False, False, "fp32", "fp32"),  # the CPU
        ("onnxruntime", True, True, "fp32", "fp32"),
        ("auto", True, True, "fp32", "fp16"),  # TensorRT where it is present
    ],
)
def test_the_default_precision_follows_the_architecture_and_the_engine(
    monkeypatch, tmp_path, minilm_dir, tiny_decoder_dir, engine, gpu, bf16, decoder_precision,
    encoder_precision,
):  # fmt: skip
    machine(monkeypatch, gpu, bf16, tensorrt=True)
    for model_dir, want, decoder in (
        (tiny_decoder_dir, decoder_precision, True),
        (minilm_dir, encoder_precision, False),
    ):
        resolved = resolve(BuildSpec(model_dir=model_dir, repository=tmp_path, engine=engine))
        assert (resolved.precision, resolved.decoder) == (want, decoder), model_dir
        runs_on_gpu = resolved.engine_kind == "tensorrt" or (engine, gpu) == ("torch", True)
        assert resolved.on_gpu == runs_on_gpu


@pytest.mark.parametrize(
    ("engine", "precision", "bf16"),
    [
        ("tensorrt", "fp16", False),  # FP16 for a decoder only when asked for
        ("tensorrt", "fp32", False),
        ("torch", "fp16", True),
        ("torch", "fp32", True),
        ("torch", "bf16", True),
    ],
)
def test_an_explicit_precision_is_honoured(
    monkeypatch, tmp_path, minilm_dir, tiny_decoder_dir, engine, precision, bf16
):
    machine(monkeypatch, gpu=True, bf16=bf16, tensorrt=True)
    for model_dir in (tiny_decoder_dir, minilm_dir):
        spec = BuildSpec(model_dir=model_dir, repository=tmp_path, engine=engine)
        resolved = resolve(spec.with_(precision=precision))
        assert resolved.precision == precision and resolved.on_gpu


@pytest.mark.parametrize(
    ("engine", "gpu", "bf16", "precision", "message"),
    [
        ("tensorrt", True, True, "bf16", "bf16 is for the torch engine on a GPU with BF16"),
        ("tensorrt", True, True, "bf16", "TensorRT engines run fp32, fp16"),
        ("onnxruntime", False, False, "bf16", "ONNX Runtime engines run fp32"),
        ("onnxruntime", False, False, "fp16", "--precision fp16 is for TensorRT and torch"),
        ("torch", True, False, "bf16", "does not compute BF16 natively"),
        ("torch", False, False, "bf16", "--precision fp32 builds it for the CPU"),
    ],
)
def test_a_precision_the_engine_cannot_run_is_refused_naming_why(
    monkeypatch, tmp_path, minilm_dir, engine, gpu, bf16, precision, message
):
    machine(monkeypatch, gpu, bf16, tensorrt=True)
    spec = BuildSpec(model_dir=minilm_dir, repository=tmp_path, engine=engine, precision=precision)
    with pytest.raises(BuildError, match=message):
        resolve(spec)


@pytest.mark.parametrize(
    ("config", "modules", "decoder"),
    [
        ({"architectures": ["BertModel"], "model_type": "bert"}, None, False),
        ({"architectures": ["BertForSequenceClassification"], "model_type": "bert"}, None, False),
        ({"architectures": ["XLMRobertaModel"], "model_type": "xlm-roberta"}, None, False),
        ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, None, True),
        # a decoder under a classification head: a Qwen2 reranker, a Llama classifier
        ({"architectures": ["Qwen2ForSequenceClassification"], "model_type": "qwen2"}, None, True),
        ({"architectures": ["LlamaForSequenceClassification"], "model_type": "llama"}, None, True),
        # a decoder embedder (Qwen3-Embedding): the embedding family, a decoder all the same
        (
            {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"},
            [{"type": "Pooling", "path": "1_Pooling"}],
            True,
        ),
        ({"architectures": ["Qwen3Model"], "model_type": "qwen3"}, None, True),
    ],
)
def test_decoder_architectures_are_told_from_encoders(tmp_path, config, modules, decoder):
    (tmp_path / "config.json").write_text(json.dumps(config))
    if modules:
        (tmp_path / "modules.json").write_text(json.dumps(modules))
    assert decoder_architecture(tmp_path) == decoder


def test_the_default_table():
    table = {
        (engine, decoder, gpu, bf16): default_precision(engine, decoder, gpu, bf16)
        for engine in ("tensorrt", "torch", "onnxruntime")
        for decoder in (True, False)
        for gpu in (True, False)
        for bf16 in (True, False)
        if gpu or not bf16
    }
    assert {k: v for k, v in table.items() if v != "fp32"} == {
        ("tensorrt", False, True, True): "fp16",
        ("tensorrt", False, True, False): "fp16",
        ("tensorrt", False, False, False): "fp16",  # TensorRT always runs on a GPU
        ("torch", True, True, True): "bf16",
        ("torch", False, True, True): "fp16",
        ("torch", False, True, False): "fp16",
    }


# -- pooling accumulates in FP32 ----------------------------------------------------------------


class GivenHidden(nn.Module):
    """An encoder that answers the hidden states it was given, in its own dtype (as a real
    transformer cast with ``.to(dtype)`` answers in that dtype)."""

    def __init__(self, hidden: torch.Tensor) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))  # its dtype is the module's
        self.hidden = hidden

    def forward(self, input_ids, attention_mask):
        return SimpleNamespace(last_hidden_state=self.hidden.to(self.scale.dtype))


def fp32_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).double()
    return ((hidden.double() * m).sum(1) / m.sum(1)).float()


def test_mean_pooling_in_bf16_equals_fp32_pooling_of_the_same_hidden_states():
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 40, 16, generator=generator) * 4
    mask = torch.ones(3, 40, dtype=torch.long)
    mask[1, 25:] = 0
    mask[2, 3:] = 0
    head = EmbeddingHead(GivenHidden(hidden), "mean", normalize=False).to(torch.bfloat16).eval()
    with torch.no_grad():
        got = head(torch.zeros_like(mask), mask)
    assert got.dtype == torch.float32
    # the same hidden states, as the BF16 model holds them, pooled in FP32: equal to FP32's
    # rounding, where a BF16 sum would be off in the third significant digit
    want = fp32_mean(hidden.to(torch.bfloat16).float(), mask)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_a_mean_that_overflows_fp16_accumulation_stays_finite_and_right():
    # 200 tokens of 1000.0: their sum, 200000, is beyond FP16's 65504; their mean is 1000
    hidden = torch.full((2, 200, 8), 1000.0)
    hidden[1, :, 1::2] = -1000.0
    mask = torch.ones(2, 200, dtype=torch.long)
    head = EmbeddingHead(GivenHidden(hidden), "mean", normalize=False).to(torch.float16).eval()
    with torch.no_grad():
        got = head(torch.zeros_like(mask), mask)
        fp16_sum = (hidden.half() * mask.unsqueeze(-1).half()).sum(1)
    assert not torch.isfinite(fp16_sum).all()  # the overflow FP16 accumulation gives
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, fp32_mean(hidden, mask))


def test_the_norm_is_taken_in_fp32_where_it_overflows_fp16():
    # 64 entries of 10000: a norm of 80000, infinite in FP16, which would zero the vector
    hidden = torch.full((1, 1, 64), 10000.0)
    mask = torch.ones(1, 1, dtype=torch.long)
    head = EmbeddingHead(GivenHidden(hidden), "mean", normalize=True).to(torch.float16).eval()
    with torch.no_grad():
        got = head(torch.zeros_like(mask), mask)
    torch.testing.assert_close(got, torch.full((1, 64), 1 / 8.0))


def test_dense_layers_after_fp32_pooling_run_in_the_models_precision():
    hidden = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 5, dtype=torch.long)
    dense = [nn.Sequential(nn.Linear(16, 4), nn.Tanh())]
    fp32 = EmbeddingHead(GivenHidden(hidden), "mean", normalize=True, after_pooling=dense).eval()
    with torch.no_grad():
        want = fp32(torch.zeros_like(mask), mask)
        got = fp32.to(torch.bfloat16)(torch.zeros_like(mask), mask)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0.02, atol=0.02)


def exported_graph(tmp_path: Path, model_dir: Path):
    import onnx

    from builder.export_onnx import export_onnx

    loaded = load_model(model_dir)
    head = loaded.module
    assert isinstance(head, EmbeddingHead)
    head.normalize = True  # as builds before format 3 exported it, and torch_check builds it
    path = export_onnx(loaded, tmp_path / "model.onnx")
    return onnx.shape_inference.infer_shapes(onnx.load(str(path))).graph


def test_the_exported_graph_pools_and_normalises_in_fp32_scopes(tmp_path, minilm_dir):
    import onnx

    graph = exported_graph(tmp_path, minilm_dir)
    scoped = [n for n in graph.node if in_fp32_scope(n.name)]
    ops = {n.op_type for n in scoped}
    assert {"Cast", "Mul", "ReduceSum", "Div", "ReduceL2"} <= ops, ops
    # the hidden states are cast to FP32 where the pooling takes them
    first_cast = next(n for n in scoped if n.op_type == "Cast")
    (to,) = [a.i for a in first_cast.attribute if a.name == "to"]
    assert to == onnx.TensorProto.FLOAT and first_cast.name == "/pool/Cast"
    assert not any(in_fp32_scope(n.name) for n in graph.node if n.name.startswith("/encoder/"))


class FakeTensor(SimpleNamespace):
    pass


class FakeNetwork:
    """The exported graph as TensorRT's parser makes a network of it: a layer per node, named
    after it, its tensors typed as the graph types them; integer constants (a ReduceSum's axes)
    are the layer's parameters, not its inputs."""

    def __init__(self, graph) -> None:
        import onnx

        values = (*graph.input, *graph.value_info, *graph.output)
        types = {v.name: v.type.tensor_type.elem_type for v in values}
        types |= {t.name: t.data_type for t in graph.initializer}
        constants = {t.name for t in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant":
                types[node.output[0]] = node.attribute[0].t.data_type
                constants.add(node.output[0])
        float_type = onnx.TensorProto.FLOAT

        def tensor(name):
            return FakeTensor(dtype="FLOAT" if types.get(name) == float_type else "OTHER")

        def inputs(node):
            return [
                name
                for name in node.input
                if name and not (name in constants and types.get(name) != float_type)
            ]

        self.layers = [
            SimpleNamespace(
                name=node.name,
                op=node.op_type,
                num_inputs=len(inputs(node)),
                num_outputs=len(node.output),
                get_input=lambda j, node=node: tensor(inputs(node)[j]),
                get_output=lambda j, node=node: tensor(node.output[j]),
            )
            for node in graph.node
            if node.op_type != "Constant"  # weights, not layers
        ]
        self.num_layers = len(self.layers)

    def get_layer(self, i):
        return self.layers[i]


def test_tensorrt_constrains_the_float_pooling_layers_to_fp32(tmp_path, minilm_dir):
    network = FakeNetwork(exported_graph(tmp_path, minilm_dir))
    pinned = [(layer.name, layer.op) for layer in fp32_layers(network, "FLOAT")]
    ops = [op for _, op in pinned]
    # the sums, the divisions and the norm; not the integer mask's casts or the shape arithmetic
    assert {"Mul", "ReduceSum", "Div", "Clip", "ReduceL2"} <= set(ops), pinned
    assert "Shape" not in ops and "Unsqueeze" not in ops
    assert ("/pool/Cast", "Cast") in pinned  # the hidden states' FP16 -> FP32
    assert all(in_fp32_scope(name) for name, _ in pinned)


# -- the built engine against the model in FP32 -------------------------------------------------


class Overflowing:
    """A stand-in GPU engine: the real engine's outputs, with every other row overflowed (inf,
    then NaN, as an FP16 residual stream past 65504 gives)."""

    def __init__(self, engine) -> None:
        self.engine, self.layout = engine, engine.layout
        self.output_name, self.output_dim = engine.output_name, engine.output_dim
        self.rows = 0

    def run(self, ids, mask):
        out = self.engine.run(ids, mask).copy()
        for i in range(len(out)):
            if (self.rows + i) % 2:
                out[i, :2] = [np.inf, np.nan]
        self.rows += len(out)
        return out

    def close(self) -> None:
        self.engine.close()


@pytest.fixture(scope="module")
def texts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("texts") / "texts.txt"
    path.write_text(
        "\n".join(
            f"Sample text number {i}: " + " ".join(["the quick brown fox"] * (1 + i % 5))
            for i in range(20)
        )
    )
    return path


def decoder_onnx(tmp_path: Path, model_dir: Path, texts: Path):
    result = build_onnx(
        tmp_path,
        model_dir,
        "dec",
        buckets=(16, 32),
        max_length=48,
        last_bucket=32,
        texts_file=texts,
    )
    return result.manifest, result.version_dir


def test_an_engine_that_matches_the_model_passes_the_check(tmp_path, tiny_decoder_dir, texts_file):
    manifest, version = decoder_onnx(tmp_path, tiny_decoder_dir, texts_file)
    spec = BuildSpec(model_dir=tiny_decoder_dir, texts_file=texts_file)
    resolved = Resolved("onnxruntime", "fp16", True, tiny_decoder_dir, Path(), 1, True, False)
    lines: list[str] = []
    progress = Progress(1)
    progress.say = lines.append  # type: ignore[method-assign]
    check_built_engine(spec, resolved, load_model(tiny_decoder_dir), manifest, version, progress)
    assert any("0 of 16 rows non-finite" in line for line in lines), lines


def test_an_engine_with_non_finite_outputs_is_refused_naming_the_fix(
    tmp_path, tiny_decoder_dir, texts_file, monkeypatch
):
    manifest, version = decoder_onnx(tmp_path, tiny_decoder_dir, texts_file)
    real = engines.open_engine
    monkeypatch.setattr(engines, "open_engine", lambda m, v: Overflowing(real(m, v)))
    spec = BuildSpec(model_dir=tiny_decoder_dir, texts_file=texts_file)
    resolved = Resolved("tensorrt", "fp16", True, tiny_decoder_dir, Path(), 1, True, False)
    with pytest.raises(BuildError) as err:
        check_built_engine(
            spec, resolved, load_model(tiny_decoder_dir), manifest, version, Progress(1, True)
        )
    message = str(err.value)
    assert "wrong on 8 of 16 sample rows" in message and "8 of 16 rows non-finite" in message
    assert "build with --precision fp32" in message and "65504" in message
    assert not (version / "model.onnx").exists()  # the refused engine is not left to serve


def test_a_gpu_build_whose_engine_overflows_is_refused_and_writes_no_entry(
    tmp_path, tiny_decoder_dir, texts_file, monkeypatch
):
    """The whole build, as on a GPU with BF16, of a torch engine asked for in FP16: its engine
    (stood in for by the CPU engine of the same files, overflowing) is checked and refused."""
    machine(monkeypatch, gpu=True, bf16=True)

    def on_the_cpu(manifest, version_dir):
        cpu = replace(manifest, precision="fp32", device="cpu")
        return Overflowing(TorchEngine(cpu, version_dir))

    monkeypatch.setattr(engines, "open_engine", on_the_cpu)
    spec = BuildSpec(
        model_dir=tiny_decoder_dir, repository=tmp_path, name="dec", engine="torch",
        buckets=(16, 32), max_length=48, last_bucket=32, texts_file=texts_file,
        calibration_repeats=0, quiet=True,
    )  # fmt: skip
    with pytest.raises(BuildError, match=r"--precision bf16 .* or --precision fp32"):
        build(spec.with_(precision="fp16"))
    version = tmp_path / "dec" / "1"
    assert not (version / MANIFEST_FILE).exists()
    assert not any((version / name).exists() for name in ("torch_model.safetensors",))
    assert not (tmp_path / "dec" / "config.pbtxt").exists()
    # the default for this decoder on this GPU is BF16, and an engine that holds passes
    monkeypatch.setattr(
        engines,
        "open_engine",
        lambda m, v: TorchEngine(replace(m, precision="fp32", device="cpu"), v),
    )
    result = build(spec)
    assert result.manifest.precision == "bf16" and result.manifest.runs_on_gpu
    assert (version / MANIFEST_FILE).is_file()


def test_the_comparison_bounds_by_precision_and_output_shape():
    rng = np.random.default_rng(0)
    want = rng.normal(size=(4, 32)).astype(np.float32)
    assert compare_with_reference(want.copy(), want, "decoder", "fp16").ok
    noisy = want + 0.05 * rng.normal(size=want.shape).astype(np.float32)
    assert not compare_with_reference(noisy, want, "embedding", "fp16").ok  # cosine ~0.999
    assert compare_with_reference(noisy, want, "embedding", "bf16").ok
    flipped = want.copy()
    flipped[2] = -flipped[2]
    verdict = compare_with_reference(flipped, want, "embedding", "fp32")
    assert (verdict.bad_rows, verdict.non_finite_rows) == (1, 0)
    # a single score: by its difference, relative to scores above 1
    scores = np.array([[12.0], [0.5], [-30.0]], dtype=np.float32)
    assert compare_with_reference(scores * 1.01, scores, "reranker", "fp16").ok
    assert not compare_with_reference(scores * 1.05, scores, "reranker", "fp16").ok
    inf = scores.copy()
    inf[0] = np.inf
    assert compare_with_reference(inf, scores, "reranker", "bf16").non_finite_rows == 1
