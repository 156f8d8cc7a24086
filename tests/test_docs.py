"""The docs' links and section citations resolve, so a renamed section or a moved file cannot leave a dead one.

Two kinds of reference are checked, in every Markdown file of the repository (README, ARCHITECTURE,
BENCHMARKS, RESULTS, docs/**: the user guide in docs/guide/ and the results in docs/results/) and, for
citations, in the code too:

- a relative Markdown link or image (`[text](path#anchor)`, `<img src="path">`) names a file or folder
  that exists, and its `#anchor`, if any, is a heading of that file (GitHub's slugs);
- a citation by title in prose or a docstring (the file name, a comma, then the section's title in double
  quotes, as `BENCHMARKS.md, "Pre-training step"`) names the start of a heading of that file.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SKIPPED_DIRS = {"node_modules", "build", "dist", "runs"}  # and every hidden folder (.git, .venv, caches)

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)|<img\s[^>]*src=\"([^\"]+)\"")
CITATION = re.compile(r"\b(BENCHMARKS|RESULTS|ARCHITECTURE)\.md,\s+\"([^\"]+)\"")
FENCE = re.compile(r"^(```|~~~)")


def _files(pattern: str) -> list[Path]:
    return sorted(p for p in REPO.rglob(pattern) if not any(
        part in SKIPPED_DIRS or part.startswith(".") for part in p.relative_to(REPO).parts[:-1]))


def _outside_code(text: str) -> str:
    """The Markdown text without its fenced code blocks (their brackets are code, not links)."""
    kept, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return "\n".join(kept)


def headings(path: Path) -> list[str]:
    """The titles of a Markdown file's headings, outside code blocks."""
    return [line.lstrip("#").strip() for line in _outside_code(path.read_text(encoding="utf-8")).splitlines()
            if re.match(r"#{1,6}\s", line)]


def slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    title = re.sub(r"[`*_]|<[^>]+>", "", title.lower())
    return re.sub(r"[^\w\- ]", "", title).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for title in headings(path):
        base = slug(title)
        out.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return out


def test_slug_follows_github():
    assert slug("The paper's ablations in miniature (§5)") == "the-papers-ablations-in-miniature-5"
    assert slug("Fine-tuning against the peer's `Trainer`: best settings") == (
        "fine-tuning-against-the-peers-trainer-best-settings")


def test_the_user_guide_is_checked():
    """The guide's pages are among the files checked, the README and the guide's index with them."""
    checked = {p.relative_to(REPO).as_posix() for p in _files("*.md")}
    guide = {p.relative_to(REPO).as_posix() for p in (REPO / "docs" / "guide").glob("*.md")}
    assert "docs/guide/README.md" in guide and {"README.md"} | guide <= checked


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for doc in _files("*.md"):
        for match in LINK.finditer(_outside_code(doc.read_text(encoding="utf-8"))):
            target = match.group(1) or match.group(2)
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            resolved = (doc.parent / path).resolve() if path else doc
            where = f"{doc.relative_to(REPO)}: ({target})"
            if not resolved.exists():
                broken.append(f"{where}: no such file")
            elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
                broken.append(f"{where}: no heading with that anchor")
    assert broken == [], "broken links:\n" + "\n".join(broken)


def test_every_section_cited_by_title_exists():
    """Citations may wrap across lines and comment markers; the quoted title must start a heading."""
    titles = {name: headings(REPO / f"{name}.md") for name in ("BENCHMARKS", "RESULTS", "ARCHITECTURE")}
    stale = []
    for source in _files("*.md") + _files("*.py"):
        if source == Path(__file__).resolve():
            continue
        text = re.sub(r"\s*\n\s*(#\s*)?", " ", source.read_text(encoding="utf-8"))
        for name, title in CITATION.findall(text):
            if not any(heading.startswith(title) for heading in titles[name]):
                stale.append(f"{source.relative_to(REPO)}: {name}.md, \"{title}\"")
    assert stale == [], "citations of sections that do not exist:\n" + "\n".join(stale)
