#!/usr/bin/env bash
# Debian packages the project needs: installed when run as root, else a clear message.
#   libpython3.11  - the Triton Python-backend stub links libpython3.11.so.1.0
#   libb64-0d      - perf_analyzer (from the tritonclient wheel) links libb64
#   docker-compose - validates docker-compose.yml in the tests (no Docker engine needed)
#   nginx-light    - the front door: the only public entry to Triton (tools/front_door.py)
#   libnginx-mod-stream, libnginx-mod-http-js - its TCP layer (open connections per client)
#                    and its repeated-header check (njs)
set -euo pipefail
needed=()
ldconfig -p | grep -q 'libpython3\.11\.so\.1\.0' || needed+=(libpython3.11)
ldconfig -p | grep -q 'libb64\.so\.0d' || needed+=(libb64-0d)
command -v docker-compose >/dev/null || needed+=(docker-compose)
[ -x /usr/sbin/nginx ] || command -v nginx >/dev/null || needed+=(nginx-light)
modules=/usr/lib/nginx/modules
[ -f $modules/ngx_stream_module.so ] || needed+=(libnginx-mod-stream)
[ -f $modules/ngx_http_js_module.so ] || needed+=(libnginx-mod-http-js)
if [ ${#needed[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${needed[*]}; run: sudo apt-get install -y ${needed[*]}" >&2
  exit 1
fi
echo "installing Debian packages: ${needed[*]}"
# installing nginx must not start Debian's own nginx service on port 80: the front door runs
# nginx with a configuration of its own. policy-rc.d is Debian's switch for that.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
  trap 'rm -f "$policy"' EXIT
fi
apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${needed[@]}" >/dev/null
