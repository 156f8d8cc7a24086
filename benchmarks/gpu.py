"""bertforge on one GPU against Hugging Face transformers (the "peer"): the measurements of issue 51, in one
process, in one call, one JSON line on stdout.

Both sides run random-initialised models with the same weights (bertforge's, saved and loaded into the
peer; nothing to download or carry), on the same synthetic batches, alternating which goes first in
each timed repeat (`--repeats`), timed with the device synchronised before and after each repeat.

1. `pretrain`: one pre-training step (forward, backward, clipping at 1.0, fused AdamW) of BERT-base
   (`--tiny`: the tiny preset) at seq 128 and seq 512, bf16 autocast: bertforge's `Trainer.train_step`
   (the packed layout, FlashAttention over variable lengths on CUDA, the masked-LM head at the masked
   positions) against the peer's `BertForPreTraining` (`attn_implementation="sdpa"`, bf16 autocast,
   `torch.optim.AdamW(fused=True)`, dense -100 labels). Instances as `prepare-pretraining` makes them:
   90% full length, 10% shorter (`short_seq_prob`), 15% of the tokens masked (at most 20 at 128, 76
   at 512), NSP labels. The batch is `--pretrain-batch` (halved for both sides until both fit).
   Reported: real tokens per second of each, their ratio, and the model FLOPs utilisation (MFU): the
   model's FLOPs on the real tokens (3 × the forward's 24·n·H² + 4·n²·H per layer for an example of n
   tokens, plus the masked-LM head at the masked positions) per second, over the GPU's dense bf16
   peak read from its name (`PEAK_BF16`; none reported for an unknown GPU or the CPU).
2. `finetune`: one fine-tuning step of `BertForSequenceClassification` (batch 32, bf16, fused AdamW)
   on batches of SST-2-like single sentences and MRPC-like pairs in random order (the paper's recipe):
   bertforge (packed) against the peer with dynamic padding (each batch padded to its longest) and
   with `group_by_length` (the peer's `LengthGroupedSampler`: mega-batches of 50 batches sorted by
   length, so that a batch's lengths are alike). The lengths are synthetic (`sentence_lengths`).
3. `inference`: the encoder's forward and mean pooling (what `pipeline("embed")` computes) at batch 32
   and 256 of SST-2-like sentences, bf16 weights: bertforge (`optimize_for_inference(dtype="bf16")`)
   against the peer's `BertModel` in bf16 with sdpa.
4. `correctness`: the first step's loss of both sides in float32 on the device, eval mode (no
   dropout), equal within 1e-4; and the packed plan's attention against the padded reference plan
   (outputs and parameter gradients) in bf16 on CUDA (FlashAttention over variable lengths), or, on
   the CPU, the packed CPU plan against the reference in float32 (FlashAttention needs CUDA: the
   varlen row then says it was skipped and why).

    python benchmarks/gpu.py                         # on the GPU (meant to end inside 8 minutes on one H100)
    python benchmarks/gpu.py --device cpu --tiny     # every part on the tiny preset, in seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from _common import log, quiet_libraries

REPO = Path(__file__).resolve().parents[1]

# Dense bf16 peak (TFLOP/s, no sparsity) by a name the device reports, first match wins. H100 SXM and
# H200: 989 (NVIDIA's data sheets); H100 PCIe: 756; H100 NVL: 835; A100: 312.
PEAK_BF16 = (("H200", 989.0, "H200 SXM, dense bf16"), ("H100 NVL", 835.0, "H100 NVL, dense bf16"),
             ("H100 PCIe", 756.0, "H100 PCIe, dense bf16"), ("H100", 989.0, "H100 SXM, dense bf16"),
             ("A100", 312.0, "A100, dense bf16"))
SEQ_LENGTHS = (128, 512)
MAX_PREDICTIONS = {128: 20, 512: 76}
# Synthetic sentence lengths in tokens ([CLS] and [SEP] included): mean, spread, shortest, longest.
SENTENCES = {"sst2": (25, 12, 5, 66), "mrpc": (53, 15, 20, 128)}


def sentence_lengths(kind: str, count: int, generator: torch.Generator) -> list[int]:
    """`count` lengths from a normal distribution clipped to the task's range (`SENTENCES`)."""
    mean, spread, low, high = SENTENCES[kind]
    draws = torch.randn(count, generator=generator) * spread + mean
    return [int(min(high, max(low, round(float(x))))) for x in draws]


def peak_flops(device: torch.device) -> tuple[float | None, str]:
    """(the dense bf16 peak in FLOP/s or None, what it was read as)."""
    if device.type != "cuda":
        return None, "no GPU peak: the CPU"
    name = torch.cuda.get_device_name(device)
    for key, tflops, said in PEAK_BF16:
        if key in name:
            return tflops * 1e12, f"{said}: {tflops:g} TFLOP/s (device name {name!r})"
    return None, f"unknown GPU {name!r}: no peak, no MFU"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- batches -----------------------------------------------------------------------------------------------

def pretraining_batch(batch: int, seq: int, vocab: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Instances as `prepare-pretraining` writes them, in bertforge's collated layout: (B, S) ids, segments
    and mask, (B, P) masked positions and labels (-100 past the instance's predictions), NSP labels."""
    predictions = MAX_PREDICTIONS.get(seq, max(1, round(0.15 * seq)))
    input_ids = torch.zeros(batch, seq, dtype=torch.long)
    token_type_ids = torch.zeros_like(input_ids)
    attention_mask = torch.zeros_like(input_ids)
    positions = torch.zeros(batch, predictions, dtype=torch.long)
    labels = torch.full((batch, predictions), -100, dtype=torch.long)
    for row in range(batch):
        short = float(torch.rand((), generator=generator)) < 0.1
        length = int(torch.randint(8, seq, (), generator=generator)) if short else seq
        input_ids[row, :length] = torch.randint(5, vocab, (length,), generator=generator)
        token_type_ids[row, length // 2:length] = 1
        attention_mask[row, :length] = 1
        count = min(predictions, max(1, round(0.15 * length)))
        chosen = torch.randperm(length - 1, generator=generator)[:count].sort().values + 1
        positions[row, :count] = chosen
        labels[row, :count] = input_ids[row, chosen]
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask,
            "masked_lm_positions": positions, "masked_lm_labels": labels,
            "next_sentence_label": torch.randint(0, 2, (batch,), generator=generator)}


def peer_pretraining_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The peer's inputs: dense (B, S) labels, -100 except at the masked positions."""
    labels = torch.full_like(batch["input_ids"], -100)
    valid = batch["masked_lm_labels"] != -100
    rows = torch.arange(len(labels))[:, None].expand_as(valid)
    labels[rows[valid], batch["masked_lm_positions"][valid]] = batch["masked_lm_labels"][valid]
    return {"input_ids": batch["input_ids"], "token_type_ids": batch["token_type_ids"],
            "attention_mask": batch["attention_mask"], "labels": labels,
            "next_sentence_label": batch["next_sentence_label"]}


def sentence_batch(lengths: list[int], vocab: int, generator: torch.Generator,
                   labels: bool = True) -> dict[str, torch.Tensor]:
    """Examples of the given lengths padded to the longest (dynamic padding); pairs split at half."""
    longest = max(lengths)
    input_ids = torch.zeros(len(lengths), longest, dtype=torch.long)
    token_type_ids = torch.zeros_like(input_ids)
    attention_mask = torch.zeros_like(input_ids)
    for row, length in enumerate(lengths):
        input_ids[row, :length] = torch.randint(5, vocab, (length,), generator=generator)
        token_type_ids[row, length // 2:length] = 1
        attention_mask[row, :length] = 1
    out = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}
    if labels:
        out["labels"] = torch.randint(0, 2, (len(lengths),), generator=generator)
    return out


def grouped_by_length(lengths: list[int], batch: int, generator: torch.Generator) -> list[list[int]]:
    """The peer's `LengthGroupedSampler`: a random order cut into mega-batches of 50 batches, each sorted
    by length (longest first), then cut into batches."""
    order = torch.randperm(len(lengths), generator=generator).tolist()
    mega = 50 * batch
    grouped = []
    for start in range(0, len(order), mega):
        grouped += sorted(order[start:start + mega], key=lambda i: -lengths[i])
    return [[lengths[i] for i in grouped[s:s + batch]] for s in range(0, len(grouped) - batch + 1, batch)]


def real_tokens(batch: dict[str, torch.Tensor]) -> int:
    return int(batch["attention_mask"].sum())


def model_flops(batch: dict[str, torch.Tensor], hidden: int, layers: int, vocab: int, training: bool) -> float:
    """The model's FLOPs on the batch's real tokens (no padding): per layer and example of n tokens,
    24·n·H² (the dense products) + 4·n²·H (Q·Kᵀ and the weights times V); the masked-LM head at the
    masked positions 2·P·(H² + H·V); ×3 for a training step (forward + backward)."""
    lengths = batch["attention_mask"].sum(1).double()
    flops = layers * float((24 * lengths * hidden ** 2 + 4 * lengths ** 2 * hidden).sum())
    if "masked_lm_labels" in batch:
        flops += 2 * float((batch["masked_lm_labels"] != -100).sum()) * (hidden ** 2 + hidden * vocab)
    return 3 * flops if training else flops


# -- timing --------------------------------------------------------------------------------------------------

def time_alternating(sides: dict, batches: dict, steps: int, repeats: int, warmup: int,
                     device: torch.device, profile: tuple[str | None, str] = (None, "")) -> dict[str, float]:
    """Median seconds per step of each side: `warmup` untimed steps each, then `repeats` rounds of
    `steps` steps each, the sides alternating which goes first; on a GPU the batches pinned first. With `profile` (a file, a label), each
    side's steps are then profiled once more (`profile_sides`)."""
    names = list(sides)
    if device.type == "cuda":  # both sides' real loaders pin host memory (the peer's Trainer by default)
        pinned: dict[int, list] = {}  # lists shared by several sides are pinned once
        for value in batches.values():
            if id(value) not in pinned:
                pinned[id(value)] = [pin(b) for b in value]
        batches = {name: pinned[id(value)] for name, value in batches.items()}
    for name in names:
        for i in range(warmup):
            sides[name](batches[name][i % len(batches[name])])
    sync(device)
    seconds = {name: [] for name in names}
    for repeat in range(repeats):
        for name in (names if repeat % 2 == 0 else names[::-1]):
            sync(device)
            start = time.perf_counter()
            for i in range(steps):
                sides[name](batches[name][i % len(batches[name])])
            sync(device)
            seconds[name].append((time.perf_counter() - start) / steps)
    if profile[0]:
        profile_sides(sides, batches, steps, device, *profile)
    return {name: statistics.median(values) for name, values in seconds.items()}


def pin(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch's tensors in page-locked host memory: copies to the GPU then overlap its work."""
    return {key: value.pin_memory() for key, value in batch.items()}


def profile_sides(sides: dict, batches: dict, steps: int, device: torch.device, path: str, label: str) -> None:
    """Append to `path` each side's top operators over `steps` steps (torch.profiler, sorted by the device's
    own time; the CPU's on the CPU): where a side's time goes, and whether the host keeps the GPU busy."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with open(path, "a", encoding="utf-8") as out:
        for name in sides:
            sync(device)
            wall = time.perf_counter()
            with profile(activities=activities) as prof:
                for i in range(steps):
                    sides[name](batches[name][i % len(batches[name])])
                sync(device)
            wall = time.perf_counter() - wall
            table = prof.key_averages().table(sort_by="self_device_time_total" if cuda else "self_cpu_time_total",
                                              row_limit=30, max_name_column_width=60)
            out.write(f"== {label} / {name}: {steps} steps, {wall:.4f} s under the profiler ==\n{table}\n")


def is_oom(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


# -- the models -------------------------------------------------------------------------------------------

class Sides:
    """bertforge's model and the peer's, same weights, on the device, with a training step each."""

    def __init__(self, kind: str, config, device: torch.device, scratch: Path, precision: str = "bf16",
                 lr: float = 1e-4, compiled: bool = False):
        import transformers

        from bertforge import modeling
        from bertforge.pretraining.objectives import MaskedLMStep
        from bertforge.training import Trainer, TrainingArguments

        torch.manual_seed(0)
        ours = getattr(modeling, kind)(config)
        folder = scratch / kind
        ours.save_pretrained(folder)
        self.peer = getattr(transformers, kind).from_pretrained(folder, attn_implementation="sdpa").to(device)
        self.device, self.precision = device, precision
        self.autocast = torch.bfloat16 if precision == "bf16" else None
        if kind == "BertForPreTraining":
            step = MaskedLMStep(nsp=True, unpad=True)
            counts = step.counts
        else:
            modeling.use_unpadded(ours)
            step, counts = classification_step, None
        args = TrainingArguments(str(scratch / f"run-{kind}"), batch_size=1, max_steps=10 ** 6, lr=lr,
                                 weight_decay=0.01, max_grad_norm=1.0, progress=False, precision=precision,
                                 device=str(device))
        self.trainer = Trainer(ours, args, [0], lambda items: items, step, count_fn=counts)
        self.compiled_trainer = None
        if compiled:  # a second bertforge model, the same weights, its per-token parts compiled (--compile)
            twin = getattr(modeling, kind).from_pretrained(folder)
            if kind != "BertForPreTraining":
                modeling.use_unpadded(twin)
            self.compiled_trainer = Trainer(twin, dataclasses.replace(args, compile=True), [0], lambda items: items,
                                            step, count_fn=counts)
        self.ours = self.trainer.module
        self.peer_optimizer = torch.optim.AdamW(self.peer.parameters(), lr=lr, weight_decay=0.01, eps=1e-6,
                                                fused=True)
        self.step_fn = step

    def ours_step(self, batch: dict[str, torch.Tensor]) -> None:
        self.trainer.train_step([batch])

    def compiled_step(self, batch: dict[str, torch.Tensor]) -> None:
        self.compiled_trainer.train_step([batch])

    def sides(self, peers: dict) -> dict:
        """The step functions by name: bertforge, bertforge_compiled (with --compile), then `peers`."""
        out = {"bertforge": self.ours_step}
        if self.compiled_trainer is not None:
            out["bertforge_compiled"] = self.compiled_step
        return {**out, **peers}

    def peer_step(self, batch: dict[str, torch.Tensor]) -> None:
        inputs = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        with torch.autocast(self.device.type, dtype=self.autocast, enabled=self.autocast is not None):
            loss = self.peer(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.peer.parameters(), 1.0)
        self.peer_optimizer.step()
        self.peer_optimizer.zero_grad(set_to_none=True)

    def close(self) -> None:
        del self.trainer, self.compiled_trainer, self.ours, self.peer, self.peer_optimizer
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def classification_step(model, batch: dict[str, torch.Tensor]):
    """The fine-tuning step's loss (what `tasks/classify.py`'s step computes for two labels)."""
    out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                attention_mask=batch["attention_mask"], labels=batch["labels"])
    return out.loss, {}


# -- the parts ------------------------------------------------------------------------------------------------

def pretrain_part(config, args, device, scratch: Path, generator: torch.Generator) -> dict:
    peak, _ = peak_flops(device)
    sides = Sides("BertForPreTraining", config, device, scratch, compiled=args.compile)
    results = {}
    try:
        for seq in args.seq_lengths:
            size = args.pretrain_batch * 128 // seq if not args.tiny else args.pretrain_batch
            while True:
                batches = [pretraining_batch(size, seq, config.vocab_size, generator) for _ in range(args.batches)]
                peer_batches = [peer_pretraining_inputs(b) for b in batches]
                try:
                    steps = sides.sides({"transformers": sides.peer_step})
                    seconds = time_alternating(steps, {name: peer_batches if name == "transformers" else batches
                                                       for name in steps},
                                               args.steps, args.repeats, args.warmup, device,
                                               (args.profile, f"pretrain seq {seq} batch {size}"))
                    break
                except RuntimeError as error:
                    if not is_oom(error) or size == 1:
                        raise
                # out of memory: the failed step's tensors are freed with the exception; try half the batch
                sides.trainer.optimizer.zero_grad(set_to_none=True)
                if sides.compiled_trainer is not None:
                    sides.compiled_trainer.optimizer.zero_grad(set_to_none=True)
                sides.peer_optimizer.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                log(f"seq {seq}: batch {size} does not fit both sides: halved")
                size //= 2
            tokens = statistics.mean(real_tokens(b) for b in batches)
            flops = statistics.mean(model_flops(b, config.hidden_size, config.num_hidden_layers,
                                                config.vocab_size, training=True) for b in batches)
            row = {"batch": size, "real_tokens_per_batch": tokens,
                   "padding_share": 1 - tokens / (size * seq)}
            for name, value in seconds.items():
                row[name] = {"seconds_per_step": value, "tokens_per_second": tokens / value,
                             "mfu": flops / value / peak if peak else None}
            row["speedup"] = seconds["transformers"] / seconds["bertforge"]
            if "bertforge_compiled" in seconds:
                row["speedup_compiled"] = seconds["transformers"] / seconds["bertforge_compiled"]
            results[f"seq{seq}"] = row
            log(f"pretrain seq {seq} batch {size}: speed-up {row['speedup']:.2f}x, "
                f"MFU {row['bertforge']['mfu']}")
    finally:
        sides.close()
    return results


def finetune_part(config, args, device, scratch: Path, generator: torch.Generator) -> dict:
    from bertforge.modeling import BertConfig

    classifier = BertConfig.from_dict({**config.to_dict(), "num_labels": 2})
    sides = Sides("BertForSequenceClassification", classifier, device, scratch, lr=2e-5, compiled=args.compile)
    results = {}
    try:
        for kind in ("sst2", "mrpc"):
            pool = sentence_lengths(kind, args.finetune_batch * args.batches * 2, generator)
            shuffled = [pool[s:s + args.finetune_batch] for s in range(0, len(pool), args.finetune_batch)]
            random_batches = [sentence_batch(lengths, config.vocab_size, generator) for lengths in shuffled]
            grouped = [sentence_batch(lengths, config.vocab_size, generator)
                       for lengths in grouped_by_length(pool, args.finetune_batch, generator)]
            steps = sides.sides({"transformers_dynamic_padding": sides.peer_step,
                                 "transformers_group_by_length": sides.peer_step})
            seconds = time_alternating(
                steps, {name: grouped if name == "transformers_group_by_length" else random_batches for name in steps},
                args.steps, args.repeats, args.warmup, device, (args.profile, f"finetune {kind}"))
            examples = args.finetune_batch
            row = {"batch": examples, "mean_length": statistics.mean(pool),
                   "padding_share_dynamic": 1 - sum(map(real_tokens, random_batches))
                   / sum(b["input_ids"].numel() for b in random_batches),
                   "padding_share_grouped": 1 - sum(map(real_tokens, grouped))
                   / sum(b["input_ids"].numel() for b in grouped)}
            for name, value in seconds.items():
                row[name] = {"seconds_per_step": value, "examples_per_second": examples / value}
            row["speedup_vs_dynamic_padding"] = seconds["transformers_dynamic_padding"] / seconds["bertforge"]
            row["speedup_vs_group_by_length"] = seconds["transformers_group_by_length"] / seconds["bertforge"]
            if "bertforge_compiled" in seconds:
                row["compiled_speedup_vs_dynamic_padding"] = (seconds["transformers_dynamic_padding"]
                                                              / seconds["bertforge_compiled"])
            results[kind] = row
            log(f"finetune {kind}: {row['speedup_vs_dynamic_padding']:.2f}x dynamic padding, "
                f"{row['speedup_vs_group_by_length']:.2f}x group_by_length")
    finally:
        sides.close()
    return results


def inference_part(config, args, device, scratch: Path, generator: torch.Generator) -> dict:
    import transformers

    from bertforge.modeling import BertModel, optimize_for_inference
    from bertforge.modeling.packing import keep_host_copy

    torch.manual_seed(0)
    ours = BertModel(config)
    ours.save_pretrained(scratch / "encoder")
    dtype = "bf16"
    compiled = (optimize_for_inference(BertModel.from_pretrained(scratch / "encoder").to(device), dtype=dtype,
                                       compile=True) if args.compile else None)
    ours = optimize_for_inference(ours.to(device), dtype=dtype)
    peer = transformers.BertModel.from_pretrained(scratch / "encoder", attn_implementation="sdpa")
    peer = peer.to(device=device, dtype=torch.bfloat16).eval()

    def embed(model, batch: dict[str, torch.Tensor], carry_host: bool) -> torch.Tensor:
        inputs = {}
        for key, value in batch.items():
            moved = value.to(device, non_blocking=True)
            inputs[key] = keep_host_copy(moved, value) if carry_host else moved
        with torch.inference_mode():
            hidden = model(**inputs).last_hidden_state
            mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            return (hidden * mask).sum(1) / mask.sum(1)

    results = {}
    for size in args.inference_batches:
        batches = [sentence_batch(sentence_lengths("sst2", size, generator), config.vocab_size, generator,
                                  labels=False) for _ in range(args.batches)]
        steps = {"bertforge": lambda b: embed(ours, b, True)}
        if compiled is not None:
            steps["bertforge_compiled"] = lambda b: embed(compiled, b, True)
        steps["transformers"] = lambda b: embed(peer, b, False)
        seconds = time_alternating(steps, {name: batches for name in steps},
                                   args.steps, args.repeats, args.warmup, device,
                                   (args.profile, f"inference batch {size}"))
        row = {"dtype": dtype}
        for name, value in seconds.items():
            row[name] = {"seconds_per_batch": value, "sentences_per_second": size / value}
        row["speedup"] = seconds["transformers"] / seconds["bertforge"]
        if compiled is not None:
            row["speedup_compiled"] = seconds["transformers"] / seconds["bertforge_compiled"]
        results[f"batch{size}"] = row
        log(f"inference batch {size}: speed-up {row['speedup']:.2f}x")
    del ours, peer, compiled
    return results


def correctness_part(config, args, device, scratch: Path, generator: torch.Generator) -> dict:
    import transformers

    from bertforge.modeling import BertConfig, BertForPreTraining, BertModel

    # The first step's loss in float32, eval mode: bertforge's packed path against the peer's padded one.
    torch.manual_seed(0)
    ours = BertForPreTraining(config)
    ours.save_pretrained(scratch / "loss")
    peer = transformers.BertForPreTraining.from_pretrained(scratch / "loss", attn_implementation="sdpa")
    ours, peer = ours.to(device).eval(), peer.to(device).eval()
    batch = pretraining_batch(8, min(128, config.max_position_embeddings), config.vocab_size, generator)
    on_device = {k: v.to(device) for k, v in batch.items()}
    with torch.no_grad():
        out = ours(**on_device, unpad=True)
        ours_loss = float(out.mlm_loss + out.nsp_loss)
        peer_loss = float(peer(**{k: v.to(device) for k, v in peer_pretraining_inputs(batch).items()}).loss)
    loss_row = {"bertforge": ours_loss, "transformers": peer_loss, "abs_diff": abs(ours_loss - peer_loss),
                "tolerance": 1e-4, "ok": abs(ours_loss - peer_loss) <= 1e-4, "dtype": "float32"}
    del ours, peer

    # The packed plan's attention against the padded reference plan: outputs and gradients.
    small = BertConfig.from_dict({**config.to_dict(), "hidden_dropout_prob": 0.0,
                                  "attention_probs_dropout_prob": 0.0})
    torch.manual_seed(0)
    encoder = BertModel(small).to(device)
    lengths = sentence_lengths("mrpc", 16, generator)
    inputs = {k: v.to(device) for k, v in sentence_batch(lengths, config.vocab_size, generator, labels=False).items()}
    real = inputs["attention_mask"].bool()
    cuda = device.type == "cuda"
    low = torch.bfloat16 if cuda else None

    def run(unpad: bool, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        encoder.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            hidden = encoder(**inputs, unpad=unpad).last_hidden_state
        hidden = hidden.float()[real]
        hidden.square().mean().backward()
        grads = torch.cat([p.grad.flatten() for p in encoder.parameters() if p.grad is not None])
        return hidden.detach(), grads

    reference_out, reference_grads = run(False, None)  # float32, padded: the reference
    row = {}
    if cuda:
        padded_out, padded_grads = run(False, low)
        packed_out, packed_grads = run(True, low)
        row["kernel"] = "FlashAttention varlen (torch.nn.attention.varlen.varlen_attn), bf16 autocast"
        row["padded_bf16_vs_fp32"] = {"output_max_abs": float((padded_out - reference_out).abs().max()),
                                      "grad_rel": float((padded_grads - reference_grads).norm()
                                                        / reference_grads.norm())}
    else:
        packed_out, packed_grads = run(True, None)
        row["kernel"] = "the packed CPU plan (float32)"
        row["varlen"] = "skipped: FlashAttention over variable lengths runs on CUDA only"
    row["packed_vs_fp32_reference"] = {
        "output_max_abs": float((packed_out - reference_out).abs().max()),
        "grad_rel": float((packed_grads - reference_grads).norm() / reference_grads.norm())}
    if cuda:  # within twice bf16's own error on the padded layout (plus a floor), or it is wrong
        ours_error, padded_error = row["packed_vs_fp32_reference"], row["padded_bf16_vs_fp32"]
        row["ok"] = (ours_error["output_max_abs"] <= 2 * padded_error["output_max_abs"] + 1e-2
                     and ours_error["grad_rel"] <= 2 * padded_error["grad_rel"] + 1e-2)
        row["criterion"] = "bf16 packed error vs fp32 <= 2 x bf16 padded error + 0.01 (outputs and gradients)"
    else:
        row["ok"] = row["packed_vs_fp32_reference"]["output_max_abs"] <= 1e-5 and \
            row["packed_vs_fp32_reference"]["grad_rel"] <= 1e-5
        row["criterion"] = "float32: outputs within 1e-5, gradients within 1e-5 relative"
    return {"first_step_loss": loss_row, "packed_attention": row}


# -- main ---------------------------------------------------------------------------------------------------------

def commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="the tiny preset, small batches, few steps (a test)")
    parser.add_argument("--parts", default="correctness,pretrain,finetune,inference",
                        help="comma-separated parts to run, in this order")
    parser.add_argument("--pretrain-batch", type=int, default=None,
                        help="pre-training batch at seq 128 (scaled by 128/S for longer S); default 256")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per repeat")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per side")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per side first")
    parser.add_argument("--compile", action="store_true",
                        help="CUDA: also time bertforge with its per-token parts compiled (`--compile` of pretrain "
                             "and finetune, optimize_for_inference(compile=True)): rows bertforge_compiled")
    parser.add_argument("--profile", metavar="FILE", default=None,
                        help="after each timing, profile each side's steps once more and append the top "
                             "operators to FILE (not part of the timed figures)")
    args = parser.parse_args(argv)
    tiny = args.tiny
    args.pretrain_batch = args.pretrain_batch or (4 if tiny else 256)
    args.steps = args.steps or (1 if tiny else 10)
    args.repeats = args.repeats or (2 if tiny else 5)
    args.warmup = args.warmup if args.warmup is not None else (1 if tiny else 3)
    args.batches = 2 if tiny else 4
    args.finetune_batch = 4 if tiny else 32
    args.inference_batches = (4, 8) if tiny else (32, 256)
    args.seq_lengths = (32, 64) if tiny else SEQ_LENGTHS
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(args.parts) - {"correctness", "pretrain", "finetune", "inference"}
    if unknown:
        parser.error(f"--parts: unknown part(s) {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    quiet_libraries()
    from bertforge.modeling import BertConfig

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu.py: --device cuda but no CUDA device: use --device cpu --tiny")
    started = time.perf_counter()
    if args.tiny:
        config = BertConfig.preset("tiny", vocab_size=1000, max_position_embeddings=128)
    else:
        config = BertConfig.preset("base", max_position_embeddings=512)
    peak, peak_source = peak_flops(device)
    result = {"benchmark": "gpu", "commit": commit(), "date": datetime.datetime.now(datetime.UTC).isoformat(
        timespec="seconds"), "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "preset": "tiny" if args.tiny else "base", "precision": "bf16",
        "peak_bf16_tflops": peak / 1e12 if peak else None, "peak_source": peak_source}
    try:
        import transformers
        result["transformers"] = transformers.__version__
    except ImportError:
        raise SystemExit("gpu.py needs transformers (the peer): pip install -e '.[dev]'")
    parts = {"correctness": correctness_part, "pretrain": pretrain_part, "finetune": finetune_part,
             "inference": inference_part}
    failed = []
    with tempfile.TemporaryDirectory(prefix="bertforge-gpu-") as scratch:
        for name in args.parts:
            log(f"{name} ...")
            part_start = time.perf_counter()
            generator = torch.Generator().manual_seed(0)
            try:
                result[name] = parts[name](config, args, device, Path(scratch), generator)
            except Exception as error:  # one device call: a part that fails must not lose the others' rows
                traceback.print_exc()
                result[name] = {"error": f"{type(error).__name__}: {error}"[:1000]}
                failed.append(name)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            result[name]["seconds"] = time.perf_counter() - part_start
            log(f"{name}: {json.dumps(result[name], allow_nan=True)}")  # in the log even if a later part hangs
    result["seconds"] = time.perf_counter() - started
    result["failed_parts"] = failed
    print(json.dumps(result, allow_nan=True), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
