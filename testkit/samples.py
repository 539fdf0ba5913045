"""A build's text sample for the tests: a few dozen texts of the corpus in a texts file, so
that a test build checks its engine and takes its int8 ranges over that many rows instead of
the 512 a real build runs (the subject of a test is never the size of the sample)."""

from __future__ import annotations

from pathlib import Path

SAMPLE_TEXTS = 48


def sample_texts_file(folder: Path, count: int = SAMPLE_TEXTS) -> Path:
    """``count`` texts of the local corpus, one a line, written under ``folder``."""
    from builder.corpus import corpus_rows

    path = folder / "sample-texts.txt"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(t.replace("\n", " ") for t in corpus_rows(count)) + "\n")
    return path
