"""Which CPU kernel runs BERT's inference fastest: the evidence behind the kernel defaults.

1. **Linear layers**: `F.linear` (torch's BLAS call, MKL in the PyPI wheel) against oneDNN's
   `torch.ops.mkldnn._linear_pointwise` (`bertforge.modeling.kernels.onednn_linear_op`), on each of the
   encoder's four products (QKV H→3H, attention output H→H, expansion H→4H, output 4H→H) at a few
   packed token counts T, plus the expansion with GELU applied after the BLAS call against oneDNN
   with GELU fused (`fused_linear_activation`); then oneDNN given the weight packed once in its blocked
   layout (`kernels.PackedWeight`) against the plain weight, in float32 and, where oneDNN has bfloat16
   kernels for the CPU, in bfloat16 (there against `F.linear` in bfloat16, and the expansion with
   GELU fused against `F.linear` then GELU).
2. **Attention** of N examples of L tokens (A heads of size D): torch's fused CPU kernel
   (`F.scaled_dot_product_attention`) against softmax(Q Kᵀ / √D) V as two batched matmuls, for L up to
   `--max-length`: where the matmuls win, `packing.MATH_ATTENTION_MAX_LENGTH` sends inference there.

Sizes: all-MiniLM-L6-v2 (H 384, 12 heads of 32) and BERT-base (H 768, 12 heads of 64). Each timing is
the median of `--repeats` runs of `--calls` calls after a warm-up, `--threads` threads. Exactly one JSON
line goes to stdout; progress goes to stderr.

    python benchmarks/cpu_kernels.py                  # a few minutes
    python benchmarks/cpu_kernels.py --repeats 1 --calls 3 --tokens 64 --lengths 16   # a smoke run
    python benchmarks/cpu_kernels.py --quick          # seconds: toy sizes (the test), backs no figure

`--quick`: both models' layers at 16 tokens, attention at L 16 and 32 on 32 tokens, 1 run of 2 calls.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

from _common import cpu_model, load_average, log

SIZES = {"minilm": (384, 12), "base": (768, 12)}  # hidden, heads


def seconds_per_call(function, calls: int, repeats: int) -> float:
    """Median over `repeats` of the mean seconds per call, after one warm-up round."""
    for _ in range(max(2, calls // 4)):
        function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            function()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def bf16_timings(op, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, gelu: bool, calls: int,
                 repeats: int) -> dict:
    """One linear layer in bfloat16: `F.linear` against oneDNN with the plain and the packed weight
    (and for the expansion, `F.linear` then GELU against GELU fused into the packed call)."""
    x, weight, bias = x.bfloat16(), weight.bfloat16(), bias.bfloat16()
    packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight)
    plain = seconds_per_call(lambda: F.linear(x, weight, bias), calls, repeats)
    onednn = seconds_per_call(lambda: op(x, weight, bias, "none", [None], ""), calls, repeats)
    packed = seconds_per_call(lambda: op(x, packed_weight, bias, "none", [None], ""), calls, repeats)
    row = {"bf16_linear_ms": round(plain * 1e3, 4), "bf16_onednn_ms": round(onednn * 1e3, 4),
           "bf16_onednn_packed_ms": round(packed * 1e3, 4), "bf16_packed_speedup": round(plain / packed, 3)}
    if gelu:
        unfused = seconds_per_call(lambda: F.gelu(F.linear(x, weight, bias)), calls, repeats)
        fused = seconds_per_call(lambda: op(x, packed_weight, bias, "gelu", [None], "none"), calls, repeats)
        row.update({"bf16_linear_then_gelu_ms": round(unfused * 1e3, 4),
                    "bf16_packed_gelu_fused_ms": round(fused * 1e3, 4), "bf16_fused_speedup": round(unfused / fused, 3)})
    return row


def linear_rows(hidden: int, tokens: list[int], calls: int, repeats: int, bf16: bool) -> list[dict]:
    op = torch.ops.mkldnn._linear_pointwise
    generator = torch.Generator().manual_seed(0)
    rows = []
    for name, (fan_in, fan_out) in {"qkv": (hidden, 3 * hidden), "attention_output": (hidden, hidden),
                                    "expansion": (hidden, 4 * hidden), "output": (4 * hidden, hidden)}.items():
        weight = torch.randn(fan_out, fan_in, generator=generator) * fan_in ** -0.5
        bias = torch.randn(fan_out, generator=generator)
        for count in tokens:
            x = torch.randn(count, fan_in, generator=generator)
            blas = seconds_per_call(lambda: F.linear(x, weight, bias), calls, repeats)
            onednn = seconds_per_call(lambda: op(x, weight, bias, "none", [None], ""), calls, repeats)
            row = {"layer": name, "in": fan_in, "out": fan_out, "tokens": count,
                   "blas_ms": round(blas * 1e3, 4), "onednn_ms": round(onednn * 1e3, 4),
                   "onednn_speedup": round(blas / onednn, 3),
                   "gflops_per_s_blas": round(2 * count * fan_in * fan_out / blas / 1e9, 1),
                   "gflops_per_s_onednn": round(2 * count * fan_in * fan_out / onednn / 1e9, 1)}
            if name == "expansion":
                unfused = seconds_per_call(lambda: F.gelu(F.linear(x, weight, bias)), calls, repeats)
                fused = seconds_per_call(lambda: op(x, weight, bias, "gelu", [None], "none"), calls, repeats)
                row.update({"blas_then_gelu_ms": round(unfused * 1e3, 4), "onednn_gelu_fused_ms": round(fused * 1e3, 4),
                            "fused_speedup": round(unfused / fused, 3)})
            packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight)
            packed = seconds_per_call(lambda: op(x, packed_weight, bias, "none", [None], ""), calls, repeats)
            row.update({"onednn_packed_ms": round(packed * 1e3, 4), "packed_speedup": round(onednn / packed, 3)})
            if bf16:
                row.update(bf16_timings(op, x, weight, bias, name == "expansion", calls, repeats))
            log(f"  H={hidden} {name} T={count}: BLAS {blas * 1e3:.2f} ms, oneDNN {onednn * 1e3:.2f} ms, "
                f"packed {packed * 1e3:.2f} ms")
            rows.append(row)
    return rows


def attention_rows(hidden: int, heads: int, lengths: list[int], token_counts: list[int], calls: int,
                   repeats: int) -> list[dict]:
    head_size = hidden // heads
    generator = torch.Generator().manual_seed(1)
    rows = []
    for length, tokens in itertools.product(lengths, token_counts):
        count = max(1, tokens // length)  # N examples of L tokens: about `tokens` tokens per call
        qkv = torch.randn(count * length, 3, heads, head_size, generator=generator)
        query, key, value = qkv.view(count, length, 3, heads, head_size).permute(2, 0, 3, 1, 4)

        def matmuls():
            scores = torch.matmul(query, key.transpose(-1, -2)).mul_(head_size ** -0.5)
            return torch.matmul(scores.softmax(dim=-1), value)

        fused = seconds_per_call(lambda: F.scaled_dot_product_attention(query, key, value), calls, repeats)
        plain = seconds_per_call(matmuls, calls, repeats)
        difference = (F.scaled_dot_product_attention(query, key, value) - matmuls()).abs().max().item()
        rows.append({"length": length, "examples": count, "tokens": count * length, "head_size": head_size,
                     "fused_kernel_ms": round(fused * 1e3, 4), "matmuls_ms": round(plain * 1e3, 4),
                     "matmuls_speedup": round(fused / plain, 3), "max_abs_diff": difference})
        log(f"  D={head_size} L={length} x{count}: fused {fused * 1e3:.3f} ms, matmuls {plain * 1e3:.3f} ms")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="minilm,base", help=f"comma-separated, from {', '.join(SIZES)}")
    parser.add_argument("--tokens", default="512,1024,2048", help="packed token counts T for the linear layers")
    parser.add_argument("--lengths", default="16,32,48,64,96,128,192,256", help="attention lengths L")
    parser.add_argument("--attention-tokens", default="128,512,2048",
                        help="comma-separated tokens per attention call (N = this / L examples): a packed batch's "
                             "group of one length holds one to a few examples of a shuffled batch, more when sorted")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="toy sizes, seconds: checks that it runs (the test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.lengths, args.attention_tokens, args.calls, args.repeats = "16", "16,32", "32", 2, 1
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for name in models:
        if name not in SIZES:
            parser.error(f"unknown model {name!r}; choose from {', '.join(SIZES)}")
    try:
        tokens = [int(t) for t in args.tokens.split(",")]
        lengths = [int(n) for n in args.lengths.split(",")]
        attention_tokens = [int(n) for n in args.attention_tokens.split(",")]
    except ValueError:
        parser.error("--tokens, --lengths and --attention-tokens take comma-separated integers")
    if min(tokens + lengths + attention_tokens) < 1 or args.calls < 1 or args.repeats < 1 or args.threads < 1:
        parser.error("--tokens, --lengths, --calls, --repeats and --threads must be at least 1")
    if not torch.backends.mkldnn.is_available():
        parser.error("this torch has no oneDNN (torch.backends.mkldnn)")
    torch.set_num_threads(args.threads)
    bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())

    load_before = load_average()
    results = {}
    with torch.inference_mode():
        for name in models:
            hidden, heads = SIZES[name]
            log(f"{name}: linear layers ...")
            results[name] = {"linear": linear_rows(hidden, tokens, args.calls, args.repeats, bf16)}
            log(f"{name}: attention ...")
            results[name]["attention"] = attention_rows(hidden, heads, lengths, attention_tokens,
                                                        args.calls, args.repeats)
    print(json.dumps({
        "benchmark": "cpu_kernels", **({"quick": True} if args.quick else {}),
        "models": models, "threads": torch.get_num_threads(), "bf16": bf16,
        "calls": args.calls, "repeats": args.repeats, "torch_version": torch.__version__,
        "cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "results": results,
        "load_average_before": load_before, "load_average_after": os.getloadavg()[0],
    }), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
