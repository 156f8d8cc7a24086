"""RESULTS.md's quality tables as reports (see report.py): each reads the result files under docs/results/
that the table's runs wrote, and writes the table from them, so that no figure is typed by hand.

The statistics are those the runs wrote or, where a table pools runs written at different times (GLUE's
seeds 45-46, SST-2's kept runs), recomputed over the pooled runs as bertforge's `describe` computes them
(mean and sample std); points are the fractions × 100 at two decimals. What a table does not take from its
files is declared here, beside it: the rows' labels and order, and which figures are bold where the bold is
an emphasis rather than a rule (distillation's headline figures).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Callable, Iterable, Sequence

import numpy as np

from .report import Report, Sources


def describe(values: Sequence[float]) -> dict[str, float]:
    """Mean, sample std (0 for one value), min, max and n: bertforge.training.finetune.describe, without
    importing bertforge (and torch) to render a table."""
    array = np.asarray(values, dtype=np.float64)
    return {"mean": float(array.mean()), "std": float(array.std(ddof=1)) if len(array) > 1 else 0.0,
            "min": float(array.min()), "max": float(array.max()), "n": int(len(array))}


def points(value: float) -> str:
    """A fraction as points, two decimals."""
    return f"{100 * value:.2f}"


def mean_std(stats: dict[str, float], scale: float = 100, digits: int = 2) -> str:
    """`mean ± std`, scaled (fractions to points by default)."""
    return f"{scale * stats['mean']:.{digits}f} ± {scale * stats['std']:.{digits}f}"


def bold(text: str, when: bool = True) -> str:
    """Markdown bold, when asked."""
    return f"**{text}**" if when else text


def rate(lr: float) -> str:
    """A learning rate as the docs write it: 5e-5, 1e-4."""
    mantissa, exponent = f"{lr:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def rows(header: Sequence[str], body: Iterable[Sequence[str]]) -> str:
    """A Markdown table."""
    def line(cells: Sequence[str]) -> str:
        return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"

    return "\n".join([line(header), "|" + "---|" * len(header), *map(line, body)])


def half_up(value: float, digits: int) -> str:
    """A figure the JSON stores already rounded (6.5595), rounded again as its decimal text reads (6.560),
    not as its binary double does (6.559)."""
    return str(Decimal(repr(value)).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


# --- GLUE -------------------------------------------------------------------------------------------

GLUE_TASKS = (  # (task, results folder, bertforge's summaries, kept runs' eval_results, lr cell's note)
    ("MRPC", "glue_mrpc", ("bertforge_lr_grid.json", "bertforge_lr2e-5.json", "bertforge_lr_grid_seeds45-46.json"),
     (), ""),
    ("CoLA", "glue_cola", ("bertforge_lr_grid.json", "bertforge_lr2e-5.json"), (), ""),
    ("RTE", "glue_rte", ("bertforge_lr_grid.json", "bertforge_lr2e-5.json"), (), ""),
    ("STS-B", "glue_stsb", ("bertforge_lr_grid.json", "bertforge_lr_grid_seeds45-46.json"), (), ""),
    ("SST-2", "glue_sst2", (), ("bertforge_lr2e-5_seed42.json", "bertforge_lr2e-5_seed43.json",
                                "bertforge_lr2e-5_seed44.json"), "not searched"),
)
METRIC_NAMES = {"f1": "F1", "accuracy": "accuracy", "mcc": "MCC", "pearson": "Pearson", "spearman": "Spearman"}


def glue_ours(sources: Sources, folder: str, summaries: Sequence[str],
              kept: Sequence[str]) -> dict[float, list[dict]]:
    """bertforge's runs by learning rate, pooled over its summaries (`finetune glue --seeds/--lr-grid`) and
    kept runs (an `eval_results.json` whose name gives lr and seed); a (lr, seed) given twice keeps the
    later file's run."""
    runs: dict[tuple[float, int], dict] = {}
    for name in summaries:
        for run in sources[f"{folder}/{name}"]["runs"]:
            runs[(float(run["lr"]), run["seed"])] = run
    for name in kept:
        lr, seed = name.removesuffix(".json").split("_lr")[1].split("_seed")
        runs[(float(lr), int(seed))] = {**sources[f"{folder}/{name}"], "lr": float(lr), "seed": int(seed)}
    by_lr: dict[float, list[dict]] = {}
    for (lr, _), run in sorted(runs.items()):
        by_lr.setdefault(lr, []).append(run)
    return by_lr


def glue_peer(sources: Sources, folder: str) -> dict[float, list[dict]]:
    """The peer's runs by learning rate, pooled over its files (`glue_peer.py`, one per rate and seed group)."""
    by_lr: dict[float, dict[int, dict]] = {}
    for name, data in sources.items():
        if name.startswith(f"{folder}/transformers_"):
            for run in data["runs"]:
                by_lr.setdefault(float(data["lr"]), {})[run["seed"]] = run
    return {lr: [runs[seed] for seed in sorted(runs)] for lr, runs in by_lr.items()}


def summarize(runs: list[dict]) -> dict[str, dict[str, float]]:
    """Each metric every run reports, described over the runs."""
    names = sorted(set.intersection(*(set(run["metrics"]) for run in runs)))
    return {name: describe([run["metrics"][name] for run in runs]) for name in names}


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task's comparison: each side at its best learning rate (by mean main dev metric, as
    `--lr-grid` picks it), every metric described over that rate's runs."""

    task: str
    main: str  # the main metric's key
    lrs: str  # the learning-rate cell: one rate, or bertforge's / the peer's
    seeds: str  # seeds a side: one count, or the two sides' counts
    ours: dict[str, dict[str, float]]
    peer: dict[str, dict[str, float]]
    ours_by_lr: dict[float, list[dict]]  # every run, by learning rate
    peer_by_lr: dict[float, list[dict]]
    ours_lr: float  # each side's best rate
    peer_lr: float

    def bar(self, metric: str) -> float:
        """The goal's bar on `metric`: the peer's mean − ½ its std."""
        return self.peer[metric]["mean"] - self.peer[metric]["std"] / 2

    def met(self, metric: str) -> bool:
        """Whether bertforge's mean reaches the bar."""
        return self.ours[metric]["mean"] >= self.bar(metric)


def glue_task(sources: Sources, task: str) -> GlueTask:
    """One task of `GLUE_TASKS` as its table row, its headline figure and its seeds table read it."""
    _, folder, summaries, kept, note = next(entry for entry in GLUE_TASKS if entry[0] == task)
    ours_by_lr = glue_ours(sources, folder, summaries, kept)
    peer_by_lr = glue_peer(sources, folder)
    first = sources[f"{folder}/{(summaries or kept)[0]}"]
    main = first.get("main_metric") or next(iter(first["metrics"]))
    ours_lr = max(ours_by_lr, key=lambda lr: summarize(ours_by_lr[lr])[main]["mean"])
    peer_lr = max(peer_by_lr, key=lambda lr: summarize(peer_by_lr[lr])[main]["mean"])
    seeds = {len(ours_by_lr[ours_lr]), len(peer_by_lr[peer_lr])}
    lrs = rate(ours_lr) if note and ours_lr == peer_lr else f"{rate(ours_lr)} / {rate(peer_lr)}"
    lrs += f" ({note})" if note else ""
    return GlueTask(task, main, lrs, " / ".join(map(str, sorted(seeds))), summarize(ours_by_lr[ours_lr]),
                    summarize(peer_by_lr[peer_lr]), ours_by_lr, peer_by_lr, ours_lr, peer_lr)


def glue_tasks(sources: Sources) -> list[GlueTask]:
    """Every task of `GLUE_TASKS`, in its order."""
    return [glue_task(sources, task) for task, *_ in GLUE_TASKS]


def glue_table(sources: Sources) -> str:
    """Per task, each side at its best learning rate (`glue_tasks`): mean ± std per metric, the goal's bar
    (the peer's mean − ½ its std) and whether bertforge's mean reaches it; the higher mean bold."""
    body = []
    for found in glue_tasks(sources):
        ours, peer = found.ours, found.peer
        for metric in [found.main] + sorted(set(ours) - {found.main}):
            if metric not in peer:
                continue
            mine, theirs = ours[metric], peer[metric]
            higher = mine["mean"] >= theirs["mean"]
            body.append([found.task, METRIC_NAMES.get(metric, metric), found.seeds, found.lrs,
                         bold(mean_std(mine), higher), bold(mean_std(theirs), not higher), points(found.bar(metric)),
                         "yes" if found.met(metric) else "no"])
    return rows(["task", "metric", "seeds a side", "lr (bertforge / peer)", "bertforge", "transformers",
                 "peer mean − ½ std", "goal met"], body)


def glue_seeds_table(task: str) -> Callable[[Sources], str]:
    """The `glue-<task>-seeds` table of docs/results/<folder>/README.md: the main metric at every learning
    rate on each side (mean ± std over its seeds, n), then each seed's scores at each side's best rate (the
    rate RESULTS.md's row reports), so that a reader sees what the pooled means are made of."""

    def table(sources: Sources) -> str:
        found = glue_task(sources, task)
        main, name = found.main, METRIC_NAMES.get(found.main, found.main)

        def cell(runs: list[dict] | None) -> str:
            return f"{mean_std(summarize(runs)[main])} (n={len(runs)})" if runs else "–"

        grid = rows(["lr", f"bertforge {name}", f"transformers {name}"],
                    [[rate(lr), cell(found.ours_by_lr.get(lr)), cell(found.peer_by_lr.get(lr))]
                     for lr in sorted({*found.ours_by_lr, *found.peer_by_lr}, reverse=True)])
        metrics = [main] + sorted(set(found.ours) - {main})
        ours, peer = ({run["seed"]: run for run in runs}
                      for runs in (found.ours_by_lr[found.ours_lr], found.peer_by_lr[found.peer_lr]))
        names = " / ".join(METRIC_NAMES.get(metric, metric) for metric in metrics)

        def scores(run: dict | None) -> str:
            return " / ".join(points(run["metrics"][metric]) for metric in metrics) if run else "–"

        seeds = rows(["seed", f"bertforge {names} (lr {rate(found.ours_lr)})",
                      f"transformers {names} (lr {rate(found.peer_lr)})"],
                     [[str(seed), scores(ours.get(seed)), scores(peer.get(seed))] for seed in sorted({*ours, *peer})])
        return f"{grid}\n\n{seeds}"

    return table


def minus(text: str) -> str:
    """A typographic minus for a negative figure, as the docs print them."""
    return text.replace("-", "−")


def seed_range(seeds: Sequence[int]) -> str:
    """Consecutive seeds as a range (42–46), any others listed."""
    ordered = sorted(seeds)
    if len(ordered) > 1 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}–{ordered[-1]}"
    return ", ".join(map(str, ordered))


# --- CoNLL-2003 NER -----------------------------------------------------------------------------------

def ner_peer_runs(sources: Sources) -> list[dict]:
    """The peer's runs (`ner_peer.py`, a file per seed), by seed."""
    return sorted((run for name, data in sources.items() if name.startswith("ner/transformers_seed")
                   for run in data["runs"]), key=lambda run: run["seed"])


def ner_table(sources: Sources) -> str:
    """Each side's dev entity F1 over its seeds and the range of its runs' wall time. Bold: the higher of
    the two sides at the sentence level, and document context where it is above both."""
    ours = sources["ner/bertforge_summary.json"]
    context = sources["ner/bertforge_document_context_summary.json"]
    peer_runs = ner_peer_runs(sources)
    peer = describe([run["f1"] for run in peer_runs])

    def wall(seconds: list[float]) -> str:
        return f"{min(seconds):,.0f}–{max(seconds):,.0f} s"

    best = max(ours["metrics"]["f1"]["mean"], peer["mean"])
    return rows(["run", "seeds", "dev entity F1", "wall per seed"], [
        ["bertforge", seed_range([run["seed"] for run in ours["runs"]]),
         bold(mean_std(ours["metrics"]["f1"]), ours["metrics"]["f1"]["mean"] == best),
         wall([run["wall_seconds"] for run in ours["runs"]])],
        ["transformers", seed_range([run["seed"] for run in peer_runs]),
         bold(mean_std(peer), peer["mean"] == best), wall([run["seconds"] for run in peer_runs])],
        ["bertforge, `--document-context`", seed_range([run["seed"] for run in context["runs"]]),
         bold(mean_std(context["metrics"]["f1"]), context["metrics"]["f1"]["mean"] > best),
         wall([run["wall_seconds"] for run in context["runs"]])],
    ])


# --- SQuAD --------------------------------------------------------------------------------------------

def squad_table(sources: Sources) -> str:
    """`squad_side_by_side.py`'s means ± std over seeds, in the official scripts' points; bertforge's F1
    bold (the figure of the goal). The "always no answer" row is the share of unanswerable questions in
    the v2.0 dev half: the official script's totals weight HasAns and NoAns by their counts, so any run's
    scores give it, (HasAns_exact − exact) / (HasAns_exact − NoAns_exact)."""
    def cells(scores: dict[str, dict[str, float]], ours: bool) -> list[str]:
        row = [mean_std(scores["exact"], 1), bold(mean_std(scores["f1"], 1), ours)]
        if "HasAns_f1" not in scores:  # v1.1: no unanswerable questions
            return row + ["", "", ""]
        threshold = minus(f"{scores['best_f1_thresh']['mean']:.1f}")
        return row + [mean_std(scores["HasAns_f1"], 1), mean_std(scores["NoAns_exact"], 1),
                      f"{mean_std(scores['best_f1'], 1)} ({threshold})"]

    v1, v2, v2_3 = (sources[f"squad/{name}.json"]["sides"] for name in ("v1.1", "v2.0", "v2.0_3_epochs"))
    run = next(iter(v2["bertforge"]["runs"].values()))["scores"]
    unanswerable = (run["HasAns_exact"] - run["exact"]) / (run["HasAns_exact"] - run["NoAns_exact"])
    always = f"{100 * unanswerable:.2f}"
    body = [["**v1.1** bertforge", *cells(v1["bertforge"]["scores"], True)],
            ["**v1.1** transformers (run_qa + utils_qa)", *cells(v1["peer"]["scores"], False)],
            ['v2.0, always "no answer"', always, always, "0.00", "100.00", ""]]
    for sides, epochs in ((v2, 2), (v2_3, 3)):
        body.append([f"v2.0 bertforge, {epochs} epochs", *cells(sides["bertforge"]["scores"], True)])
        body.append([f"v2.0 transformers, {epochs} epochs", *cells(sides["peer"]["scores"], False)])
    return rows(["", "EM", "F1", "HasAns F1", "NoAns (EM = F1)", "best F1 (its threshold)"], body)


# --- Distillation -------------------------------------------------------------------------------------

DISTILL_ROWS = (  # each student size's rows: (label, file: "" for distill.json, objective, augmented copies)
    ("{n} layers, distilled", "", "distill", 0),
    ("{n} layers, distilled + hidden states and attention maps{tinybert}", "intermediate", "intermediate", 0),
    ("{n} layers, labels only", "", "labels", 0),
    ("{n} layers, distilled, + 1 augmented copy of each sentence", "", "distill", 1),
)
DISTILL_TASKS = (("sst2", "SST-2 (accuracy)"), ("conll", "CoNLL-2003 (entity F1)"))
DISTILL_BOLD = {  # the headline figures the table marks: (task, layers, row's key) -> (bold score, bold %)
    ("sst2", 3, "distill"): (True, True), ("sst2", 3, "distill+aug"): (True, True),
    ("sst2", 2, "distill"): (True, False), ("sst2", 2, "distill+aug"): (True, False),
    ("conll", 3, "distill"): (True, True), ("conll", 3, "distill, 4 epochs"): (True, True),
    ("conll", 2, "distill"): (True, False), ("conll", 2, "distill+aug"): (True, False),
}


DISTILL_FILES = {"": "distill/distill.json", "intermediate": "distill/intermediate.json",
                 "4 epochs": "distill/conll_4_epochs.json"}  # a group's file, by the key DISTILL_ROWS give it


def distill_group(sources: Sources, file: str, task: str, layers: int, objective: str, augment: int) -> dict:
    """One group of students (`distill.py`'s summary: seeds, score, % of the teacher, agreement) from the file
    `DISTILL_FILES[file]`."""
    [found] = [g for g in sources[DISTILL_FILES[file]]["study"][task]["summary"]
               if (g["layers"], g["objective"], g["augment"]) == (layers, objective, augment)]
    return found


def distill_table(sources: Sources) -> str:
    """`benchmarks/distill.py`'s groups: the teacher, then per student size each objective (and CoNLL's
    4-epoch runs after the 3-layer ones), mean ± std over seeds, % of the teacher, agreement with it."""
    def group(file: str, task: str, layers: int, objective: str, augment: int) -> dict:
        return distill_group(sources, file, task, layers, objective, augment)

    def row(title: str, label: str, task: str, layers: int, key: str, found: dict) -> list[str]:
        bold_score, bold_pct = DISTILL_BOLD.get((task, layers, key), (False, False))
        return [title, label, seed_range(found["seeds"]), bold(mean_std(found["score"]), bold_score),
                bold(f"{found['pct_of_teacher']:.1f}", bold_pct), f"{100 * found['teacher_agreement']['mean']:.1f}%"]

    body = []
    for task, title in DISTILL_TASKS:
        teacher = sources[DISTILL_FILES[""]]["study"][task]["teacher"]
        body.append([title, "teacher, 6 layers", "1", f"{100 * teacher['score']:.2f}", "100", ""])
        for layers in (3, 2):
            for label, file, objective, augment in DISTILL_ROWS:
                key = objective + ("+aug" if augment else "")
                tinybert = " (TinyBERT)" if (task, layers) == ("sst2", 3) else ""  # the method named once, first
                body.append(row(title, label.format(n=layers, tinybert=tinybert), task, layers, key,
                                group(file, task, layers, objective, augment)))
            if task == "conll" and layers == 3:
                for objective, label in (("distill", "distilled"), ("labels", "labels only")):
                    body.append(row(title, f"3 layers, {label}, 4 epochs", task, layers, f"{objective}, 4 epochs",
                                    group("4 epochs", task, layers, objective, 0)))
    return rows(["task (metric)", "model", "seeds", "dev score", "% of teacher", "agrees with the teacher"], body)


# --- Pre-training -------------------------------------------------------------------------------------

def pretrain_table(sources: Sources) -> str:
    """`pretrain_budget.py`'s final held-out evaluation of each side; bertforge's row bold but for NSP
    (neither side has learned it)."""
    body = []
    for name, label in (("ours", "bertforge"), ("peer", "transformers")):
        result = sources[f"pretrain_budget_mini/{name}.json"]
        ours = name == "ours"
        cells = [label, str(result["step"]), f"{result['eval_mlm_loss']:.3f}", f"{result['eval_perplexity']:.0f}",
                 f"{100 * result['eval_mlm_accuracy']:.2f}%"]
        body.append([bold(cell, ours) for cell in cells] + [f"{100 * result['eval_nsp_accuracy']:.1f}%"])
    return rows(["after 30 min of training", "steps", "held-out MLM loss", "perplexity", "MLM accuracy",
                 "NSP accuracy"], body)


def sst2_mini_table(sources: Sources) -> str:
    """Each arm's SST-2 dev accuracy by epoch and its best (the kept epoch), pre-trained and random
    weights side by side at each learning rate."""
    runs = sources["glue_sst2_mini_vs_random/sst2_runs.json"]
    body = []
    for lr in ("2e-5", "1e-4"):
        for start, label in (("pretrained", "pre-trained 30 min"), ("random", "random (BERT init)")):
            run = runs[f"{start}_lr{lr}"]
            body.append([label, rate(run["lr"]), *(f"{100 * acc:.2f}%" for acc in run["dev_accuracy_by_epoch"]),
                         bold(f"{100 * run['eval_results']['metrics']['accuracy']:.2f}%")])
    return rows(["initialisation", "lr", "SST-2 dev acc. after epoch 1", "epoch 2", "epoch 3", "**best**"], body)


# --- Task-adaptive pre-training ------------------------------------------------------------------------

def tapt_table(sources: Sources) -> str:
    """`benchmarks/tapt.py`'s arms per task: the held-out MLM loss of the continued pre-training (first and
    last evaluation), the best-epoch dev score over seeds, and the change from MiniLM directly."""
    def score(arm: dict) -> str:  # tapt.py writes points at two decimals
        return bold(f"{arm['mean']:.2f} ± {arm['std']:.2f}")

    def loss(pretraining: dict) -> str:
        return " → ".join(half_up(value, 3) for value in pretraining["heldout_mlm_loss_first_last"])

    def delta(points_: float) -> str:
        return bold(minus(f"{points_:+.2f}"))

    body = []
    for task, title, text in (("sst2", "SST-2 (acc.)", "SST-2's"), ("conll", "CoNLL-2003 (F1)", "CoNLL's")):
        result = sources[f"tapt_{task}/result.json"]
        arms = result["arms"]
        body.append([title, "MiniLM directly", "—", score(arms["direct"]), ""])
        body.append([title, f"continued on {text} text", loss(result["pretraining"]), score(arms["tapt"]),
                     delta(result["delta_points"])])
        if "tapt-vocab" in arms:
            body.append([title, f"continued, {result['vocabulary']['new_words']} `[unusedN]` slots given its words",
                         loss(result["pretraining_extended_vocab"]) + " (its own tokens)", score(arms["tapt-vocab"]),
                         delta(result["delta_points_vocab"])])
    seeds = {sources[f"tapt_{task}/result.json"]["seeds"] for task in ("sst2", "conll")}
    return rows(["task", "start of fine-tuning", "held-out MLM loss (step 100 → 1,000)",
                 f"dev, mean ± std ({' / '.join(map(str, sorted(seeds)))} seeds)", "Δ"], body)


GOEMOTIONS_SIDES = (("ours", "bertforge"), ("reference", "reference loop"))
GOEMOTIONS_SETTINGS = (("defaults", "defaults (fp32, shuffled)"), ("fast", "fast (bf16, length-grouped)"))


def goemotions_table(sources: Sources) -> str:
    """Issue 64's acceptance (`goemotions/acceptance.json`): per settings and side, dev macro- and micro-F1
    over seeds (the best epoch, the third in every run), the range of the tuned threshold, and the goal
    (bertforge's mean ≥ the reference loop's mean − ½ its std); the GoEmotions paper's figure beside."""
    result = sources["goemotions/acceptance.json"]
    body = []
    for settings, settings_text in GOEMOTIONS_SETTINGS:
        block = result[settings]
        means = {side: describe([r["macro_f1"] for r in block[side]["runs"]])["mean"]
                 for side, _ in GOEMOTIONS_SIDES if block[side]["runs"]}
        for side, side_text in GOEMOTIONS_SIDES:
            runs = block[side]["runs"]
            if not runs:
                continue
            macro = describe([r["macro_f1"] for r in runs])
            micro = describe([r["micro_f1"] for r in runs])
            thresholds = sorted(r["threshold"] for r in runs)
            goal, verdict = "", ""
            if side == "ours" and block.get("goal_macro_f1") is not None:
                goal = points(block["goal_macro_f1"])
                gap = 100 * (macro["mean"] - block["reference"]["summary"]["macro_f1"]["mean"])
                verdict = bold("yes" if block["goal_met"] else "no") + f" ({minus(f'{gap:+.2f}')} against the mean)"
            higher = len(means) == 2 and means[side] == max(means.values())  # bold: the higher of the two sides
            body.append([settings_text, side_text, ", ".join(str(r["seed"]) for r in runs),
                         bold(mean_std(macro), higher), mean_std(micro),
                         f"{thresholds[0]:.2f}–{thresholds[-1]:.2f}" if len(thresholds) > 1 else f"{thresholds[0]:.2f}",
                         goal, verdict])
    body.append(["", "the GoEmotions paper: BERT-base, 4 epochs, **test** split", "", "46", "", "", "", ""])
    return rows(["settings", "side", "seeds", "dev macro-F1", "dev micro-F1", "threshold", "reference mean − ½ std",
                 "goal met"], body)


def goemotions_seeds_table(sources: Sources) -> str:
    """Every acceptance run: dev macro-F1 after each epoch, the best, micro-F1, threshold and its commit."""
    result = sources["goemotions/acceptance.json"]
    body = []
    for settings, _ in GOEMOTIONS_SETTINGS:
        for side, side_text in GOEMOTIONS_SIDES:
            for run in result[settings][side]["runs"]:
                body.append([settings, side_text, str(run["seed"]),
                             " / ".join(points(v) for v in run["macro_f1_per_epoch"]), points(run["macro_f1"]),
                             points(run["micro_f1"]), f"{run['threshold']:.2f}", run["commit"]])
    return rows(["settings", "side", "seed", "dev macro-F1 by epoch 1 / 2 / 3", "best macro-F1", "micro-F1",
                 "threshold", "commit"], body)


def goemotions_labels_table(sources: Sources) -> str:
    """Each label's dev F1, the mean over the acceptance runs that recorded it, per settings and side (the
    reference loop records it from its fast runs on): where the two sides' macro-F1 differ."""
    result = sources["goemotions/acceptance.json"]
    columns = [(settings, side, f"{side_text}, {settings}")
               for settings, _ in GOEMOTIONS_SETTINGS for side, side_text in GOEMOTIONS_SIDES
               if any("per_label_f1" in run for run in result[settings][side]["runs"])]
    support = next(run["support"] for settings, _ in GOEMOTIONS_SETTINGS
                   for run in result[settings]["ours"]["runs"] if "support" in run)
    header = ["label", "dev support"]
    means = []
    for settings, side, text in columns:
        runs = [run["per_label_f1"] for run in result[settings][side]["runs"] if "per_label_f1" in run]
        header.append(f"{text} ({len(runs)} seeds)")
        means.append({label: float(np.mean([run[label] for run in runs])) for label in support})
    body = [[label, f"{support[label]:,}", *(points(column[label]) for column in means)]
            for label in sorted(support, key=lambda name: -support[name])]
    return rows(header, body)


HEAD_INIT = "goemotions/head_init.json"


def goemotions_head_init_table(sources: Sources) -> str:
    """The same seeds (the same batches and dropout masks) with the new head drawn from the paper's truncated
    normal and from transformers' plain normal: dev macro-F1 at each run's tuned threshold, then two
    threshold-free figures (macro average precision, mean binary cross-entropy), each "truncated → normal";
    each settings block's means last, the mean change in macro-F1 bold."""
    result = sources[HEAD_INIT]

    def pair_cells(old: Sequence[dict], new: Sequence[dict]) -> list[str]:
        def mean(runs: Sequence[dict], key: str) -> float:
            return float(np.mean([run[key] for run in runs]))

        return [f"{points(mean(old, 'macro_f1'))} → {points(mean(new, 'macro_f1'))}",
                f"{points(mean(old, 'macro_average_precision'))} → {points(mean(new, 'macro_average_precision'))}",
                f"{mean(old, 'mean_bce'):.4f} → {mean(new, 'mean_bce'):.4f}",
                f"{100 * (mean(new, 'macro_f1') - mean(old, 'macro_f1')):+.2f}"]

    body = []
    for settings, _ in GOEMOTIONS_SETTINGS:
        pairs = result[settings]
        if not pairs:
            continue
        body += [[settings, str(pair["seed"]), *pair_cells([pair["truncated_normal"]], [pair["normal"]])]
                 for pair in pairs]
        mean_row = pair_cells([pair["truncated_normal"] for pair in pairs], [pair["normal"] for pair in pairs])
        body.append([f"**{settings}**", f"mean of {len(pairs)}", *mean_row[:-1], bold(mean_row[-1])])
    return rows(["settings", "seed", "dev macro-F1", "macro average precision", "mean BCE", "macro-F1 change"], body)


def sentence_embedding_table(sources: Sources) -> str:
    """STS-B bi-encoders: each side's dev Spearman and Pearson (× 100) over its seeds, its fine-tuning wall time
    (median over seeds) and bertforge's speed against the peer; the goal Spearman ≥ the peer's mean − ½ std;
    the untouched checkpoint's zero-shot scores as the last row."""
    result = sources["sentence_embedding/stsb.json"]
    sides = result["sides"]
    stats = {side: {metric: describe([run[metric] for run in sides[side]["runs"]]) for metric in ("spearman", "pearson")}
             for side in sides}
    wall = {side: float(np.median([run["wall_s"] for run in sides[side]["runs"]])) for side in sides}
    goal = stats["peer"]["spearman"]["mean"] - stats["peer"]["spearman"]["std"] / 2
    met = stats["ours"]["spearman"]["mean"] >= goal
    labels = {"ours": "bertforge `finetune sentence-embedding`", "peer": "sentence-transformers (its loss, a plain loop)"}
    body = []
    for side in ("ours", "peer"):
        higher = stats[side]["spearman"]["mean"] == max(s["spearman"]["mean"] for s in stats.values())
        body.append([labels[side], ", ".join(str(run["seed"]) for run in sides[side]["runs"]),
                     bold(mean_std(stats[side]["spearman"]), higher), mean_std(stats[side]["pearson"]),
                     f"{wall[side]:.0f}", f"{wall['peer'] / wall['ours']:.2f}×" if side == "ours" else "",
                     f"{points(goal)}: {bold('yes' if met else 'no')}" if side == "ours" else ""])
    zero = result["zero_shot"]
    body.append(["the checkpoint before fine-tuning (zero-shot)", "", points(zero["spearman"]), points(zero["pearson"]),
                 "", "", ""])
    return rows(["side", "seeds", "dev Spearman", "dev Pearson", "fine-tuning s (median)", "speed (goal ≥ 1.5×)",
                 "goal: peer mean − ½ std"], body)


ACCURACY_BUDGET = 0.5  # points of dev accuracy bf16 or int8 inference may cost against fp32 (the inference issue's goal)
PEER_EXACT = ("peer_fp32", "peer_bf16", "peer_onnx")  # the peer's precisions written on one row when they agree


def accuracy_change(value: float) -> str:
    """A change in points, signed with a minus sign, two decimals (−0.12)."""
    return f"{value:.2f}".replace("-", "−")


def accuracy_table(sources: Sources) -> str:
    """`benchmarks/inference_accuracy.py`'s file: each side and precision's dev accuracy against bertforge's fp32,
    the predictions that changed and the largest logit difference; the peer's fp32, bf16 and fp32-on-ONNX
    Runtime on one row where their accuracies agree."""
    result = sources["inference/accuracy_sst2.json"]["results"]

    def accuracy(name: str) -> str:
        return f"{100 * result[name]['metrics']['accuracy']:.2f}%"

    def changed(name: str) -> str:
        return f"{result[name]['predictions_changed']} of {sources['inference/accuracy_sst2.json']['examples']}"

    def logit(value: float) -> str:
        return f"{value:.1e}" if value < 1e-3 else f"{value:.2g}" if value < 1 else f"{value:.2f}"

    body = [["bertforge fp32", accuracy("fp32"), "", "", "", ""]]
    for name in ("bf16", "int8"):
        change = result[name]["change_points"]["accuracy"]
        body.append([f"bertforge {name}", accuracy(name), bold(accuracy_change(change)), f"≤ {ACCURACY_BUDGET}",
                     changed(name), logit(result[name]["max_abs_logit_diff"])])
    labels = {"peer_fp32": "fp32 (eager, sdpa)", "peer_bf16": "bf16 (autocast)", "peer_onnx": "fp32 on ONNX Runtime"}
    if len({result[name]["metrics"]["accuracy"] for name in PEER_EXACT}) == 1:
        body.append([f"peer {', '.join(labels[name] for name in PEER_EXACT)}", accuracy("peer_fp32") + " each",
                     accuracy_change(result["peer_fp32"]["change_points"]["accuracy"]), "",
                     f"{max(result[name]['predictions_changed'] for name in PEER_EXACT)} of "
                     f"{sources['inference/accuracy_sst2.json']['examples']}",
                     ", ".join(logit(result[name]["max_abs_logit_diff"]) for name in PEER_EXACT)])
    else:
        for name in PEER_EXACT:
            body.append([f"peer {labels[name]}", accuracy(name),
                         accuracy_change(result[name]["change_points"]["accuracy"]), "", changed(name),
                         logit(result[name]["max_abs_logit_diff"])])
    body.append(["peer int8, ONNX Runtime `quantize_dynamic`", accuracy("peer_onnx_int8"),
                 accuracy_change(result["peer_onnx_int8"]["change_points"]["accuracy"]), "", changed("peer_onnx_int8"),
                 logit(result["peer_onnx_int8"]["max_abs_logit_diff"])])
    return rows(["side, precision", "dev accuracy", "change (points)", "goal", "predictions that differ from fp32",
                 "max abs logit diff"], body)


REPORTS = (
    Report(name="glue", figure='RESULTS.md, "GLUE: MRPC, CoLA, RTE, STS-B, SST-2"',
           sources=tuple(f"{folder}/{name}" for _, folder, summaries, kept, _ in GLUE_TASKS
                         for name in (*summaries, *kept, "transformers_*.json")),
           table=glue_table),
    *(Report(name=f"glue-{folder.removeprefix('glue_')}-seeds", figure=f"docs/results/{folder}/README.md, {task} at "
             "every learning rate and seed", sources=tuple(f"{folder}/{name}" for name in (*summaries, *kept,
                                                                                         "transformers_*.json")),
             table=glue_seeds_table(task)) for task, folder, summaries, kept, _ in GLUE_TASKS),
    Report(name="ner", figure='RESULTS.md, "CoNLL-2003 NER, fine-tuned"',
           sources=("ner/bertforge_summary.json", "ner/transformers_seed*.json",
                    "ner/bertforge_document_context_summary.json"), table=ner_table),
    Report(name="squad", figure='RESULTS.md, "SQuAD v1.1 and v2.0"',
           sources=("squad/v1.1.json", "squad/v2.0.json", "squad/v2.0_3_epochs.json"), table=squad_table),
    Report(name="distill",
           figure='RESULTS.md, "Distillation: 3- and 2-layer students of MiniLM on SST-2 and CoNLL-2003"',
           sources=("distill/distill.json", "distill/intermediate.json", "distill/conll_4_epochs.json"),
           table=distill_table),
    Report(name="pretrain-budget",
           figure='RESULTS.md, "Pre-training: 30 minutes of CPU, `mini`, bertforge against the peer"',
           sources=("pretrain_budget_mini/ours.json", "pretrain_budget_mini/peer.json"), table=pretrain_table),
    Report(name="sst2-mini-vs-random",
           figure='RESULTS.md, "Does pre-training pay? Pre-trained `mini` against random weights on SST-2"',
           sources=("glue_sst2_mini_vs_random/sst2_runs.json",), table=sst2_mini_table),
    Report(name="tapt",
           figure='''docs/results/tapt_conll/README.md, "Task-adaptive pre-training: MiniLM continued on a task's own text"''',
           sources=("tapt_sst2/result.json", "tapt_conll/result.json"), table=tapt_table),
    Report(name="goemotions", figure='RESULTS.md, "Multi-label classification: GoEmotions"',
           sources=("goemotions/acceptance.json",), table=goemotions_table),
    Report(name="sentence-embedding-stsb", figure='RESULTS.md, "Sentence embeddings: STS-B bi-encoders"',
           sources=("sentence_embedding/stsb.json",), table=sentence_embedding_table),
    Report(name="goemotions-seeds", figure="docs/results/goemotions/README.md, issue 64's acceptance per run",
           sources=("goemotions/acceptance.json",), table=goemotions_seeds_table),
    Report(name="accuracy", figure='BENCHMARKS.md, "bf16 and int8 accuracy"',
           sources=("inference/accuracy_sst2.json",), table=accuracy_table),
    Report(name="goemotions-labels", figure="docs/results/goemotions/README.md, each label's F1 by side",
           sources=("goemotions/acceptance.json",), table=goemotions_labels_table),
    Report(name="goemotions-head-init", figure="docs/results/goemotions/README.md, the new head's initialisation",
           sources=(HEAD_INIT,), table=goemotions_head_init_table),
)
