"""Fine-tuning wall time against the peer at its best settings: `bertforge finetune glue` against transformers'
`Trainer` (benchmarks/glue_peer.py), the same checkpoint, data and recipe.

Each side's call is one whole fine-tuning run in a fresh process: all-MiniLM-L6-v2, batch 32, lr 2e-5, warm-up
10%, seed 42, 128 tokens, the benchmark's threads (2), both sides bf16 and length-grouped, as an expert would set
the peer: bertforge at `--precision bf16 --group-by-length`, unpadded as by default; the peer with
`--dynamic-padding --group-by-length --bf16` (`DataCollatorWithPadding`, `group_by_length`, `bf16=True`). A run
reports its own wall seconds of training and the per-epoch dev evaluations (`wall_seconds`, what the docs
compare; not the process's start-up or the tokenizing), which each call returns as its time (`Measured`): the
whole process's interval is kept beside it (`outer_seconds`). A process has nothing to warm, so there is no
warm-up (`warmup=0`): the sides alternate round by round (runs 1 and 3 bertforge first, run 2 the peer first),
and `check` records the first round's dev metrics (the best epoch's: both sides keep their best epoch) and
each side's peak resident memory (`peak_rss_mb`, from wait4).

Two benchmarks, so that each can be rerun on its own (one round takes minutes: MRPC about 2.5 + 3.5, SST-2
about 5 + 7.5 on 2 cores), and one table of both (the view `finetune-speed`):

    python -m benchmarks run finetune-mrpc      # MRPC, 3 epochs, 3 rounds (about 20 minutes)
    python -m benchmarks run finetune-sst2      # SST-2, 1 epoch, 3 rounds (about 40 minutes)
    python -m benchmarks run finetune-mrpc finetune-sst2 --quick --threads 1   # seconds: the test

`--quick`: a tiny random checkpoint (MiniLM's vocabulary) on the first 32 of a toy task's training examples
(`_common.quick_glue`: Shakespeare's speeches in MRPC's or SST-2's layout), batch 8, one epoch.

Until a run through the harness writes finetune_speed/mrpc.json and sst2.json, the figures are those of the
pre-harness script (`python benchmarks/finetune.py --runs sst2:1,mrpc:3 --sides ...`, three runs, in
finetune_speed/*_best_peer_grouped.json; `adapt`), whose sides `ours_bf16_grouped` and `peer_best` are these.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    raise SystemExit("benchmarks/finetune.py runs through the harness, from the repository root: "
                     "python -m benchmarks run finetune-mrpc finetune-sst2 [--quick]")

import functools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

from . import legacy  # noqa: E402
from ._common import minilm_dir, quick_checkpoint, quick_glue, scratch  # noqa: E402
from .harness import ROOT, Benchmark, Measured, Params, Prepared, View  # noqa: E402
from .inference import GLUE  # noqa: E402
from .results import bold, points, rows  # noqa: E402
from .speed_reports import times  # noqa: E402

SIDES = ("bertforge", "transformers")
GOAL = 1.5  # bertforge's wall time against the peer at its best (the fine-tuning issue's goal)
# per task: its GLUE folder (the table's label too) and its dev metric, the metrics' key and the table's label
TASKS = {"mrpc": ("MRPC", "f1", "F1"), "sst2": ("SST-2", "accuracy", "acc.")}
PEER_BEST = ("--dynamic-padding", "--group-by-length", "--bf16")  # the peer as an expert would set it
QUICK_EXAMPLES = 32  # --quick's training examples
LEGACY_SIDES = {"bertforge": "ours_bf16_grouped", "transformers": "peer_best"}  # the pre-harness files' names


# --- measuring a side --------------------------------------------------------------------------------------

def run_measured(command: list[str], capture: bool = False) -> tuple[str, float]:
    """Run `command` to the end from the repository root: its stdout (with `capture`; else discarded; its
    stderr shows) and its peak resident memory in MB, from wait4 (Linux reports it in KB). Raises
    CalledProcessError when it fails, so that a failing side stops the benchmark."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE if capture else subprocess.DEVNULL, text=True,
                               cwd=ROOT)
    stdout = process.stdout.read() if process.stdout else ""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise subprocess.CalledProcessError(process.returncode, command, stdout)
    return stdout, round(usage.ru_maxrss / 1024, 1)


def measure(command: list[str], capture: bool = False) -> tuple[str, float]:
    """`run_measured(command, capture)` run by a small launcher process (this module, `launch`): the kernel
    starts a child's peak count at its parent's, and the harness's process, with torch imported, would set
    that floor at some hundreds of MB; the launcher's is some tens."""
    stdout, _ = run_measured([sys.executable, "-m", "benchmarks.finetune",
                              json.dumps({"command": command, "capture": capture})], capture=True)
    found = json.loads(stdout)
    return found["stdout"], found["peak_rss_mb"]


def launch(request: dict[str, Any]) -> None:
    """The launcher: `run_measured` of the request's command, its stdout and peak RSS as one JSON line."""
    stdout, peak_rss_mb = run_measured(request["command"], request["capture"])
    print(json.dumps({"stdout": stdout, "peak_rss_mb": peak_rss_mb}))


# --- the sides ---------------------------------------------------------------------------------------------

def recipe(params: Params) -> list[str]:
    """The flags both sides' commands share, under the same names: lr, epochs, batch size, maximum length,
    and with `max_train_examples` the first N training examples only (the seed's flag differs)."""
    limit = params["max_train_examples"]
    return ["--lr", str(params["lr"]), "--epochs", f"{params['epochs']:g}", "--batch-size", str(params["batch_size"]),
            "--max-seq-length", str(params["max_seq_length"]),
            *(["--max-train-examples", str(limit)] if limit else [])]


def ours(params: Params, data: Path, model: Path, threads: int) -> Measured:
    """One `bertforge finetune glue` run, bf16 and length-grouped, in a fresh output folder: its wall seconds
    as the call's time, its best epoch's dev metrics and its peak RSS as the output."""
    out = Path(tempfile.mkdtemp(dir=scratch("bertforge-finetune-bench-"))) / "bertforge"
    _, peak_rss_mb = measure([sys.executable, "-m", "bertforge", "finetune", "glue", "--task", params["task"],
                              "--data-dir", str(data), "--model", str(model), "--output-dir", str(out),
                              "--seed", str(params["seed"]), *recipe(params), "--num-threads", str(threads),
                              "--precision", "bf16", "--group-by-length", "--no-progress", "--no-test-predictions"])
    found = json.loads((out / "eval_results.json").read_text(encoding="utf-8"))
    return Measured(found["wall_seconds"], {"wall_seconds": found["wall_seconds"], "metrics": found["metrics"],
                                            "epoch": found["epoch"], "peak_rss_mb": peak_rss_mb})


def peer(params: Params, data: Path, model: Path, threads: int) -> Measured:
    """One run of the peer at its best (`glue_peer.py ... --dynamic-padding --group-by-length --bf16`), one
    seed, in a fresh output folder: as `ours`, from its JSON line (`wall_seconds`: its `trainer.train`)."""
    out = Path(tempfile.mkdtemp(dir=scratch("bertforge-finetune-bench-"))) / "transformers"
    stdout, peak_rss_mb = measure([sys.executable, str(ROOT / "benchmarks" / "glue_peer.py"), "--task", params["task"],
                                   "--data-dir", str(data), "--model", str(model), "--output-dir", str(out),
                                   "--seeds", str(params["seed"]), *recipe(params), "--threads", str(threads),
                                   *PEER_BEST], capture=True)
    [run] = json.loads(stdout.splitlines()[-1])["runs"]
    return Measured(run["wall_seconds"], {"wall_seconds": run["wall_seconds"], "metrics": run["metrics"],
                                          "epoch": run["epoch"], "peak_rss_mb": peak_rss_mb})


def inputs(params: Params) -> tuple[Path, Path]:
    """The case's GLUE root and checkpoint: the shared GLUE data and MiniLM, or for `--quick` (model `tiny`)
    a toy task and a tiny random checkpoint, made once per process in a temporary folder."""
    if params["model"] != "tiny":
        folder = GLUE / TASKS[params["task"]][0]
        if not folder.is_dir():
            raise SystemExit(f"the benchmark's data is not there: {folder}")
        return GLUE, minilm_dir()
    root = scratch("bertforge-finetune-bench-")
    data = root / "glue"
    if not (data / TASKS[params["task"]][0]).is_dir():
        quick_glue(data, TASKS[params["task"]][0])
    model = root / "tiny"
    if not (model / "config.json").exists():
        quick_checkpoint(model)
    return data, model


def setup(params: Params) -> Prepared:
    """Both sides of the case on the threads the harness set, each a fresh process per call."""
    import torch

    data, model = inputs(params)
    threads = torch.get_num_threads()
    return Prepared(sides={"bertforge": functools.partial(ours, params, data, model, threads),
                           "transformers": functools.partial(peer, params, data, model, threads)})


def check(params: Params, outputs: dict[str, Any]) -> dict[str, Any]:
    """Each side's dev metrics, best epoch and peak RSS (the first round's). The scores may differ (one seed
    each; no quality bar here): raises only when a side reported no dev metric of its task."""
    metric = TASKS[params["task"]][1]
    for side, output in outputs.items():
        if not isinstance(output.get("metrics"), dict) or metric not in output["metrics"]:
            raise ValueError(f"{params['task']}: {side} reported no dev {metric}: {output}")
    return {key: {side: outputs[side][key] for side in SIDES} for key in ("metrics", "epoch", "peak_rss_mb")}


def cases(task: str, epochs: int) -> Callable[[bool], list[Params]]:
    """The one case of `task` at `epochs`: MiniLM at the recipe; `quick`: the tiny checkpoint, batch 8, one
    epoch over `QUICK_EXAMPLES` toy examples."""
    def build(quick: bool) -> list[Params]:
        return [{"task": task, "model": "tiny" if quick else "minilm", "epochs": 1 if quick else epochs,
                 "batch_size": 8 if quick else 32, "lr": 2e-5, "seed": 42, "max_seq_length": 128,
                 "max_train_examples": QUICK_EXAMPLES if quick else None}]

    return build


# --- reading a result --------------------------------------------------------------------------------------

def ratios(case: dict[str, Any]) -> list[float]:
    """The peer's seconds over bertforge's, round by round."""
    return [theirs / mine for mine, theirs in zip(*(case["sides"][side]["repeats"] for side in SIDES))]


def table(result: dict[str, Any]) -> str:
    """One row per task: each side's seconds per run, the ratio per run and its median against the goal, and
    both sides' dev score (one seed: every run of a side scores the same; the first run's)."""
    body, counts = [], set()
    for case in result["cases"]:
        params = case["params"]
        label, metric, metric_label = TASKS[params["task"]]
        found = ratios(case)
        counts.add(len(found))
        dev = " / ".join(points(case["facts"]["metrics"][side][metric]) for side in SIDES)
        body.append([label, f"{params['epochs']:g}",
                     *(" / ".join(f"{seconds:.1f}" for seconds in case["sides"][side]["repeats"]) for side in SIDES),
                     " / ".join(map(times, found)), bold(times(statistics.median(found))), f"≥ {GOAL:g}×",
                     f"{metric_label} {dev}"])
    count = counts.pop() if len(counts) == 1 else None  # the tasks' runs, where they have as many
    runs = "each run" if count is None else "run 1" if count == 1 else f"runs 1–{count}"
    return rows(["task", "epochs", f"bertforge s ({runs})", f"peer s ({runs})", "bertforge / peer", "**median**",
                 "goal", "dev (bertforge / peer)"], body)


# --- results written before the harness --------------------------------------------------------------------

def adapt(files: dict[str, Any]) -> dict[str, Any]:
    """The `legacy` adaptor: a file of the pre-harness script (one task, three runs of its sides
    `ours_bf16_grouped` and `peer_best`, run 2 the peer first, as the harness's rotation orders them) in the
    schema: each run's `wall_seconds` a repeat, its `process_seconds` the outer interval, the first run's dev
    metrics and best epoch the facts (the script did not record peak RSS then). The `provenance` block added
    to the file gives the machine, commit and date; the file's own `commands` the commands."""
    [old] = files.values()
    runs = sorted(old["runs"], key=lambda run: run["run"])
    [task] = {run["task"] for run in runs}
    [epochs] = {run["epochs"] for run in runs}
    name = f"finetune-{task}"
    blocks = [{**old["provenance"], "command": command} for command in old["commands"]]
    sides = {side: {**legacy.side_from_seconds([run[key]["wall_seconds"] for run in runs]),
                    "outer_seconds": [run[key]["process_seconds"] for run in runs]}
             for side, key in LEGACY_SIDES.items()}
    facts = {fact: {side: runs[0][key][fact] for side, key in LEGACY_SIDES.items()} for fact in ("metrics", "epoch")}
    params = {"task": task, "model": "minilm", "epochs": epochs, "batch_size": 32, "lr": old["lr"], "seed": old["seed"],
              "max_seq_length": old["max_seq_length"], "max_train_examples": None}
    return {**legacy.header(name, f"python -m benchmarks run {name}", blocks, {},
                            round(max(old["load_average_before"]), 2)),
            "threads": old["threads"], "warmup": 0, "cases": [{"params": params, "facts": facts, "sides": sides}]}


FIGURE = 'BENCHMARKS.md, "Fine-tuning against the peer at its best settings"'

BENCHMARKS = (
    Benchmark(name="finetune-mrpc", figure=f"{FIGURE} (its MRPC row)", sides=SIDES, cases=cases("mrpc", 3),
              setup=setup, check=check, table=table, result="finetune_speed/mrpc.json",
              views=(View("finetune-speed", FIGURE, table, joins=("finetune-sst2",)),),
              repeats=3, quick_repeats=1, warmup=0),
    Benchmark(name="finetune-sst2", figure=f"{FIGURE} (its SST-2 row)", sides=SIDES, cases=cases("sst2", 1),
              setup=setup, check=check, table=table, result="finetune_speed/sst2.json", legacy=adapt,
              legacy_files=("finetune_speed/sst2_1_epoch_best_peer_grouped.json",),
              repeats=3, quick_repeats=1, warmup=0),
)


if __name__ == "__main__":  # the launcher: `measure` starts it with its command
    launch(json.loads(sys.argv[1]))
