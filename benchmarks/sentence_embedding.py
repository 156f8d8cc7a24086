"""Sentence embeddings (bi-encoders) on STS-B, side by side: `bertforge finetune sentence-embedding` against
sentence-transformers at the same recipe, from the same checkpoint.

    python benchmarks/sentence_embedding.py --model DIR --train glue/STS-B/train.tsv --dev glue/STS-B/dev.tsv \
        --seeds 0,1,2 --keep runs/stsb
    python benchmarks/sentence_embedding.py --quick      # a toy STS task on a tiny random checkpoint (the test)

The recipe (both sides): sentence-transformers' training_stsbenchmark.py: mean pooling, the cosine-similarity
loss (MSE between the cosine of the two embeddings and the gold score / 5), batch 16 uniformly shuffled,
`--epochs` (4), AdamW at lr 2e-5 (weight decay 0.01 except biases and LayerNorm), 10% linear warm-up then
linear decay, gradients clipped to norm 1, sequences of 128 tokens, dev Spearman of the cosine after each
epoch, the best epoch kept. bertforge runs its CLI (`bertforge.cli.main`); sentence-transformers runs its own
model, tokenizer, `CosineSimilarityLoss` and `encode` in a plain loop (its `fit` needs the `datasets`
package, which this benchmark does not install), with transformers' linear schedule.

Exactly one JSON line goes to stdout (per side and seed: the best dev Spearman and Pearson, its epoch, the
training wall time); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from _common import cpu_model, log, quiet_libraries

from bertforge.cli import main as bertforge_main
from bertforge.metrics.glue import pearson, spearman
from bertforge.tasks.sentence_embedding import RECIPE, read_sentence_file

TOPICS = {"pets": ["cat", "dog", "puppy", "kitten", "pet", "fur"], "cars": ["car", "bus", "road", "wheel", "truck"],
          "food": ["bread", "soup", "apple", "cheese", "rice", "meal"]}


def _toy_rows(count: int, seed: int) -> list[tuple[str, str, float]]:
    """--quick's data: sentences about one or two topics; the gold score is 5 x the Jaccard overlap of topics."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        pair = [tuple(rng.sample(sorted(TOPICS), rng.choice([1, 2]))) for _ in range(2)]
        texts = []
        for topics in pair:
            words = [w for t in topics for w in rng.sample(TOPICS[t], 2)]
            rng.shuffle(words)
            texts.append(" ".join(["the", *words[:2], "is", "a", *words[2:]]))
        rows.append((texts[0], texts[1], round(5 * len(set(pair[0]) & set(pair[1])) / len(set(pair[0]) | set(pair[1])), 3)))
    return rows


def quick_inputs(directory: Path) -> tuple[Path, Path, Path]:
    """A tiny random checkpoint and toy STS-B-layout train/dev files in `directory`."""
    from bertforge.modeling import BertConfig, BertModel
    from bertforge.tokenization import BertTokenizer

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "is", "a", *(w for ws in TOPICS.values() for w in ws)]
    model = directory / "model"
    model.mkdir(parents=True)
    (model / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=128)).save_pretrained(model)
    BertTokenizer(model / "vocab.txt", do_lower_case=True).save_pretrained(model)
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    files = []
    for name, count, seed in (("train.tsv", 96, 0), ("dev.tsv", 48, 1)):
        path = directory / name
        path.write_text(header + "".join(f"{i}\ttoy\tnone\t2026\t{i}\tnone\tnone\t{a}\t{b}\t{s}\n"
                                         for i, (a, b, s) in enumerate(_toy_rows(count, seed))))
        files.append(path)
    return model, files[0], files[1]


def run_ours(model: Path, train: Path, dev: Path, out: Path, seed: int, epochs: float, lr: float) -> dict:
    """`bertforge finetune sentence-embedding` at the recipe; its best dev scores and wall time."""
    started = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # its report is progress; stdout carries the one JSON line
        code = bertforge_main(["finetune", "sentence-embedding", "--train-file", str(train), "--dev-file", str(dev),
                               "--model", str(model), "--output-dir", str(out), "--seed", str(seed), "--epochs",
                               str(epochs), "--lr", str(lr), "--pooling", "mean", "--no-progress"])
    if code != 0:
        raise SystemExit(f"bertforge finetune failed ({code})")
    results = json.loads((out / "eval_results.json").read_text())
    return {"spearman": results["metrics"]["spearman"], "pearson": results["metrics"]["pearson"],
            "epoch": results["epoch"], "wall_s": round(time.perf_counter() - started, 2)}


def run_peer(model: Path, train: Path, dev: Path, seed: int, epochs: float, lr: float) -> dict:
    """sentence-transformers at the same recipe (see the module docstring); its best dev scores and wall time."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import CosineSimilarityLoss
    from transformers import get_linear_schedule_with_warmup

    train_rows = read_sentence_file(train, texts=2, scored=True)
    dev_rows = read_sentence_file(dev, texts=2, scored=True)
    torch.manual_seed(seed)
    st = SentenceTransformer(str(model), device="cpu")  # a plain BERT directory: Transformer + mean Pooling
    st.max_seq_length = RECIPE["max_seq_length"]
    loss = CosineSimilarityLoss(st)
    decay = [p for n, p in loss.named_parameters() if not any(k in n for k in ("bias", "LayerNorm"))]
    rest = [p for n, p in loss.named_parameters() if any(k in n for k in ("bias", "LayerNorm"))]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                                  lr=lr)
    batch = RECIPE["batch_size"]
    steps_per_epoch = (len(train_rows) + batch - 1) // batch
    total = int(steps_per_epoch * epochs)
    schedule = get_linear_schedule_with_warmup(optimizer, int(0.1 * total), total)
    rng = np.random.default_rng(seed)
    best, started, step = None, time.perf_counter(), 0
    for epoch in range(int(np.ceil(epochs))):
        st.train()
        order = rng.permutation(len(train_rows))
        for start in range(0, len(order), batch):
            if step >= total:
                break
            rows = [train_rows[i] for i in order[start:start + batch]]
            features = [st.preprocess([r.texts[c] for r in rows]) for c in (0, 1)]
            value = loss(features, torch.tensor([r.score for r in rows], dtype=torch.float32))
            value.backward()
            torch.nn.utils.clip_grad_norm_(loss.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            step += 1
        st.eval()
        a = st.encode([r.texts[0] for r in dev_rows], convert_to_numpy=True)
        b = st.encode([r.texts[1] for r in dev_rows], convert_to_numpy=True)
        cosines = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
        gold = [r.score for r in dev_rows]
        scores = {"spearman": spearman(cosines, gold), "pearson": pearson(cosines, gold), "epoch": epoch + 1}
        if best is None or scores["spearman"] > best["spearman"]:
            best = scores
    return {**best, "wall_s": round(time.perf_counter() - started, 2)}


def zero_shot(model: Path, dev: Path) -> dict:
    """The untouched checkpoint's dev scores (`pipeline("embed")` with the pooling it declares, else mean): what
    fine-tuning starts from."""
    from bertforge.serving.pipelines import pipeline

    rows = read_sentence_file(dev, texts=2, scored=True)
    embed = pipeline("embed", model=str(model))
    a, b = (embed([r.texts[c] for r in rows], batch_size=64) for c in (0, 1))
    cosines = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
    gold = [r.score for r in rows]
    return {"spearman": spearman(cosines, gold), "pearson": pearson(cosines, gold)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="the checkpoint both sides start from")
    p.add_argument("--train", help="STS-B-layout training file (GLUE's train.tsv)")
    p.add_argument("--dev", help="STS-B-layout dev file")
    p.add_argument("--seeds", default="0", help="comma-separated seeds, each side once per seed")
    p.add_argument("--epochs", type=float, default=RECIPE["epochs"])
    p.add_argument("--lr", type=float, default=RECIPE["lr"])
    p.add_argument("--sides", default="ours,peer")
    p.add_argument("--keep", help="bertforge's run directories here (default: a temporary directory)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="a toy STS task on a tiny random checkpoint, 2 epochs, lr 1e-3")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    quiet_libraries()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(args.keep or scratch)
        if args.quick:
            model, train, dev = quick_inputs(Path(scratch) / "quick")
            args.epochs, args.lr = 2.0, 1e-3
        else:
            if not (args.model and args.train and args.dev):
                p.error("--model, --train and --dev are required (or --quick)")
            model, train, dev = Path(args.model), Path(args.train), Path(args.dev)
        before = zero_shot(model, dev)
        runs = {side: [] for side in args.sides.split(",")}
        for seed in (int(s) for s in args.seeds.split(",")):
            for side in runs:
                log(f"{side}, seed {seed}")
                result = run_ours(model, train, dev, work / f"ours-seed{seed}", seed, args.epochs, args.lr) \
                    if side == "ours" else run_peer(model, train, dev, seed, args.epochs, args.lr)
                runs[side].append({"seed": seed, **result})
    summary = {side: {"spearman_mean": float(np.mean([r["spearman"] for r in rs])), "runs": rs}
               for side, rs in runs.items()}
    print(json.dumps({"benchmark": "sentence_embedding", "quick": args.quick, "cpu": cpu_model(),
                      "threads": args.threads, "recipe": {**RECIPE, "epochs": args.epochs, "lr": args.lr,
                                                          "warmup_ratio": 0.1, "loss": "cosine", "pooling": "mean"},
                      "train": str(train) if not args.quick else "toy", "zero_shot": before, "sides": summary}))


if __name__ == "__main__":
    sys.exit(main())
