"""The outputs of `bertforge reproduce`: OUT/results.json, OUT/table.md and OUT/plots/*.png.

`results.json` holds everything measured (per variant: the held-out pre-training curve and, per task,
every seed's score with their mean and sample std); `table.md` and the plots are drawn from it alone, so
they can be redrawn from a results.json (`write_table`, `write_plots`). Scores are percentages: accuracy,
or entity F1 for the token tasks. The paper's numbers stand beside the miniature's: in the same row
where the rows are the paper's (Tables 5 and 7), in a table of their own for Table 6 (other sizes).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .._files import write_text_atomic
from ..metrics.glue import main_metric
from ..training.finetune import describe
from .downstream import PAPER_SHAPE
from .settings import PAPER

TITLES = {"table5": "Table 5 in miniature: ablation over the pre-training tasks",
          "table6": "Table 6 in miniature: ablation over model size",
          "table7": "Table 7 in miniature: feature-based vs fine-tuning (token tasks)"}
TASK_LABELS = {"genre": "genre (acc)", "reply": "reply (acc)", "continuation": "continuation (acc)",
               "names": "names (F1)", "conll": "CoNLL-2003 (F1)"}
GLUE_NAMES = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP", "mnli": "MNLI",
              "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
_SHORT = {"accuracy": "acc", "f1": "F1", "mcc": "MCC", "pearson": "Pearson"}


def task_label(task: str) -> str:
    """A task's column heading: its name and metric ("genre (acc)", "MRPC (F1)")."""
    if task in TASK_LABELS:
        return TASK_LABELS[task]
    metric = main_metric(task)
    return f"{GLUE_NAMES.get(task, task)} ({_SHORT.get(metric, metric)})"


def paper_number(value: float | int) -> str:
    """A number as the paper prints it: integers as they are, perplexities with two decimals, scores one."""
    if isinstance(value, (int, str)):
        return str(value)
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def cell(scores: dict | None) -> str:
    """"57.3 ± 1.2" (mean ± sample std over seeds), "—" for no cell."""
    if not scores:
        return "—"
    return f"{scores['mean']:.1f} ± {scores['std']:.1f}"


def _held_out(variant: dict) -> str:
    curve = variant["pretraining"]["curve"]
    if not curve:
        return "—"
    last = curve[-1]
    kind = "LM" if last["objective"] == "ltr" else "MLM"
    return f"{last['loss']:.3f} ({kind} ppl {math.exp(min(last['loss'], 700)):.1f})"


def paired_differences(results: dict) -> dict[str, dict[str, dict]]:
    """{variant key: {task: describe(score - first row's score)}} over the seeds both rows ran, for every row
    but the first. The same fine-tuning seed gives both runs the same head initialisation and data order,
    so the per-seed difference is the variant's effect with that noise shared."""
    first, *others = results["variants"]
    differences = {}
    for variant in others:
        cells = {}
        for task, scores in variant["tasks"].items():
            reference = {r["seed"]: r["score"] for r in first["tasks"].get(task, {}).get("runs", [])}
            values = [r["score"] - reference[r["seed"]] for r in scores["runs"] if r["seed"] in reference]
            if values:
                cells[task] = describe(values)
        differences[variant["key"]] = cells
    return differences


def _signed(scores: dict | None) -> str:
    return "—" if not scores else f"{round(scores['mean'], 1) + 0.0:+.1f} ± {scores['std']:.1f}"


def _difference_table(results: dict) -> list[str]:
    """The rows after the first, as paired differences from it."""
    first, tasks = results["variants"][0], results["tasks"]
    differences = paired_differences(results)
    lines = ["", f"Differences from the first row ({first['name']}), paired by fine-tuning seed (mean ± sample std of "
             "the per-seed differences, points):", "",
             "| " + " | ".join(["row"] + [task_label(t) for t in tasks]) + " |", "|" + "---|" * (len(tasks) + 1)]
    lines += ["| " + " | ".join([v["name"]] + [_signed(differences[v["key"]].get(t)) for t in tasks]) + " |"
              for v in results["variants"][1:]]
    return lines


def table_markdown(results: dict) -> str:
    """table.md's text: the table, the paper's numbers, and how it was made."""
    table, tasks, settings = results["table"], results["tasks"], results["settings"]
    paper = PAPER[table]
    lines = [f"# {TITLES[table]}", ""]
    if table == "table6":
        head = ["#L", "#H", "#A", "parameters", "held-out MLM loss (ppl)"] + [task_label(t) for t in tasks]
        rows = [[*map(str, v["size"]), f"{v['parameters'] / 1e6:.2f}M", _held_out(v)] +
                [cell(v["tasks"].get(t)) for t in tasks] for v in results["variants"]]
    else:
        head = ["variant" if table == "table5" else "approach", "held-out loss (ppl)"] + \
            [task_label(t) for t in tasks] + [f"paper: {c}" for c in paper["columns"]]
        rows = [[v["name"], _held_out(v)] + [cell(v["tasks"].get(t)) for t in tasks] +
                [paper_number(x) for x in paper["rows"].get(v["key"], ["—"] * len(paper["columns"]))]
                for v in results["variants"]]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    if table == "table6":
        lines += ["", "The paper (BERT pre-trained 1M steps; dev sets):", "",
                  "| " + " | ".join(paper["columns"]) + " |", "|" + "---|" * len(paper["columns"])]
        lines += ["| " + " | ".join(paper_number(x) for x in row) + " |" for row in paper["rows"]]
    if len(results["variants"]) > 1:
        lines += _difference_table(results)
    baselines = ", ".join(f"{t} {b:.1f}" for t, b in results.get("baselines", {}).items())
    lines += ["", f"Mean ± sample std over {settings['seeds']} fine-tuning seed(s) of dev scores in percent "
              f"(the metric in each column's heading), each run's best epoch on dev; majority class / chance: "
              f"{baselines or 'n/a'}.",
              f"Fine-tuning ({'the Fine-tuning row' if table == 'table7' else 'every row'}): "
              f"lr {settings['finetune_lr']:g}, batch {settings['finetune_batch_size']}, "
              f"{settings['finetune_epochs']:g} epochs.",
              f"Every variant pre-trained {settings['steps']} steps of {settings['batch_size']} sequences on the same "
              f"batches in the same order ({settings['corpus']}, seed {settings['seed']}); held-out loss on plays "
              "never pre-trained on (masked LM; the LTR model's is next-token loss, not comparable).",
              "Task shapes: " + "; ".join(f"{t}: {PAPER_SHAPE.get(t, 'token (NER)' if t == 'conll' else 'GLUE')}"
                                         for t in tasks) + "."]
    if table == "table5":
        lines.append(f"The + BiLSTM row fine-tunes the LTR model with a randomly initialised BiLSTM "
                     f"({settings['lstm_hidden']} per direction) on top: under the token classifier, and as the "
                     "sentence vector (its two directions' final states) for the other tasks. The LTR row's "
                     "sentence-level tasks read its last token ([SEP], the only one a causal encoder lets read "
                     "the whole input) instead of [CLS], as OpenAI GPT does.")
    if table == "table7":
        lines.append("Feature-based rows: the pre-trained encoder frozen, the chosen hidden states of each word's "
                     f"first sub-token fed to a 2-layer BiLSTM ({settings['lstm_hidden']} per direction; the "
                     f"paper: 768), {settings['feature_epochs']:g} epochs at lr {settings['feature_lr']:g}; "
                     "Sum All Layers sums every encoder layer. "
                     f"CoNLL-2003: the first {settings['ner_train_sentences']} training and "
                     f"{settings['ner_dev_sentences']} dev sentences.")
    stages = results.get("stage_seconds", {})
    lines += [f"Compute: data {stages.get('data', 0) / 60:.1f} min, pre-training {stages.get('pretrain', 0) / 60:.1f} "
              f"min, fine-tuning {stages.get('finetune', 0) / 60:.1f} min (every stage that ran, journal.jsonl); "
              f"this invocation {results['wall_seconds'] / 60:.1f} min (finished stages are read back). "
              f"Plots: plots/pretraining_loss.png, plots/downstream.png.", ""]
    return "\n".join(lines)


def write_table(results: dict, output_dir: Path) -> Path:
    """OUT/table.md from a results dict; returns its path."""
    path = output_dir / "table.md"
    write_text_atomic(path, table_markdown(results))
    return path


def write_results(results: dict, output_dir: Path) -> Path:
    """OUT/results.json; returns its path."""
    path = output_dir / "results.json"
    write_text_atomic(path, json.dumps(results, indent=2, default=str) + "\n")
    return path


def write_plots(results: dict, output_dir: Path) -> list[Path]:
    """plots/pretraining_loss.png (held-out loss against steps, one line per pre-trained model) and
    plots/downstream.png (one panel per task, a bar per variant, error bars ± one std)."""
    import matplotlib  # optional extra
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt  # optional extra

    directory = output_dir / "plots"
    directory.mkdir(parents=True, exist_ok=True)
    figure, axis = plt.subplots(figsize=(7, 4.5))
    seen = set()
    for variant in results["variants"]:
        curve = variant["pretraining"]["curve"]
        if variant["pretrain"] in seen or not curve:
            continue
        seen.add(variant["pretrain"])
        kind = "next-token" if curve[-1]["objective"] == "ltr" else "masked LM"
        label = variant["name"] if results["table"] != "table7" else variant["pretrain"]
        axis.plot([p["step"] for p in curve], [p["loss"] for p in curve], marker="o", label=f"{label} ({kind})")
    axis.set_xlabel("pre-training step")
    axis.set_ylabel("held-out loss")
    axis.set_title(TITLES[results["table"]], fontsize=10)
    axis.legend(fontsize=8)
    figure.tight_layout()
    paths = [directory / "pretraining_loss.png"]
    figure.savefig(paths[0], dpi=120)
    plt.close(figure)

    tasks = results["tasks"]
    figure, axes = plt.subplots(1, len(tasks), figsize=(3.6 * len(tasks), 4), squeeze=False)
    for axis, task in zip(axes[0], tasks):
        cells = [(v["name"], v["tasks"].get(task)) for v in results["variants"]]
        cells = [(name, scores) for name, scores in cells if scores]
        positions = range(len(cells))
        axis.bar(positions, [s["mean"] for _, s in cells], yerr=[s["std"] for _, s in cells], capsize=4,
                 color=[f"C{i}" for i in positions])
        axis.set_xticks(list(positions), [name for name, _ in cells], rotation=35, ha="right", fontsize=7)
        if task in results.get("baselines", {}):
            axis.axhline(results["baselines"][task], color="grey", linestyle="--", linewidth=1)
        axis.set_title(task_label(task), fontsize=9)
    figure.tight_layout()
    paths.append(directory / "downstream.png")
    figure.savefig(paths[1], dpi=120)
    plt.close(figure)
    return paths
