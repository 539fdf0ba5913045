#!/bin/sh
# Runs before the nginx image renders its templates: writes the keys map the front door's
# configuration includes (FRONT_DOOR_KEYS) from API_KEY (one key for every client) and API_KEYS
# (a file of `name key` or `name key class` lines, each key's clients named by it, a class the
# highest they may ask for: the map's value is then `name/class`). Keys go into the configuration as
# literals, so they may hold only characters that need no quoting there. tools/front_door.py
# (keys_map, read_api_keys) writes the same map for `make serve`; a test compares the two.
set -eu
out="${FRONT_DOOR_KEYS:?FRONT_DOOR_KEYS must name the keys map to write}"
key_rule='^[A-Za-z0-9._~+/=-]{16,256}$'
name_rule='^[A-Za-z0-9._-]{1,64}$'
rule="16 to 256 characters of A-Z a-z 0-9 . _ ~ + / = -"
tmp="$out.tmp"
: > "$tmp"
entries=0
key="${API_KEY:-}"
if [ -n "$key" ]; then
  if ! printf '%s' "$key" | grep -Eq "$key_rule"; then
    echo "API_KEY must be $rule (for example: openssl rand -hex 32)" >&2
    exit 1
  fi
  printf '"~^(?i:bearer) \\Q%s\\E$" "-";\n' "$key" >> "$tmp"
  entries=1
fi
if [ -n "${API_KEYS:-}" ]; then
  if [ ! -f "$API_KEYS" ]; then
    echo "API_KEYS names $API_KEYS, which is not a file" >&2
    exit 1
  fi
  number=0
  seen=" ${key:-} "
  names=" "
  cr=$(printf '\r')
  while IFS= read -r line || [ -n "$line" ]; do
    number=$((number + 1))
    line=${line%"$cr"}  # a CRLF line reads as its LF one
    set -f
    # shellcheck disable=SC2086 # split on spaces and tabs, as the Python side does
    IFS="$(printf ' \t')"
    set -- $line
    unset IFS
    set +f
    if [ $# -eq 0 ] || [ "${1#\#}" != "$1" ]; then
      continue
    fi
    where="API_KEYS ($API_KEYS) line $number"
    if [ $# -ne 2 ] && [ $# -ne 3 ]; then
      echo "$where: write \`name key\` or \`name key class\`" >&2
      exit 1
    fi
    if ! printf '%s' "$1" | grep -Eq "$name_rule" || [ "$1" = "-" ] || [ "$1" = "!" ]; then
      echo "$where: a name is 1 to 64 characters of A-Z a-z 0-9 . _ -" >&2
      exit 1
    fi
    if ! printf '%s' "$2" | grep -Eq "$key_rule"; then
      echo "$where: a key is $rule" >&2
      exit 1
    fi
    value="$1"
    if [ $# -eq 3 ]; then
      if ! printf '%s' "$3" | grep -Eq '^[1-9][0-9]{0,3}$'; then
        echo "$where: a class is a whole number from 1 to 9999" >&2
        exit 1
      fi
      value="$1/$3"
    fi
    case "$seen" in *" $2 "*) echo "$where: key given twice" >&2; exit 1 ;; esac
    case "$names" in *" $1 "*) echo "$where: name given twice" >&2; exit 1 ;; esac
    seen="$seen$2 "
    names="$names$1 "
    printf '"~^(?i:bearer) \\Q%s\\E$" "%s";\n' "$2" "$value" >> "$tmp"
    entries=1
  done < "$API_KEYS"
fi
if [ "$entries" -eq 1 ]; then
  echo 'default "!";' >> "$tmp"
else
  echo 'default "";' >> "$tmp"
fi
chmod 600 "$tmp"
mv "$tmp" "$out"
