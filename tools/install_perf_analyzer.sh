#!/usr/bin/env bash
# perf_analyzer for this machine: the newest perf-analyzer wheel needs glibc 2.38 (Debian 12 has
# 2.36), but the tritonclient 2.50.0 wheel carries a perf_analyzer binary that runs here. Only
# the binary is taken (that wheel pins protobuf<5, which the project's onnx cannot use). It links
# libcudart (the nvidia-cuda-runtime-cu12 wheel, in the venv) and libb64 (Debian's libb64-0d).
# Usage: tools/install_perf_analyzer.sh VENV_PYTHON TARGET_DIR
set -euo pipefail
python="$1"
target="$2"
if [ -x "$target/perf_analyzer" ]; then
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$python" -m pip download --quiet --no-deps tritonclient==2.50.0 -d "$tmp"
mkdir -p "$target"
"$python" - "$tmp" "$target" <<'PY'
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "tritonclient-2.50.0-*.whl"))[0]
with zipfile.ZipFile(wheel) as zf:
    data = zf.read("tritonclient-2.50.0.data/data/bin/perf_analyzer")
path = os.path.join(sys.argv[2], "perf_analyzer")
with open(path, "wb") as f:
    f.write(data)
os.chmod(path, 0o755)
PY
echo "perf_analyzer installed in $target"
