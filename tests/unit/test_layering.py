"""The layering the code relies on: only tests import from tests/; shared support is testkit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMPORTS_TESTS = re.compile(r"^\s*(from tests(\.|\s)|import tests\b)", re.M)


@pytest.mark.parametrize("package", ["python_backend", "builder", "bench", "tools", "testkit"])
def test_nothing_outside_tests_imports_from_tests(package):
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / package).rglob("*.py")
        if IMPORTS_TESTS.search(path.read_text())
    ]
    assert not offenders


@pytest.mark.parametrize("package", ["python_backend", "builder"])
def test_the_serving_code_and_the_builder_never_import_test_support(package):
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / package).rglob("*.py")
        if re.search(r"^\s*(from|import) testkit\b", path.read_text(), re.M)
    ]
    assert not offenders


def test_bench_scripts_run_as_modules_without_patching_sys_path():
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "bench").glob("*.py")
        if "sys.path" in path.read_text()
    ]
    assert not offenders
