"""Copies the TensorRT type stubs into build/typings, fixed so that mypy can read them.

The `tensorrt-stubs` package installs `tensorrt/__init__.pyi` beside the real package's place
without a py.typed marker, and its generated stubs carry a few lines that are not valid Python
(a parameter named `in`, a required parameter after defaulted ones). mypy reads the copy through
`mypy_path`; the fixes touch only those lines.
"""

from __future__ import annotations

import re
import shutil
import sys
import sysconfig
from pathlib import Path

TARGET = Path(__file__).resolve().parents[1] / "build" / "typings"


def fix_line(line: str) -> str:
    if line.lstrip().startswith("def "):
        line = re.sub(r"\bin: ", "in_: ", line)
        line = re.sub(r"\bin\)", "in_)", line)
        if "= None" in line and re.search(r"= None, \w+: [\w\[\], ]+\)", line):
            line = line.replace("= None", "")  # required after optional: drop the defaults
    if line.strip() == "import tensorrt_libs as tensorrt_libs":
        return ""  # the native libraries have no stubs
    return line


def main() -> int:
    site = Path(sysconfig.get_paths()["purelib"])
    if not (site / "tensorrt" / "__init__.pyi").is_file():
        print("tensorrt-stubs is not installed in this environment", file=sys.stderr)
        return 1
    shutil.rmtree(TARGET, ignore_errors=True)
    for package in ("tensorrt", "tensorrt_bindings"):
        for stub in (site / package).glob("*.pyi"):
            out = TARGET / package / stub.name
            out.parent.mkdir(parents=True, exist_ok=True)
            lines = stub.read_text().splitlines(keepends=True)
            out.write_text("".join(fix_line(line) for line in lines))
    print(f"TensorRT stubs ready in {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
