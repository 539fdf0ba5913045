"""The layering the code relies on: only tests import from tests/; shared support is testkit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMPORTS_TESTS = re.compile(r"^\s*(from tests(\.|\s)|import tests\b)", re.M)


@pytest.mark.parametrize(
    "package", ["python_backend", "builder", "bench", "tools", "testkit", "body_check"]
)
def test_nothing_outside_tests_imports_from_tests(package):
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / package).rglob("*.py")
        if IMPORTS_TESTS.search(path.read_text())
    ]
    assert not offenders


@pytest.mark.parametrize("package", ["python_backend", "builder", "body_check"])
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


def module_imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth of its code (inside functions too), with
    relative imports resolved: read with ``ast``, so strings that hold code never count."""
    import ast

    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


PACKAGES = ("python_backend", "builder", "body_check", "openai_api", "tools", "bench", "testkit")


def import_graph(packages: tuple[str, ...] = ("bench",)) -> dict[str, set[str]]:
    modules = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts): p
        for package in packages
        for p in (ROOT / package).rglob("*.py")
        if p.name != "__init__.py"
    }
    return {name: module_imports(path) & set(modules) for name, path in modules.items()}


def bench_graph() -> dict[str, set[str]]:
    return import_graph(("bench",))


def test_the_code_imports_form_no_cycle():
    """Across every package, type-only and function-level imports included."""
    graph = import_graph(PACKAGES)
    text = "".join(path.read_text() for path in (ROOT / "bench").rglob("*.py"))
    assert "importlib" not in text, "imports are read from the code: no importlib"
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = [*path[path.index(target) :], target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


# below the command lines: the harness (what the benchmarks share) and the simulator's package
HARNESS = (
    "bench.paths",
    "bench.errors",
    "bench.harness",
    "bench.cost_tables",
    "bench.emulated_engine",
    "bench.sim.policies",
    "bench.sim.run",
    "bench.sim.validation",
)


def test_the_harness_imports_no_command_line_module():
    import ast

    graph = bench_graph()
    command_lines = {
        name
        for name in graph
        if any(
            isinstance(node, ast.FunctionDef) and node.name == "main"
            for node in ast.parse((ROOT / (name.replace(".", "/") + ".py")).read_text()).body
        )
    }
    assert "bench.simulate" in command_lines  # the rule sees what it should
    for module in HARNESS:
        reached, frontier = set(), [module]
        while frontier:
            for target in graph[frontier.pop()] - reached:
                reached.add(target)
                frontier.append(target)
        assert not reached & command_lines, (module, sorted(reached & command_lines))
        assert module not in command_lines


def test_no_private_name_is_imported_across_modules():
    import ast

    offenders = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
                    PACKAGES
                ):
                    offenders += [
                        f"{path.relative_to(ROOT)}: {node.module}.{a.name}"
                        for a in node.names
                        if a.name.startswith("_")
                    ]
    assert not offenders


# the parts of python_backend, and the parts each may import besides its own (docs/ARCHITECTURE.md,
# "Code layout"): the Triton glue at the top wires every part; nothing imports the glue
PARTS: dict[str, set[str]] = {
    "common": set(),
    "engines": {"common"},
    "scheduling": {"common", "engines"},
    "transport": {"common", "scheduling"},
    "stub": {"common", "scheduling"},
    "glue": {"common", "engines", "scheduling", "transport", "stub"},
}


def part_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else "glue"  # python_backend.<part>.<module>, or the top


def test_each_part_of_the_served_code_imports_only_the_parts_below_it():
    graph = import_graph(("python_backend",))
    assert {part_of(m) for m in graph} == set(PARTS), "a part is missing from the rule"
    crossings = {
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if part_of(target) != part_of(module) and part_of(target) not in PARTS[part_of(module)]
    }
    assert not crossings, sorted(crossings)


@pytest.mark.parametrize("package", ["builder", "openai_api", "body_check", "tools"])
def test_the_other_packages_never_import_the_triton_glue(package):
    """The glue imports triton_python_backend_utils, which exists only in Triton's stub."""
    graph = import_graph((package, "python_backend"))
    offenders = {
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith(f"{package}.")
        for target in targets
        if target.startswith("python_backend.")
        and part_of(target) == "glue"
        and target != "python_backend.settings"
    }
    assert not offenders, sorted(offenders)
