"""The one timing harness: what a benchmark declares, how its sides are timed, and the one JSON it writes.

A benchmark is a module of this package that holds `BENCHMARKS`, a tuple of `Benchmark` objects (the
pattern of TorchBench's model modules and asv's suites: the module says what runs, the harness how it is
timed). The harness owns what every benchmark would otherwise copy and get subtly different: the threads,
the load-average warning, warm-up, the alternation of the sides, repeats, median and spread, and the
provenance (machine, versions, commit, date, the command that reproduces the run). Benchmarks named in
`MODULES` are the ported ones; the other files of `benchmarks/` are still scripts run as files.

Timing protocol, per case: `setup` builds the sides (untimed); each side runs `warmup` times untimed, and
the first warm-up's outputs go to `check`, which compares the sides and returns facts about the work (a
token count, say) or raises; then `repeats` rounds, each running every side once, the order rotated by
one per round (A B, B A, A B, ...) so that neither side always runs on a machine the other just warmed.
Each timed run is one `time.perf_counter` interval around a zero-argument call, after `gc.collect()`; the
CPU time over the same call is kept beside it (`cpu_seconds`: the process's, all threads together, plus
that of the child processes it waited for in the call, so that a side run as a subprocess has one too; what
other work on a busy machine does not inflate).

Two variations, for sides that run their work in a fresh process per call (a fine-tuning run, say):

- A side may time itself: a call that returns `Measured(seconds, output)` has `seconds` recorded as its
  time (the work's own interval: a subprocess's training, without its start-up and data loading), the
  outer interval kept beside it (`outer_seconds` in the side's summary), and `output` is what `check`
  receives. A side returns `Measured` from every call or from none.
- `warmup=0`: there is nothing to warm (every call starts afresh) and a call is too long to run untimed, so
  `check` receives the outputs of the first timed round instead, once all rounds have run.

A view (`View`) renders a benchmark's result again under its own marker; one that `joins` other benchmarks
renders their results with it, as one table (a row per task, say, each task a benchmark of its own so that
it can be rerun alone).
"""

from __future__ import annotations

import datetime
import gc
import importlib
import importlib.metadata
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path("docs") / "results"
SCHEMA = "bertforge-benchmark/1"
MODULES = ("tokenizer", "inference", "encoder", "machine_limit", "embed", "embed_student", "distill_speed",
           "pretrain", "finetune")  # the modules ported onto this harness; each holds BENCHMARKS

Params = dict[str, Any]


@dataclass
class Prepared:
    """One case made ready to time: each side as a zero-argument call, plus facts learned while building it."""

    sides: Mapping[str, Callable[[], Any]]
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Measured:
    """What a side's call returns when it times its own work (see the module docstring): `seconds`, the work's
    own interval, is recorded as the call's time; `output` is what `check` receives."""

    seconds: float
    output: Any


@dataclass(frozen=True)
class View:
    """A second table of a benchmark's result, rendered under its own marker (a longer table in docs/results/
    beside the docs' summary, say): `run` has nothing more to do for it, `render` reads the same result.

    name: its `<!-- render: NAME -->` marker; figure: the table it writes, as `list` prints it;
    table: `table(result)`, as `Benchmark.table`.
    joins: other benchmarks whose results the table reads too (`join`: one result with every benchmark's
        cases, its own first, then these in order); the caption states each result's provenance. Empty: its
        benchmark's result alone.
    """

    name: str
    figure: str
    table: Callable[[dict[str, Any]], str]
    joins: tuple[str, ...] = ()


@dataclass(frozen=True)
class Benchmark:
    """What a benchmark declares; everything else is the harness's.

    name: what `run` and the docs' `<!-- render: NAME -->` markers call it.
    figure: the figure it backs, as `list` prints it (the document and section).
    sides: the contenders, in the order the first round runs them (bertforge first, then each peer).
    cases: `cases(quick)` gives the cases' parameters, at full size or, with `quick`, toy size (seconds).
    setup: `setup(params)` builds one case's sides, untimed.
    check: `check(params, outputs)`, outputs of the first warm-up keyed by side (with `warmup` 0: of the
        first timed round, once every round has run): compares them, returns facts about the work (recorded
        with the case), raises when the sides disagree.
    table: `table(result)` renders a result (the schema below) as the Markdown table of the docs.
    result: its current result file, relative to docs/results/ (what `render` reads and a full run writes).
    legacy: `legacy(old)` turns a result file written before the harness into the schema, so that its
        figures render unchanged until the benchmark is run again through the harness; None for none.
    legacy_files: where the figures came from several runs before the harness (one file each, under
        docs/results/), those files: until a run through the harness writes `result`, `render` reads them
        and `legacy` receives {file: its JSON} in this order instead of one file's JSON (once a full run has
        written `result`, they are superseded: delete them, git keeps them). Empty: `result` is itself the
        file `legacy` adapts.
    views: further tables of the same result (`View`), each under its own marker.
    packages: libraries whose versions the result records besides python, torch, transformers, bertforge.
    repeats, quick_repeats, warmup, threads: the defaults of the timing protocol (warmup 0: for sides that
        start afresh on every call, see the module docstring).
    """

    name: str
    figure: str
    sides: tuple[str, ...]
    cases: Callable[[bool], list[Params]]
    setup: Callable[[Params], Prepared]
    check: Callable[[Params, dict[str, Any]], dict[str, Any]]
    table: Callable[[dict[str, Any]], str]
    result: str
    legacy: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    legacy_files: tuple[str, ...] = ()
    views: tuple[View, ...] = ()
    packages: tuple[str, ...] = ()
    repeats: int = 5
    quick_repeats: int = 2
    warmup: int = 1
    threads: int = 2

    def __post_init__(self) -> None:
        if not self.sides or self.warmup < 0:
            raise ValueError(f"{self.name}: a benchmark needs a side, and no negative warm-up")
        if self.legacy_files and self.legacy is None:
            raise ValueError(f"{self.name}: legacy_files need a legacy adaptor")


def registry() -> dict[str, Benchmark]:
    """Every ported benchmark by name, in `MODULES` order. Importing a module must stay cheap: the
    libraries a benchmark times are imported in its `setup`, not at the module's top."""
    found: dict[str, Benchmark] = {}
    for module in MODULES:
        for benchmark in importlib.import_module(f"{__package__}.{module}").BENCHMARKS:
            if benchmark.name in found:
                raise ValueError(f"two benchmarks named {benchmark.name!r}")
            found[benchmark.name] = benchmark
    return found


def views(benchmarks: Mapping[str, Benchmark]) -> dict[str, tuple[Benchmark, View]]:
    """Every benchmark's views by name, each with the benchmark whose result it renders; raises on a view that
    joins a benchmark not in `benchmarks`."""
    found: dict[str, tuple[Benchmark, View]] = {}
    for benchmark in benchmarks.values():
        for view in benchmark.views:
            if view.name in found or view.name in benchmarks:
                raise ValueError(f"two benchmarks or views named {view.name!r}")
            unknown = [name for name in view.joins if name not in benchmarks]
            if unknown:
                raise ValueError(f"view {view.name!r} joins no benchmark named {unknown}")
            found[view.name] = (benchmark, view)
    return found


def joined(benchmark: Benchmark, view: View) -> list[Benchmark]:
    """The benchmarks whose results a view of `benchmark` renders: `benchmark`, then those the view joins."""
    found = registry()
    return [benchmark, *(found[name] for name in view.joins)]


def join(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Several benchmarks' results as the one result a joining view's table reads: the first's fields, with
    every result's cases in order (one result: itself)."""
    return {**results[0], "cases": [case for result in results for case in result["cases"]]}


def log(message: str) -> None:
    """Progress for a person watching, on stderr."""
    print(message, file=sys.stderr, flush=True)


def summary(seconds: Sequence[float], cpu_seconds: Sequence[float],
            outer_seconds: Sequence[float] | None = None) -> dict[str, Any]:
    """One side's timings: every repeat as measured, the median (what the docs report) and the spread, then
    the CPU time of every repeat, and for a side that timed itself (`Measured`) each call's outer interval."""
    found = {"repeats": list(seconds), "median": statistics.median(seconds), "min": min(seconds),
             "max": max(seconds), "cpu_seconds": list(cpu_seconds)}
    if outer_seconds is not None:
        found["outer_seconds"] = list(outer_seconds)
    return found


def cpu_time() -> float:
    """This process's CPU time (all threads) plus that of its child processes waited for: a call's difference
    counts the work of a subprocess it ran to the end."""
    children = os.times()
    return time.process_time() + children.children_user + children.children_system


def unwrap(output: Any) -> Any:
    """What `check` receives of a call's output: a `Measured`'s output, anything else as it is."""
    return output.output if isinstance(output, Measured) else output


def time_case(benchmark: Benchmark, params: Params, repeats: int) -> dict[str, Any]:
    """One case under the protocol of the module docstring: its params, facts and each side's summary."""
    prepared = benchmark.setup(params)
    missing = set(benchmark.sides) - set(prepared.sides)
    if missing:
        raise ValueError(f"{benchmark.name}: setup gave no side {sorted(missing)}")
    outputs: dict[str, Any] = {}
    for round_ in range(benchmark.warmup):
        for side in benchmark.sides:
            output = unwrap(prepared.sides[side]())
            if round_ == 0:
                outputs[side] = output
    checked = benchmark.check(params, outputs) if benchmark.warmup else None
    outputs.clear()
    times: dict[str, list[float]] = {side: [] for side in benchmark.sides}
    outer: dict[str, list[float]] = {side: [] for side in benchmark.sides}
    cpu: dict[str, list[float]] = {side: [] for side in benchmark.sides}
    measured: set[str] = set()  # the sides that timed themselves
    for round_ in range(repeats):
        shift = round_ % len(benchmark.sides)
        for side in benchmark.sides[shift:] + benchmark.sides[:shift]:
            call = prepared.sides[side]
            gc.collect()
            start, cpu_start = time.perf_counter(), cpu_time()
            output = call()
            outer[side].append(time.perf_counter() - start)
            cpu[side].append(cpu_time() - cpu_start)
            if isinstance(output, Measured):
                measured.add(side)
            times[side].append(output.seconds if isinstance(output, Measured) else outer[side][-1])
            if not benchmark.warmup and round_ == 0:
                outputs[side] = unwrap(output)
            del output  # freed after the clock stops: a large result's deallocation is not the side's work
        log(f"{benchmark.name} {params} round {round_ + 1}/{repeats}: "
            + ", ".join(f"{side} {times[side][-1]:.3f} s" for side in benchmark.sides))
    if checked is None:  # warmup 0: the first timed round's outputs
        checked = benchmark.check(params, outputs)
    sides = {side: summary(times[side], cpu[side], outer[side] if side in measured else None)
             for side in benchmark.sides}
    return {"params": params, "facts": {**prepared.facts, **checked}, "sides": sides}


def machine() -> dict[str, Any]:
    """The CPU's name (from /proc/cpuinfo), its cores, the memory, and the GPU's name where torch sees one."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    import torch  # here: `list` and `render` never need it

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": memory_gib, "gpu": gpu}


def versions(packages: Sequence[str] = ()) -> dict[str, str]:
    """Python's version and each installed library's, read from package metadata (nothing is imported)."""
    found = {"python": platform.python_version()}
    for name in ("torch", "transformers", "bertforge", *packages):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def commit(root: Path = ROOT) -> dict[str, Any]:
    """The checkout's short commit hash, whether tracked files differ from it (a dirty tree), and which
    (`changed`: a reader can tell a run whose code differed from one whose docs were being edited)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()

    try:
        changed = git("diff", "--name-only", "HEAD").splitlines()
        return {"hash": git("rev-parse", "--short", "HEAD"), "dirty": bool(changed), "changed": changed}
    except (OSError, subprocess.CalledProcessError):
        return {"hash": None, "dirty": None}


def command(name: str, quick: bool, repeats: int | None, threads: int | None) -> str:
    """The one line that reproduces a run (where it writes is left out: it does not change the figures)."""
    words = ["python", "-m", "benchmarks", "run", name]
    words += ["--quick"] if quick else []
    words += ["--repeats", str(repeats)] if repeats is not None else []
    words += ["--threads", str(threads)] if threads is not None else []
    return shlex.join(words)


def set_threads(threads: int) -> None:
    """Size torch's intra-op pool and the Rust (rayon) pool of `tokenizers`: the latter reads its size when
    it starts, so this runs before any benchmark's `setup` imports the libraries it times."""
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    import torch

    torch.set_num_threads(threads)


def warn_if_loaded() -> float:
    """The 1-minute load average, with a warning when other work is running: the timings would be noisy."""
    load = os.getloadavg()[0]
    cores = os.cpu_count() or 1
    if load > 0.5 * cores:
        log(f"warning: load average {load:.2f} on {cores} cores: other work is running, timings will be noisy")
    return load


def run(benchmark: Benchmark, *, quick: bool = False, repeats: int | None = None,
        threads: int | None = None) -> dict[str, Any]:
    """Time every case of `benchmark` and return the result in the harness's schema (see `validate`)."""
    count = repeats if repeats is not None else (benchmark.quick_repeats if quick else benchmark.repeats)
    if count < 1:
        raise ValueError("repeats must be at least 1")
    pool = threads if threads is not None else benchmark.threads
    set_threads(pool)
    load = warn_if_loaded()
    started = datetime.datetime.now(datetime.timezone.utc)
    cases = [time_case(benchmark, params, count) for params in benchmark.cases(quick)]
    return {
        "schema": SCHEMA,
        "benchmark": benchmark.name,
        "figure": benchmark.figure,
        "quick": quick,
        "machine": machine(),
        "versions": versions(benchmark.packages),
        "commit": commit(),
        "date": started.isoformat(timespec="seconds"),
        "command": command(benchmark.name, quick, repeats, threads),
        "threads": pool,
        "warmup": benchmark.warmup,
        "load_average_1min": round(load, 2),
        "unit": "seconds",
        "cases": cases,
    }


def validate(result: Mapping[str, Any]) -> None:
    """Raise ValueError unless `result` has the schema's fields, each side's median within its min and max."""
    required = ("schema", "benchmark", "machine", "versions", "commit", "date", "command", "cases")
    missing = [key for key in required if key not in result]
    if missing or result["schema"] != SCHEMA:
        raise ValueError(f"not a {SCHEMA} result: missing {missing}")
    for case in result["cases"]:
        for side, timing in case["sides"].items():
            if not timing["min"] <= timing["median"] <= timing["max"]:
                raise ValueError(f"{result['benchmark']} {case['params']} {side}: median outside [min, max]")


def result_path(benchmark: Benchmark, root: Path = ROOT) -> Path:
    """Where the benchmark's current result lives: docs/results/<its result file>."""
    return root / RESULTS / benchmark.result


def source_paths(benchmark: Benchmark, root: Path = ROOT) -> list[Path]:
    """The files the benchmark's current figures are read from: its result file, or while no run through the
    harness has written it, the pre-harness files it names in `legacy_files`."""
    path = result_path(benchmark, root)
    if benchmark.legacy_files and not path.exists():
        return [root / RESULTS / name for name in benchmark.legacy_files]
    return [path]


def load_result(benchmark: Benchmark, root: Path = ROOT) -> dict[str, Any]:
    """The benchmark's current result in the schema, pre-harness files passed through its `legacy` adaptor."""
    path = result_path(benchmark, root)
    paths = source_paths(benchmark, root)
    if paths != [path]:  # several pre-harness files, adapted together
        assert benchmark.legacy is not None  # __post_init__: legacy_files come with their adaptor
        data = benchmark.legacy({name: json.loads(file.read_text(encoding="utf-8"))
                                 for name, file in zip(benchmark.legacy_files, paths)})
    else:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("schema") != SCHEMA:
            if benchmark.legacy is None:
                raise ValueError(f"{path} is not a {SCHEMA} result and {benchmark.name} has no legacy adaptor")
            data = benchmark.legacy(data)
    validate(data)
    return data


def write_result(result: Mapping[str, Any], path: Path) -> None:
    """The result as indented JSON (reviewable in a diff), through a temporary file so no reader sees half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    partial.replace(path)
