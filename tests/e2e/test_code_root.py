"""A server started with another checkout's code (``TritonServer(code_root=...)``) runs that
checkout's python_backend in its models' stubs, not this one's: what every bench comparison
against an earlier commit (``--baseline-tree``) rests on. The stub ignores PYTHONPATH, and this
checkout is installed in the virtual environment, so nothing else would tell them apart."""

from __future__ import annotations

import shutil

from tools.triton_server import ROOT, TritonServer


def test_a_server_on_another_checkout_imports_that_checkouts_python_backend(repository, tmp_path):
    other = tmp_path / "other-checkout"
    shutil.copytree(ROOT / "python_backend", other / "python_backend")
    imported = tmp_path / "imported-from"
    init = other / "python_backend" / "__init__.py"
    init.write_text(
        init.read_text()
        + f"\nfrom pathlib import Path as _Path\n_Path({str(imported)!r}).write_text(__file__)\n"
    )
    server = TritonServer.loading_only(
        repository, ("minilm",), tmp_path / "triton.log", code_root=other
    )
    server.start()
    try:
        server.wait_ready(180)
    finally:
        server.stop()
    assert imported.read_text() == str(other / "python_backend" / "__init__.py")
