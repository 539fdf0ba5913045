# The server: NVIDIA's Triton image with the Python backend, plus this project's python_backend
# and the launcher that watches it.
ARG NGC_RELEASE=24.10
FROM nvcr.io/nvidia/tritonserver:${NGC_RELEASE}-py3
ARG TENSORRT_VERSION=10.5.0
# the TensorRT runtime for Python, the same version as the builder's (checked below); torch for
# device buffers, streams and CUDA graphs (2.5.1: CUDA 12.4 wheels, within the 24.10 driver range)
RUN pip install --no-cache-dir "tensorrt-cu12==${TENSORRT_VERSION}.*" torch==2.5.1 \
        tokenizers==0.23.3 \
    && python3 -c "import tensorrt, sys; v = tensorrt.__version__; \
sys.exit(0 if v.startswith('${TENSORRT_VERSION}') else f'TensorRT {v}, expected ${TENSORRT_VERSION}')"
WORKDIR /app
COPY pyproject.toml README.md ./
COPY python_backend python_backend
# the launcher and watchdog (tools/serve.py) the container runs; the standard library only
COPY tools/__init__.py tools/serve.py tools/front_door.py tools/triton_server.py tools/
RUN pip install --no-cache-dir --no-deps -e .
