"""The headline tables: RESULTS.md's and BENCHMARKS.md's first tables and README.md's two, rendered from the
same declarations, so that a headline figure cannot drift from the section (and the JSON) it summarises.

Each row is a `Headline`: the question a user asks (its link into the section that answers it) and either
a function over the result files that section's rendered table reads (the same files, loaded the same way:
a report's sources, a benchmark's result), giving the answer cells and the verdict, or, where that section
is not rendered yet, its cells typed by hand (`Typed`: "typed: section not yet rendered"), kept here rather
than in the Markdown so that each is written once. A row's "commit, date" cell is what its section's
caption states: a report's runs in docs/results/provenance.json (`runs` keeps those its figures come from),
a benchmark's result's commit and date; a typed row's is typed with it.

A `HeadlineTable` names the rows a document shows and its columns: RESULTS.md's and BENCHMARKS.md's have
the commit column, README.md's leave it out. Links are declared relative to the repository root
(`RESULTS.md#glue-...`) and written relative to the document rendered (`#glue-...` inside RESULTS.md).
"""

from __future__ import annotations

import os
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from . import distill_speed
from . import finetune
from . import inference
from . import legacy
from . import machine_limit
from .detail_reports import (ablations_answer, at_limits_answer, book_choice_answer, cpu_kernels_answer,
                             ner_features_answer, prepare_pretraining_answer, pretrain_memory_answer,
                             serve_memory_answer, squad_features_answer, varied_batches_answer, vocab_extend_answer)
from .harness import ROOT, Benchmark, View, join, joined, load_result, registry as benchmark_registry, views
from .report import Report, load_provenance, load_sources, registry as report_registry
from .results import (DISTILL_FILES, bold, describe, distill_group, glue_tasks, mean_std, minus, ner_peer_runs,
                      points, rows)
from .speed_reports import gpu_answer, serve_answer, squad_cpu_answer, times

Cells = tuple[str, ...]
NOT_RENDERED = "section not yet rendered"  # why a row is typed; anything else must say why


@dataclass(frozen=True)
class Typed:
    """A row's cells typed by hand ("typed: section not yet rendered"): its section's table is not rendered
    from its JSON yet, so there is no file the row could read the same way. When the section is rendered,
    the row becomes a function of its files (a test fails while a typed row links a rendered section,
    unless `reason` says why its figures are not that section's table's).

    cells: the answer cells (and the verdict, where the table has one); commit: the "commit, date" cell.
    """

    cells: Cells
    commit: str
    reason: str = NOT_RENDERED


@dataclass(frozen=True)
class Headline:
    """One question and its answer.

    key: what a `HeadlineTable` lists it by.
    question: the question cell, Markdown, its link relative to the repository root.
    answer: a function of its section's data (`section_data`) giving the answer cells, or `Typed` cells.
    section: the benchmark, view or report whose rendered table the row summarises (a function's rows only).
    runs: of that report's provenance runs, the commits its figures come from, in the order to state them;
        empty: every run the section's caption states.
    """

    key: str
    question: str
    answer: Callable[[Any], Cells] | Typed
    section: str = ""
    runs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.answer, Typed) == bool(self.section):
            raise ValueError(f"{self.key}: a row read from JSON names its section; a typed row names none")


@dataclass(frozen=True)
class HeadlineTable:
    """A document's headline table: its marker, the columns after the question, the rows by key, and whether
    it ends with the "commit, date" column (RESULTS.md's and BENCHMARKS.md's do, README.md's do not)."""

    name: str
    figure: str
    columns: tuple[str, ...]
    keys: tuple[str, ...]
    commit_column: bool = True


# --- formatting --------------------------------------------------------------------------------------

NUMBERS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def number(count: int) -> str:
    """A small count in words (`five`), a larger one in digits."""
    return NUMBERS[count] if count < len(NUMBERS) else str(count)


def span(figures: Iterable[str]) -> str:
    """The range of figures already formatted (`1.52–1.97`): the smallest and the largest by value."""
    ordered = sorted(figures, key=float)
    return ordered[0] if ordered[0] == ordered[-1] else f"{ordered[0]}–{ordered[-1]}"


def dates_text(dates: Iterable[str]) -> str:
    """One date, or the first and last with what they share written once (`2026-12-01/02`)."""
    days = sorted({date[:10] for date in dates})
    first, last = days[0], days[-1]
    if first == last:
        return first
    shared = 8 if first[:8] == last[:8] else 5 if first[:5] == last[:5] else 0
    return f"{first}/{last[shared:]}"


def commit_text(commits: Sequence[str], dates: Iterable[str]) -> str:
    """The "commit, date" cell: up to three commits listed (more: the first … the last), then the dates."""
    commits = list(dict.fromkeys(commits))
    shown = ", ".join(commits) if len(commits) <= 3 else f"{commits[0]} … {commits[-1]}"
    return f"{shown}, {dates_text(dates)}"


LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:)([^)#\s]*)(#[^)\s]*)?\)")


def relink(text: str, document: Path, root: Path = ROOT) -> str:
    """`text` with its links, declared relative to the repository root, made relative to `document` (an
    anchor alone where a link points into the document itself)."""
    def replace(match: re.Match[str]) -> str:
        path, anchor = match[1], match[2] or ""
        target = root / path
        if path and target.resolve() == document.resolve() and anchor:
            return f"]({anchor})"
        return f"]({Path(os.path.relpath(target, document.parent)).as_posix()}{anchor})" if path else match[0]

    return LINK.sub(replace, text)


# --- RESULTS.md: quality -------------------------------------------------------------------------------

def goal_text(met: bool) -> str:
    """The verdict of one comparison against the goal (bertforge's mean ≥ the peer's mean − ½ its std)."""
    return "goal met" if met else "not met"


def reaches(ours: Mapping[str, float], peer: Mapping[str, float]) -> bool:
    """Whether bertforge's mean reaches the goal's bar: the peer's mean − ½ its std."""
    return ours["mean"] >= peer["mean"] - peer["std"] / 2


def glue_answer(sources: dict[str, Any]) -> Cells:
    """Each task's main metric at each side's best rate (means, as the GLUE table's rows), and on how many
    tasks the goal is met."""
    tasks = glue_tasks(sources)
    missed = [task.task for task in tasks if not task.met(task.main)]
    verdict = (f"goal met on all {number(len(tasks))}" if not missed else
               f"goal met on {number(len(tasks) - len(missed))} of {number(len(tasks))} (not on {', '.join(missed)})")
    return (", ".join(points(task.ours[task.main]["mean"]) for task in tasks),
            ", ".join(points(task.peer[task.main]["mean"]) for task in tasks), verdict)


def ner_answer(sources: dict[str, Any]) -> Cells:
    """Dev entity F1 at the sentence level on each side (and bertforge's with document context); the goal at
    the sentence level, and whether the seeds resolve the difference (Welch's t-test, p < 0.05)."""
    from scipy import stats  # a dependency of bertforge's metrics; here only when this row renders

    ours = sources["ner/bertforge_summary.json"]
    context = sources["ner/bertforge_document_context_summary.json"]["metrics"]["f1"]
    peer_f1 = [run["f1"] for run in ner_peer_runs(sources)]
    ours_f1 = [run["metrics"]["f1"] for run in ours["runs"]]
    mine, peer = ours["metrics"]["f1"], describe(peer_f1)  # as the NER table states them
    verdict = goal_text(reaches(mine, peer)) + " at the sentence level"
    if stats.ttest_ind(ours_f1, peer_f1, equal_var=False).pvalue >= 0.05:
        verdict += f" (not resolved by {min(len(ours_f1), len(peer_f1))} seeds)"
    return f"{mean_std(mine)} (`--document-context`: {mean_std(context)})", mean_std(peer), verdict


def squad_answer(*versions: str) -> Callable[[dict[str, Any]], Cells]:
    """SQuAD F1 of each side, mean ± std over seeds, for each of `versions` (files under squad/, joined by
    " / "), and whether the goal is met in all of them."""
    def answer(sources: dict[str, Any]) -> Cells:
        sides = [sources[f"squad/{version}.json"]["sides"] for version in versions]
        ours = [side["bertforge"]["scores"]["f1"] for side in sides]
        peer = [side["peer"]["scores"]["f1"] for side in sides]
        met = [reaches(mine, theirs) for mine, theirs in zip(ours, peer)]
        verdict = goal_text(all(met)) if all(met) or not any(met) else "met in " + ", ".join(
            version for version, ok in zip(versions, met) if ok) + " only"
        return (" / ".join(mean_std(stats, 1) for stats in ours), " / ".join(mean_std(stats, 1) for stats in peer),
                verdict)

    return answer


GOEMOTIONS = "goemotions/acceptance.json"


def goemotions_answer(sources: dict[str, Any]) -> Cells:
    """Dev macro-F1 at bertforge's defaults on each side (mean ± std, seeds), the verdict from the defaults
    block's `goal_met`; the fast settings beside them once both sides have run there (their verdict from
    their block's `goal_met`, or the goal computed where the file does not state it yet)."""
    result = sources[GOEMOTIONS]

    def figure(block: Mapping[str, Any], side: str) -> str:
        runs = block[side]["runs"]
        return f"{mean_std(describe([run['macro_f1'] for run in runs]))} ({len(runs)} seed{'s' if len(runs) != 1 else ''})"

    def verdict(block: Mapping[str, Any]) -> str:
        ours, reference = ([run["macro_f1"] for run in block[side]["runs"]] for side in ("ours", "reference"))
        mine, theirs = describe(ours), describe(reference)
        met = block["goal_met"] if block.get("goal_met") is not None else reaches(mine, theirs)
        gap = 100 * (theirs["mean"] - mine["mean"])
        return "goal met" if met else f"not met: {gap:.1f} points behind"

    defaults, fast = result["defaults"], result["fast"]
    ours, reference, verdicts = [figure(defaults, "ours")], ["reference loop: " + figure(defaults, "reference")], [
        verdict(defaults)]
    run = [side for side in ("ours", "reference") if fast[side]["runs"]]
    if len(run) == 2:
        ours.append("fast: " + figure(fast, "ours"))
        reference.append("fast: " + figure(fast, "reference"))
        verdicts.append("fast: " + verdict(fast))
    else:
        verdicts.append("the fast settings not run" if not run else "the fast settings' reference loop not run")
    return "; ".join(ours), "; ".join(reference), "; ".join(verdicts)


DISTILL_GOAL = 98.0  # % of the teacher a 3-layer student is to keep (issue's goal)
DISTILL_SPEED = "speed: [BENCHMARKS](BENCHMARKS.md#distilled-students-throughput)"


def distill_answer(sources: dict[str, Any]) -> Cells:
    """The 3-layer students' share of their teacher (distilled; with augmented copies; CoNLL's 4 epochs),
    bold where it reaches the goal; the labels-only control's beside; whether each task reaches the goal."""
    def share(task: str, objective: str, augment: int = 0, file: str = "", emphasise: bool = True) -> tuple[str, float]:
        pct = distill_group(sources, file, task, 3, objective, augment)["pct_of_teacher"]
        return bold(f"{pct:.1f}%", emphasise and pct >= DISTILL_GOAL), pct

    def of_teacher(task: str) -> str:
        student = distill_group(sources, "", task, 3, "distill", 0)["score"]["mean"]
        return f"{points(student)} of {points(sources[DISTILL_FILES['']]['study'][task]['teacher']['score'])}"

    sst2 = [share("sst2", "distill"), share("sst2", "distill", 1)]
    conll = [share("conll", "distill"), share("conll", "distill", 1), share("conll", "distill", file="4 epochs")]
    ours = (f"SST-2 {sst2[0][0]} ({of_teacher('sst2')}), {sst2[1][0]} with one augmented copy of each sentence; "
            f"CoNLL-2003 {conll[0][0]} ({of_teacher('conll')}), {conll[1][0]} augmented, {conll[2][0]} with 4 epochs")
    labels = [share("sst2", "labels", emphasise=False)[0], share("conll", "labels", emphasise=False)[0],
              share("conll", "labels", file="4 epochs", emphasise=False)[0]]
    peer = f"labels only: {labels[0]}; {labels[1]}, {labels[2]} (4 epochs)"
    met = [name for name, shares in (("SST-2", sst2), ("CoNLL-2003", conll))
           if max(pct for _, pct in shares) >= DISTILL_GOAL]
    goal = (f"≥ {DISTILL_GOAL:g}% met on both" if len(met) == 2 else f"≥ {DISTILL_GOAL:g}% met on {met[0]} only"
            if met else f"≥ {DISTILL_GOAL:g}% not met")
    return ours, peer, f"{goal}; {DISTILL_SPEED}"


def pretrain_answer(sources: dict[str, Any]) -> Cells:
    """Each side's held-out MLM loss after 30 minutes, and its steps; which side is ahead (the lower loss)."""
    ours, peer = (sources[f"pretrain_budget_mini/{name}.json"] for name in ("ours", "peer"))
    ahead = "bertforge ahead" if ours["eval_mlm_loss"] < peer["eval_mlm_loss"] else "the peer ahead"
    return (f"held-out MLM loss {ours['eval_mlm_loss']:.3f} ({ours['step']} steps)",
            f"{peer['eval_mlm_loss']:.3f} ({peer['step']} steps)", ahead)


SST2_RATES = ("2e-5", "1e-4")


def sst2_mini_answer(sources: dict[str, Any]) -> Cells:
    """The best SST-2 dev accuracy from the pre-trained `mini` and from random weights at each rate; whether
    pre-training wins at every rate."""
    runs = sources["glue_sst2_mini_vs_random/sst2_runs.json"]

    def best(start: str, lr: str) -> float:
        return runs[f"{start}_lr{lr}"]["eval_results"]["metrics"]["accuracy"]

    wins = [lr for lr in SST2_RATES if best("pretrained", lr) > best("random", lr)]
    verdict = ("yes" if len(wins) == len(SST2_RATES) else f"at lr {', '.join(wins)} only" if wins
               else "no, at this budget")
    return (" / ".join(f"{100 * best('pretrained', lr):.2f}%" for lr in SST2_RATES) + f" (lr {' / '.join(SST2_RATES)})",
            "random: " + " / ".join(f"{100 * best('random', lr):.2f}%" for lr in SST2_RATES), verdict)


def tapt_answer(sources: dict[str, Any]) -> Cells:
    """The change task-adaptive pre-training makes to each task's dev score (points), and where it helps."""
    conll, sst2 = (sources[f"tapt_{task}/result.json"]["delta_points"] for task in ("conll", "sst2"))
    helps = {(True, True): "helps both tasks", (True, False): "helps the token task only",
             (False, True): "helps the sentence task only", (False, False): "helps neither task"}[(conll > 0, sst2 > 0)]
    return (f"CoNLL-2003 F1 {bold(minus(f'{conll:+.2f}'))}, SST-2 acc. {bold(minus(f'{sst2:+.2f}'))}", "", helps)


def sentence_embedding_answer(sources: dict[str, Any]) -> Cells:
    """Each side's mean ± std dev Spearman and the goal (bertforge ≥ the peer's mean − ½ std)."""
    sides = sources["sentence_embedding/stsb.json"]["sides"]
    stats = {side: describe([run["spearman"] for run in sides[side]["runs"]]) for side in sides}
    goal = stats["peer"]["mean"] - stats["peer"]["std"] / 2
    gap = 100 * (stats["ours"]["mean"] - goal)
    verdict = "goal met" if gap >= 0 else f"not met ({minus(f'{gap:+.2f}')} points against the goal)"
    n = len(sides["ours"]["runs"])
    return (f"{mean_std(stats['ours'])} ({n} seeds)", f"{mean_std(stats['peer'])} ({len(sides['peer']['runs'])} seeds)",
            verdict)


# --- BENCHMARKS.md: speed -------------------------------------------------------------------------------

def inference_cases_text(result: Mapping[str, Any]) -> str:
    """The models and data the cases cover: `MiniLM and base, SST-2 and MRPC`."""
    cases = [case["params"] for case in result["cases"]]
    models = dict.fromkeys(inference.MODEL_LABELS[params["model"]] for params in cases)
    data = dict.fromkeys(inference.DATA_LABELS[params["dataset"]] for params in cases)
    return f"{' and '.join(models)}, {' and '.join(data)}"


def best_peer_ratios(result: Mapping[str, Any], ours: str, theirs: str | None) -> list[str]:
    """bertforge's `ours` over the peer's `theirs` (None: the faster fp32 peer) in every case, at two
    decimals as the table writes them."""
    return [legacy.ratio_text(case, ours, theirs or inference.best_fp32_peer(case)[0], 2) for case in result["cases"]]


def inference_answer(result: dict[str, Any]) -> Cells:
    """The range of bertforge's ratio over the peer at its best, fp32 and bf16, over the table's cases."""
    fp32, bf16 = best_peer_ratios(result, "ours", None), best_peer_ratios(result, "bf16", "peer_bf16")
    return (f"fp32 **{span(fp32)}×**, bf16 **{span(bf16)}×** ({inference_cases_text(result)})",)


def int8_answer(result: dict[str, Any]) -> Cells:
    """The range of bertforge's int8 over ONNX Runtime's `quantize_dynamic`, over the table's cases."""
    return (f"**{span(best_peer_ratios(result, 'int8', 'peer_onnx_int8'))}×**",)


def dtypes_answer(result: dict[str, Any]) -> Cells:
    """The range of bf16's and int8's gain over bertforge's fp32, at two decimals."""
    gains = {side: [legacy.ratio_text(case, side, "ours", 2) for case in result["cases"]] for side in ("bf16", "int8")}
    return (f"bf16 {span(gains['bf16'])}×, int8 {span(gains['int8'])}×",)


def encoder_answer(result: dict[str, Any]) -> Cells:
    """The range of the encoder's ratio over transformers' `BertModel`, at three decimals as the table's."""
    return (span(legacy.ratio_text(case, "bertforge", "transformers", 3) for case in result["cases"]),)


def machine_limit_answer(result: dict[str, Any]) -> Cells:
    """The first configuration's (base's): the fp32 forward's and the training step's share of the peak, and the
    range of its ratios, as the table writes them."""
    cases = next(iter(machine_limit.by_configuration(result).values()))
    size = machine_limit.size_label(next(iter(cases.values()))["params"])
    shares = {key: f"{machine_limit.share(case, 'bertforge'):.0%}" for key, case in cases.items()}
    ratios = span(f"{machine_limit.ratio(case):.2f}" for case in cases.values())
    return (f"{size}: fp32 forward at {shares['forward', 'fp32']} of `torch.mm`'s best, training step "
            f"{shares['train_step', 'fp32']} (fp32) / {shares['train_step', 'bf16']} (bf16); {ratios}× the peer",)


def accuracy_answer(sources: dict[str, Any]) -> Cells:
    """bertforge's bf16 and int8 change in dev accuracy (once when equal), and the peer's ONNX Runtime int8's."""
    from .results import accuracy_change

    result = sources["inference/accuracy_sst2.json"]["results"]
    bf16, int8, peer = (accuracy_change(result[name]["change_points"]["accuracy"])
                        for name in ("bf16", "int8", "peer_onnx_int8"))
    ours = f"{bf16} points each" if bf16 == int8 else f"bf16 {bf16}, int8 {int8} points"
    return (f"{ours} (the peer's ORT int8: {peer})",)


def pretrain_step_answer(result: dict[str, Any]) -> Cells:
    """Each preset's ratio at fp32 and bf16, at three decimals as the table's."""
    from .pretrain import ratio

    by_model: dict[str, dict[str, str]] = {}
    for case in result["cases"]:
        by_model.setdefault(case["params"]["model"], {})[case["params"]["precision"]] = f"{ratio(case):.3f}"
    parts = [f"`{model}` {cells['fp32']} / {cells['bf16']}" for model, cells in by_model.items()]
    return (parts[0].replace(" / ", " (fp32) / ", 1) + " (bf16)" + "".join(f"; {part}" for part in parts[1:]),)


def continued_pretrain_answer(result: dict[str, Any]) -> Cells:
    """The continued model's ratio, at two decimals as the table's."""
    from .pretrain import ratio

    case = result["cases"][0]
    model = {"minilm": "MiniLM"}.get(case["params"]["model"], case["params"]["model"])
    return (f"{ratio(case):.2f}× ({model}, {case['params']['precision']})",)


def tokenizer_answer(result: dict[str, Any]) -> Cells:
    """The ratio of the medians and bertforge's tokens per second."""
    case = result["cases"][0]
    sides = case["sides"]
    ratio = sides["transformers"]["median"] / sides["bertforge"]["median"]
    return (f"{ratio:.3f} ({round(case['facts']['tokens'] / sides['bertforge']['median']):,} tokens/s)",)


def tokenizer_long_answer(result: dict[str, Any]) -> Cells:
    """The range of the fast path's median seconds over the long texts."""
    return (span(f"{case['sides']['fast']['median']:.3f}" for case in result["cases"]) + " s (the fast path)",)


def embed_answer(result: dict[str, Any]) -> Cells:
    """bertforge's texts per second over the peer's, per precision (int8: against the peer's fastest)."""
    parts = []
    for case in result["cases"]:
        sides, dtype = case["sides"], case["params"]["dtype"]
        ratio = sides["sentence-transformers"]["median"] / sides["bertforge"]["median"]
        peer = {"float32": "fp32", "bfloat16": "bf16"}.get(case["facts"]["peer_dtype"], case["facts"]["peer_dtype"])
        text = f"{ratio:.2f}×" if ratio < 1.5 else f"**{ratio:.2f}×**"
        parts.append(f"{dtype} {text}" + ("" if peer == dtype else f" (against its {peer})"))
    return (", ".join(parts) + " (MiniLM, 10,000 STS-B sentences, batch 64)",)


def embed_student_answer(result: dict[str, Any]) -> Cells:
    """The student's dev Spearman as a share of the teacher's and its speed-up, in fp32, then int8's."""
    by_dtype = {case["params"]["dtype"]: case for case in result["cases"]}

    def kept_and_speed(dtype: str) -> tuple[float, float]:
        case = by_dtype[dtype]
        facts, sides = case["facts"], case["sides"]
        return (facts["student_dev_spearman"] / facts["teacher_dev_spearman"],
                sides["teacher"]["median"] / sides["student"]["median"])

    (kept, speed), (kept8, speed8) = kept_and_speed("fp32"), kept_and_speed("int8")
    return (f"keeps **{kept:.1%}** of its teacher's STS-B dev Spearman at **{speed:.2f}×** its fp32 throughput "
            f"(int8: {kept8:.1%} at {speed8:.2f}× the teacher's int8)",)


def finetune_answer(result: dict[str, Any]) -> Cells:
    """Per task, the median of the runs' ratios and its epochs, bold where it meets the goal."""
    parts = []
    for case in result["cases"]:
        median, epochs = statistics.median(finetune.ratios(case)), case["params"]["epochs"]
        parts.append(f"{bold(times(median), median >= finetune.GOAL)} on {finetune.TASKS[case['params']['task']][0]} "
                     f"({epochs:g} epoch{'' if epochs == 1 else 's'})")
    return (", ".join(parts),)


def distill_speed_answer(result: dict[str, Any]) -> Cells:
    """The goal's student's fp32 and int8 speed-ups over its teacher's fp32 on each task (bold where its goal is
    met), and the tagger's bound (half its teacher's layers, with the tokenizing and labelling each example needs)."""
    verdicts = distill_speed.goal(result)
    found = {task: {dtype: bold(times(verdicts[task][dtype]["speedup"]), verdicts[task][dtype]["met"])
                    for dtype in ("fp32", "int8")} for task in ("sst2", "conll")}
    names = distill_speed.NAMES
    return (f"fp32 {found['sst2']['fp32']} ({names['sst2']}) and {found['conll']['fp32']} ({names['conll']}) its "
            f"teacher; int8 {found['sst2']['int8']} and {found['conll']['int8']} the teacher's fp32; the tagger's "
            f"bound {times(verdicts['conll']['bound']['with_pre_post'])}",)


# --- the rows ------------------------------------------------------------------------------------------

R = "RESULTS.md"
B = "BENCHMARKS.md"

# Each row either names its `section=` and a function of that section's files, or is `Typed(...)`: typed, its
# section not yet rendered (a `reason=` other than that says why its figures are not its section's table's).
HEADLINES = (
    # RESULTS.md: quality
    Headline("glue", f"[GLUE dev against the peer]({R}#glue-mrpc-cola-rte-sts-b-sst-2) (MiniLM, the paper's recipe): "
             "MRPC F1, CoLA MCC, RTE acc., STS-B Pearson, SST-2 acc.", glue_answer, section="glue"),
    Headline("ner", f"[CoNLL-2003 NER dev F1 against the peer]({R}#conll-2003-ner-fine-tuned)", ner_answer,
             section="ner"),
    Headline("ner-features", "[Feature-based NER against fine-tuning](docs/results/ner_table7/README.md#table-7-at-"
             "small-scale-feature-based-ner-against-fine-tuning) (the paper's Table 7, MiniLM)", ner_features_answer,
             section="ner-features"),
    Headline("squad-v1.1", f"[SQuAD v1.1 F1 against the peer]({R}#squad-v11-and-v20)", squad_answer("v1.1"),
             section="squad"),
    Headline("squad-v2.0", f"[SQuAD v2.0 F1 against the peer]({R}#squad-v11-and-v20) (2 / 3 epochs)",
             squad_answer("v2.0", "v2.0_3_epochs"), section="squad"),
    Headline("goemotions", f"[Multi-label GoEmotions against the reference loop]({R}#multi-label-classification-"
             "goemotions) (MiniLM, dev macro-F1, bertforge's defaults: fp32, shuffled; the issue's two causes, AdamW's "
             "ε and the new head's initialisation, fixed)", goemotions_answer, section="goemotions"),
    Headline("sentence-embedding", f"[Sentence embeddings: STS-B bi-encoders against sentence-transformers]({R}#"
             "sentence-embeddings-sts-b-bi-encoders) (MiniLM, dev Spearman, its recipe)", sentence_embedding_answer,
             section="sentence-embedding-stsb"),
    Headline("distill", f"[Distillation: how much of its teacher does a 3-layer student keep?]({R}#distillation-3--and-"
             "2-layer-students-of-minilm-on-sst-2-and-conll-2003) (MiniLM teachers, 3 seeds)", distill_answer,
             section="distill", runs=("b9cf256", "e068e0b", "9240e77")),  # not 996811a: the intermediate runs
    Headline("multiple-choice", "[Multiple choice](docs/results/book_choice/README.md#multiple-choice-a-four-way-task-"
             "from-the-public-domain-books) (four-way, books)", book_choice_answer, section="book-choice"),
    Headline("pretrain-budget", f"[Pre-training, 30 CPU minutes of `mini`, against the peer]({R}#pre-training-30-"
             "minutes-of-cpu-mini-bertforge-against-the-peer)", pretrain_answer, section="pretrain-budget"),
    Headline("sst2-mini-vs-random", f"[Does 30 minutes of pre-training beat random weights on SST-2?]({R}#does-pre-"
             "training-pay-pre-trained-mini-against-random-weights-on-sst-2)", sst2_mini_answer,
             section="sst2-mini-vs-random"),
    Headline("tapt", "[Task-adaptive pre-training](docs/results/tapt_conll/README.md#task-adaptive-pre-training-"
             "minilm-continued-on-a-tasks-own-text) (1,000 labelled examples)", tapt_answer, section="tapt",
             runs=("0c67daa", "2d6862c")),
    Headline("ablations", "[The paper's ablations in miniature](docs/results/reproduce_table5/README.md#the-papers-"
             "ablations-in-miniature-5): Tables 5, 6, 7", ablations_answer, section="ablations"),

    # BENCHMARKS.md: speed and memory
    Headline("finetune-speed", f"[Fine-tuning against transformers' `Trainer` at its best settings]({B}#fine-tuning-"
             "against-the-peer-at-its-best-settings) (bf16, length-grouped, MiniLM)", finetune_answer,
             section="finetune-speed"),
    Headline("goemotions-speed", "[Fine-tuning a multi-label classifier (GoEmotions) against the peer at its best "
             f"settings]({R}#multi-label-classification-goemotions) (bf16, length-grouped, MiniLM, 3 epochs)",
             Typed(("**1.28×** (771.8 s against 984.5 s), past the 1.20× equal kernels would give; the 1.5× goal is "
                    "not met",), "fae56ea, 16a87a8",
                   reason="its section's rendered table is the quality acceptance; the timing it cites is in "
                          "no result file (the lr 3e-4 grid pair's wall times, `multi_label.py --timing`'s per-step "
                          "medians), only `--ceiling`'s is (goemotions/ceiling.json)")),
    Headline("inference", f"[Inference against the peer at its best settings]({B}#inference-against-the-peer-at-its-"
             "best-settings): fp32 (the faster of transformers and ONNX Runtime), bf16 (autocast)", inference_answer,
             section="inference"),
    Headline("inference-int8", f"[Inference against ONNX Runtime int8]({B}#inference-against-the-peer-at-its-best-"
             "settings) (`quantize_dynamic`)", int8_answer, section="inference"),
    Headline("accuracy", f"[What bf16 and int8 cost in accuracy]({B}#bf16-and-int8-accuracy) (SST-2 dev)",
             accuracy_answer, section="accuracy"),
    Headline("inference-dtypes", f"[What bf16 and int8 gain over bertforge's fp32]({B}#inference-on-real-length-"
             "batches)", dtypes_answer, section="inference-dtypes"),
    Headline("encoder", f"[Encoder forward on padded batches]({B}#encoder-forward), fp32, against transformers' "
             "`BertModel`", encoder_answer, section="encoder"),
    Headline("machine-limit", f"[How close to the machine's limit]({B}#how-close-to-the-machines-limit)",
             machine_limit_answer, section="machine-limit"),
    Headline("pretrain-step", f"[Pre-training step (MLM + NSP) against the peer]({B}#pre-training-step)",
             pretrain_step_answer, section="pretrain-step"),
    Headline("continued-pretrain", "[Continued pre-training step against `run_mlm.py`](docs/results/pretrain_step/"
             "README.md#continued-pre-training-step)", continued_pretrain_answer, section="continued-pretrain"),
    Headline("training-memory", "[Does training memory stay flat?](docs/results/pretrain_memory/README.md#training-"
             "memory)", pretrain_memory_answer, section="pretrain-memory"),
    Headline("varied-batches", "[Inference on shapes that never repeat](docs/results/inference/README.md#inference-"
             "on-batches-whose-shapes-never-repeat)", varied_batches_answer, section="varied-batches"),
    Headline("server", f"[Server throughput]({B}#server-under-load) (16 clients, 2 cores)", serve_answer,
             section="serve-load"),
    Headline("server-limits", "[Server at its limits](docs/results/serve_load/README.md#server-at-its-limits): 50 "
             "clients at every request limit + 200 slow-header sockets, 10 min, then SIGTERM", at_limits_answer,
             section="server-limits"),
    Headline("server-memory", "[Server memory under random traffic](docs/results/serve_memory/README.md#server-memory-"
             "under-randomised-traffic)", serve_memory_answer, section="server-memory"),
    Headline("tokenizer", f"[Tokenizer throughput]({B}#tokenizer-throughput) against `BertTokenizerFast`",
             tokenizer_answer, section="tokenizer"),
    Headline("tokenizer-long", f"[Tokenizing 1,000,000 characters without spaces]({B}#tokenizer-throughput)",
             tokenizer_long_answer, section="tokenizer-long"),
    Headline("prepare-pretraining", "[Pre-training instances from 54.2 MB of text](docs/results/prepare_pretraining/"
             "README.md#pre-training-instances-at-corpus-scale)", prepare_pretraining_answer,
             section="prepare-pretraining"),
    Headline("squad-cpu", f"[SQuAD v1.1 fine-tuning on CPU]({B}#squad-fine-tuning-on-cpu) against run_qa",
             squad_cpu_answer, section="squad-cpu"),
    Headline("squad-features", "[SQuAD feature conversion](docs/results/squad/README.md#squad-feature-conversion) "
             "against run_qa", squad_features_answer, section="squad-features"),
    Headline("vocab-extend", "[Vocabulary extension](docs/results/vocab_extend/README.md#vocabulary-extension)",
             vocab_extend_answer, section="vocab-extend"),
    Headline("cpu-kernels", "[CPU kernels for inference](docs/results/inference/README.md#cpu-kernels-for-inference)",
             cpu_kernels_answer, section="cpu-kernels"),
    Headline("distill-speed", f"[How much faster is a distilled student?]({B}#distilled-students-throughput) "
             "(`pipeline`, batch 32, 3-layer student of MiniLM)", distill_speed_answer, section="distill-speed"),
    Headline("embed", f"[Sentence embeddings against sentence-transformers' `encode`]({B}#sentence-embeddings-"
             "encoding-throughput) (`pipeline(\"embed\")`)", embed_answer, section="embed"),
    Headline("embed-student", f"[How much does a 3-layer sentence-embedding student keep?]({B}#sentence-embeddings-"
             "a-distilled-3-layer-student) (distilled from the STS-B bi-encoder)", embed_student_answer,
             section="embed-student"),
    Headline("gpu", f"[GPU (one H100): pre-training, fine-tuning, inference against the peer]({B}#gpu) "
             "(BERT-base, bf16)", gpu_answer, section="gpu"),
)

QUALITY = ("bertforge", "peer", "verdict")
SPEED = ("answer (ratios: bertforge / peer)",)
RESULTS_KEYS = ("glue", "ner", "ner-features", "squad-v1.1", "squad-v2.0", "goemotions", "sentence-embedding", "distill", "multiple-choice",
                "pretrain-budget", "sst2-mini-vs-random", "tapt", "ablations")
BENCHMARKS_KEYS = ("finetune-speed", "goemotions-speed", "inference", "inference-int8", "accuracy", "inference-dtypes",
                   "encoder", "machine-limit", "pretrain-step", "continued-pretrain", "training-memory",
                   "varied-batches", "server", "server-limits", "server-memory", "tokenizer", "tokenizer-long",
                   "prepare-pretraining", "squad-cpu", "squad-features", "vocab-extend", "cpu-kernels",
                   "distill-speed", "embed", "embed-student", "gpu")

TABLES = (
    HeadlineTable("headlines-results", "RESULTS.md, the headline table (quality)", QUALITY, RESULTS_KEYS),
    HeadlineTable("headlines-benchmarks", "BENCHMARKS.md, the headline table (speed and memory)", SPEED,
                  BENCHMARKS_KEYS),
    HeadlineTable("headlines-readme-quality", "README.md, headline figures: quality (RESULTS.md's rows)", QUALITY,
                  ("glue", "ner", "squad-v1.1", "squad-v2.0", "distill", "pretrain-budget"), commit_column=False),
    HeadlineTable("headlines-readme-speed", "README.md, headline figures: speed (BENCHMARKS.md's rows)", SPEED,
                  ("finetune-speed", "inference", "inference-int8", "accuracy", "pretrain-step", "server",
                   "distill-speed", "embed", "gpu"), commit_column=False),
)


def headlines() -> dict[str, Headline]:
    """Every row by key; raises on a key declared twice."""
    found: dict[str, Headline] = {}
    for row in HEADLINES:
        if row.key in found:
            raise ValueError(f"two headline rows keyed {row.key!r}")
        found[row.key] = row
    return found


def registry() -> dict[str, HeadlineTable]:
    """Every headline table by its marker's name; raises on a table that lists a row not declared."""
    rows_ = headlines()
    for table in TABLES:
        unknown = [key for key in table.keys if key not in rows_]
        if unknown:
            raise ValueError(f"{table.name}: no headline row keyed {unknown}")
    return {table.name: table for table in TABLES}


# --- rendering -----------------------------------------------------------------------------------------

Section = Benchmark | Report | tuple[Benchmark, View]  # a view: with the benchmark whose result it renders
Sections = Mapping[str, Section]  # by name


def sections() -> dict[str, Section]:
    """Every section a row can read: the reports, the benchmarks, and each view with its benchmark."""
    benchmarks = benchmark_registry()
    return {**report_registry(), **benchmarks, **views(benchmarks)}


def section_data(section: Section, root: Path = ROOT) -> tuple[Any, str | None]:
    """What a row's function reads, as the section's table reads it (a report's sources; a benchmark's result,
    pre-harness files adapted; a view's, joined with those of the benchmarks it joins), and the section's
    captions' commits and dates as a "commit, date" cell for every run (None for a report, whose runs
    `commit_cell` picks)."""
    if isinstance(section, Report):
        return load_sources(section, root), None
    results = [load_result(owner, root) for owner in (joined(*section) if isinstance(section, tuple) else [section])]
    commits, dates = [], []
    for result in results:
        version = result["commit"]
        mine = str(version["hash"]).split(", ")
        if version.get("dirty"):
            mine[-1] += " (uncommitted changes)"
        commits += mine
        dates += str(result["date"]).split(", ")
    return join(results), commit_text(commits, dates)


def commit_cell(row: Headline, section: Section, cell: str | None, root: Path = ROOT) -> str:
    """A row's "commit, date": a benchmark's result's; a report's provenance runs (those in `row.runs`,
    in its order, each of which must be among them)."""
    if cell is not None:
        if row.runs:
            raise ValueError(f"headline {row.key}: `runs` picks a report's provenance runs; {row.section} is a "
                             "benchmark, whose result has one commit and date")
        return cell
    assert isinstance(section, Report)
    runs = load_provenance(section, root)["runs"]
    if row.runs:
        by_commit = {run["commit"]: run for run in runs}
        missing = [commit for commit in row.runs if commit not in by_commit]
        if missing:
            raise ValueError(f"headline {row.key}: {missing} not among {section.name}'s runs in provenance.json")
        runs = [by_commit[commit] for commit in row.runs]
    return commit_text([run["commit"] for run in runs], [run["date"] for run in runs])


def row_cells(row: Headline, known: Sections, root: Path = ROOT,
              cache: dict[str, tuple[Any, str | None]] | None = None) -> tuple[Cells, str]:
    """A row's answer cells and its "commit, date" cell, read from its section's files (or as typed)."""
    if isinstance(row.answer, Typed):
        return row.answer.cells, row.answer.commit
    if row.section not in known:
        raise ValueError(f"headline {row.key}: no benchmark, view or report named {row.section!r}")
    section = known[row.section]
    cache = {} if cache is None else cache
    if row.section not in cache:
        cache[row.section] = section_data(section, root)
    data, cell = cache[row.section]
    return tuple(row.answer(data)), commit_cell(row, section, cell, root)


def section(table: HeadlineTable, document: Path, root: Path = ROOT) -> str:
    """What belongs between a headline table's markers in `document`: the table, its links made relative
    to the document."""
    rows_, known, cache = headlines(), sections(), {}
    header = ["question", *table.columns] + (["commit, date"] if table.commit_column else [])
    body = []
    for key in table.keys:
        cells, commit = row_cells(rows_[key], known, root, cache)
        if len(cells) != len(table.columns):
            raise ValueError(f"headline {key}: {len(cells)} answer cells for {table.name}'s {len(table.columns)}")
        line = [rows_[key].question, *cells] + ([commit] if table.commit_column else [])
        body.append([relink(cell, document, root) for cell in line])
    return rows(header, body) + "\n"
