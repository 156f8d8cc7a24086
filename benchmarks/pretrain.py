"""Pre-training step throughput against Hugging Face transformers (the peer): from scratch (MLM + NSP) and
continued from a released checkpoint (MLM only, `run_mlm.py`'s recipe).

One step = forward, backward, global-norm clipping (1.0) and AdamW (weight decay 0.01, ε 1e-6), dropout on.
Each side lives in a worker process of its own (so that its peak RSS is its own); a side's call asks its
worker for `steps` steps over a fixed cycle of batches and waits for them, and the harness alternates the
sides round by round. Before any timing each worker computes the loss of the same first batch in eval mode
(fp32, the same weights): setup stops with an error when the sides differ by more than `LOSS_TOLERANCE`.
Reported: real tokens (padding excluded) per second at the median, the ratio, and each worker's peak RSS
after the warm-up.

- `pretrain-step`: `BertForPreTraining` at the `mini` (batch 32) and `base` (batch 8) presets with random
  weights (seed 0), fp32 and bf16, on real 128-token instances (15% masked, at most 20 predictions, NSP
  pairs) that `prepare_pretraining` makes from a public-domain novel with BERT's uncased vocabulary.
  bertforge: `Trainer.train_step` with `MaskedLMStep` (its `--precision`); the peer: the model called with
  `labels` (B, S) and `next_sentence_label`, then `torch.optim.AdamW(fused=True)` (its `Trainer`'s
  default); bf16: the forward and loss under `torch.autocast`, as its `Trainer(bf16=True)`.
- `continued-pretrain`: `bertforge pretrain --init-from MiniLM --no-nsp`'s step (`build_model` as
  `run_pretraining` builds it, lr 5e-5) against `run_mlm.py`'s: `AutoModelForMaskedLM` with
  `DataCollatorForLanguageModeling(mlm_probability=0.15)` (its own 80/10/10 masking, labels over the whole
  grid), fused AdamW. MiniLM has no masked-LM head: bertforge initialises one and the peer's is overwritten
  with it. Only instances that fill all 128 positions are used, on both sides (run_mlm groups text into
  full blocks), the peer's rows the same token sequences before masking; the loss check is the masked-LM
  loss of bertforge's first masked batch.

    python -m benchmarks run pretrain-step          # mini and base, fp32 and bf16 (about 15 minutes)
    python -m benchmarks run continued-pretrain     # MiniLM continued, batch 32, fp32
    python -m benchmarks run pretrain-step continued-pretrain --quick --threads 1   # seconds: the test

`--quick`: the `tiny` preset (random, MiniLM's vocabulary), instances from the built-in Shakespeare corpus,
batch 4, 2 steps a call.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    raise SystemExit("benchmarks/pretrain.py runs through the harness, from the repository root: "
                     "python -m benchmarks run pretrain-step continued-pretrain [--quick]")

import atexit  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

from .harness import ROOT, Benchmark, Params, Prepared  # noqa: E402

SIDES = ("bertforge", "transformers")
SEQ_LENGTH = 128
LOSS_TOLERANCE = 1e-4  # the sides' first loss on the same batch and weights, fp32
BOOK = ROOT.parent / "shared" / "data" / "pretraining" / "books" / "Doyle_Hound_1902.txt"
TARGETS = {"mini": 2.0, "base": 1.3, "minilm": 2.0}  # the ratios the pre-training issues asked for
HEAD_FILE = "mlm_head.pt"  # bertforge's newly initialised masked-LM head, for the continued peer to copy


# -- the worker: one side, one model, commands on stdin ----------------------------------------------------

def worker(spec: dict[str, Any]) -> None:
    """One side of one case (`spec`: what `Worker` passes), then the protocol of `serve`."""
    import logging

    import torch

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    logging.getLogger("bertforge").setLevel(logging.ERROR)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    from bertforge.pretraining import PretrainingDataset, collate

    dataset = PretrainingDataset(spec["data"])
    if spec["kind"] == "continued":
        batches = full_batches(dataset, spec["batch_size"], spec["batches"])
    else:
        count = min(spec["batches"], len(dataset) // spec["batch_size"])
        batches = [collate([dataset[i] for i in range(b * spec["batch_size"], (b + 1) * spec["batch_size"])])
                   for b in range(count)]
    build = {("scratch", "bertforge"): ours_from_scratch, ("scratch", "transformers"): peer_from_scratch,
             ("continued", "bertforge"): ours_continued, ("continued", "transformers"): peer_continued}
    step, first_loss, batches = build[spec["kind"], spec["side"]](spec, dataset, batches)
    serve(batches, step, first_loss, spec["warmup_steps"])


def ours_from_scratch(spec, dataset, batches):
    """bertforge's step: `Trainer.train_step` with `MaskedLMStep` (MLM at the masked positions, NSP)."""
    from bertforge.modeling import BertForPreTraining
    from bertforge.pretraining import collate
    from bertforge.pretraining.trainer import MaskedLMStep
    from bertforge.training import Trainer, TrainingArguments

    model = BertForPreTraining.from_pretrained(spec["model"])
    task = MaskedLMStep()
    trainer = Trainer(model, TrainingArguments(spec["scratch"], batch_size=spec["batch_size"], max_steps=10**6,
                                               lr=1e-4, weight_decay=0.01, max_grad_norm=1.0, progress=False,
                                               precision=spec["precision"]),
                      dataset, collate, task, count_fn=task.counts)
    return (lambda batch: trainer.train_step([batch]), lambda: model_loss(model, task, batches[0], "loss"), batches)


def peer_from_scratch(spec, dataset, batches):
    """transformers' `BertForPreTraining` with dense MLM labels and NSP labels, fused AdamW."""
    import torch
    import transformers

    model = transformers.BertForPreTraining.from_pretrained(spec["model"], attn_implementation="sdpa")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, eps=1e-6, fused=True)
    inputs = [{"input_ids": b["input_ids"], "token_type_ids": b["token_type_ids"], "attention_mask": b["attention_mask"],
               "labels": dense_mlm_labels(b), "next_sentence_label": b["next_sentence_label"]} for b in batches]
    return peer_step(model, optimizer, spec["precision"]), lambda: peer_loss(model, inputs[0]), inputs


def ours_continued(spec, dataset, batches):
    """What `bertforge pretrain --init-from MODEL --no-nsp` runs per step; its new head saved for the peer."""
    import torch

    from bertforge.pretraining import collate
    from bertforge.pretraining.trainer import CONTINUED_LR, MaskedLMStep, build_model, init_config
    from bertforge.training import Trainer, TrainingArguments

    config = init_config(Path(spec["model"]), None, "mlm", SEQ_LENGTH)
    model = build_model(config, seed=0, nsp=False, init_from=Path(spec["model"]))
    torch.save({k: v.detach().clone() for k, v in model.cls.predictions.state_dict().items()},
               Path(spec["scratch"]) / HEAD_FILE)
    task = MaskedLMStep(nsp=False, unpad=True)
    trainer = Trainer(model, TrainingArguments(spec["scratch"], batch_size=spec["batch_size"], max_steps=10**6,
                                               lr=CONTINUED_LR, weight_decay=0.01, max_grad_norm=1.0, progress=False),
                      dataset, collate, task, count_fn=task.counts)
    return (lambda batch: trainer.train_step([batch]), lambda: model_loss(model, task, batches[0], "mlm_loss"),
            batches)


def peer_continued(spec, dataset, batches):
    """run_mlm.py's step: its collator masks the same token rows; the loss check reads bertforge's masks."""
    import torch
    import transformers

    from bertforge.pretraining.trainer import unmasked_input_ids

    model = transformers.AutoModelForMaskedLM.from_pretrained(spec["model"], attn_implementation="sdpa")
    copy_head(model, torch.load(Path(spec["scratch"]) / HEAD_FILE))
    tokenizer = transformers.AutoTokenizer.from_pretrained(spec["model"])
    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    rows = [collator([{"input_ids": ids.tolist(), "token_type_ids": types.tolist()}
                      for ids, types in zip(unmasked_input_ids(b), b["token_type_ids"])]) for b in batches]
    first = {"input_ids": batches[0]["input_ids"], "token_type_ids": batches[0]["token_type_ids"],
             "attention_mask": batches[0]["attention_mask"], "labels": dense_mlm_labels(batches[0])}
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01, eps=1e-6, fused=True)
    return peer_step(model, optimizer, "fp32"), lambda: peer_loss(model, first), rows


def model_loss(model, task, batch: dict, key: str | None) -> float:
    """bertforge's loss of `batch` (the sum of its parts, or the part `key` names) in eval mode."""
    import torch

    model.eval()
    with torch.no_grad():
        losses, _ = task(model, batch)
    model.train()
    return float(losses["mlm_loss"]) if key == "mlm_loss" else float(sum(losses.values()))


def peer_loss(model, inputs: dict) -> float:
    """The peer's loss of `inputs` in eval mode."""
    import torch

    model.eval()
    with torch.no_grad():
        loss = float(model(**inputs).loss)
    model.train()
    return loss


def peer_step(model, optimizer, precision: str) -> Callable[[dict], None]:
    """The peer's plain loop: as its Trainer with bf16=True, the forward and the loss under autocast, the
    backward outside it; clipping at 1.0."""
    import torch

    def step(inputs: dict) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def dense_mlm_labels(batch: dict):
    """The peer's masked-LM labels (B, S): -100 everywhere except at the instance's masked positions, which
    hold the original tokens (bertforge's batches list them as (B, P) `masked_lm_positions` and labels)."""
    import torch

    labels = torch.full_like(batch["input_ids"], -100)
    valid = batch["masked_lm_labels"] != -100
    rows = torch.arange(len(labels))[:, None].expand_as(valid)
    labels[rows[valid], batch["masked_lm_positions"][valid]] = batch["masked_lm_labels"][valid]
    return labels


def full_batches(dataset, batch_size: int, count: int) -> list[dict]:
    """bertforge batches of the instances whose 128 positions are all real tokens, in file order."""
    from bertforge.pretraining import collate

    full = []
    for i in range(len(dataset)):
        if len(full) == batch_size * count:
            break
        if int(dataset[i]["attention_mask"].sum()) == SEQ_LENGTH:
            full.append(dataset[i])
    if len(full) < batch_size:
        raise SystemExit(f"only {len(full)} instances fill {SEQ_LENGTH} tokens: fewer than one batch of {batch_size}")
    return [collate(full[b * batch_size:(b + 1) * batch_size]) for b in range(len(full) // batch_size)]


def copy_head(model, head: dict) -> None:
    """Overwrite the peer's masked-LM head (transform and output bias; the decoder is tied to the word
    embeddings on both sides) with bertforge's; anything left out or left over is an error."""
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


def serve(batches: list[dict], step: Callable[[dict], None], first_loss: Callable[[], float], warmup: int) -> None:
    """The worker's protocol: after `warmup` untimed steps (allocator, oneDNN kernels, optimizer state), one
    line {"loss": the first batch's loss in eval mode}; then for each "run N" line, N steps over `batches`
    in turn and one line {"seconds", "tokens" (real ones), "max_rss_mb"}; "quit" ends it."""
    loss = first_loss()
    counter = 0

    def run(steps: int) -> dict[str, float]:
        nonlocal counter
        tokens, start = 0, time.perf_counter()
        for _ in range(steps):
            batch = batches[counter % len(batches)]
            counter += 1
            tokens += int(batch["attention_mask"].sum())
            step(batch)
        return {"seconds": time.perf_counter() - start, "tokens": tokens,
                "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}  # KiB on Linux

    run(warmup)
    print(json.dumps({"loss": loss}), flush=True)
    for line in sys.stdin:
        if line.split()[0] != "run":
            return
        print(json.dumps(run(int(line.split()[1]))), flush=True)


# -- the parent: workers, data, cases ----------------------------------------------------------------------

class Worker:
    """One side's worker process (`python -m benchmarks.pretrain SPEC`), started in the repository root."""

    def __init__(self, spec: dict[str, Any]):
        self.side = spec["side"]
        self.process = subprocess.Popen([sys.executable, "-m", "benchmarks.pretrain", json.dumps(spec)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        self.loss = self.read()["loss"]

    def read(self) -> dict[str, Any]:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.side} worker died (exit code {self.process.wait()})")
        return json.loads(line)

    def run(self, steps: int) -> dict[str, Any]:
        self.process.stdin.write(f"run {steps}\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.write("quit\n")
                self.process.stdin.close()
                self.process.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()


_LIVE: list[Worker] = []  # the current case's workers: closed before the next case's start, and at exit
_WORKDIR: list[tempfile.TemporaryDirectory] = []


def close_workers() -> None:
    while _LIVE:
        _LIVE.pop().close()


atexit.register(close_workers)


def workdir() -> Path:
    """This process's scratch directory (models, instances), removed at exit."""
    if not _WORKDIR:
        _WORKDIR.append(tempfile.TemporaryDirectory(prefix="bertforge-pretrain-bench-"))
    return Path(_WORKDIR[0].name)


def instances(quick: bool) -> Path:
    """Pre-training instances (128 tokens, MiniLM's = BERT's uncased vocabulary), made once per process:
    from `BOOK`, or with `quick` from the built-in Shakespeare speeches."""
    from ._common import minilm_dir, quick_text

    out = workdir() / ("instances-quick" if quick else "instances")
    if not out.exists():
        from bertforge.pretraining import prepare_pretraining

        if quick:
            [book] = quick_text(workdir() / "quick-text", files=1, speeches=160)
        elif not BOOK.is_file():
            raise SystemExit(f"the benchmark's text is not there: {BOOK}")
        else:
            book = BOOK
        prepare_pretraining([book], minilm_dir() / "vocab.txt", out, max_seq_length=SEQ_LENGTH,
                            max_predictions_per_seq=20, masked_lm_prob=0.15, dupe_factor=2, seed=12345, progress=False)
    return out


def model_directory(params: Params) -> Path:
    """The case's starting weights: a random `BertForPreTraining` at its preset (seed 0), MiniLM as
    installed, or for a quick continued case a random tiny `BertModel` with MiniLM's vocabulary."""
    from ._common import minilm_dir, quick_checkpoint

    if params["model"] == "minilm":
        return minilm_dir()
    directory = workdir() / f"model-{params['kind']}-{params['model']}"
    if not (directory / "config.json").exists():
        if params["kind"] == "continued":
            return quick_checkpoint(directory)
        import torch

        from bertforge.modeling import BertConfig, BertForPreTraining

        torch.manual_seed(0)
        BertForPreTraining(BertConfig.preset(params["model"])).save_pretrained(directory)
    return directory


def setup(params: Params) -> Prepared:
    """Both workers of the case (the previous case's closed first), started in turn: the continued peer copies
    the head bertforge's worker writes. Raises when their first losses differ past `LOSS_TOLERANCE`."""
    import torch

    close_workers()
    scratch = workdir() / f"scratch-{params['kind']}-{params['model']}-{params['precision']}"
    scratch.mkdir(exist_ok=True)
    spec = {"kind": params["kind"], "data": str(instances(params["model"] == "tiny")),
            "model": str(model_directory(params)), "batch_size": params["batch_size"],
            "batches": params["batches"], "warmup_steps": params["warmup_steps"], "precision": params["precision"],
            "threads": torch.get_num_threads(), "scratch": str(scratch)}
    for side in SIDES:
        _LIVE.append(Worker({**spec, "side": side}))
    ours, peer = _LIVE
    if abs(ours.loss - peer.loss) > LOSS_TOLERANCE:
        raise ValueError(f"{params}: the sides' first losses differ: bertforge {ours.loss:.6f}, transformers "
                         f"{peer.loss:.6f} (more than {LOSS_TOLERANCE})")
    return Prepared(sides={worker.side: (lambda worker=worker: worker.run(params["steps"])) for worker in _LIVE},
                    facts={"first_loss": {worker.side: worker.loss for worker in _LIVE}})


def check(params: Params, outputs: dict[str, Any]) -> dict[str, Any]:
    """Both sides trained on the same number of real tokens per call; each worker's peak RSS so far."""
    tokens = {side: outputs[side]["tokens"] for side in SIDES}
    if len(set(tokens.values())) != 1:
        raise ValueError(f"{params}: the sides' calls covered different token counts: {tokens}")
    return {"tokens_per_call": tokens["bertforge"],
            "peak_rss_mb": {side: outputs[side]["max_rss_mb"] for side in SIDES}}


def scratch_cases(quick: bool) -> list[Params]:
    """mini (batch 32, 10 steps a call) and base (batch 8, 3), fp32 then bf16; `quick`: tiny, batch 4."""
    shapes = [("tiny", 4, 2)] if quick else [("mini", 32, 10), ("base", 8, 3)]
    return [{"kind": "scratch", "model": model, "precision": precision, "batch_size": batch, "steps": steps,
             "batches": 2 if quick else 8, "warmup_steps": 1 if quick else 2}
            for precision in ("fp32", "bf16") for model, batch, steps in shapes]


def continued_cases(quick: bool) -> list[Params]:
    """MiniLM continued, batch 32, 10 steps a call, fp32; `quick`: a tiny random model, batch 4."""
    return [{"kind": "continued", "model": "tiny" if quick else "minilm", "precision": "fp32",
             "batch_size": 4 if quick else 32, "steps": 2 if quick else 10, "batches": 2 if quick else 8,
             "warmup_steps": 1 if quick else 2}]


def rates(case: dict[str, Any]) -> tuple[float, float]:
    """(bertforge's, the peer's) real tokens per second at their median call."""
    tokens = case["facts"]["tokens_per_call"]
    return tuple(tokens / case["sides"][side]["median"] for side in SIDES)


def ratio(case: dict[str, Any]) -> float:
    ours, peer = rates(case)
    return ours / peer


def table(result: dict[str, Any], leading: dict[str, Callable[[Params], Any]], digits: int, loss: str) -> str:
    """One row per case: the `leading` columns (header -> cell from the case's params), both sides' tokens per
    second, the ratio at `digits` decimals, the target, each worker's peak RSS and both first losses."""
    header = [*leading, "bertforge tok/s", "peer tok/s", "ratio", "target", "peak RSS MB (bertforge / peer)",
              f"{loss} (bertforge / peer)"]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for case in result["cases"]:
        params, facts = case["params"], case["facts"]
        ours, peer = rates(case)
        cells = [*(str(cell(params)) for cell in leading.values()), f"{ours:.1f}", f"{peer:.1f}",
                 f"**{ours / peer:.{digits}f}**", str(TARGETS.get(params["model"], "")),
                 " / ".join(f"{facts['peak_rss_mb'][side]:.0f}" for side in SIDES),
                 " / ".join(f"{facts['first_loss'][side]:.6f}" for side in SIDES)]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def scratch_table(result: dict[str, Any]) -> str:
    """One row per preset and precision."""
    return table(result, {"config": lambda p: p["model"], "precision": lambda p: p["precision"],
                          "batch": lambda p: p["batch_size"]}, 3, "first loss")


def continued_table(result: dict[str, Any]) -> str:
    """One row: the continued model."""
    return table(result, {"model": lambda p: p["model"], "batch": lambda p: p["batch_size"]}, 2,
                 "MLM loss, same masked batch")


BENCHMARKS = (
    Benchmark(name="pretrain-step", figure='BENCHMARKS.md, "Pre-training step"', sides=SIDES, cases=scratch_cases,
              setup=setup, check=check, table=scratch_table, result="pretrain_step/pretrain_step.json",
              quick_repeats=1),
    Benchmark(name="continued-pretrain", figure='docs/results/pretrain_step/README.md, "Continued pre-training step"',
              sides=SIDES, cases=continued_cases, setup=setup, check=check, table=continued_table,
              result="pretrain_step/continued_minilm.json", repeats=3, quick_repeats=1),
)


if __name__ == "__main__":  # a worker: `Worker` starts it with its case's spec
    worker(json.loads(sys.argv[1]))
