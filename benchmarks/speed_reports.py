"""BENCHMARKS.md's speed tables whose runs predate the harness, as reports (see report.py): each reads the files
its script wrote under docs/results/ and writes the table from them, and BENCHMARKS.md's headline rows for
these sections read the same files through the `*_answer` functions here.

Ratios are computed from the times (or rates) the files record, not from a ratio a script stored rounded to
three decimals, so that a figure is not rounded twice (legacy.ratio_text's rule); a figure stored only
rounded (the server's latencies) is rounded as its decimal text reads (`half_up`). What a table does not take
from its files is declared beside it: the rows' labels and order, the goals, and which figures are bold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from .report import Report, Sources
from .results import bold, half_up, rows, seed_range

if TYPE_CHECKING:  # headlines imports this module for its answers: only the annotation here
    from .headlines import Cells


def times(ratio: float) -> str:
    """A speed ratio at two decimals: `1.56×`."""
    return f"{ratio:.2f}×"


def verdict(bar: str, met: bool) -> str:
    """A goal and whether it is met: `≥ 1.5× **not met**` (a miss bold)."""
    return f"{bar} " + bold("met" if met else "not met", not met)


def span_text(figures: list[str]) -> str:
    """headlines.span, imported where it is called: headlines imports this module for its answers."""
    from .headlines import span

    return span(figures)


# --- Server under load ----------------------------------------------------------------------------------

SERVE_ROWS = (  # (file, label, the row bold: the headline's, int8)
    ("serve_load/fp32.json", "fp32 (exact packing)", False),
    ("serve_load/bf16.json", "`--dtype bf16` (buckets)", False),
    ("serve_load/int8.json", "`--dtype int8` (buckets)", True),
)


def serve_table(sources: Sources) -> str:
    """`serve_load.py --modes batched` per dtype: requests, rate, latencies, errors, RSS after warm-up and at
    the end and its growth over the second half; the int8 row's rate and memory bold (the headline's)."""
    body = []
    durations = set()
    for file, label, emphasis in SERVE_ROWS:
        result = sources[file]
        load = result["batched"]
        durations.add(result["duration_s"])
        body.append([label, f"{load['requests']:,}", bold(half_up(load["throughput_rps"], 1), emphasis),
                     half_up(load["p50_ms"], 1), half_up(load["p99_ms"], 1), str(load["errors"]),
                     f"{load['rss_start_mb']:.1f} → " + bold(f"{load['rss_end_mb']:.1f}", emphasis),
                     bold(f"{load['rss_growth_second_half_mb']:.1f}", emphasis)])
    [duration] = durations
    return rows(["server", f"requests in {duration:g} s", "req/s", "p50 ms", "p99 ms", "errors",
                 "RSS after warm-up → end (MB)", "growth, 2nd half (MB)"], body)


def serve_answer(sources: Sources) -> Cells:
    """int8's rate and p99 latency, and bf16's rate."""
    int8, bf16 = (sources[f"serve_load/{dtype}.json"]["batched"] for dtype in ("int8", "bf16"))
    return (f"int8 {half_up(int8['throughput_rps'], 1)} req/s, p99 {half_up(int8['p99_ms'], 1)} ms; "
            f"bf16 {half_up(bf16['throughput_rps'], 1)} req/s",)


# --- SQuAD fine-tuning on CPU ---------------------------------------------------------------------------

SQUAD_CPU = "squad/v1.1_cpu.json"
SQUAD_QUESTIONS = "squad/v1.1_errors.json"  # the same dev file's question count (squad_errors.py read it)
SQUAD_MEMORY = "squad_v2/squad_memory.json"


def squad_cpu_figures(sources: Sources) -> dict[str, Any]:
    """The CPU run's figures: each side's seed-1 run (bertforge's 3 epochs, the peer's first), the peer's
    evaluation seconds, and the BERT-Base memory run."""
    cpu = sources[SQUAD_CPU]
    [ours] = cpu["bertforge_3_epochs"]["sides"]["bertforge"]["runs"].values()
    [peer] = cpu["peer_1_epoch"]["sides"]["peer"]["runs"].values()
    [peer_eval] = cpu["peer_eval_seconds"]
    first = {side: run["epochs"][0]["elapsed_seconds"] for side, run in (("ours", ours), ("peer", peer))}
    return {"ours": ours, "peer": peer, "peer_eval": peer_eval, "first": first,
            "ratio": first["peer"] / first["ours"], "memory": sources[SQUAD_MEMORY]}


def squad_cpu_table(sources: Sources) -> str:
    """First-epoch training seconds (bertforge's later epochs beside), evaluation seconds and peak RSS per
    side; the last row: the peak of a BERT-Base-size run (`squad_memory.py`)."""
    found = squad_cpu_figures(sources)
    ours, memory = found["ours"], found["memory"]
    run = sources[SQUAD_CPU]["bertforge_3_epochs"]
    questions = sources[SQUAD_QUESTIONS]
    if questions["dev_file"] != run["dev_file"]:
        raise ValueError(f"{SQUAD_QUESTIONS} counts {questions['dev_file']}, not the CPU run's dev file")
    elapsed = [epoch["elapsed_seconds"] for epoch in ours["epochs"]]
    later = ", ".join(f"{after - before:.1f} s" for before, after in zip(elapsed, elapsed[1:]))
    later_epochs = " and ".join(f"{epoch['epoch']:g}" for epoch in ours["epochs"][1:])

    def gib(mib: float) -> str:
        return f"{mib / 1024:.1f} GiB"

    seeds = seed_range(run["sides"]["bertforge"]["seeds"])
    return rows([f"v{run['version']}, seed {seeds}", "training, epoch 1",
                 f"evaluation, {questions['questions']:,} questions", "peak RSS"], [
        ["bertforge", bold(f"{found['first']['ours']:,.1f} s") + f" (epochs {later_epochs}: {later})",
         "not recorded separately", bold(gib(ours["peak_rss_mib"]))],
        ["transformers (run_qa + utils_qa)",
         f"{found['first']['peer']:,.1f} s ({bold(times(found['ratio']))} bertforge's)",
         f"{found['peer_eval']:,.1f} s", gib(found["peer"]["peak_rss_mib"])],
        [f"bertforge at BERT-Base size (`{memory['preset']}`, random weights, seq {memory['max_seq_length']}, "
         f"batch {memory['batch_size']}, {memory['max_steps']} steps" + (", `--no-unpad`" if memory["padded"] else "")
         + ", then evaluation)", "", "", bold(f"{memory['peak_rss_gib']:.2f} GiB")],
    ])


def squad_cpu_answer(sources: Sources) -> Cells:
    """Both sides' first epoch and their ratio, and the BERT-Base run's peak."""
    found = squad_cpu_figures(sources)
    return (f"first epoch {found['first']['ours']:,.1f} s / {found['first']['peer']:,.1f} s "
            f"({times(found['ratio'])}); BERT-Base peak {found['memory']['peak_rss_gib']:.2f} GiB",)


# --- GPU ------------------------------------------------------------------------------------------------

GPU = "gpu/call3_pinned.json"  # the pinned-batch call: the headline table (the others: docs/results/gpu/)
GPU_GOAL_CASE = "seq128"  # the pre-training case the goals are set at
GPU_PRETRAIN_GOAL, GPU_MFU_GOAL = 1.3, 0.40  # pre-training: speed-up and MFU
GPU_STEP_GOAL = 1.5  # fine-tuning (against dynamic padding) and inference at batch 32
GPU_FINETUNE = (("sst2", "SST-2-length sentences"), ("mrpc", "MRPC-length pairs"))


def gpu_table(sources: Sources) -> str:
    """`gpu.py --parts pretrain,finetune,inference`: each step's rate on both sides (MFU for pre-training),
    the ratio and its goal; bold: the figures the goals read, and a goal not met."""
    result = sources[GPU]
    body = []
    for case, found in result["pretrain"].items():
        if not case.startswith("seq"):  # the part's own seconds
            continue
        ours, peer = found["bertforge"], found["transformers"]
        goal = case == GPU_GOAL_CASE
        verdicts = (verdict(f"≥ {GPU_PRETRAIN_GOAL:g}×", found["speedup"] >= GPU_PRETRAIN_GOAL) + "; "
                    + verdict(f"MFU ≥ {GPU_MFU_GOAL:.0%}", ours["mfu"] >= GPU_MFU_GOAL))
        body.append([f"pre-training, seq {case.removeprefix('seq')}, batch {found['batch']}",
                     f"{ours['tokens_per_second']:,.0f} tokens/s, " + bold(f"MFU {ours['mfu']:.1%}", goal),
                     f"{peer['tokens_per_second']:,.0f} tokens/s, MFU {peer['mfu']:.1%}",
                     bold(times(found["speedup"]), goal), verdicts if goal else ""])
    for index, (task, label) in enumerate(GPU_FINETUNE):
        found = result["finetune"][task]
        dynamic, grouped = (f"{found[f'transformers_{how}']['examples_per_second']:,.0f}"
                            for how in ("dynamic_padding", "group_by_length"))
        peer = f"{dynamic} (dynamic padding), {grouped} (`group_by_length`)" if index == 0 else f"{dynamic} / {grouped}"
        body.append([f"fine-tuning, {label}, batch {found['batch']}",
                     f"{found['bertforge']['examples_per_second']:,.0f} examples/s", peer,
                     f"{bold(times(found['speedup_vs_dynamic_padding']), index == 0)} / "
                     f"{times(found['speedup_vs_group_by_length'])}",
                     verdict(f"≥ {GPU_STEP_GOAL:g}×", found["speedup_vs_dynamic_padding"] >= GPU_STEP_GOAL)])
    small, large = result["inference"]["batch32"], result["inference"]["batch256"]

    def sentences(side: str) -> str:
        return " / ".join(f"{found[side]['sentences_per_second']:,.0f}" for found in (small, large))

    body.append(["inference (encoder + mean pooling), batch 32 / 256", sentences("bertforge") + " sentences/s",
                 sentences("transformers"), f"{bold(times(small['speedup']))} / {times(large['speedup'])}",
                 verdict(f"≥ {GPU_STEP_GOAL:g}× at 32", small["speedup"] >= GPU_STEP_GOAL)])
    return rows(["step", "bertforge", "transformers", "ratio", "goal"], body)


def gpu_answer(sources: Sources) -> Cells:
    """Pre-training's ratio and MFU at seq 128, the range of fine-tuning's ratios (against dynamic padding),
    inference's at batch 32, and whether the launch-bound steps reach their goal."""
    result = sources[GPU]
    pretrain = result["pretrain"][GPU_GOAL_CASE]
    finetune = [result["finetune"][task]["speedup_vs_dynamic_padding"] for task, _ in GPU_FINETUNE]
    inference = result["inference"]["batch32"]["speedup"]
    reach = "reach" if min(*finetune, inference) >= GPU_STEP_GOAL else "do not reach"
    return (f"pre-training {bold(times(pretrain['speedup']))} at MFU {pretrain['bertforge']['mfu']:.1%}; fine-tuning "
            f"{span_text([f'{ratio:.2f}' for ratio in finetune])}×; inference batch 32 {times(inference)}: GPU-bound "
            f"pre-training leads, launch-bound steps {reach} {GPU_STEP_GOAL:g}×",)


REPORTS = (
    Report(name="serve-load", figure='BENCHMARKS.md, "Server under load"',
           sources=tuple(file for file, *_ in SERVE_ROWS), table=serve_table),
    Report(name="squad-cpu", figure='BENCHMARKS.md, "SQuAD fine-tuning on CPU"',
           sources=(SQUAD_CPU, SQUAD_QUESTIONS, SQUAD_MEMORY), table=squad_cpu_table),
    Report(name="gpu", figure='BENCHMARKS.md, "GPU"', sources=(GPU,), table=gpu_table),
)
