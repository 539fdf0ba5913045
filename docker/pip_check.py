"""`pip check` for an environment where some packages are installed without their dependencies
on purpose (`--no-deps`): the offline model package, which declares sentence-transformers but
needs nothing; TensorRT's type stubs, which declare TensorRT itself. Every other broken
requirement is printed and fails (exit 1).

    python3 docker/pip_check.py [PACKAGE | REQUIREMENTS_FILE] ...

Each argument names packages exempt from the check: a name (a pin like name==1.0 is read as its
name), or a requirements file whose pins are all exempt.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def exempt_names(arguments: list[str]) -> set[str]:
    names = set()
    for argument in arguments:
        path = Path(argument)
        lines = path.read_text().splitlines() if path.is_file() else [argument]
        for line in lines:
            match = NAME.match(line.split("#", 1)[0])
            if match and not line.lstrip().startswith("-"):
                names.add(canonical(match.group(1)))
    return names


def broken(report: str, exempt: set[str]) -> list[str]:
    """``pip check``'s lines about packages not exempt (each line starts with the package)."""
    problems = []
    for line in report.splitlines():
        match = NAME.match(line)
        if not line.strip() or line.startswith("No broken requirements"):
            continue
        if match is None or canonical(match.group(1)) not in exempt:
            problems.append(line)
    return problems


def main(argv: list[str]) -> int:
    exempt = exempt_names(argv)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False
    )
    problems = broken(result.stdout + result.stderr, exempt)
    for line in problems:
        print(line, file=sys.stderr)
    if result.returncode not in (0, 1):  # pip itself failed: nothing was checked
        print(f"pip check exited {result.returncode}", file=sys.stderr)
        return 1
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
