"""Distilled students' throughput: `pipeline` of a fine-tuned all-MiniLM-L6-v2 teacher against its 3- and 2-layer
distilled students, at fp32, bf16 and int8, on SST-2 and CoNLL-2003; and how fast half a teacher's layers could be.

The models are the distillation study's (benchmarks/distill.py, RESULTS.md "Distillation"): per task the teacher
and the seed-0 students distilled without augmented text, where the study's `--keep` folder holds them,
KEEP/<task>/teacher, KEEP/<task>/L3-distill-seed0 and KEEP/<task>/L2-distill-seed0. KEEP is runs/distill, or the
folder $BERTFORGE_DISTILL_KEEP names; the study makes what is missing (`STUDY_COMMAND`). They are not trained
here: the study takes hours, its scores are RESULTS.md's.

Texts: the first 1,024 dev texts, SST-2 dev's sentences (it has 872) for `pipeline("classify")` and CoNLL-2003
valid's sentences (words joined by spaces) for `pipeline("tag", aggregation="none")`, at batch 32, in calls of
the server's row limit (`RequestLimits().max_rows` texts a call, as the figures were first measured). Cases, each
with the three models as its sides (`part` "pipeline"): per task, fp32, bf16 and int8. Facts: each side's layers
and its dev score on the texts, from its first warm-up's answers (SST-2: accuracy; CoNLL: entity F1, each file
word labelled by the pipeline's word that starts where it does), which `check` also holds to one well-formed
answer per text.

The bound (`bound`): how fast a student could be against its teacher at fp32 with nothing but its linear layers
costing less. Each model's linear-layer work on the texts, in full-layer units, counted from the pipeline's own
features: every layer but the last at every token, the last one's query/key/value projections at every token
and the rest of it (output projection, feed-forward: 9 of its 12 H² per token) at the rows the pipeline reads
(a classifier's [CLS], a tagger's words' first pieces). The ratio of the works is the speed-up with the
linear layers alone costing time; `with_pre_post` adds each model's tokenizing and labelling, timed, with its
whole forward pass counted as layer work (generous to the student). Two more fp32 cases per task time the
parts of a call: `forward` (`Pipeline.run` on the call's features) and `pre_post` (the checks, `preprocess`
and `postprocess` on outputs computed beforehand).

The goal (the issue's, for the 3-layer student): at least 98% of the teacher's score at 2× its fp32
throughput or more; 97% at 4× with int8 (`GOAL`). The share kept is the study's, not measured here: its best distilled
3-layer group's mean over seeds as a percentage of the teacher's (docs/results/distill/distill.json, `study`,
RESULTS.md's table), at int8 scaled by the timed student's int8 / fp32 dev scores. A run records it in the fp32
pipeline case's facts, so that the verdict (`goal`) is a function of the result.

    python -m benchmarks run distill-speed            # the figures (the study's models; minutes, a quiet machine)
    python -m benchmarks run distill-speed --quick    # seconds: tiny random models on toy texts, in a temp folder

Until a run through the harness writes distill/speed.json, the figures are those distill.py's former
`--throughput` wrote into distill/distill.json (`throughput`, `goal`; `adapt`). That file stays the study's:
once speed.json is written, drop `legacy_files` here and the throughput keys there.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    raise SystemExit("benchmarks/distill_speed.py runs through the harness, from the repository root: "
                     "python -m benchmarks run distill-speed [--quick]")

import functools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Sequence  # noqa: E402

from . import legacy  # noqa: E402
from ._common import finished, quick_checkpoint, quick_conll, quick_glue, scratch, student_name  # noqa: E402
from .harness import RESULTS, ROOT, Benchmark, Params, Prepared  # noqa: E402
from .inference import GLUE, held, quiet_libraries  # noqa: E402
from .results import DISTILL_FILES, DISTILL_TASKS, bold, points, rows  # noqa: E402
from .speed_reports import times  # noqa: E402

NAME = "distill-speed"
SIDES = ("teacher", "L3", "L2")  # the students by their layers, as the study names them
STUDENT_LAYERS = {"L3": 3, "L2": 2}
GOAL_SIDE = "L3"  # the student the goal is set for
DTYPES = ("fp32", "bf16", "int8")
GOAL = {"fp32": (98.0, 2.0), "int8": (97.0, 4.0)}  # % of the teacher's score kept, speed-up over its fp32
PARTS = (("fp32", "pipeline"), ("fp32", "forward"), ("fp32", "pre_post"), ("bf16", "pipeline"),
         ("int8", "pipeline"))  # each task's cases in order: the fp32 ones share their pipelines (`held`)
PIPELINES = {"sst2": "classify", "conll": "tag"}
OPTIONS: dict[str, dict[str, Any]] = {"sst2": {}, "conll": {"aggregation": "none"}}  # the tagger's every word
NAMES = {task: title.split(" (")[0] for task, title in DISTILL_TASKS}  # `SST-2`: the title less its metric
TEXTS, QUICK_TEXTS, BATCH = 1024, 64, 32
KEEP, KEEP_ENV = ROOT / "runs" / "distill", "BERTFORGE_DISTILL_KEEP"
CONLL = GLUE.parent / "conll2003"
STUDY = DISTILL_FILES[""]  # the study's result, under docs/results/: the goal's share kept
STUDY_COMMAND = ("python benchmarks/distill.py --keep {keep} --tasks sst2,conll --layers 3,2 --seeds 0 "
                 "--objectives distill --student-epochs 2")  # the models it times, and nothing else
CONLL_TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")  # --quick's tagger


# --- inputs ----------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def quick_data() -> Path:
    """--quick's dev files, once per process: toy SST-2 (64 dev rows) and CoNLL (64 sentences) in `scratch`."""
    root = scratch("bertforge-distill-speed-")
    quick_glue(root, "SST-2", rows=3 * QUICK_TEXTS)
    quick_conll(root / "conll" / "valid.txt", sentences=QUICK_TEXTS)
    return root


def dev_file(task: str, quick: bool) -> Path:
    """The dev file of `task`: SST-2's dev.tsv or CoNLL-2003's valid.txt (`quick`: the toy ones)."""
    if quick:
        return quick_data() / ("SST-2/dev.tsv" if task == "sst2" else "conll/valid.txt")
    return GLUE / "SST-2" / "dev.tsv" if task == "sst2" else CONLL / "valid.txt"


@functools.lru_cache(maxsize=None)
def dev_rows(task: str, count: int, quick: bool) -> tuple[list[str], list[Any]]:
    """The first `count` dev texts of `task` and their gold answers (SST-2: labels; CoNLL: each sentence's
    words and tags, the text being its words joined by single spaces)."""
    if task == "sst2":
        from bertforge.tasks.glue_data import read_glue_file

        examples = read_glue_file("sst2", dev_file(task, quick), "dev")[:count]
        return [example.text_a for example in examples], [str(example.label) for example in examples]
    from bertforge.tasks.conll import read_conll

    gold = [(sentence.words, list(sentence.tags)) for sentence in read_conll(dev_file(task, quick))[:count]]
    return [" ".join(words) for words, _ in gold], gold


# --- the models ------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def quick_models(task: str) -> dict[str, Path]:
    """--quick's models of `task`: random tiny checkpoints (H 128) of 6, 3 and 2 layers with the task's head."""
    head, labels = (("BertForSequenceClassification", ("0", "1")) if task == "sst2"
                    else ("BertForTokenClassification", CONLL_TAGS))
    folder = scratch("bertforge-distill-speed-") / "models" / task
    return {side: quick_checkpoint(folder / side, head, num_hidden_layers=STUDENT_LAYERS.get(side, 6),
                                   id2label=dict(enumerate(labels)))
            for side in SIDES}


def model_dirs(task: str, quick: bool) -> dict[str, Path]:
    """Each side's folder: the study's finished runs under KEEP (`quick`: `quick_models`). A missing or
    unfinished one ends the run with a line naming it and the command that makes it."""
    if quick:
        return quick_models(task)
    keep = Path(os.environ.get(KEEP_ENV, KEEP))
    found = {"teacher": keep / task / "teacher",
             **{side: keep / task / student_name(layers, "distill", 0, 0) for side, layers in STUDENT_LAYERS.items()}}
    for directory in found.values():
        if not finished(directory):
            raise SystemExit(f"{NAME}: no finished model at {directory}: make it with `"
                             f"{STUDY_COMMAND.format(keep=keep)}` (or set {KEEP_ENV} to the study's --keep)")
    return found


def pipelines(task: str, dtype: str, quick: bool) -> dict[str, Any]:
    """Each side's pipeline at `dtype`, with the server's request limits (its row limit sizes the calls);
    `held`: the fp32 cases share theirs, and one task and dtype's models are in memory at a time."""
    def build() -> dict[str, Any]:
        from bertforge import pipeline
        from bertforge.serving.limits import RequestLimits

        return {side: pipeline(PIPELINES[task], model=str(directory), dtype=dtype, limits=RequestLimits())
                for side, directory in model_dirs(task, quick).items()}

    return held((NAME, task, dtype, quick), build)


def study_share(study: dict[str, Any], task: str) -> dict[str, Any] | None:
    """The goal's share kept, from the study's result (distill.py's JSON): its best distilled 3-layer group
    (any augmentation, with or without the intermediate terms; never the labels-only control) by mean dev
    score over seeds, as a percentage of the teacher's; None when the study has no such group."""
    groups = [group for group in study.get("study", {}).get(task, {}).get("summary", [])
              if group["layers"] == STUDENT_LAYERS[GOAL_SIDE] and group["objective"] != "labels"]
    if not groups:
        return None
    best = max(groups, key=lambda group: group["score"]["mean"])
    return {"pct_of_teacher": best["pct_of_teacher"], "objective": best["objective"], "augment": best["augment"],
            "seeds": best["seeds"], "file": STUDY}


# --- the sides -------------------------------------------------------------------------------------------

def answer(pipe: Any, calls: list[list[str]], batch_size: int, options: dict[str, Any]) -> list[Any]:
    """One side's timed work: the pipeline's answers to every text, a call per `calls` item."""
    return [result for call in calls for result in pipe(call, batch_size=batch_size, **options)]


def forward(pipe: Any, features: list[list[Any]], batch_size: int) -> list[list[dict[str, Any]]]:
    """The forward passes of every call alone: `Pipeline.run` on each call's features."""
    return [pipe.run(mine, batch_size) for mine in features]


def pre_post(pipe: Any, calls: list[list[str]], outputs: list[list[dict[str, Any]]],
             options: dict[str, Any]) -> list[Any]:
    """Every call less its forward passes: the checks and tokenizing (`preprocess`), then `postprocess` on the
    model outputs computed beforehand (the answers a call gives)."""
    answers = []
    for call, computed in zip(calls, outputs):
        pipe.check_options(**options)
        inputs = pipe.check_inputs((call,))
        answers += pipe.postprocess(inputs, pipe.preprocess(*inputs, **options), computed, **options)
    return answers


def layer_work(features: list[list[Any]], layers: int) -> dict[str, Any]:
    """A `layers`-layer model's linear-layer work on the features, in full-layer units (see the module
    docstring): its tokens, the rows its last layer reads, the units."""
    tokens = sum(len(feature.input_ids) for mine in features for feature in mine)
    read = sum(len(feature.extra_inputs.get("word_positions", [0])) for mine in features for feature in mine)
    return {"tokens": tokens, "last_layer_rows": read, "units": layers - 1 + (3 + 9 * read / tokens) / 12}


def cases(quick: bool) -> list[Params]:
    """Per task (SST-2, then CoNLL-2003), `PARTS`: fp32, its forward passes, its tokenizing and labelling,
    bf16, int8; the first 1,024 dev texts (`quick`: 64 toy ones) at batch 32."""
    return [{"task": task, "dtype": dtype, "part": part, "texts": QUICK_TEXTS if quick else TEXTS,
             "batch_size": BATCH, "quick": quick} for task, _ in DISTILL_TASKS for dtype, part in PARTS]


def setup(params: Params) -> Prepared:
    """The case's three pipelines (built once for a task's fp32 cases) as sides of its part; facts: the texts
    answered and each side's layers, the forward case's layer work, the fp32 case's share kept by the study."""
    quiet_libraries()
    task, part, batch, options = params["task"], params["part"], params["batch_size"], OPTIONS[params["task"]]
    pipes = pipelines(task, params["dtype"], params["quick"])
    texts, _ = dev_rows(task, params["texts"], params["quick"])
    size = pipes["teacher"].limits.max_rows
    calls = [texts[start:start + size] for start in range(0, len(texts), size)]
    facts: dict[str, Any] = {"rows": len(texts),
                             "layers": {side: pipe.config.num_hidden_layers for side, pipe in pipes.items()}}
    sides: dict[str, Callable[[], Any]]
    if part == "pipeline":
        sides = {side: functools.partial(answer, pipe, calls, batch, options) for side, pipe in pipes.items()}
        if params["dtype"] == "fp32":
            facts["study"] = None if params["quick"] else study_share(
                json.loads((ROOT / RESULTS / STUDY).read_text(encoding="utf-8")), task)
        return Prepared(sides=sides, facts=facts)
    features = {side: [pipe.preprocess(call, **options) for call in calls] for side, pipe in pipes.items()}
    if part == "forward":
        facts["work"] = {side: layer_work(features[side], facts["layers"][side]) for side in pipes}
        sides = {side: functools.partial(forward, pipe, features[side], batch) for side, pipe in pipes.items()}
    else:
        outputs = {side: forward(pipe, features[side], batch) for side, pipe in pipes.items()}
        sides = {side: functools.partial(pre_post, pipe, calls, outputs[side], options) for side, pipe in pipes.items()}
    return Prepared(sides=sides, facts=facts)


# --- the check -------------------------------------------------------------------------------------------

def malformed(task: str, answers: Sequence[Any], texts: Sequence[str]) -> str | None:
    """Why `answers` are not one well-formed answer per text, or None: SST-2's a label and its probability;
    CoNLL's a list of words, each labelled, its span inside the text, in text order."""
    if len(answers) != len(texts):
        return f"{len(answers)} answers for {len(texts)} texts"
    for index, (found, text) in enumerate(zip(answers, texts)):
        if task == "sst2":
            good = isinstance(found, dict) and isinstance(found.get("label"), str) and 0 <= found.get("score", -1) <= 1
        else:
            good = isinstance(found, list) and bool(found) and all(
                isinstance(word, dict) and isinstance(word.get("label"), str)
                and 0 <= word.get("start", -1) < word.get("end", -1) <= len(text) for word in found) and all(
                before["end"] <= after["start"] for before, after in zip(found, found[1:]))
        if not good:
            return f"text {index}: {str(found)[:200]}"
    return None


def score(task: str, answers: Sequence[Any], gold: Sequence[Any]) -> float:
    """The dev score of the answers: SST-2 accuracy; CoNLL entity F1, each file word taking the label of the
    pipeline's word that starts where it starts (its first piece's, as the fine-tuning evaluation labels a word;
    the pipeline's basic tokenizer splits some file words, "U.S." or "1-0", into several)."""
    if task == "sst2":
        return sum(found["label"] == label for found, label in zip(answers, gold)) / len(gold)
    from bertforge.tasks.conll import ner_metrics

    predicted = []
    for words, (gold_words, _) in zip(answers, gold):
        label_at = {word["start"]: word["label"] for word in words}
        tags, start = [], 0
        for word in gold_words:  # the text is the file's words joined by single spaces
            tags.append(label_at.get(start, "O"))
            start += len(word) + 1
        predicted.append(tags)
    return ner_metrics([tags for _, tags in gold], predicted)["f1"]


def check(params: Params, outputs: dict[str, Any]) -> dict[str, Any]:
    """Raises unless every side answered every text well (`malformed`; a forward case: finite outputs, at least
    a row per text); a pipeline case's facts: each side's dev score on the texts."""
    import numpy as np

    task = params["task"]
    texts, gold = dev_rows(task, params["texts"], params["quick"])
    for side, found in outputs.items():
        if params["part"] == "forward":
            rows_run = [row for call in found for row in call]
            problem = None if len(rows_run) >= len(texts) and all(
                np.isfinite(value).all() for row in rows_run for value in row.values()) else "outputs not finite"
        else:
            problem = malformed(task, found, texts)
        if problem:
            raise ValueError(f"{NAME} {params} {side}: {problem}")
    if params["part"] != "pipeline":
        return {}
    return {"dev_score": {side: score(task, found, gold) for side, found in outputs.items()}}


# --- reading a result ------------------------------------------------------------------------------------

def case(result: dict[str, Any], task: str, dtype: str = "fp32", part: str = "pipeline") -> dict[str, Any]:
    """The result's case of `task` at `dtype` timing `part`."""
    for found in result["cases"]:
        if (found["params"]["task"], found["params"]["dtype"], found["params"]["part"]) == (task, dtype, part):
            return found
    raise ValueError(f"{NAME}: no {task} {dtype} {part} case in the result")


def bound(result: dict[str, Any], task: str, side: str = GOAL_SIDE) -> dict[str, float]:
    """`side`'s speed-up over the teacher at fp32 with nothing but the linear layers' work costing time
    (`layers_only`), and with each model's measured tokenizing and labelling beside its forward pass, the
    teacher's forward pass scaled by the share of the work (`with_pre_post`)."""
    work, outside = case(result, task, part="forward"), case(result, task, part="pre_post")
    share = work["facts"]["work"][side]["units"] / work["facts"]["work"]["teacher"]["units"]
    run = work["sides"]["teacher"]["median"]
    pre_post_teacher, pre_post_student = (outside["sides"][name]["median"] for name in ("teacher", side))
    return {"layers_only": 1 / share,
            "with_pre_post": (run + pre_post_teacher) / (run * share + pre_post_student)}


def speedup(result: dict[str, Any], task: str, dtype: str, side: str) -> float:
    """`side`'s texts per second at `dtype` over the teacher's at fp32."""
    return case(result, task)["sides"]["teacher"]["median"] / case(result, task, dtype)["sides"][side]["median"]


def goal(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per task, the goal for the 3-layer student at fp32 and int8 (`GOAL`): the share kept (the study's, at
    int8 scaled by the student's int8 / fp32 dev scores; None without a study), its speed-up over the teacher's
    fp32 and whether both reach the goal (`met`); and its fp32 `bound`."""
    found: dict[str, dict[str, Any]] = {}
    for task, _ in DISTILL_TASKS:
        fp32 = case(result, task)["facts"]
        study = fp32.get("study")
        found[task] = {"bound": bound(result, task)}
        for dtype, (kept_goal, speed_goal) in GOAL.items():
            scores = case(result, task, dtype)["facts"]["dev_score"]
            base = fp32["dev_score"][GOAL_SIDE]
            kept = None if study is None else study["pct_of_teacher"] * (scores[GOAL_SIDE] / base if base else 1.0)
            fast = speedup(result, task, dtype, GOAL_SIDE)
            found[task][dtype] = {"pct_of_teacher": kept, "speedup": fast,
                                  "met": kept is not None and kept >= kept_goal and fast >= speed_goal}
    return found


def table(result: dict[str, Any]) -> str:
    """Per task, the teacher and each student: texts per second per dtype, the speed-up over the teacher's fp32
    and the pipeline's dev score; bold: the goal's student's speed-ups where its goal is met."""
    verdicts = goal(result)
    body = []
    for task, _ in DISTILL_TASKS:
        fp32 = case(result, task)
        for side in SIDES:
            layers = fp32["facts"]["layers"][side]
            timed = {dtype: case(result, task, dtype) for dtype in DTYPES}
            met = {dtype: side == GOAL_SIDE and verdicts[task].get(dtype, {}).get("met", False) for dtype in DTYPES}
            rates = [found["facts"]["rows"] / found["sides"][side]["median"] for found in timed.values()]
            body.append([NAMES[task], f"teacher, {layers} layers" if side == "teacher" else f"{layers} layers",
                         *(f"{rate:,.0f}" for rate in rates),
                         " / ".join(bold(times(speedup(result, task, dtype, side)), met[dtype]) for dtype in DTYPES),
                         " / ".join(points(found["facts"]["dev_score"][side]) for found in timed.values())])
    return rows(["task", "model", *(f"{dtype} ex/s" for dtype in DTYPES),
                 f"over the teacher's fp32: {' / '.join(DTYPES)}", f"pipeline's dev score: {' / '.join(DTYPES)}"], body)


# --- results written before the harness ------------------------------------------------------------------

def adapt(files: dict[str, Any]) -> dict[str, Any]:
    """The `legacy` adaptor: distill.py's former `--throughput` (distill/distill.json, with the
    `throughput_provenance` block added when it was adapted) in the schema. Its timed passes are the pipeline
    cases' repeats; its fp32 stage passes kept only their medians (ms per example, times the rows: each
    part's one repeat), the forward passes' as `forward`, the tokenizing's and labelling's as `pre_post`; its
    work counts and dev scores are the facts, and the share kept is read from its study as a run reads it."""
    [old] = files.values()
    result = {**legacy.header(NAME, f"python -m benchmarks run {NAME}", [old["throughput_provenance"]], {},
                              round(old["load_average_throughput"], 2)),
              "threads": old["threads"], "warmup": 1, "cases": []}
    for task, _ in DISTILL_TASKS:
        entry = old["throughput"][task]
        models, count = entry["models"], entry["rows"]
        for dtype, part in PARTS:
            facts: dict[str, Any] = {"rows": count, "layers": {side: models[side]["layers"] for side in SIDES}}
            if part == "pipeline":
                timed = {side: models[side]["dtypes"][dtype] for side in SIDES}
                facts["dev_score"] = {side: found["dev_score"] for side, found in timed.items()}
                if dtype == "fp32":
                    facts["study"] = study_share(old, task)
                sides = {side: legacy.side_from_seconds(found["seconds"]) for side, found in timed.items()}
            else:
                stages = {side: models[side]["stages_fp32_ms_per_example"] for side in SIDES}
                if part == "forward":
                    facts["work"] = {side: models[side]["work"] for side in SIDES}
                sides = {side: legacy.side_from_seconds([count / 1e3 * (
                    found["run"] if part == "forward" else found["preprocess"] + found["postprocess"])])
                    for side, found in stages.items()}
            result["cases"].append({"params": {"task": task, "dtype": dtype, "part": part, "texts": TEXTS,
                                               "batch_size": old["batch_size"], "quick": False},
                                    "facts": facts, "sides": sides})
    return result


BENCHMARKS = (
    Benchmark(name=NAME, figure='''BENCHMARKS.md, "Distilled students' throughput"''', sides=SIDES, cases=cases,
              setup=setup, check=check, table=table, result="distill/speed.json", legacy=adapt,
              legacy_files=(STUDY,), repeats=15, quick_repeats=1),
)
