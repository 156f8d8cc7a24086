"""The detail pages' tables (docs/results/*/README.md) that RESULTS.md's and BENCHMARKS.md's headline rows
link to, as reports (see report.py), and those rows' answers, each a function of its report's sources.

Each table reads the files its run wrote, as results.py's do: what it does not take from them is declared
beside it (row labels and order, which figures are bold). The paper's figures printed beside the
miniature ablations are bertforge's own `reproduce.settings.PAPER`, and the attention rule the CPU-kernel
table marks is `modeling.attention`'s; both are read from bertforge's source rather than imported, since
importing bertforge imports torch and a report's module must stay cheap to import.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from typing import Any, Callable, Mapping, Sequence

from .harness import ROOT
from .report import Report, Sources
from .results import bold, half_up, mean_std, minus, points, rows

Cells = tuple[str, ...]  # a headline row's answer cells (headlines.Cells; that module imports this one)


@cache
def bertforge_constant(module: str, name: str) -> Any:
    """A module-level constant of bertforge's source (`module` under bertforge/), evaluated from its text
    without importing bertforge (and torch)."""
    path = ROOT / "bertforge" / module
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == name for target in node.targets):
            return eval(compile(ast.Expression(node.value), str(path), "eval"), {"__builtins__": {}})
    raise ValueError(f"bertforge/{module} assigns no {name}")


def paper(table: str) -> dict[str, Any]:
    """Devlin et al.'s Table 5, 6 or 7 as `bertforge reproduce` prints it beside the miniature."""
    return bertforge_constant("reproduce/settings.py", "PAPER")[table]


def grouped(value: float, digits: int) -> str:
    """A figure rounded as its decimal text reads (`half_up`), with thousands separators: 1,097.3."""
    return f"{Decimal(half_up(value, digits)):,.{digits}f}"


def signed(value: float, digits: int = 1) -> str:
    """A change with its sign, a typographic minus when negative: +8.1, −0.4."""
    return minus(f"{value:+.{digits}f}")


def superscript(exponent: int) -> str:
    """An exponent as superscript digits: 2²²."""
    return str(exponent).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))


def value_range(values: Sequence[float], digits: int = 2, unit: str = "×") -> str:
    """The smallest and the largest of `values` (`1.03–1.25×`), through headlines.span."""
    from .headlines import span  # headlines imports this module's answers: imported when a table renders

    return span(f"{value:.{digits}f}" for value in values) + unit


# --- RESULTS.md: feature-based NER (the paper's Table 7 with MiniLM) ----------------------------------------

NER_FEATURES = (  # (file stem under ner_table7/, row label, the row of the paper's Table 7 in PAPER)
    ("fine-tuning", "fine-tuning (all weights)", "finetune"),
    ("embeddings", "embeddings", "features-embeddings"),
    ("second-to-last", "second-to-last hidden", "features-second-to-last"),
    ("last", "last hidden", "features-last"),
    ("sum-last-4", "sum last four hidden", "features-sum-last-4"),
    ("concat-last-4", "concat last four hidden", "features-concat-last-4"),
    ("sum-all", "sum all layers (+ embeddings; the paper's: weighted)", "features-sum-all"),
)
FINE_TUNING = "fine-tuning"


def ner_feature_f1(sources: Sources) -> dict[str, float]:
    """Each approach's dev entity F1 (its eval_results.json: the best epoch), by file stem."""
    return {stem: sources[f"ner_table7/{stem}.eval_results.json"]["metrics"]["f1"] for stem, _, _ in NER_FEATURES}


def ner_features_table(sources: Sources) -> str:
    """Each approach's dev entity F1, precision / recall, F1 after each epoch (its log; the fine-tuning run
    kept none), its run's `wall_seconds` and the paper's BERT-Base figure; bold: fine-tuning and the best
    features."""
    f1 = ner_feature_f1(sources)
    best = max(value for stem, value in f1.items() if stem != FINE_TUNING)
    body = []
    for stem, label, key in NER_FEATURES:
        result = sources[f"ner_table7/{stem}.eval_results.json"]
        metrics = result["metrics"]
        log = sources.get(f"ner_table7/{stem}.log.jsonl", [])
        body.append([label, bold(points(metrics["f1"]), stem == FINE_TUNING or metrics["f1"] == best),
                     f"{points(metrics['precision'])} / {points(metrics['recall'])}",
                     ", ".join(points(record["eval_f1"]) for record in log if "eval_f1" in record),
                     f"{result['wall_seconds'] / 60:.1f} min", f"{paper('table7')['rows'][key][0]:.1f}"])
    return rows(["approach", "dev entity F1", "P / R", "F1 by epoch", "wall (`wall_seconds`)", "paper (BERT-Base)"],
                body)


def ner_features_answer(sources: Sources) -> Cells:
    """Fine-tuning's F1 and the best features'; whether the paper's order holds as the page reads it:
    fine-tuning first, the last four layers combined the best features, second-to-last above last."""
    f1 = ner_feature_f1(sources)
    labels = {stem: label for stem, label, _ in NER_FEATURES}
    best = max((stem for stem in f1 if stem != FINE_TUNING), key=f1.__getitem__)
    claims = {"fine-tuning first": f1[FINE_TUNING] > f1[best],
              "the last four layers combined the best features": best in ("sum-last-4", "concat-last-4"),
              "second-to-last above last": f1["second-to-last"] > f1["last"]}
    failed = [claim for claim, held in claims.items() if not held]
    verdict = "the paper's order holds" if not failed else f"the paper's order holds but for: {'; '.join(failed)}"
    return (f"fine-tuning {points(f1[FINE_TUNING])}, the best features ({labels[best]}) {points(f1[best])}", "",
            verdict)


# --- RESULTS.md: multiple choice on the books ---------------------------------------------------------------

def book_choice_table(sources: Sources) -> str:
    """The split's sizes and unseen dev books (`make_book_choice.py`'s info.json), the kept epoch's dev
    accuracy, chance (one in the number of choices) and the run's wall time."""
    result, info = sources["book_choice/eval_results.json"], sources["book_choice/info.json"]
    return rows(["model", "split: train / dev examples", "dev books (none in training)",
                 f"dev accuracy (kept: epoch {result['epoch']:g})", "chance", "wall"],
                [["MiniLM", f"{info['train_examples']:,} / {info['dev_examples']:,}", str(len(info["dev_books"])),
                  bold(f"{100 * result['metrics']['accuracy']:.2f}%"),
                  f"{100 / len(info['dev_label_counts']):g}%", f"{result['wall_seconds'] / 60:.1f} min"]])


def book_choice_answer(sources: Sources) -> Cells:
    """The dev accuracy, and chance beside it."""
    result, info = sources["book_choice/eval_results.json"], sources["book_choice/info.json"]
    return f"{100 * result['metrics']['accuracy']:.2f}%", "", f"chance {100 / len(info['dev_label_counts']):g}%"


# --- RESULTS.md: the paper's ablations in miniature (`bertforge reproduce`) ---------------------------------

REPRODUCE = {table: f"reproduce_{table}/results.json" for table in ("table5", "table6", "table7")}
TASKS = {"genre": "genre (acc)", "reply": "reply (acc)", "continuation": "continuation (acc)", "names": "names (F1)",
         "conll": "CoNLL-2003 (F1)"}
TABLE5_PAPER = ("MRPC", "SQuAD F1")  # the paper's Table 5 columns shown beside the miniature's


def variants(result: Mapping[str, Any]) -> dict[str, dict]:
    """A results.json's variants (rows) by key."""
    return {variant["key"]: variant for variant in result["variants"]}


def mean(result: Mapping[str, Any], key: str, task: str) -> float:
    """A variant's mean dev score on a task over the fine-tuning seeds (percent)."""
    return variants(result)[key]["tasks"][task]["mean"]


def score(variant: Mapping[str, Any], task: str) -> str:
    """A variant's mean ± std on a task, one decimal, as table.md prints it."""
    return mean_std(variant["tasks"][task], 1, 1)


def held_out(variant: Mapping[str, Any]) -> dict[str, Any]:
    """The variant's last held-out evaluation of its pre-training (loss, perplexity, objective)."""
    return variant["pretraining"]["curve"][-1]


def size(variant: Mapping[str, Any], separator: str = "/") -> str:
    """#L/#H/#A."""
    return separator.join(map(str, variant["size"]))


def chance_row(result: Mapping[str, Any], leading: int, trailing: int) -> list[str]:
    """The majority class / chance row: each task's baseline where the run computed one."""
    baselines = result["baselines"]
    return (["majority class / chance"] + [""] * (leading - 1)
            + [f"{baselines[task]:.1f}" if task in baselines else "" for task in result["tasks"]] + [""] * trailing)


def table5_table(sources: Sources) -> str:
    """Table 5's variants: held-out loss (its objective), mean ± std per task, the paper's MRPC and SQuAD."""
    result = sources[REPRODUCE["table5"]]
    printed = paper("table5")
    columns = [printed["columns"].index(name) for name in TABLE5_PAPER]
    body = []
    for variant in result["variants"]:
        last = held_out(variant)
        objective = "MLM" if last["objective"] == "mlm" else "next token"
        figures = printed["rows"][variant["key"]]
        body.append([variant["name"], f"{last['loss']:.3f} ({objective})",
                     *(score(variant, task) for task in result["tasks"]), *(f"{figures[i]:.1f}" for i in columns)])
    body.append(chance_row(result, 2, len(columns)))
    return rows(["variant", "held-out loss", *(TASKS[task] for task in result["tasks"]),
                 *(f"paper: {name}" for name in TABLE5_PAPER)], body)


def table6_table(sources: Sources) -> str:
    """Table 6's sizes: parameters, held-out MLM loss (perplexity), mean ± std per task."""
    result = sources[REPRODUCE["table6"]]
    body = [[size(variant, " / "), f"{variant['parameters'] / 1e6:.2f}M",
             f"{held_out(variant)['loss']:.3f} ({held_out(variant)['perplexity']:.1f})",
             *(score(variant, task) for task in result["tasks"])] for variant in result["variants"]]
    body.append(chance_row(result, 3, 0))
    return rows(["#L / #H / #A", "parameters", "held-out MLM loss (ppl)", *(TASKS[task] for task in result["tasks"])],
                body)


def table7_table(sources: Sources) -> str:
    """Table 7's approaches: mean ± std per task (bold: the highest mean), the paper's CoNLL-2003 dev F1."""
    result = sources[REPRODUCE["table7"]]
    best = {task: max(variant["tasks"][task]["mean"] for variant in result["variants"]) for task in result["tasks"]}
    body = [[variant["name"], *(bold(score(variant, task), variant["tasks"][task]["mean"] == best[task])
                                for task in result["tasks"]),
             f"{paper('table7')['rows'][variant['key']][0]:.1f}"] for variant in result["variants"]]
    return rows(["approach", *(TASKS[task] for task in result["tasks"]), "paper: CoNLL-2003 dev F1"], body)


SINGLE_LAYERS = ("features-embeddings", "features-second-to-last", "features-last")
LAST_FOUR = ("features-sum-last-4", "features-concat-last-4")


def features(result: Mapping[str, Any]) -> list[str]:
    """Table 7's feature-based rows (every row but fine-tuning)."""
    return [key for key in variants(result) if key != "finetune"]


def perplexities(result: Mapping[str, Any]) -> list[float]:
    """Each variant's final held-out perplexity, in the table's order."""
    return [held_out(variant)["perplexity"] for variant in result["variants"]]


@dataclass(frozen=True)
class Finding:
    """One of the paper's findings that a miniature table tests, and whether its means show it."""

    text: str
    holds: Callable[[Mapping[str, Any]], bool]


FINDINGS: dict[str, tuple[Finding, ...]] = {  # names stands in for the paper's SQuAD (a token / span task)
    "table5": (
        Finding("No NSP hurts the span task", lambda r: mean(r, "bert", "names") > mean(r, "no-nsp", "names")),
        Finding("LTR & No NSP is below No NSP",
                lambda r: mean(r, "ltr", "names") < mean(r, "no-nsp", "names")),
        Finding("a BiLSTM helps the LTR model on the span task",
                lambda r: mean(r, "ltr-bilstm", "names") > mean(r, "ltr", "names")),
    ),
    "table6": (
        Finding("each larger size reaches a lower held-out perplexity",
                lambda r: all(a > b for a, b in zip(perplexities(r), perplexities(r)[1:]))),
        Finding("the larger sizes score above the smallest on names",
                lambda r: all(v["tasks"]["names"]["mean"] > r["variants"][0]["tasks"]["names"]["mean"]
                              for v in r["variants"][1:])),
    ),
    "table7": (
        Finding("fine-tuning is above every feature row on both tasks",
                lambda r: all(mean(r, "finetune", task) > max(mean(r, key, task) for key in features(r))
                              for task in r["tasks"])),
        Finding("the last four layers combined beat any single one",
                lambda r: all(max(mean(r, key, task) for key in LAST_FOUR)
                              > max(mean(r, key, task) for key in SINGLE_LAYERS) for task in r["tasks"])),
        Finding("second-to-last beats last on CoNLL-2003",
                lambda r: mean(r, "features-second-to-last", "conll") > mean(r, "features-last", "conll")),
        Finding("the embeddings are the worst features on CoNLL-2003",
                lambda r: min(features(r), key=lambda key: mean(r, key, "conll")) == "features-embeddings"),
        Finding("Concat Last Four is the best feature row on CoNLL-2003",
                lambda r: max(features(r), key=lambda key: mean(r, key, "conll")) == "features-concat-last-4"),
    ),
}
ABLATION_ROWS = (  # (table, the summary's link to its page, relative to reproduce_table5/README.md)
    ("table5", "[5: pre-training tasks](#table-5-in-miniature-pre-training-tasks)"),
    ("table6", "[6: model size](../reproduce_table6/README.md)"),
    ("table7", "[7: feature-based vs fine-tuning](../reproduce_table7/README.md)"),
)


def verdict(table: str, result: Mapping[str, Any]) -> tuple[str, list[str], list[str]]:
    """Whether the miniature reproduces a table: every finding of `FINDINGS` holds (reproduced), none does
    (not reproduced), or some do (in part); and the findings that hold and those that do not."""
    held = [finding.text for finding in FINDINGS[table] if finding.holds(result)]
    failed = [finding.text for finding in FINDINGS[table] if not finding.holds(result)]
    word = "reproduced" if not failed else "not reproduced" if not held else "in part"
    return word, held, failed


def ablation_result(table: str, result: Mapping[str, Any]) -> str:
    """The summary's result cell: names F1 per row (Table 6: the perplexities first; Table 7: per task,
    fine-tuning and the best feature row)."""
    rows_ = variants(result)
    if table == "table7":
        parts = []
        for task in result["tasks"]:
            best = rows_[max(features(result), key=lambda key: mean(result, key, task))]
            parts.append(f"{TASKS[task]}: fine-tuning {score(rows_['finetune'], task)}, best features "
                         f"({best['name']}) {score(best, task)}")
        return "; ".join(parts)
    names = ", ".join(f"{variant['name'] if table == 'table5' else size(variant)} {score(variant, 'names')}"
                      for variant in result["variants"])
    if table == "table6":
        return ("held-out MLM perplexity " + " → ".join(f"{value:.1f}" for value in perplexities(result))
                + f"; names {names}")
    return names


def ablations_table(sources: Sources) -> str:
    """Each table's setting (sizes, steps, the run's wall time: the sum of its stages), its headline scores
    and the verdict of `FINDINGS` with the findings that hold and those that do not."""
    body = []
    for table, link in ABLATION_ROWS:
        result = sources[REPRODUCE[table]]
        settings = result["settings"]
        sizes = list(dict.fromkeys(size(variant) for variant in result["variants"]))
        setting = (f"{', '.join(sizes)}, {settings['steps']:,} steps of {settings['batch_size']} sequences"
                   + (" each" if len(sizes) > 1 else "") + f"; {sum(result['stage_seconds'].values()) / 60:.1f} min")
        word, held, failed = verdict(table, result)
        reasons = ([f"Holds: {'; '.join(held)}."] if held else []) + (
            [f"Does not: {'; '.join(failed)}."] if failed else [])
        body.append([link, setting, ablation_result(table, result), " ".join([f"**{word}**.", *reasons])])
    return rows(["table", "setting", "result (names F1 unless said; mean ± std)", "verdict (the paper's findings)"],
                body)


def ablations_answer(sources: Sources) -> Cells:
    """Each table's verdict."""
    return ("; ".join(f"Table {table.removeprefix('table')} {verdict(table, sources[REPRODUCE[table]])[0]}"
                      for table, _ in ABLATION_ROWS), "", "")


# --- BENCHMARKS.md: training memory -------------------------------------------------------------------------

PRETRAIN_MEMORY = ("pretrain_memory/bf16_200_steps.jsonl", "pretrain_memory/fp32_300_steps.jsonl",
                   "pretrain_memory/fp32_1000_steps.jsonl")


def packing(arm: Mapping[str, Any]) -> str:
    """An arm's packing: row buckets, or exact with the diagnostic it ran under."""
    if arm["buckets"] == "on":
        return bold("row buckets (the default)")
    diagnostics = (["oneDNN primitive cache off"] if arm.get("onednn_primitive_cache_capacity") == "0" else []) + (
        ["glibc's default malloc"] if arm.get("keep_freed_memory") is False else [])
    return ", ".join(["exact", *diagnostics])


def pretrain_memory_table(sources: Sources) -> str:
    """Every arm of `pretrain_memory.py` (a line each): median tokens/s and RSS (MB) after a quarter of the
    steps, at half and at the end (the peak beside it where higher); bold: row buckets' end."""
    body = []
    for name in PRETRAIN_MEMORY:
        for arm in sources[name]:
            end = f"{arm['rss_mb_at_end']:,}"
            if arm["buckets"] == "on":
                end = bold(end)
            elif arm["rss_mb_max"] > arm["rss_mb_at_end"]:
                end += f" (max {arm['rss_mb_max']:,})"
            body.append([f"{arm['precision']}, {arm['steps']:,}", packing(arm),
                         grouped(arm["median_tokens_per_second"], 0), f"{arm['rss_mb_after_first_quarter']:,}",
                         f"{arm['rss_mb_at_half']:,}", end])
    return rows(["precision, steps", "packing", "tokens/s (median)", "RSS after 1/4", "at 1/2", "at the end"], body)


def pretrain_memory_answer(sources: Sources) -> Cells:
    """Whether row buckets keep memory flat (in every file the row-bucket arm grows less after its first
    quarter than the first exact arm), with the bf16 arms' figures."""
    def arm(name: str, buckets: str) -> Mapping[str, Any]:
        return next(found for found in sources[name] if found["buckets"] == buckets)

    def growth(found: Mapping[str, Any]) -> int:
        return found["rss_mb_at_end"] - found["rss_mb_after_first_quarter"]

    flat = all(growth(arm(name, "on")) < growth(arm(name, "off")) for name in PRETRAIN_MEMORY)
    on, off = arm(PRETRAIN_MEMORY[0], "on"), arm(PRETRAIN_MEMORY[0], "off")
    return (f"{'yes' if flat else 'no'} with row buckets (the default): `{on['config']}` {on['precision']} "
            f"{on['rss_mb_after_first_quarter']:,} → {on['rss_mb_at_end']:,} MB over {on['steps']} steps, "
            f"{off['rss_mb_at_end']:,} MB without",)


# --- BENCHMARKS.md: pre-training instances at corpus scale ---------------------------------------------------

PREPARE = "prepare_pretraining/prepare_pretraining.json"


def prepare_pretraining_table(sources: Sources) -> str:
    """Each run of `prepare_pretraining.py`: corpus, workers, wall, the process tree's peak RSS, instances
    and the load average before it."""
    return rows(["corpus", "workers", "wall s", "peak RSS MB", "instances", "load before"], [
        [f"{run['corpus']} ({run['mb']} MB)", str(run["workers"]), f"{run['wall_s']:.2f}",
         f"{run['peak_rss_tree_mb']:.1f}", f"{run['instances']:,}", f"{run['load_before']:g}"]
        for run in sources[PREPARE]["runs"]])


def prepare_pretraining_answer(sources: Sources) -> Cells:
    """The largest corpus's fastest run and the peak RSS over all runs."""
    result = sources[PREPARE]
    largest = max(run["mb"] for run in result["runs"])
    fastest = min((run for run in result["runs"] if run["mb"] == largest), key=lambda run: run["wall_s"])
    return (f"{fastest['wall_s']:.2f} s with {fastest['workers']} worker{'s' if fastest['workers'] > 1 else ''}, "
            f"{result['peak_rss_mb']:.1f} MB peak",)


# --- BENCHMARKS.md: vocabulary extension --------------------------------------------------------------------

VOCAB_EXTEND = (("vocab_extend/minilm_wiki.json", "Wikipedia", "Wikipedia files"),  # (file, short, domain text)
                ("vocab_extend/minilm_books.json", "books", "public-domain books"))


def tokens_saved(report: Mapping[str, Any]) -> tuple[int, float]:
    """Tokens the extension saves over the domain text, and their share of the tokens before (%)."""
    saved = report["before"]["tokens"] - report["after"]["tokens"]
    return saved, 100 * saved / report["before"]["tokens"]


def vocab_extend_table(sources: Sources) -> str:
    """Each domain's `vocab --extend` report: words, tokens per word before and after, tokens saved and the
    occurrences of the new words (now one token each)."""
    body = []
    for name, _, text in VOCAB_EXTEND:
        report = sources[name]
        saved, share = tokens_saved(report)
        body.append([f"{len(report['inputs'])} {text}", f"{report['words']:,}",
                     f"{report['before']['tokens_per_word']:.4f} → {report['after']['tokens_per_word']:.4f}",
                     f"{saved:,} ({share:.1f}%)",
                     f"{report['new_word_occurrences']:,} ({100 * report['new_word_share']:.2f}%)"])
    return rows(["domain text", "words", "tokens per word before → after", "tokens saved",
                 "occurrences now one token"], body)


def vocab_extend_answer(sources: Sources) -> Cells:
    """The share of tokens saved in each domain."""
    return (" and ".join(f"{tokens_saved(sources[name])[1]:.1f}% ({short})" for name, short, _ in VOCAB_EXTEND)
            + " fewer tokens",)


# --- BENCHMARKS.md: inference on shapes that never repeat ----------------------------------------------------

VARIED = "inference/varied_batches.json"
VARIED_FP32 = "inference/varied_batches_fp32.json"
VARIED_ROWS = (  # (label, file, the file's block of medians (None: the top level), dtype, bold: a default path)
    ("bf16", VARIED, None, "bf16", True),
    ("int8", VARIED, None, "int8", True),
    ("fp32 (oneDNN, the default)", VARIED_FP32, "onednn", "fp32", True),
    ("fp32 (BLAS)", VARIED_FP32, "blas", "fp32", False),
)


def varied_medians(sources: Sources) -> list[tuple[str, bool, dict, dict]]:
    """Each row of `VARIED_ROWS`: label, whether bold, and its medians at row_bucket 0 and 16."""
    found = []
    for label, name, block, dtype, default in VARIED_ROWS:
        medians = (sources[name][block] if block else sources[name])["medians"]
        found.append((label, default, medians[f"{dtype}/row_bucket=0"], medians[f"{dtype}/row_bucket=16"]))
    return found


def varied_batches_table(sources: Sources) -> str:
    """`varied_batches.py`'s medians at row_bucket 0 and 16: sequences/s, RSS at the end and its growth over
    the second half (MB); bold: row buckets' throughput and RSS on the default paths."""
    body = []
    for label, default, exact, buckets in varied_medians(sources):
        body.append([label, f"{grouped(exact['seq_per_s'], 1)} → {bold(grouped(buckets['seq_per_s'], 1), default)}",
                     f"{grouped(exact['rss_end_mb'], 1)} → {bold(grouped(buckets['rss_end_mb'], 1), default)}",
                     f"{grouped(exact['rss_growth_second_half_mb'], 1)} → "
                     f"{grouped(buckets['rss_growth_second_half_mb'], 1)}"])
    return rows(["dtype (fp32: matmuls)", "seq/s, row_bucket 0 → **16**", "RSS at the end, 0 → 16",
                 "growth in the 2nd half, 0 → 16"], body)


def varied_batches_answer(sources: Sources) -> Cells:
    """Whether row buckets are faster on every row, and their largest growth over the second half."""
    medians = varied_medians(sources)
    faster = all(buckets["seq_per_s"] > exact["seq_per_s"] for _, _, exact, buckets in medians)
    growth = max(buckets["rss_growth_second_half_mb"] for _, _, _, buckets in medians)
    return (f"row buckets: {'faster at every dtype' if faster else 'not faster at every dtype'}, growth in the "
            f"2nd half ≤ {grouped(growth, 1)} MB",)


# --- BENCHMARKS.md: CPU kernels for inference ----------------------------------------------------------------

CPU_KERNELS = "inference/cpu_kernels.json"


def linear_speedups(result: Mapping[str, Any], key: str) -> list[float]:
    """One speed-up of `cpu_kernels.py`'s linear rows, over every model, layer and token count."""
    return [row[key] for model in result["results"].values() for row in model["linear"]]


def attention_rule() -> tuple[int, int]:
    """Where bertforge's fp32 inference computes attention as two matmuls (modeling/attention.py): L up to
    MATH_ATTENTION_MAX_LENGTH and N·L²·D up to MATH_ATTENTION_MAX_WORK."""
    return (bertforge_constant("modeling/attention.py", "MATH_ATTENTION_MAX_LENGTH"),
            bertforge_constant("modeling/attention.py", "MATH_ATTENTION_MAX_WORK"))


def attention_taken(row: Mapping[str, Any]) -> bool:
    """Whether `attention_rule` takes this attention cell (N examples of L tokens, head size D)."""
    longest, work = attention_rule()
    return row["length"] <= longest and row["examples"] * row["length"] ** 2 * row["head_size"] <= work


def speedup_text(values: Sequence[float]) -> str:
    """The range of the speed-ups at or above 1, the cells below 1 named after it."""
    from .headlines import number

    slower = sorted(value for value in values if value < 1)
    text = value_range([value for value in values if value >= 1])
    if slower:
        text += f" ({number(len(slower))} cell{'s' if len(slower) > 1 else ''} " + ", ".join(
            f"{value:.2f}×" for value in slower) + ")"
    return text


def gflops(row: Mapping[str, Any], milliseconds: str) -> float:
    """A linear row's rate in GFLOP/s: 2·T·in·out multiply-adds in the given time."""
    return 2 * row["tokens"] * row["in"] * row["out"] / (row[milliseconds] * 1e6)


def cpu_kernels_table(sources: Sources) -> str:
    """`cpu_kernels.py`'s speed-ups as ranges over its cells (the attention row over the cells bertforge
    takes), and the packed oneDNN linear's rate at its largest token count."""
    result = sources[CPU_KERNELS]
    attention = [row["matmuls_speedup"] for model in result["results"].values() for row in model["attention"]
                 if attention_taken(row)]
    longest = max(row["tokens"] for model in result["results"].values() for row in model["linear"])
    at_longest = [row for model in result["results"].values() for row in model["linear"] if row["tokens"] == longest]
    longest_length, work = attention_rule()
    return rows(["kernel, against its alternative", "speed-up over the run's cells"], [
        ["fp32: oneDNN's linear, against `F.linear` (MKL)", speedup_text(linear_speedups(result, "onednn_speedup"))],
        ["fp32: oneDNN with the weight packed once (`kernels.PackedWeight`), against the plain weight",
         speedup_text(linear_speedups(result, "packed_speedup"))],
        ["bf16: packed oneDNN, against `F.linear`", speedup_text(linear_speedups(result, "bf16_packed_speedup"))],
        ["fp32 attention as two batched matmuls, against `F.scaled_dot_product_attention`, where bertforge takes "
         f"them (L ≤ {longest_length}, N·L²·D ≤ 2{superscript(work.bit_length() - 1)})",
         speedup_text(attention)],
        [f"packed oneDNN's rate at T = {longest:,} tokens, GFLOP/s: fp32; bf16",
         f"{value_range([gflops(row, 'onednn_packed_ms') for row in at_longest], 0, '')}; "
         f"{value_range([gflops(row, 'bf16_onednn_packed_ms') for row in at_longest], 0, '')}"],
    ])


def cpu_kernels_answer(sources: Sources) -> Cells:
    """oneDNN's fp32 linear over MKL's and packed bf16 over `F.linear`, as ranges."""
    result = sources[CPU_KERNELS]
    return (f"oneDNN's fp32 linear {value_range(linear_speedups(result, 'onednn_speedup'))} MKL's; packed bf16 "
            f"{value_range(linear_speedups(result, 'bf16_packed_speedup'))} `F.linear`",)


# --- BENCHMARKS.md: the server at its limits and under randomised traffic ------------------------------------

AT_LIMITS = "serve_load/at_limits.json"


def at_limits_table(sources: Sources) -> str:
    """`serve_load.py --at-limits`: the at-limit requests answered 200 and 429, the longest waits against
    the admission bound, 5xx, the shutdown, the small request's latency, RSS and the slow sockets."""
    result = sources[AT_LIMITS]
    served = sum(statuses.get("200", 0) for statuses in result["requests"].values())
    answered_503 = sum(statuses.get("503", 0) for statuses in result["requests_after_sigterm"].values())
    others = result["five_xx_after_sigterm_not_503"]
    tracebacks = result["server_tracebacks"]
    shutdown = (f"exit **{half_up(result['exit_seconds_after_sigterm'], 1)} s**; {answered_503} requests answered "
                f"503, {'no other 5xx' if not others else f'{others} other 5xx'}, "
                f"{'no traceback' if not tracebacks else f'{tracebacks} tracebacks'}")
    small = " / ".join(f"{result[f'small_{key}_ms']:,.0f}" for key in ("p50", "p99", "max"))
    return rows(["at-limit answers: 200 / 429", "longest wait for a 200 / a 429 (bound)", "5xx", "SIGTERM under load",
                 "small request p50 / p99 / max", "RSS after warm-up → end",
                 "slow sockets closed by the header timeout (408)"],
                [[f"{served} / {result['refused_429']:,}",
                  f"**{result['longest_wait_200_s']:.1f}** / {result['longest_wait_429_s']:.1f} s "
                  f"({result['wait_bound_s']:.1f} s)", bold(str(result["five_xx"])), shutdown,
                  f"{small} ms ({result['small_requests']} requests)",
                  f"{grouped(result['rss_after_warmup_mb'], 1)} → {grouped(result['rss_end_mb'], 1)} MB "
                  f"(**{signed(result['rss_growth_pct'])}%**)", f"{result['slow_closed_by_server']['408']:,}"]])


def at_limits_answer(sources: Sources) -> Cells:
    """Whether every 200 came within the admission bound, the 429s and 5xx, the exit after SIGTERM against
    the graceful timeout, and RSS growth."""
    result = sources[AT_LIMITS]
    wait, bound = result["longest_wait_200_s"], result["wait_bound_s"]
    admission = (f"no answer later than the admission bound ({wait:.1f} s ≤ {bound:.1f} s)" if wait <= bound else
                 f"an answer later than the admission bound ({wait:.1f} s > {bound:.1f} s)")
    five_xx = "no 5xx" if not result["five_xx"] else f"{result['five_xx']} × 5xx"
    return (f"{admission}, {result['refused_429']:,} × 429, {five_xx}; exit "
            f"{half_up(result['exit_seconds_after_sigterm'], 1)} s after SIGTERM (graceful "
            f"{result['graceful_timeout_s']:g} s); RSS {signed(result['rss_growth_pct'])}%",)


SERVE_MEMORY = ("serve_memory/fp32_10min.json", "serve_memory/bf16_10min.json", "serve_memory/bf16_5min.json",
                "serve_memory/int8_5min.json")


def serve_memory_table(sources: Sources) -> str:
    """Each `serve_memory.py` run: requests, 5xx, peak RSS at the start, after warm-up and at the end, the
    growth, and the latency's median and p99."""
    body = []
    for name in SERVE_MEMORY:
        run = sources[name]
        body.append([run["dtype"], f"{run['minutes']:g}", f"{run['requests_ok']:,}", str(run["errors_5xx"]),
                     " → ".join(f"{run[key]:,.0f}" for key in ("rss_start_mb", "rss_peak_after_warmup_mb",
                                                                "rss_peak_at_end_mb")),
                     f"{signed(run['rss_growth_pct'])}%", f"{run['p50_ms'] / 1000:.1f} / {run['p99_ms'] / 1000:.1f}"])
    return rows(["dtype", "minutes", "requests", "5xx", "RSS start → after warm-up → end (peak, MB)", "growth",
                 "p50 / p99 latency (s)"], body)


def serve_memory_answer(sources: Sources) -> Cells:
    """The range of RSS growth after warm-up over the runs, and their 5xx."""
    runs = [sources[name] for name in SERVE_MEMORY]
    growth = sorted(run["rss_growth_pct"] for run in runs)
    errors = sum(run["errors_5xx"] for run in runs)
    return (f"{signed(growth[0])}% to {signed(growth[-1])}% after warm-up, "
            f"{'no 5xx' if not errors else f'{errors} × 5xx'}",)


# --- BENCHMARKS.md: SQuAD feature conversion -----------------------------------------------------------------

SQUAD_FEATURES = "squad_v2/squad_features.json"
SQUAD_SIDES = (("bertforge", "bertforge `convert_examples_to_features`"),
               ("transformers", "transformers run_qa `prepare_*_features`"))


def squad_features_table(sources: Sources) -> str:
    """`squad_features.py`'s medians per side: training and evaluation features, wall (CPU) seconds, and the
    windows made; bold: the faster side."""
    result = sources[SQUAD_FEATURES]
    seconds, cpu = result["seconds_median"], result["cpu_seconds_median"]

    def cell(side: str, kind: str) -> str:
        wall, fastest = seconds[f"{side}_{kind}"], min(seconds[f"{other}_{kind}"] for other, _ in SQUAD_SIDES)
        return f"{bold(f'{wall:.2f} s', wall == fastest)} ({cpu[f'{side}_{kind}']:.2f} s CPU)"

    def windows(side: str) -> str:
        counts = dict.fromkeys(result["windows"][f"{side}_{kind}"] for kind in ("train", "eval"))
        return " / ".join(f"{count:,}" for count in counts)

    return rows(["", "training features (answers aligned)", "evaluation features (offsets kept)", "windows"],
                [[label, cell(side, "train"), cell(side, "eval"), windows(side)] for side, label in SQUAD_SIDES])


def squad_features_answer(sources: Sources) -> Cells:
    """Each side's median seconds for the training features."""
    seconds = sources[SQUAD_FEATURES]["seconds_median"]
    return (" / ".join(f"{seconds[f'{side}_train']:.2f} s" for side, _ in SQUAD_SIDES) + " (training features)",)


REPORTS = (
    Report(name="ner-features",
           figure="docs/results/ner_table7/README.md, Table 7 at small scale: feature-based NER against fine-tuning",
           sources=("ner_table7/*.eval_results.json", "ner_table7/*.log.jsonl"), table=ner_features_table),
    Report(name="book-choice",
           figure="docs/results/book_choice/README.md, multiple choice: a four-way task from the books",
           sources=("book_choice/eval_results.json", "book_choice/info.json"), table=book_choice_table),
    Report(name="ablations", figure="docs/results/reproduce_table5/README.md, the paper's ablations in miniature",
           sources=tuple(REPRODUCE.values()), table=ablations_table),
    Report(name="reproduce-table5", figure="docs/results/reproduce_table5/README.md, Table 5 in miniature",
           sources=(REPRODUCE["table5"],), table=table5_table),
    Report(name="reproduce-table6", figure="docs/results/reproduce_table6/README.md, Table 6 in miniature",
           sources=(REPRODUCE["table6"],), table=table6_table),
    Report(name="reproduce-table7", figure="docs/results/reproduce_table7/README.md, Table 7 in miniature",
           sources=(REPRODUCE["table7"],), table=table7_table),
    Report(name="pretrain-memory", figure="docs/results/pretrain_memory/README.md, training memory",
           sources=PRETRAIN_MEMORY, table=pretrain_memory_table),
    Report(name="prepare-pretraining",
           figure="docs/results/prepare_pretraining/README.md, pre-training instances at corpus scale",
           sources=(PREPARE,), table=prepare_pretraining_table),
    Report(name="vocab-extend", figure="docs/results/vocab_extend/README.md, vocabulary extension",
           sources=tuple(name for name, _, _ in VOCAB_EXTEND), table=vocab_extend_table),
    Report(name="varied-batches",
           figure="docs/results/inference/README.md, inference on batches whose shapes never repeat",
           sources=(VARIED, VARIED_FP32), table=varied_batches_table),
    Report(name="cpu-kernels", figure="docs/results/inference/README.md, CPU kernels for inference",
           sources=(CPU_KERNELS,), table=cpu_kernels_table),
    Report(name="server-limits", figure="docs/results/serve_load/README.md, the server at its limits",
           sources=(AT_LIMITS,), table=at_limits_table),
    Report(name="server-memory", figure="docs/results/serve_memory/README.md, server memory under randomised traffic",
           sources=SERVE_MEMORY, table=serve_memory_table),
    Report(name="squad-features", figure="docs/results/squad/README.md, SQuAD feature conversion",
           sources=(SQUAD_FEATURES,), table=squad_features_table),
)
