"""`python -m benchmarks list | run NAME... | render`: the command line of the harness (see __init__)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .headlines import Typed, headlines
from .headlines import registry as headline_registry
from .harness import (ROOT, Benchmark, joined, log, registry, result_path, run, source_paths, validate, views,
                      write_result)
from .prose import unbacked
from .render import Renderable, render
from .report import Report
from .report import registry as report_registry
from .report import source_paths as report_source_paths


def files_behind(renderable: Renderable, root: Path) -> list[Path]:
    """The result files a rendered table reads (none for a headline table: its rows link their sections)."""
    if isinstance(renderable, Report):
        return report_source_paths(renderable, root)
    if isinstance(renderable, Benchmark):
        return source_paths(renderable, root)
    if isinstance(renderable, tuple):  # a view: its benchmark's result, and those of the benchmarks it joins
        return [path for owner in joined(*renderable) for path in source_paths(owner, root)]
    return []


def parser() -> argparse.ArgumentParser:
    """The three commands and their options."""
    top = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    commands = top.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="every benchmark, its sides and the figure it backs; then every view, "
                                           "report and headline table")
    timing = commands.add_parser("run", help="time benchmarks and write their results")
    timing.add_argument("names", nargs="+", metavar="NAME")
    timing.add_argument("--quick", action="store_true", help="toy size, seconds: checks that it runs, backs no figure")
    timing.add_argument("--repeats", type=int, default=None, help="timed rounds (default: the benchmark's)")
    timing.add_argument("--threads", type=int, default=None,
                        help="torch and tokenizers threads (default: the benchmark's)")
    timing.add_argument("--output-dir", type=Path, default=None,
                        help="write NAME.json here (default: the benchmark's file under docs/results/; "
                             "with --quick, print the JSON on stdout instead)")
    docs = commands.add_parser("render", help="write the docs' marked tables from their result JSON")
    docs.add_argument("--check", action="store_true", help="change nothing; fail naming each section that differs "
                      "and each figure in RESULTS.md's or BENCHMARKS.md's prose with no result file behind it")
    docs.add_argument("--root", type=Path, default=ROOT, help="the repository whose docs and docs/results to use")
    return top


def main(argv: list[str] | None = None) -> int:
    """Run one command; the exit status is non-zero when a check fails or a name is unknown."""
    args = parser().parse_args(argv)
    benchmarks, reports, headline_tables = registry(), report_registry(), headline_registry()
    tables = views(benchmarks)
    names = [*benchmarks, *tables, *reports, *headline_tables]
    if len(set(names)) != len(names):
        raise ValueError(f"a benchmark, view, report or headline table shares a name: "
                         f"{sorted({name for name in names if names.count(name) > 1})}")
    if args.command == "list":
        for benchmark in benchmarks.values():
            print(f"{benchmark.name}\t{' vs '.join(benchmark.sides)}\t{benchmark.figure}")
        for name, (benchmark, view) in tables.items():
            owners = " and ".join(owner.name for owner in joined(benchmark, view))
            again = "their results rendered again as one table" if view.joins else "its result rendered again"
            print(f"{name}\tview of {owners} ({again}; nothing to run)\t{view.figure}")
        for report in reports.values():
            print(f"{report.name}\treport (rendered from its result files; nothing to run)\t{report.figure}")
        rows = headlines()
        for table in headline_tables.values():
            typed = [key for key in table.keys if isinstance(rows[key].answer, Typed)]
            print(f"{table.name}\theadline table: {len(table.keys) - len(typed)} rows read from their sections' "
                  f"result files, {len(typed)} typed ({', '.join(typed) or 'none'})\t{table.figure}")
        return 0
    if args.command == "render":
        root, renderables = args.root.resolve(), {**benchmarks, **tables, **reports, **headline_tables}
        try:
            stale = render(renderables, root, check=args.check)
            figures = unbacked(lambda name: files_behind(renderables[name], root) if name in renderables else [],
                               root) if args.check else []
        except (ValueError, OSError) as error:  # a marker without its end, an unknown name, a missing result
            log(f"render: {error}")
            return 2
        for name in stale:
            print(f"{'differs from its JSON' if args.check else 'rendered'}: {name}")
        for problem in figures:
            print(f"a figure in prose without its result file: {problem}")
        return 1 if args.check and (stale or figures) else 0
    static = [name for name in args.names if name in reports or name in headline_tables]
    if static:
        log(f"{static}: a report or headline table renders result files already written and has nothing to run "
            "(`python -m benchmarks render`; docs/results/provenance.json gives the commands that made them)")
        return 2
    shown = {name: " ".join(owner.name for owner in joined(*tables[name])) for name in args.names if name in tables}
    if shown:
        log("a view renders its benchmarks' results and has nothing of its own to run: "
            + ", ".join(f"{name}: run {parents}" for name, parents in shown.items()))
        return 2
    unknown = [name for name in args.names if name not in benchmarks]
    if unknown:
        log(f"no benchmark named {unknown}; `python -m benchmarks list` names them")
        return 2
    for name in args.names:
        result = run(benchmarks[name], quick=args.quick, repeats=args.repeats, threads=args.threads)
        validate(result)
        if args.output_dir is not None:
            path = args.output_dir / f"{name}.json"
        elif args.quick:
            print(json.dumps(result))
            continue
        else:
            path = result_path(benchmarks[name])
        write_result(result, path)
        log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
