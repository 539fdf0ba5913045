"""Writes a benchmark's section of docs/PERFORMANCE.md, between its own markers."""

from __future__ import annotations

from pathlib import Path

from bench.paths import DOC


def write_section(section: str, begin: str, end: str, doc: Path = DOC) -> None:
    """Replaces what stands between ``begin`` and ``end``, or appends both with the section."""
    text = doc.read_text() if doc.is_file() else "# Performance\n"
    block = f"{begin}\n{section}\n{end}"
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.write_text(text)
