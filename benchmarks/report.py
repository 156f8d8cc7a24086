"""Reports: the docs' tables rendered from result files that are already written, with nothing to time.

A benchmark (`harness.Benchmark`) both runs and renders; a report only renders. RESULTS.md's quality tables
are reports: their figures are dev scores of fine-tuning runs that take hours (or a GPU), written by the
scripts that made them, so `render` reads those files as they are and `run` has nothing to do. A report
declares its result files (`sources`) and a `table` function over their parsed JSON; `render` writes the
table between the document's `<!-- render: NAME -->` markers exactly as it does a benchmark's.

Those runs recorded no commit, date or machine, so a report's provenance lives in one file,
docs/results/provenance.json, keyed by the report's name (the same role as the `provenance` block a
pre-harness benchmark file carries for its `legacy` adaptor):

    {"NAME": {"machine": {"cpu": ..., "cores": ..., "memory_gib": ..., "gpu": ...},   # null: not recorded
              "runs": [{"what": "MRPC", "commit": "69dfc6f", "date": "2026-12-02"}, ...],
              "commands": ["the lines that reproduce the files", ...],
              "source": "where these facts were taken from"}}

The caption states the machine, each run's commit and date, and the commands once (one line inline, more
as a block under the table). When a report's experiment is rerun through the harness, its entry goes.
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from .harness import RESULTS, ROOT

PROVENANCE = "provenance.json"  # under docs/results/
MODULES = ("results", "speed_reports", "detail_reports")  # the modules that declare REPORTS

Sources = dict[str, Any]  # each source file's parsed JSON, keyed by its path under docs/results/ (posix)


@dataclass(frozen=True)
class Report:
    """A table of the docs rendered from existing result files.

    name: what the docs' `<!-- render: NAME -->` markers and provenance.json call it.
    figure: the table it writes, as `list` prints it (the document and section).
    sources: glob patterns under docs/results/, each of which must match at least one file.
    table: `table(sources)` gives the Markdown table from every matched file's parsed JSON.
    """

    name: str
    figure: str
    sources: tuple[str, ...]
    table: Callable[[Sources], str]


def registry() -> dict[str, Report]:
    """Every report by name, in `MODULES` order (a module's import stays cheap: no torch)."""
    found: dict[str, Report] = {}
    for module in MODULES:
        for report in importlib.import_module(f"{__package__}.{module}").REPORTS:
            if report.name in found:
                raise ValueError(f"two reports named {report.name!r}")
            found[report.name] = report
    return found


def source_paths(report: Report, root: Path = ROOT) -> list[Path]:
    """The files the report reads, in the order of its patterns (each pattern's matches sorted by name)."""
    base = root / RESULTS
    paths: list[Path] = []
    for pattern in report.sources:
        matched = sorted(base.glob(pattern))
        if not matched:
            raise ValueError(f"{report.name}: no result file matches docs/results/{pattern}")
        paths += [path for path in matched if path not in paths]
    return paths


def parse(path: Path) -> Any:
    """A result file's JSON; a `.jsonl` file (a JSON record a line, as the scripts that append a run or an
    epoch at a time write them): the list of its records."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def load_sources(report: Report, root: Path = ROOT) -> Sources:
    """Each source file's JSON (a `.jsonl` file's: its records), keyed by its path under docs/results/."""
    base = root / RESULTS
    return {path.relative_to(base).as_posix(): parse(path) for path in source_paths(report, root)}


def load_provenance(report: Report, root: Path = ROOT) -> dict[str, Any]:
    """The report's entry of docs/results/provenance.json; raises when it is missing or incomplete."""
    path = root / RESULTS / PROVENANCE
    entries = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    if report.name not in entries:
        raise ValueError(f"{report.name}: no entry in docs/results/{PROVENANCE} (machine, runs, commands)")
    entry = entries[report.name]
    missing = [key for key in ("machine", "runs", "commands") if key not in entry]
    runs = entry.get("runs") or []
    if missing or not runs or any(not run.get("commit") or not run.get("date") for run in runs):
        raise ValueError(f"{report.name}: docs/results/{PROVENANCE} needs machine, commands and runs, "
                         f"each run with its commit and date")
    return entry


def links(paths: list[Path], document: Path, root: Path = ROOT) -> list[tuple[str, str]]:
    """(label, link) for the caption: the files themselves when few, else their folders."""
    base = root / RESULTS
    folders = list(dict.fromkeys(path.parent for path in paths))  # in the order of the report's sources
    if len(paths) <= 4:
        chosen = [(path.relative_to(base).as_posix(), path) for path in paths]
    else:
        chosen = [(folder.relative_to(base).as_posix() + "/", folder) for folder in folders]
    return [(label, Path(os.path.relpath(target, document.parent)).as_posix() + ("/" if label.endswith("/") else ""))
            for label, target in chosen]


def machine_text(machine: Mapping[str, Any]) -> str:
    """The machine as far as it was recorded: CPU, cores, memory, GPU, each left out when unknown."""
    parts = [machine["cpu"]] if machine.get("cpu") else []
    parts += [f"{machine['cores']} cores"] if machine.get("cores") else []
    parts += [f"{machine['memory_gib']:g} GiB"] if machine.get("memory_gib") else []
    parts += [machine["gpu"]] if machine.get("gpu") else []
    return ", ".join(parts) or "a machine not recorded"


def runs_text(runs: list[Mapping[str, Any]]) -> str:
    """Each run's commit and date, once: one date for all when they share it, else beside each commit."""
    word = "commit" if len(runs) == 1 else "commits"
    dates = {run["date"] for run in runs}
    if len(dates) == 1:
        return f"{word} " + ", ".join(run["commit"] + (f" ({run['what']})" if run.get("what") else "")
                                      for run in runs) + f" · {dates.pop()}"
    return f"{word} " + ", ".join(f"{run['commit']} ({', '.join(filter(None, (run.get('what'), run['date'])))})"
                                  for run in runs)


def caption(provenance: Mapping[str, Any], json_links: list[tuple[str, str]]) -> str:
    """The line that states where and when the table's runs were made and how to make them again."""
    commands = provenance["commands"]
    command = f"`{commands[0]}`" if len(commands) == 1 else "commands below the table"
    files = ", ".join(f"[`{label}`]({link})" for label, link in json_links)
    return (f"Run on {machine_text(provenance['machine'])} · {runs_text(provenance['runs'])} · {command} · "
            f"JSON: {files}.")


def section(report: Report, document: Path, root: Path = ROOT) -> str:
    """What belongs between a report's markers: the caption, the table, and the commands when several."""
    provenance = load_provenance(report, root)
    paths = source_paths(report, root)
    table = report.table(load_sources(report, root)).rstrip()
    text = f"{caption(provenance, links(paths, document, root))}\n\n{table}\n"
    if len(provenance["commands"]) > 1:
        text += "\n```bash\n" + "\n".join(provenance["commands"]) + "\n```\n"
    return text
