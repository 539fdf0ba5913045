#!/bin/sh
# Runs before the nginx image renders its templates: an API key is written into the
# configuration as a literal, so it may hold only characters that need no quoting there.
# tools/front_door.py applies the same rule for `make serve`.
set -eu
key="${API_KEY:-}"
if [ -n "$key" ] && ! printf '%s' "$key" | grep -Eq '^[A-Za-z0-9._~+/=-]{16,256}$'; then
  echo "API_KEY must be 16 to 256 characters of A-Z a-z 0-9 . _ ~ + / = - (for example: openssl rand -hex 32)" >&2
  exit 1
fi
