"""The docs' tables, written from the result files they report, so that a figure cannot drift from its JSON.

A document marks each generated table with its benchmark's name; everything outside the markers (the
prose, the setup, the reading of the figures) stays hand-written:

    <!-- render: tokenizer -->
    (a caption line: machine, commit, date, the command, the JSON; then the table)
    <!-- /render -->

`render` rewrites the text between the markers from the benchmark's current result (`Benchmark.result`,
under docs/results/) through its `table` function; `render --check` changes nothing and names every
section whose checked-in text differs. NAME may also be a benchmark's view (`harness.View`: a second table
of its result) or a report (`report.Report`): a table from result files already written, with nothing to
time (RESULTS.md's quality tables), rendered the same way, or a headline table (`headlines.HeadlineTable`:
RESULTS.md's, BENCHMARKS.md's and README.md's rows of headline figures, each read from its section's files).
The documents searched are the Markdown files at the root and under docs/.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from . import headlines
from . import report as reports
from .harness import ROOT, Benchmark, View, join, joined, load_result, result_path, source_paths
from .headlines import HeadlineTable
from .report import Report

# the tuple: a view and the benchmark it renders
Renderable = Benchmark | Report | HeadlineTable | tuple[Benchmark, View]

# A marker is a line of its own: the same text quoted inside a line of prose is not one.
SECTION = re.compile(r"^(<!-- render: (?P<name>[\w-]+) -->\n)(?P<body>.*?)^(<!-- /render -->)$", re.S | re.M)
OPENING = re.compile(r"^<!-- render: ([\w-]+) -->$", re.M)


def documents(root: Path = ROOT) -> list[Path]:
    """The Markdown files that may hold rendered sections: those at the root and under docs/."""
    return sorted(root.glob("*.md")) + sorted((root / "docs").rglob("*.md"))


def uncommitted(version: Mapping[str, Any]) -> str:
    """What a dirty run's caption says: the files that differed from its commit, up to three (a result written
    before the harness recorded them: "uncommitted changes")."""
    changed = version.get("changed")
    if not changed:
        return "uncommitted changes"
    shown = ", ".join(f"`{name}`" for name in changed[:3])
    return f"uncommitted changes to {shown}" + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")


def caption(result: Mapping[str, Any], json_links: Sequence[str]) -> str:
    """The one line that states where and when a table's figures were measured and how to measure them again."""
    where = result["machine"]
    parts = [f"{where['cpu']}, {where['cores']} cores"]
    if where.get("memory_gib") is not None:
        parts[0] += f", {where['memory_gib']:g} GiB"
    if where.get("gpu"):
        parts[0] += f", {where['gpu']}"
    version = result["commit"]
    parts.append(f"commit {version['hash']}" + (f" ({uncommitted(version)})" if version.get("dirty") else ""))
    parts.append(result["date"][:10])
    parts.append(f"`{result['command']}`")
    if result.get("note"):
        parts.append(result["note"])
    parts.append("JSON: " + ", ".join(f"[`{Path(link).name}`]({link})" for link in json_links))
    return "Measured on " + " · ".join(parts) + "."


def section(benchmark: Renderable, document: Path, root: Path = ROOT) -> str:
    """What belongs between a benchmark's (or a view's) markers in `document`: the caption, a blank line,
    the table (a report's section: `report.section`; a headline table's: `headlines.section`). A view that
    joins other benchmarks: each result's caption, a paragraph each, then the one table of them all."""
    if isinstance(benchmark, Report):
        return reports.section(benchmark, document, root)
    if isinstance(benchmark, HeadlineTable):
        return headlines.section(benchmark, document, root)
    owners, table = (joined(*benchmark), benchmark[1].table) if isinstance(benchmark, tuple) else (
        [benchmark], benchmark.table)
    results, captions = [], []
    for owner in owners:
        result = load_result(owner, root)
        if result.get("quick"):
            raise ValueError(f"{result_path(owner, root)} is a --quick run: toy sizes do not back a figure")
        links = [os.path.relpath(path, document.parent) for path in source_paths(owner, root)]
        results.append(result)
        captions.append(caption(result, links))
    return "\n\n".join(captions) + f"\n\n{table(join(results)).rstrip()}\n"


def render_text(text: str, document: Path, benchmarks: Mapping[str, Renderable], root: Path = ROOT) -> str:
    """`text` with every marked section rewritten; raises on a marker without its end or an unknown name."""
    opened = OPENING.findall(text)
    closed = [match["name"] for match in SECTION.finditer(text)]
    if opened != closed:
        raise ValueError(f"{document}: a `<!-- render: NAME -->` without its `<!-- /render -->`")
    unknown = sorted(set(closed) - set(benchmarks))
    if unknown:
        raise ValueError(f"{document}: no benchmark or report named {unknown} (python -m benchmarks list)")

    def replace(match: re.Match[str]) -> str:
        return match[1] + section(benchmarks[match["name"]], document, root) + match[4]

    return SECTION.sub(replace, text)


def render(benchmarks: Mapping[str, Renderable], root: Path = ROOT, check: bool = False) -> list[str]:
    """Rewrite every marked section under `root` (with `check`: only compare). Returns the sections that
    differed, as `DOCUMENT: NAME`, documents relative to `root`."""
    stale: list[str] = []
    for document in documents(root):
        text = document.read_text(encoding="utf-8")
        if not OPENING.search(text):
            continue
        rendered = render_text(text, document, benchmarks, root)
        if rendered == text:
            continue
        old = {match["name"]: match["body"] for match in SECTION.finditer(text)}
        new = {match["name"]: match["body"] for match in SECTION.finditer(rendered)}
        name = document.relative_to(root).as_posix()
        stale += [f"{name}: {key}" for key in new if old.get(key) != new[key]]
        if not check:
            document.write_text(rendered, encoding="utf-8")
    return stale
