"""The stub's extension modules: the system's lib-dynload goes first on sys.path only when an
extension module does not load from the path as it is."""

from __future__ import annotations

import sys

from python_backend.stub.stub_python import match_extension_modules


def test_nothing_changes_where_the_extension_module_loads(tmp_path, monkeypatch):
    (tmp_path / f"python{sys.version_info.major}.{sys.version_info.minor}" / "lib-dynload").mkdir(
        parents=True
    )
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = list(sys.path)
    assert match_extension_modules("_json", system_root=tmp_path) is None
    assert sys.path == before


def test_the_system_folder_goes_first_where_the_module_does_not_load(tmp_path, monkeypatch):
    system = tmp_path / f"python{sys.version_info.major}.{sys.version_info.minor}" / "lib-dynload"
    system.mkdir(parents=True)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert match_extension_modules("no_such_extension_module", system_root=tmp_path) == str(system)
    assert sys.path[0] == str(system)
    # once is enough; and no folder, nothing to put there
    assert match_extension_modules("no_such_extension_module", system_root=tmp_path) is None
    assert sys.path.count(str(system)) == 1
    assert match_extension_modules("no_such_extension_module", system_root=tmp_path / "x") is None
