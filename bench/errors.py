"""The benchmarks' one error for a bad option or a missing prerequisite: library code raises it,
and only a command line's ``main`` turns it into an exit (``reports_errors``)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any


class BenchError(Exception):
    """A bad option, a missing prerequisite or a build that failed; the message says which."""


def reports_errors(main: Callable[..., Any]) -> Callable[..., Any]:
    """A command line's ``main``: a BenchError becomes its message on stderr and exit code 2."""

    @functools.wraps(main)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return main(*args, **kwargs)
        except BenchError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2

    return run
