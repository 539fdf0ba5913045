"""The Python-backend stub's extension modules, matched to the libpython it runs.

The stub of the ``nvidia-pytriton`` wheel links the system's libpython (Debian's 3.11.2 on the
CPU machines) but takes its standard library from the virtual environment's Python, which may be
another build of the same minor version (pyenv's 3.11.7). That build's C extension modules can
need symbols the system library lacks: its ``_ssl`` does, so ``import ssl``, and with it
transformers (the torch engine rebuilds its module with it), fails inside the stub. The stub
ignores ``PYTHONPATH``, so the model's own code puts the system's ``lib-dynload``, built for the
running libpython, ahead of the other build's, and only when that import fails. Nothing changes
where the two are one build (the project image, a venv of the system Python).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path


def match_extension_modules(
    probe: str = "_ssl", system_root: Path = Path("/usr/lib")
) -> str | None:
    """When the extension module ``probe`` does not load, puts the system's ``lib-dynload`` first
    on ``sys.path``; returns the folder put there, or None (nothing to do, or nowhere to look)."""
    try:
        importlib.import_module(probe)
        return None
    except ImportError:
        pass
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = system_root / version / "lib-dynload"
    if not system.is_dir() or str(system) in sys.path:
        return None
    sys.path.insert(0, str(system))
    return str(system)
