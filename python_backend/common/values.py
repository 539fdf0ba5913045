"""One parser for each kind of setting value: text in, a typed value out, or a ``BadValue`` that
names the setting. The model's settings (``settings``), the launcher's and the front door's
(``tools``) all parse with these. Standard library only: the launcher imports it too.

A parser is called as ``parse(raw, name)``; ``raw`` is the text as given (stripped), and the empty
text means "not set" where a parser allows it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Parser = Callable[[str, str], Any]


class BadValue(ValueError):
    """A setting's text that its parser refuses; the message names the setting."""


def parse_bool(raw: str, name: str) -> bool:
    lowered = raw.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise BadValue(f"{name} must be true or false, got {raw!r}")


def _at_least(
    convert: Callable[[str], Any],
    what: str,
    minimum: float,
    empty: Any,
    maximum: float = float("inf"),
) -> Parser:
    def parse(raw: str, name: str) -> Any:
        if raw == "":
            return empty
        try:
            value = convert(raw)
        except ValueError:
            raise BadValue(f"{name} must be {what}, got {raw!r}") from None
        if not value >= minimum:  # NaN too
            raise BadValue(f"{name} must be >= {minimum:g}, got {value:g}")
        if value > maximum:
            raise BadValue(f"{name} must be <= {maximum:g}, got {value:g}")
        return value

    return parse


def int_at_least(minimum: int, empty: int | None = None) -> Parser:
    """An integer >= ``minimum``; the empty text gives ``empty`` (None: not set)."""
    return _at_least(int, "an integer", minimum, empty)


def number_at_least(minimum: float, empty: float | None = None) -> Parser:
    """A number >= ``minimum``; the empty text gives ``empty`` (None: not set)."""
    return _at_least(float, "a number", minimum, empty)


def number_between(minimum: float, maximum: float) -> Parser:
    """A number in [``minimum``, ``maximum``]."""
    return _at_least(float, "a number", minimum, None, maximum)


def one_of(choices: tuple[str, ...]) -> Parser:
    def parse(raw: str, name: str) -> str:
        if raw not in choices:
            raise BadValue(f"{name} must be {' or '.join(choices)}, got {raw!r}")
        return raw

    return parse


def matching(pattern: str, description: str) -> Parser:
    """Text that matches ``pattern`` whole (the empty text is allowed only if it matches)."""
    compiled = re.compile(pattern)

    def parse(raw: str, name: str) -> str:
        if not compiled.fullmatch(raw):
            raise BadValue(f"{name} must be {description}")
        return raw

    return parse


def text(raw: str, name: str) -> str:
    return raw


# nginx's size syntax (client_max_body_size and the like): bytes, or kilobytes / megabytes
SIZE_PATTERN = re.compile(r"([0-9]+)([kKmM]?)")
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20}


def nginx_size(raw: str, name: str) -> int:
    """An nginx size (``8m``, ``512k``, ``1048576``) in bytes."""
    match = SIZE_PATTERN.fullmatch(raw.strip())
    if match is None:
        raise BadValue(f"{name} must be like 8m, 512k or 1048576")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
