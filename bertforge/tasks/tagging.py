"""Named-entity recognition (§4.3, CoNLL-2003) by fine-tuning: the training step, prediction, the task.

* `ner_task(...)`: the `FinetuneTask` for `bertforge finetune ner`; `predict_conll(...)`: a fine-tuned
  model's tags for a CoNLL file, written as its columns plus a predicted tag column.

The CoNLL data this builds on (reader, first-sub-token labels, windows with maximal document context,
batches, conlleval metrics, shared with the feature-based approach) is `bertforge.tasks.conll`, whose
docstring states the rules; its names stay importable from here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import torch

from ..modeling import BertForTokenClassification, load_for_inference
from ..modeling.pretrained import resolve_model_dir
from ..modeling.modes import evaluating
from ..tokenization import BertTokenizer
from ..training.finetune import FinetuneTask
from .conll import (CONFIG_DOCUMENT_CONTEXT, CONFIG_MAX_SEQ_LENGTH, DEV_PREDICTIONS, DOCSTART, IGNORE_INDEX,
                    NerData, Sentence, build_windows, collate_windows, label_list_from, labelled_tokens,
                    ner_metrics, prepare_ner_data, read_conll, read_for_prediction, read_model_config, to_iob2,
                    word_piece_ids, write_conll)
from .feature_based import predict_conll_feature_based

__all__ = ["CONFIG_DOCUMENT_CONTEXT", "CONFIG_MAX_SEQ_LENGTH", "DEV_PREDICTIONS", "DOCSTART", "IGNORE_INDEX",
           "NerData", "Sentence", "build_windows", "collate_windows", "label_list_from", "labelled_tokens",
           "ner_metrics", "ner_task", "predict_conll", "predict_window_tags", "prepare_ner_data", "read_conll",
           "read_for_prediction", "read_model_config", "to_iob2", "token_classification_step", "word_piece_ids",
           "write_conll"]


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
             max_train_examples: int | None = None, data: NerData | None = None):
    """The `FinetuneTask` of CoNLL NER: `BertForTokenClassification` on the checkpoint in `model_dir`,
    the label list from `train_file` (saved as `config.id2label`), entity F1 on `dev_file` as the main
    metric, OUT/dev_predictions.txt in CoNLL columns with the predicted tag last."""
    if data is None:
        data = prepare_ner_data(model_dir, train_file, dev_file, document_context=document_context,
                                max_seq_length=max_seq_length, max_train_examples=max_train_examples)
    pad_id = data.tokenizer.pad_token_id
    gold = [s.tags for s in data.dev]
    lengths = [len(s) for s in data.dev]

    def build_model():
        return BertForTokenClassification.from_pretrained(
            model_dir, num_labels=len(data.labels), id2label=data.id2label, finetuning_task="ner",
            **{CONFIG_DOCUMENT_CONTEXT: data.document_context, CONFIG_MAX_SEQ_LENGTH: data.max_seq_length})

    def evaluate(model):
        predicted = predict_window_tags(model, data.dev_windows, lengths, data.id2label, eval_batch_size, pad_id)
        return ner_metrics(gold, predicted), predicted

    def write_predictions(output_dir: Path, predicted) -> None:
        write_conll(output_dir / DEV_PREDICTIONS, data.dev, predicted)

    return FinetuneTask(
        name="ner", build_model=build_model, tokenizer=data.tokenizer, train_features=data.train_windows,
        collate=lambda rows: collate_windows(rows, pad_id), step_fn=token_classification_step, evaluate=evaluate,
        main_metric="f1", write_predictions=write_predictions,
        lengths=[len(w["input_ids"]) for w in data.train_windows], count_fn=labelled_tokens)


# ---------------------------------------------------------------------------- prediction

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
    model = load_for_inference(BertForTokenClassification, model_dir, dtype, task="ner")
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

