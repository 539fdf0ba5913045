#!/usr/bin/env bash
# Debian packages the project needs: installed when run as root, else a clear message.
#   libpython3.11  - the Triton Python-backend stub links libpython3.11.so.1.0
#   libb64-0d      - perf_analyzer (from the tritonclient wheel) links libb64
#   docker-compose - validates docker-compose.yml in the tests (no Docker engine needed)
set -euo pipefail
needed=()
ldconfig -p | grep -q 'libpython3\.11\.so\.1\.0' || needed+=(libpython3.11)
ldconfig -p | grep -q 'libb64\.so\.0d' || needed+=(libb64-0d)
command -v docker-compose >/dev/null || needed+=(docker-compose)
if [ ${#needed[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${needed[*]}; run: sudo apt-get install -y ${needed[*]}" >&2
  exit 1
fi
echo "installing Debian packages: ${needed[*]}"
apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${needed[@]}" >/dev/null
