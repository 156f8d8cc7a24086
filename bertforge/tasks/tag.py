"""Named-entity recognition (§4.3, CoNLL-2003) by fine-tuning: the training step, prediction, the task.

* `ner_task(...)`: the `FinetuneTask` for `bertforge finetune ner`; `predict_conll(...)`: a fine-tuned
  model's tags for a CoNLL file, written as its columns plus a predicted tag column.
* the tag family's commands (`bertforge finetune ner`, with `--feature-based` the BiLSTM of
  `bertforge.tasks.feature_based`; `bertforge predict` for a tagger), read by the task registry.

The CoNLL data this builds on (reader, first-sub-token labels, windows with maximal document context,
batches, conlleval metrics, shared with the feature-based approach) is `bertforge.tasks.conll`, whose
docstring states the rules.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..modeling import BertForTokenClassification, load_for_inference
from ..modeling.pretrained import resolve_model_dir
from ..modeling.modes import evaluating
from ..tokenization import BertTokenizer
from ..training.finetune import FinetuneTask
from .conll import (CONFIG_DOCUMENT_CONTEXT, CONFIG_MAX_SEQ_LENGTH, DEV_PREDICTIONS, IGNORE_INDEX, TASK_NAME, NerData,
                    build_windows, collate_windows, labelled_tokens, ner_metrics, prepare_ner_data,
                    read_for_prediction, read_model_config, word_piece_ids, write_conll)
from .feature_based import feature_ner_task, predict_conll_feature_based

__all__ = ["FEATURE_BASED_RECIPE", "FINE_TUNING_RECIPE", "add_ner_flags", "add_predict_flags", "ner_after",
           "ner_from_args", "ner_recipe", "ner_summary", "ner_task", "predict_conll", "predict_from_args",
           "predict_window_tags", "token_classification_step"]


def token_classification_step(model, batch: dict[str, torch.Tensor]):
    """Cross-entropy over the labelled tokens, and their accuracy as (correct, count)."""
    out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                attention_mask=batch["attention_mask"], labels=batch["labels"])
    with torch.no_grad():
        mask = batch["labels"] != IGNORE_INDEX
        correct = ((out.logits.argmax(-1) == batch["labels"]) & mask).sum()
    return out.loss, {"accuracy": (correct, mask.sum())}


@torch.no_grad()
def predict_window_tags(model, windows: Sequence[dict], sentence_lengths: Sequence[int], id2label: dict[int, str],
                        batch_size: int = 128, pad_token_id: int = 0) -> list[list[str]]:
    """The predicted tag of every word: argmax of the logits at each word's first sub-token, in the window
    that predicts it. Windows run sorted by length (little padding). Returns one tag list per sentence."""
    tags: list[list[str | None]] = [[None] * n for n in sentence_lengths]
    order = sorted(range(len(windows)), key=lambda i: len(windows[i]["input_ids"]))
    device = next(model.parameters()).device
    with evaluating(model):
        for start in range(0, len(order), batch_size):
            rows = [windows[i] for i in order[start:start + batch_size]]
            batch = collate_windows([{"input_ids": w["input_ids"]} for w in rows], pad_token_id)
            logits = model(**{k: v.to(device) for k, v in batch.items()}).logits  # (B, S, K)
            best = logits.argmax(-1).cpu().numpy()
            for row, window in enumerate(rows):
                sentence, first = window["sentence"], window["word_start"]
                for k, position in enumerate(window["positions"]):
                    tags[sentence][first + k] = id2label[int(best[row, position])]
    missing = [s for s, t in enumerate(tags) if any(tag is None for tag in t)]
    if missing:
        raise RuntimeError(f"{len(missing)} sentences have words without a window (first: sentence {missing[0]})")
    return tags  # type: ignore[return-value]


# ---------------------------------------------------------------------------- the task

def ner_task(model_dir: str | os.PathLike, train_file: str | os.PathLike, dev_file: str | os.PathLike, *,
             document_context: bool = False, max_seq_length: int = 128, eval_batch_size: int = 128,
             max_train_examples: int | None = None, data: NerData | None = None, name: str = TASK_NAME,
             metrics: Callable[[list, list], dict[str, float]] = ner_metrics, main_metric: str = "f1"):
    """The `FinetuneTask` of CoNLL NER: `BertForTokenClassification` on the checkpoint in `model_dir`,
    the label list from `train_file` (saved as `config.id2label`), entity F1 on `dev_file` as the main
    metric, OUT/dev_predictions.txt in CoNLL columns with the predicted tag last.

    Any other tag set in CoNLL columns (chunks, parts of speech) trains the same way: `name` is the
    `finetuning_task` recorded (the tag family's, "ner", by default), `metrics(gold, predicted)` scores
    dev (default conlleval's entity scores) and `main_metric` picks the best epoch."""
    if data is None:
        data = prepare_ner_data(model_dir, train_file, dev_file, document_context=document_context,
                                max_seq_length=max_seq_length, max_train_examples=max_train_examples)
    pad_id = data.tokenizer.pad_token_id
    gold = [s.tags for s in data.dev]
    lengths = [len(s) for s in data.dev]

    def build_model():
        return BertForTokenClassification.from_pretrained(
            model_dir, num_labels=len(data.labels), id2label=data.id2label, finetuning_task=name,
            **{CONFIG_DOCUMENT_CONTEXT: data.document_context, CONFIG_MAX_SEQ_LENGTH: data.max_seq_length})

    def evaluate(model):
        predicted = predict_window_tags(model, data.dev_windows, lengths, data.id2label, eval_batch_size, pad_id)
        return metrics(gold, predicted), predicted

    def write_predictions(output_dir: Path, predicted) -> None:
        write_conll(output_dir / DEV_PREDICTIONS, data.dev, predicted)

    return FinetuneTask(
        name=name, build_model=build_model, tokenizer=data.tokenizer, train_features=data.train_windows,
        collate=lambda rows: collate_windows(rows, pad_id), step_fn=token_classification_step, evaluate=evaluate,
        main_metric=main_metric, write_predictions=write_predictions,
        lengths=[len(w["input_ids"]) for w in data.train_windows], count_fn=labelled_tokens)


# ---------------------------------------------------------------------------- prediction

def predict_conll(model_dir: str | os.PathLike, input_file: str | os.PathLike, output_file: str | os.PathLike, *,
                  document_context: bool | None = None, max_seq_length: int | None = None,
                  batch_size: int = 128, dtype: str | None = None) -> tuple[Path, dict[str, float] | None]:
    """Tag a CoNLL file with a fine-tuned NER model (or a feature-based one); returns the written path and,
    when the input's last column holds gold tags, `ner_metrics` against them.

    The output is the input's columns plus the predicted tag (conlleval's input format for a labelled
    file). Windowing follows how the model was trained (config.json) unless `document_context` /
    `max_seq_length` are given. An unlabelled input may have any number of columns (the word first).
    `dtype`: see `bertforge.modeling.load_for_inference` (fine-tuned models only).
    """
    config = read_model_config(model_dir)
    if "feature_based" in config:
        if dtype is not None:
            raise ValueError(f"{model_dir} is a feature-based tagger: dtype applies to fine-tuned models only")
        return predict_conll_feature_based(model_dir, input_file, output_file, document_context=document_context,
                                           max_seq_length=max_seq_length, batch_size=batch_size)
    # The input is read (and its errors reported) before the model loads.
    stored = config.get("id2label") or {}
    labels = [stored[key] for key in sorted(stored, key=int)] if stored else []
    sentences, labelled = read_for_prediction(input_file, labels)
    model = load_for_inference(BertForTokenClassification, model_dir, dtype, task=TASK_NAME)
    id2label = model.config.id2label or {i: f"LABEL_{i}" for i in range(model.config.num_labels)}
    if labels != list(id2label.values()):  # config.json's labels were not the model's: read again with them
        sentences, labelled = read_for_prediction(input_file, list(id2label.values()))
    document_context = config.get(CONFIG_DOCUMENT_CONTEXT, False) if document_context is None else document_context
    max_seq_length = max_seq_length or config.get(CONFIG_MAX_SEQ_LENGTH, 128)
    tokenizer = BertTokenizer.from_pretrained(resolve_model_dir(model_dir))
    pieces = word_piece_ids(tokenizer, (w for s in sentences for w in s.words))
    windows = build_windows(sentences, pieces, max_seq_length, tokenizer.cls_token_id, tokenizer.sep_token_id,
                            None, document_context)
    predicted = predict_window_tags(model, windows, [len(s) for s in sentences], id2label, batch_size,
                                    tokenizer.pad_token_id)
    path = write_conll(output_file, sentences, predicted)
    return path, ner_metrics([s.tags for s in sentences], predicted) if labelled else None



# ---------------------------------------------------------------------------- the commands (the registry's entry)

def ner_summary(metrics: dict) -> str:
    """Entity F1, precision and recall, and F1 per entity type, on one line."""
    types = sorted(k[3:] for k in metrics if k.startswith("f1_"))
    per_type = ", ".join(f"{t} {metrics['f1_' + t]:.4f}" for t in types)
    return (f"entity F1 {metrics['f1']:.4f} (precision {metrics['precision']:.4f}, recall {metrics['recall']:.4f}); "
            f"per type F1: {per_type}")


def add_ner_flags(p: argparse.ArgumentParser) -> None:
    """`bertforge finetune ner`'s own flags: CoNLL files, document context, the feature-based approach."""
    p.add_argument("--train-file", required=True, help="CoNLL columns (word first, IOB1/IOB2 tag last), blank line "
                   "between sentences, -DOCSTART- between documents; the label list is taken from it")
    p.add_argument("--dev-file", required=True, help="the same format, labelled: entity F1 picks the best epoch")
    p.add_argument("--test-file", help="CoNLL file tagged by the best model into OUT/test_predictions.txt "
                   "(scored when it has gold tags)")
    p.add_argument("--document-context", action="store_true", help="fill each window with the neighbouring "
                   "sentences of the same document and predict only the centre sentence (the paper's setup)")
    p.add_argument("--max-train-examples", type=int, help="train on the first N sentences only")
    p.add_argument("--feature-based", action="store_true", help="the paper's feature-based approach (Table 7): "
                   "frozen encoder, its hidden states cached once, a BiLSTM tagger trained on them")
    p.add_argument("--features", default="concat-last-4", choices=("embeddings", "last", "second-to-last",
                   "sum-last-4", "concat-last-4", "sum-all"), help="--feature-based: which hidden states "
                   "(default concat-last-4, the paper's best)")
    p.add_argument("--lstm-hidden", type=int, default=768, help="--feature-based: BiLSTM hidden size per direction")
    p.add_argument("--lstm-layers", type=int, default=2, help="--feature-based: BiLSTM layers")
    p.add_argument("--lstm-dropout", type=float, default=0.1, help="--feature-based: dropout on the BiLSTM's "
                   "input, between its layers and before the classifier")


# The recipes of the two approaches (lr, batch size, sequence length, epochs): fine-tuning at BERT's rates
# (also `distill`'s for a tagger), and the BiLSTM over frozen features at the usual LSTM rates.
FINE_TUNING_RECIPE = dict(lr=5e-5, batch_size=16, max_seq_length=128, epochs=3.0)
FEATURE_BASED_RECIPE = dict(lr=1e-3, batch_size=16, max_seq_length=128, epochs=4.0)


def ner_recipe(args: argparse.Namespace) -> dict[str, float]:
    """`finetune ner`'s recipe for its flags: a randomly initialised BiLSTM (--feature-based) learns at the
    usual LSTM rates, not at BERT's fine-tuning rates."""
    return dict(FEATURE_BASED_RECIPE if args.feature_based else FINE_TUNING_RECIPE)


def ner_from_args(args: argparse.Namespace) -> FinetuneTask:
    """`ner_task` (or, with --feature-based, `feature_ner_task`) from `bertforge finetune ner`'s flags (the
    approach's recipe, `ner_recipe`, fills the learning rate and epochs not given)."""
    if args.feature_based:
        return feature_ner_task(args.model, args.train_file, args.dev_file, features=args.features,
                                lstm_hidden=args.lstm_hidden, lstm_layers=args.lstm_layers, dropout=args.lstm_dropout,
                                document_context=args.document_context, max_seq_length=args.max_seq_length,
                                eval_batch_size=args.eval_batch_size, max_train_examples=args.max_train_examples,
                                device=args.device, progress=args.progress)
    return ner_task(args.model, args.train_file, args.dev_file, document_context=args.document_context,
                    max_seq_length=args.max_seq_length, eval_batch_size=args.eval_batch_size,
                    max_train_examples=args.max_train_examples)


def ner_after(args: argparse.Namespace) -> None:
    """--test-file tagged with the best model into OUT/test_predictions.txt (scored when it has gold tags)."""
    if args.test_file:
        path, metrics = predict_conll(args.output_dir, args.test_file, Path(args.output_dir) / "test_predictions.txt",
                                      batch_size=args.eval_batch_size)
        print(f"test predictions: {path}" + (f"; {ner_summary(metrics)}" if metrics else ""))


def add_predict_flags(p: argparse.ArgumentParser) -> None:
    """`bertforge predict`'s flags for a tagger."""
    p.add_argument("--document-context", action=argparse.BooleanOptionalAction, default=None,
                   help="NER: windows with document context (default: as the model was trained)")


def predict_from_args(args: argparse.Namespace) -> None:
    """`bertforge predict` for a tagger: `predict_conll`, and the scores when the input has gold tags."""
    path, metrics = predict_conll(args.model, args.input, args.output, document_context=args.document_context,
                                  max_seq_length=args.max_seq_length, batch_size=args.batch_size, dtype=args.dtype)
    print(f"wrote {path}")
    if metrics is not None:  # the input had gold tags
        print(ner_summary(metrics))
