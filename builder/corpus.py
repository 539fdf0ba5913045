"""Real English text that every Debian machine carries, cut into rows shaped like real traffic.

The licence texts under /usr/share/common-licenses are cut into rows: 60% sentence slices (one to
three sentences), 30% paragraphs, 10% runs of several paragraphs. Token lengths come out with many
short rows and a long tail up to (and past) a 256-token limit, like search or chat traffic.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

CORPUS_DIRS = (Path("/usr/share/common-licenses"),)
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")


def corpus_paragraphs(dirs: tuple[Path, ...] = CORPUS_DIRS) -> list[str]:
    """Paragraphs of every readable text file under ``dirs``, whitespace collapsed, in file order."""
    paragraphs: list[str] = []
    for folder in dirs:
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if not path.is_file():
                continue
            try:
                text = path.read_text(encoding="utf-8", errors="strict")
            except (OSError, UnicodeDecodeError):
                continue
            for block in re.split(r"\n\s*\n", text):
                para = " ".join(block.split())
                if len(para) >= 8:
                    paragraphs.append(para)
    return paragraphs


def corpus_rows(num_rows: int, seed: int = 0, dirs: tuple[Path, ...] = CORPUS_DIRS) -> list[str]:
    """``num_rows`` text rows cut from the corpus (deterministic for a seed)."""
    paragraphs = corpus_paragraphs(dirs)
    if not paragraphs:
        raise FileNotFoundError(f"no text found under {[str(d) for d in dirs]}")
    rng = random.Random(seed)
    rows = []
    for _ in range(num_rows):
        kind = rng.random()
        i = rng.randrange(len(paragraphs))
        if kind < 0.6:
            sentences = [s for s in _SENTENCE_END.split(paragraphs[i]) if s]
            start = rng.randrange(len(sentences))
            rows.append(" ".join(sentences[start : start + rng.randint(1, 3)]))
        elif kind < 0.9:
            rows.append(paragraphs[i])
        else:
            rows.append(" ".join(paragraphs[i : i + rng.randint(2, 5)]))
    return rows
