"""Benchmark reports: their prose lives in ``bench/templates/*.md``; this fills them in and writes
a report into its section of docs/PERFORMANCE.md, between its own markers.

A template is ``string.Template`` text: ``$name`` or ``${name}`` stands for a value the report
computes (a table, a figure, the command that produced it). Prose stays in Markdown, where it
reads as what it is; the Python beside it computes only numbers and tables.
"""

from __future__ import annotations

from pathlib import Path
from string import Template
from typing import Any

from bench.paths import DOC

TEMPLATES = Path(__file__).resolve().parent / "templates"


def template_fields(name: str) -> set[str]:
    """The fields ``bench/templates/<name>.md`` asks for."""
    return set(Template(_template_text(name)).get_identifiers())


def render(name: str, **fields: object) -> str:
    """``bench/templates/<name>.md`` with its fields filled in. A field the template asks for and
    is not given, or one given that it never uses, is a mistake in the report: refused by name."""
    text = _template_text(name)
    template = Template(text)
    if not template.is_valid():
        raise ValueError(f"bench/templates/{name}.md: a `$` that names no field (write `$$`)")
    wanted, given = set(template.get_identifiers()), set(fields)
    if wanted != given:
        missing, unused = sorted(wanted - given), sorted(given - wanted)
        raise ValueError(
            f"bench/templates/{name}.md: fields missing {missing}, given but unused {unused}"
        )
    return template.substitute({k: str(v) for k, v in fields.items()}).rstrip("\n")


def _template_text(name: str) -> str:
    path = TEMPLATES / f"{name}.md"
    if not path.is_file():
        raise ValueError(f"no report template {path}")
    return path.read_text()


def write_section(section: str, begin: str, end: str, doc: Path = DOC) -> None:
    """Replaces what stands between ``begin`` and ``end``, or appends both with the section."""
    text = doc.read_text() if doc.is_file() else "# Performance\n"
    block = f"{begin}\n{section}\n{end}"
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.write_text(text)


def publish(section: str, begin: str, end: str, write: bool) -> int:
    """Prints a benchmark's report and, unless told not to (``--no-write``), writes it into
    docs/PERFORMANCE.md between its markers; the exit code of a bench that got this far."""
    print(section)
    if write:
        write_section(section, begin, end)
    return 0


def save_figure(fig: Any, path: Path) -> Path:
    """A matplotlib figure written as a PNG for docs/, and closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
