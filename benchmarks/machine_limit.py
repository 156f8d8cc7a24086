"""How close the encoder runs to this CPU's limit: the FLOP/s a forward pass and a training step achieve as a
share of the best square matmul's, bertforge beside the peer (Hugging Face transformers).

Two configurations, each timed for its forward pass and its training step, fp32 and bf16 (8 cases):

- `12/768/12` (BERT-base's shape) on the first 4 batches of 32 GLUE SST-2 dev sentences in file order, each
  padded to its longest sentence: the peer computes the padding as well (about twice the real tokens);
- `6/384/12` (all-MiniLM-L6-v2's shape) on 8 batches of 32 grouped by length as transformers'
  `group_by_length=True` forms them (`grouped_batches`): both sides do nearly the same arithmetic.

Each configuration's model is a random `BertForSequenceClassification` (seed 0, 2 labels) saved once, which
both sides load: the same weights and the same batches (labels alternate 0, 1). A side's call is one pass
over the configuration's batches:

- forward, under `torch.inference_mode()`: bertforge `optimize_for_inference(model, dtype=precision)`
  (unpadded; bf16: bf16 weights and activations), the peer with attn_implementation="sdpa", its bf16 under
  `torch.autocast("cpu", dtype=torch.bfloat16)`;
- training step (forward, backward, AdamW at lr 1e-5, dropout on) on each batch: bertforge's plain model
  unpadded (`use_unpadded`; not its `Trainer`, whose CPU extras such as sparse word-embedding gradients are
  off here) with `build_optimizer`, the peer padded with `torch.optim.AdamW(fused=True)` (its `Trainer`'s
  default): PyTorch's fused AdamW on both; bf16: the forward and the loss under autocast on both.

Peak: a plain `torch.mm` of square n×n matrices (2·n³ FLOPs a product) for each n of the case's `mm_sizes`,
each timed for `mm_seconds`, the best rate; measured once per precision in a run (at the run's threads, in
the setup of that precision's first case, before its sides are loaded) and recorded in every case of that
precision (`facts["peak"]`).

Useful FLOPs count the real tokens only (`useful_flops`): per layer, a sequence of n tokens costs 24·n·H²
(the Q, K, V and output projections 8·n·H², the feed-forward 16·n·H², a multiply-add as 2 FLOPs) plus 4·n²·H
(QKᵀ and the weighted sum of V); a training step counts 3× the forward (backward ≈ 2× forward). Work a side
spends on padding does not count, so the two sides' shares of the peak compare directly.

The check, on each side's first pass: forward, the largest absolute difference of the sides' logits (fp32:
within `inference.FP32_TOLERANCE`; bf16: recorded, finite: the two sides round differently, bertforge's
weights being bf16 themselves, the peer's cast per op); training step, before its first step each side's
loss on the first batch in eval mode and fp32 (the same weights and batch: within `pretrain.LOSS_TOLERANCE`),
and every step's loss of that pass finite.

Tables: BENCHMARKS.md's (`table`: seconds, ratio, share of the peak) and the view `machine-limit-full`
(`full_table`: docs/results/machine_limit/README.md's, with the GFLOP/s and the setting). A run writes
docs/results/machine_limit/machine_limit.json; until one has, they render the script's files base.json and
minilm_grouped.json (`LEGACY_FILES`, through `adapt`).

    python -m benchmarks run machine-limit                        # the figures (about 6 minutes)
    python -m benchmarks run machine-limit --quick --threads 1    # seconds: toy sizes, backs no figure

`--quick`: the peak of 64×64 and 128×128 products timed for 0.05 s each, a random 2/64/2 model on 2 batches
of 4 (in file order, and grouped) from a toy SST-2 dev file of Shakespeare's speeches (`_common.quick_glue`,
written in a temporary directory).

The script this replaces also profiled each side (`torch.profiler`: self CPU time by kind of op); that
profile is not part of the benchmark (it is no timing the harness could alternate or check). Its figures,
docs/results/machine_limit/README.md's profile table, stay in the pre-harness files base.json and
minilm_grouped.json (`profile_*`), kept for them after a rerun; the script is in git's history.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    raise SystemExit("benchmarks/machine_limit.py runs through the harness, from the repository root: "
                     "python -m benchmarks run machine-limit [--quick]")

import functools  # noqa: E402
import math  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, Any, Callable  # noqa: E402

from . import legacy  # noqa: E402
from .harness import Benchmark, Params, Prepared, View, log  # noqa: E402
from .inference import FP32_TOLERANCE, GLUE, held, plural, read_tsv  # noqa: E402
from .pretrain import LOSS_TOLERANCE  # noqa: E402
from .results import bold, rows  # noqa: E402
from .speed_reports import times  # noqa: E402

if TYPE_CHECKING:
    import torch

SIDES = ("bertforge", "transformers")
WORKS = {"forward": "forward", "train_step": "training step"}  # the work a case times -> its label in the tables
PRECISIONS = ("fp32", "bf16")
FORWARDS = {"forward": 1, "train_step": 3}  # a work's useful FLOPs in forward passes (backward ≈ 2 forwards)
SIZE_LABELS = {"12/768/12": "base", "6/384/12": "MiniLM shape"}  # #L/#H/#A -> the tables' name for it
MAX_LENGTH = 128
PEAK = {"mm_sizes": [1024, 2048, 3072], "mm_seconds": 1.0}  # the peak's products (the script's defaults)
QUICK_PEAK = {"mm_sizes": [64, 128], "mm_seconds": 0.05}
DATA_LABELS = {"sst2": "SST-2 dev sentences", "speeches": "Shakespeare speeches"}
LEGACY_FILES = ("machine_limit/base.json", "machine_limit/minilm_grouped.json")  # the table's two halves

Batch = dict[str, "torch.Tensor"]


# --- cases and inputs -----------------------------------------------------------------------------------

def configurations(quick: bool) -> list[Params]:
    """The configurations the section reports (base in file order, MiniLM's shape grouped); `quick`: a 2/64/2
    model on 2 batches of 4 toy sentences, in file order and grouped."""
    if quick:
        return [{"model_size": "2/64/2", "data": "speeches", "batch_size": 4, "batches": 2, "grouped": grouped}
                for grouped in (False, True)]
    return [{"model_size": "12/768/12", "data": "sst2", "batch_size": 32, "batches": 4, "grouped": False},
            {"model_size": "6/384/12", "data": "sst2", "batch_size": 32, "batches": 8, "grouped": True}]


def cases(quick: bool) -> list[Params]:
    """Per configuration: forward then training step, each fp32 then bf16."""
    peak = QUICK_PEAK if quick else PEAK
    return [{**configuration, "work": work, "precision": precision, **peak}
            for configuration in configurations(quick) for work in WORKS for precision in PRECISIONS]


def shape(params: Params) -> tuple[int, int, int]:
    """(layers, hidden size, attention heads) of the case's `model_size`, `#L/#H/#A`."""
    layers, hidden, heads = (int(part) for part in params["model_size"].split("/"))
    return layers, hidden, heads


def sentences(data: str, scratch: Path) -> list[str]:
    """GLUE SST-2 dev's sentences in file order, or for `--quick` (`speeches`) those of a toy SST-2 dev file
    of Shakespeare's speeches written under `scratch`."""
    from ._common import quick_glue

    root = quick_glue(scratch, "SST-2", rows=150) if data == "speeches" else GLUE
    return [row[0].strip() for row in read_tsv(root / "SST-2" / "dev.tsv")]


def grouped_batches(texts: list[str], tokenizer: Any, batch_size: int, count: int, seed: int = 0) -> list[list[str]]:
    """`count` evenly spaced batches of one mega-batch, as transformers' `LengthGroupedSampler` orders them: the
    sentences in a seeded random order, the first 50 batches' worth sorted by length (longest first) and cut
    into batches; so each batch is padded little and their lengths span the data's."""
    import torch

    order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(seed)).tolist()
    mega = [texts[i] for i in order[:50 * batch_size]]
    lengths = [len(e["input_ids"]) for e in tokenizer.encode_batch(mega, max_length=MAX_LENGTH, padding=False)]
    mega = [text for _, text in sorted(zip(lengths, mega), key=lambda pair: -pair[0])]
    cut = [mega[i:i + batch_size] for i in range(0, len(mega), batch_size)]
    return [cut[round(k * (len(cut) - 1) / max(1, count - 1))] for k in range(count)]


@dataclass
class Configuration:
    """A configuration's inputs, built once for its cases: the saved model both sides load (in `scratch`,
    removed when this is dropped) and the batches, labels included."""

    scratch: tempfile.TemporaryDirectory
    directory: Path
    batches: list[Batch]

    def lengths(self) -> list[int]:
        """Every sequence's real tokens."""
        return [n for batch in self.batches for n in batch["attention_mask"].sum(-1).tolist()]


def configuration(params: Params) -> Configuration:
    """The case's configuration (`inference.held`: built once for all its cases, the previous one's freed)."""
    keys = ("model_size", "data", "batch_size", "batches", "grouped")

    def build() -> Configuration:
        import torch

        from bertforge.tokenization import BertTokenizer

        from ._common import minilm_dir, quick_checkpoint

        scratch = tempfile.TemporaryDirectory(prefix="bertforge-limit-")
        layers, hidden, heads = shape(params)
        directory = quick_checkpoint(Path(scratch.name) / "model", "BertForSequenceClassification",
                                     num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                     intermediate_size=4 * hidden, num_labels=2)
        texts = sentences(params["data"], Path(scratch.name))
        tokenizer = BertTokenizer.from_pretrained(minilm_dir())
        size, count = params["batch_size"], params["batches"]
        groups = (grouped_batches(texts, tokenizer, size, count) if params["grouped"]
                  else [texts[i * size:(i + 1) * size] for i in range(count)])
        batches = []
        for group in groups:
            batch = tokenizer.encode_batch(group, max_length=MAX_LENGTH, return_tensors="pt")
            batch["labels"] = torch.arange(len(group)) % 2
            batches.append(batch)
        return Configuration(scratch, directory, batches)

    return held(("machine-limit", *(params[key] for key in keys)), build)


def useful_flops(lengths: list[int], layers: int, hidden: int, intermediate: int) -> float:
    """Forward FLOPs of the real tokens (the module docstring's count), summed over sequences and layers."""
    per_token = 2 * (4 * hidden * hidden + 2 * hidden * intermediate)
    return float(layers * sum(n * per_token + 4 * n * n * hidden for n in lengths))


@functools.cache
def matmul_peak(precision: str, sizes: tuple[int, ...], seconds: float) -> dict[str, float]:
    """The best FLOP/s of `torch.mm` over square sizes n, each timed for about `seconds` after two untimed
    products (the kernel, the pages), and the n that gave it; measured once per process and arguments."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    best = {"flops_per_s": 0.0, "n": 0}
    for n in sizes:
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        for _ in range(2):
            torch.mm(a, b)
        count, start = 0, time.perf_counter()
        while True:
            torch.mm(a, b)
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        rate = 2 * n ** 3 * count / elapsed
        log(f"machine-limit: mm {precision} n={n}: {rate / 1e9:.1f} GFLOP/s")
        if rate > best["flops_per_s"]:
            best = {"flops_per_s": rate, "n": n}
    return best


# --- the sides ------------------------------------------------------------------------------------------

def features(batch: Batch) -> Batch:
    """A batch's model inputs, its labels left out (a forward pass computes no loss)."""
    return {key: batch[key] for key in ("input_ids", "token_type_ids", "attention_mask")}


def forward_pass(model: Any, batches: list[Batch], autocast: bool) -> Callable[[], list["torch.Tensor"]]:
    """A side's forward call: every batch's logits, with `autocast` under bf16 autocast."""
    import torch

    def call() -> list[torch.Tensor]:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return [model(**features(batch)).logits for batch in batches]

    return call


def training_pass(model: Any, optimizer: Any, batches: list[Batch], autocast: bool) -> Callable[[], dict[str, Any]]:
    """A side's training call: a step on every batch (with `autocast`, the forward and the loss under bf16
    autocast), returning each step's loss. Its first call (the harness's first warm-up, which `check` sees)
    first computes the first batch's loss in eval mode, fp32, untrained: the sides must agree on it."""
    import torch

    first = [True]

    def call() -> dict[str, Any]:
        untrained = None
        if first:
            first.clear()
            model.eval()
            with torch.no_grad():
                untrained = float(model(**batches[0]).loss)
            model.train()
        losses = []
        for batch in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        return {"first_loss": untrained, "losses": losses}

    return call


def setup(params: Params) -> Prepared:
    """Both sides of one case on the configuration's weights and batches (module docstring), and the facts
    the tables need: the tokens, the useful FLOPs of a call, the precision's matmul peak."""
    import torch
    import transformers

    from bertforge.modeling import BertForSequenceClassification, optimize_for_inference, use_unpadded
    from bertforge.training.optim import build_optimizer

    from ._common import quiet_libraries

    quiet_libraries()
    found = configuration(params)
    precision, bf16 = params["precision"], params["precision"] == "bf16"
    peak = matmul_peak(precision, tuple(params["mm_sizes"]), params["mm_seconds"])
    layers, hidden, _ = shape(params)
    facts = {"real_tokens": sum(found.lengths()),
             "padded_tokens": sum(batch["input_ids"].numel() for batch in found.batches),
             "useful_flops": FORWARDS[params["work"]] * useful_flops(found.lengths(), layers, hidden, 4 * hidden),
             "peak": dict(peak)}
    peer = transformers.BertForSequenceClassification.from_pretrained(found.directory, attn_implementation="sdpa")
    ours = BertForSequenceClassification.from_pretrained(found.directory)
    if params["work"] == "forward":
        sides = {"bertforge": forward_pass(optimize_for_inference(ours, dtype=precision), found.batches, False),
                 "transformers": forward_pass(peer.eval(), found.batches, bf16)}
    else:
        use_unpadded(ours)
        # each side's optimizer as its trainer builds it: both PyTorch's fused AdamW
        optimizers = {"bertforge": build_optimizer(ours, lr=1e-5),
                      "transformers": torch.optim.AdamW(peer.parameters(), lr=1e-5, fused=True)}
        sides = {side: training_pass(model.train(), optimizers[side], found.batches, bf16)
                 for side, model in zip(SIDES, (ours, peer))}
    return Prepared(sides, facts)


def check(params: Params, outputs: dict[str, Any]) -> dict[str, Any]:
    """Forward: the largest absolute difference of the sides' logits, within `FP32_TOLERANCE` in fp32 (finite in
    bf16). Training step: both sides' untrained fp32 loss on the first batch, within `LOSS_TOLERANCE` of each
    other, and every step's loss finite. Raises otherwise."""
    if params["work"] == "forward":
        ours, peer = outputs["bertforge"], outputs["transformers"]
        diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(ours, peer))
        if not math.isfinite(diff) or (params["precision"] == "fp32" and not diff <= FP32_TOLERANCE):
            raise AssertionError(f"{params}: bertforge's logits differ from transformers' by {diff:.3g}")
        return {"max_abs_diff_logits": diff}
    losses = {side: outputs[side]["first_loss"] for side in SIDES}
    if not abs(losses["bertforge"] - losses["transformers"]) <= LOSS_TOLERANCE:
        raise AssertionError(f"{params}: the sides' untrained losses on the first batch differ: {losses}")
    unfinite = [side for side in SIDES if not all(math.isfinite(float(loss)) for loss in outputs[side]["losses"])]
    if unfinite:
        raise AssertionError(f"{params}: a training loss of {unfinite} is not finite")
    return {"first_loss": losses}


# --- tables ---------------------------------------------------------------------------------------------

def size_label(params: Params) -> str:
    """`base`, `MiniLM shape`, or the size itself (`2/64/2`)."""
    return SIZE_LABELS.get(params["model_size"], params["model_size"])


def configuration_label(params: Params) -> str:
    """`base, file order`, `MiniLM shape, grouped`."""
    return f"{size_label(params)}, {'grouped' if params['grouped'] else 'file order'}"


def by_configuration(result: dict[str, Any]) -> dict[str, dict[tuple[str, str], dict[str, Any]]]:
    """The result's cases by configuration (its label, in run order), then by (work, precision)."""
    found: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
    for case in result["cases"]:
        params = case["params"]
        found.setdefault(configuration_label(params), {})[params["work"], params["precision"]] = case
    return found


def rate(case: dict[str, Any], side: str) -> float:
    """A side's useful FLOP/s at its median call."""
    return case["facts"]["useful_flops"] / case["sides"][side]["median"]


def share(case: dict[str, Any], side: str) -> float:
    """A side's useful FLOP/s as a share of the precision's matmul peak."""
    return rate(case, side) / case["facts"]["peak"]["flops_per_s"]


def ratio(case: dict[str, Any]) -> float:
    """The peer's median seconds over bertforge's."""
    return case["sides"]["transformers"]["median"] / case["sides"]["bertforge"]["median"]


def table(result: dict[str, Any]) -> str:
    """BENCHMARKS.md's: per work and precision, each configuration's median seconds on both sides, the ratio and
    both sides' share of the peak."""
    groups = by_configuration(result)
    header = ["work", "precision"]
    for index, label in enumerate(groups):
        header += [f"{label}: bertforge / peer s", "**ratio**",
                   "of peak: bertforge / peer" if index == 0 else "of peak"]
    body = []
    for work, precision in next(iter(groups.values())):
        cells = [WORKS[work], precision]
        for found in groups.values():
            case = found[work, precision]
            sides = case["sides"]
            cells += [f"{sides['bertforge']['median']:.2f} / {sides['transformers']['median']:.2f}",
                      bold(times(ratio(case))), f"{share(case, 'bertforge'):.0%} / {share(case, 'transformers'):.0%}"]
        body.append(cells)
    return rows(header, body)


def full_table(result: dict[str, Any]) -> str:
    """docs/results/machine_limit/README.md's: each configuration's setting (batches, tokens, peaks), then a row
    per configuration, work and precision with both sides' seconds, the ratio, and each side's useful GFLOP/s
    and share of the peak."""
    groups = by_configuration(result)
    setting = []
    for label, found in groups.items():
        first = next(iter(found.values()))
        params, facts = first["params"], first["facts"]
        peaks = ", ".join(f"{precision} {found[work, precision]['facts']['peak']['flops_per_s'] / 1e9:.1f}"
                          for work, precision in found if work == "forward")
        setting.append(f"{label}: {params['batches']} batches of {params['batch_size']} {DATA_LABELS[params['data']]} "
                       f"({facts['real_tokens']:,} real tokens, {facts['padded_tokens']:,} padded), "
                       f"peak {peaks} GFLOP/s")
    repeats = len(result["cases"][0]["sides"]["bertforge"]["repeats"])
    body = []
    for label, found in groups.items():
        for index, ((work, precision), case) in enumerate(found.items()):
            body.append([label if index == 0 else "", WORKS[work], precision,
                         *(f"{case['sides'][side]['median']:.2f}" for side in SIDES), bold(times(ratio(case))),
                         *(f"{rate(case, side) / 1e9:.1f} ({share(case, side):.0%})" for side in SIDES)])
    return ("; ".join(setting) + f"; medians of {plural(repeats, 'repeat')}, {plural(result['threads'], 'thread')}."
            + "\n\n" + rows(["model, batches", "work", "precision", "bertforge s", "peer s", "**bertforge / peer**",
                             "bertforge GFLOP/s (of peak)", "peer GFLOP/s (of peak)"], body))


# --- results written before the harness -----------------------------------------------------------------

def adapt(files: dict[str, Any]) -> dict[str, Any]:
    """docs/results/machine_limit/{base,minilm_grouped}.json as benchmarks/machine_limit.py wrote them (one
    configuration each, with the `provenance` block added when they were adapted): per work and precision and
    side (`ours`, `peer`), every repeat's seconds and their median; the configuration's tokens and useful
    forward FLOPs; the matmul peak per precision (GFLOP/s at one decimal). The script ran with its default peak
    sizes (`PEAK`); its profiles (`profile_*`) are not part of the schema."""
    olds = list(files.values())
    first = olds[0]
    if any(old["threads"] != first["threads"] for old in olds):
        raise ValueError("machine-limit: the pre-harness files ran on different thread counts")
    versions = {"torch": first["torch_version"], "transformers": first["transformers_version"]}
    result = {**legacy.header("machine-limit", "python -m benchmarks run machine-limit",
                              [old["provenance"] for old in olds], versions, round(first["load_average_before"], 2)),
              "threads": first["threads"], "cases": []}
    for old in olds:
        params = {"model_size": old["model_size"], "data": "sst2", "batch_size": old["batch_size"],
                  "batches": old["batches"], "grouped": old["grouped"]}
        for work in WORKS:
            for precision in PRECISIONS:
                peak = old["matmul_peak"][precision]
                sides = {}
                for side, name in zip(SIDES, ("ours", "peer")):
                    found = old["results"][f"{work}_{name}_{precision}"]
                    every = found["seconds_all"]
                    sides[side] = {"repeats": every, "median": found["seconds"], "min": min(every), "max": max(every)}
                result["cases"].append({
                    "params": {**params, "work": work, "precision": precision, **PEAK},
                    "facts": {"real_tokens": old["real_tokens"], "padded_tokens": old["padded_tokens"],
                              "useful_flops": FORWARDS[work] * old["useful_forward_flops"],
                              "peak": {"flops_per_s": peak["gflops_per_s"] * 1e9, "n": peak["n"]}},
                    "sides": sides})
    return result


BENCHMARKS = (
    Benchmark(name="machine-limit", figure='''BENCHMARKS.md, "How close to the machine's limit"''', sides=SIDES,
              cases=cases, setup=setup, check=check, table=table, result="machine_limit/machine_limit.json",
              legacy=adapt, legacy_files=LEGACY_FILES, repeats=3,
              views=(View("machine-limit-full", 'docs/results/machine_limit/README.md, "The timed table in full"',
                          full_table),)),
)
