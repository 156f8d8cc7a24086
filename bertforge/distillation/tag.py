"""The tag family's distillation adaptor (token classification, CoNLL NER): the objective over the
tagged words.

The transfer set is the teacher's CoNLL training file, read and windowed as the tag family fine-tunes
(`conll.read_conll`, `conll.build_windows`: each word tokenized on its own, its first sub-token labelled,
one window per sentence or, for a teacher trained with document context, the sentence in its
document's context; a sentence longer than a window in consecutive chunks), plus any unlabelled text
(--unlabeled: one sentence per line, words split on whitespace, no tags; each line its own context),
plus, with `augment` N, N augmented copies of each training sentence's words (`augment`: masking,
replacement, n-gram windows; untagged, each its own context, kept beside the teacher's outputs).

The teacher's per-word logits (at each word's first sub-token) over the transfer set are computed once
(`cache.teacher_outputs`) and stored flat, without padding: `logits` (total words, K) float32 and
`offsets` (windows + 1,) int64, window i's words being rows offsets[i]:offsets[i+1] in order. A batch
reads its windows' rows; nothing of shape (windows, sequence, K) is ever held. The loss of a batch is
two terms, each a mean over its own words, which the Trainer weights across micro-batches:

* `distill_loss`: T² · KL(teacher_T || student_T) over every word of the batch (`objectives.soft_target_loss`);
* `label_loss`: alpha × the cross-entropy against the gold tag, over the words that have one (the
  training file's; --unlabeled lines and augmented copies have none).

With `intermediate` (TinyBERT's intermediate-layer transfer, `intermediate.py`), the teacher also runs on
each batch and `hidden_loss` / `attention_loss` over every real token of the windows are added, each ×
`intermediate_weight`.

`labels_only=True` is the control: the same student, data and engine on the gold tags alone
(`label_loss` with weight 1). Evaluation on --dev-file is the family's (`conll.ner_metrics`:
conlleval's entity F1, as `bertforge finetune ner` reports it), plus the share of dev words on which the
student's tag is the teacher's; without --dev-file, that agreement on the training file's words. The
student is a normal `ner` checkpoint (finetuning_task "ner", the teacher's labels and windowing in its
config.json): `bertforge predict` and `pipeline("tag")` take it.
"""

from __future__ import annotations

import functools
import os
from typing import Sequence

import numpy as np
import torch

from .._files import read_text
from ..modeling.modes import evaluating
from ..tasks.conll import (CONFIG_DOCUMENT_CONTEXT, CONFIG_MAX_SEQ_LENGTH, DEV_PREDICTIONS, IGNORE_INDEX, TASK_NAME,
                           Sentence, build_windows, collate_windows, ner_metrics, word_piece_ids,
                           write_conll)
from ..tasks.tag import predict_window_tags
from ..tokenization import BertTokenizer
from .augment import augmented_transfer
from .distiller import Adaptor, DistillRun, Terms
from .objectives import hard_label_loss, soft_target_loss

__all__ = ["TagAdaptor", "augmented_sentences", "read_unlabeled_sentences", "tag_distillation_count", "tag_terms",
           "teacher_word_logits"]


def read_unlabeled_sentences(paths: Sequence[str | os.PathLike]) -> list[Sentence]:
    """Unlabelled transfer sentences: each non-blank line of each file is one sentence, its words split
    on whitespace; each is its own document (no context from the lines around it)."""
    sentences: list[Sentence] = []
    for path in paths:
        for number, line in enumerate(read_text(path).splitlines(), start=1):
            words = line.split()
            if words:
                sentences.append(Sentence([[word] for word in words], None, len(sentences), number))
    return sentences


def augmented_sentences(cache_dir: str | os.PathLike, sentences: Sequence[Sentence], copies: int, seed: int,
                        mlm: str | os.PathLike | None = None, *, first: int = 0,
                        device: str | None = None) -> list[Sentence]:
    """`copies` augmented copies of each sentence's word list (`augment.augmented_transfer`: masking,
    replacement, n-gram windows; kept in `cache_dir` and read back from there), in order, as untagged
    sentences, each its own document (numbered from `first`, after the --unlabeled ones) and carrying its
    source sentence's line. A CoNLL word holds no whitespace, so a copy's text splits back into its words."""
    texts = augmented_transfer(cache_dir, [(" ".join(s.words),) for s in sentences], copies, seed, mlm,
                               device=device)
    return [Sentence([[word] for word in text.split()], None, first + i, sentences[i // copies].line)
            for i, (text,) in enumerate(texts)]


def _check_tags(sentences: Sequence[Sentence], labels: Sequence[str], path: str | os.PathLike,
                teacher_dir: str | os.PathLike) -> None:
    """ValueError naming `path:line` for the first gold tag that is not one of the teacher's labels: the
    teacher (and so the student) has no output for it."""
    known = set(labels)
    for sentence in sentences:
        for offset, tag in enumerate(sentence.tags or ()):
            if tag not in known:
                raise ValueError(f"{path}:{sentence.line + offset}: tag {tag!r} is not one of the labels of --teacher "
                                 f"{teacher_dir} ({' '.join(labels)}): the teacher never learned to predict it")


@torch.no_grad()
def teacher_word_logits(teacher, windows: Sequence[dict], batch_size: int, pad_id: int
                        ) -> tuple[np.ndarray, np.ndarray]:
    """The teacher's logits at each window's word positions, flat: (`logits` (total words, K) float32,
    `offsets` (windows + 1,) int64), window i's words at rows offsets[i]:offsets[i+1], in `windows`' order.
    Windows run sorted by length (little padding), in eval mode."""
    counts = np.array([len(w["positions"]) for w in windows], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    logits = np.zeros((int(offsets[-1]), teacher.config.num_labels), dtype=np.float32)
    order = sorted(range(len(windows)), key=lambda i: len(windows[i]["input_ids"]))
    device = next(teacher.parameters()).device
    with evaluating(teacher):
        for start in range(0, len(order), batch_size):
            chosen = order[start:start + batch_size]
            batch = collate_windows([{"input_ids": windows[i]["input_ids"]} for i in chosen], pad_id)
            out = teacher(**{k: v.to(device) for k, v in batch.items()}).logits.float().cpu().numpy()
            for row, i in enumerate(chosen):
                logits[offsets[i]:offsets[i + 1]] = out[row, windows[i]["positions"]]
    return logits, offsets


def tag_terms(out, batch: dict[str, torch.Tensor], temperature: float) -> Terms:
    """The tag family's terms (see the module docstring) over the batch's word positions (`word_mask`), and
    the share of words on which the student's tag is the teacher's."""
    logits = out.logits  # (B, S, K)
    mask, teacher, labels = batch["word_mask"], batch["teacher_logits"], batch["labels"]
    hard = hard_label_loss(logits, labels.clamp(min=0), labels != IGNORE_INDEX)
    with torch.no_grad():
        agree = (logits[mask].argmax(-1) == teacher.argmax(-1)).sum()
    metrics = {"teacher_agreement": (agree, len(teacher))}
    # the teacher's rows are the batch's words in row-major order: logits[mask]'s order
    soft = functools.partial(soft_target_loss, logits[mask], teacher, temperature)
    return soft, hard, metrics


def tag_distillation_count(batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """Units behind each term's mean: every word for the soft targets, the tagged ones for the labels."""
    return {"distill_loss": float(batch["word_mask"].sum()),
            "label_loss": float((batch["labels"] != IGNORE_INDEX).sum())}


def _collate(rows: list[dict], logits: np.ndarray, offsets: np.ndarray, pad_id: int) -> dict[str, torch.Tensor]:
    """collate_windows' batch, with `word_mask` (B, S) true at each window's word positions and
    `teacher_logits` (words, K): the windows' rows of the flat cache, in the mask's row-major order."""
    batch = collate_windows(rows, pad_id)
    mask = torch.zeros(batch["input_ids"].shape, dtype=torch.bool)
    for r, row in enumerate(rows):
        mask[r, row["positions"]] = True
    batch["word_mask"] = mask
    parts = [np.asarray(logits[offsets[row["index"]]:offsets[row["index"] + 1]]) for row in rows]
    batch["teacher_logits"] = torch.from_numpy(np.concatenate(parts).astype(np.float32, copy=False))
    return batch


def _tags_from_logits(windows: Sequence[dict], logits: np.ndarray, offsets: np.ndarray, lengths: Sequence[int],
                      id2label: dict[int, str]) -> list[list[str]]:
    """Each sentence's tags (argmax per word) from flat per-window word logits (`teacher_word_logits`)."""
    tags: list[list[str]] = [[""] * n for n in lengths]
    best = np.asarray(logits).argmax(-1)
    for i, window in enumerate(windows):
        first = window["word_start"]
        for k, label in enumerate(best[offsets[i]:offsets[i + 1]]):
            tags[window["sentence"]][first + k] = id2label[int(label)]
    return tags


def _agreement(a: Sequence[Sequence[str]], b: Sequence[Sequence[str]]) -> float:
    pairs = [(x, y) for s, t in zip(a, b, strict=True) for x, y in zip(s, t, strict=True)]
    return float(np.mean([x == y for x, y in pairs])) if pairs else 0.0


class TagAdaptor(Adaptor):
    """The tag family: the teacher's logits at each word's first sub-token, stored flat with per-window
    offsets (`teacher_word_logits`); windows as the teacher was trained (document context or not) at
    `run.max_seq_length` (default 128); a feature-based tagger is refused."""

    what = "tag word logits"
    inputs = ("input_ids", "positions")
    per_row = False  # `offsets` has one row more than the windows, `logits` one per word

    def __init__(self, run: DistillRun) -> None:
        super().__init__(run)
        config, teacher_dir = run.config, run.teacher_dir
        if "feature_based" in config.extra:
            raise ValueError(f"--teacher {teacher_dir}: a feature-based tagger (a BiLSTM over frozen BERT features) "
                             "cannot be distilled; distil a fine-tuned one (bertforge finetune ner)")
        self.max_seq_length = max_seq_length = run.max_seq_length if run.max_seq_length is not None else 128
        self.name = self.teacher_task = TASK_NAME
        self.id2label = id2label = config.id2label or {i: f"LABEL_{i}" for i in range(config.num_labels)}
        labels = [id2label[i] for i in range(config.num_labels)]
        label_map = {label: i for i, label in enumerate(labels)}
        self.document_context = document_context = bool(config.extra.get(CONFIG_DOCUMENT_CONTEXT, False))

        self.train = train = run.family.reader(run.train_file)  # the family's reader: errors name file:line
        _check_tags(train, labels, run.train_file, teacher_dir)
        self.extra = extra = read_unlabeled_sentences(run.unlabeled)
        self.dev = dev = run.family.reader(run.dev_file) if run.dev_file is not None else None
        if dev is not None:
            _check_tags(dev, labels, run.dev_file, teacher_dir)
        self.augmented = augmented = augmented_sentences(run.cache_dir, train, run.augment, run.augment_seed,
                                                         run.augment_mlm, first=len(extra), device=run.device) \
            if run.augment else []

        self.tokenizer = tokenizer = BertTokenizer.from_pretrained(teacher_dir)
        self.pad_id = self.teacher_pad_id = tokenizer.pad_token_id
        pieces = word_piece_ids(tokenizer, (w for s in train + extra + augmented + (dev or []) for w in s.words))
        cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
        self.train_windows = build_windows(train, pieces, max_seq_length, cls, sep, label_map, document_context)
        extra_windows = build_windows(extra + augmented, pieces, max_seq_length, cls, sep, None, document_context)
        for window in extra_windows:  # untagged: every position ignored by the label loss
            window["labels"] = [IGNORE_INDEX] * len(window["input_ids"])
        self.features = self.teacher_features = [{**w, "index": i}
                                                 for i, w in enumerate(self.train_windows + extra_windows)]
        self.dev_windows = build_windows(dev, pieces, max_seq_length, cls, sep, None, document_context) if dev else []
        if dev:
            self.teacher_dev_features = self.dev_windows
        self.main_metric = "f1" if dev is not None else "teacher_agreement"
        self.head_overrides = {"num_labels": config.num_labels, "id2label": id2label, "finetuning_task": TASK_NAME,
                               CONFIG_DOCUMENT_CONTEXT: document_context, CONFIG_MAX_SEQ_LENGTH: max_seq_length}
        if dev is not None:
            self.write_predictions = lambda directory, predicted: write_conll(directory / DEV_PREDICTIONS, dev,
                                                                              predicted)

    def compute(self, teacher, rows: Sequence[dict]) -> dict[str, np.ndarray]:
        logits, offsets = teacher_word_logits(teacher, rows, self.run.eval_batch_size, self.pad_id)
        return {"logits": logits, "offsets": offsets}

    def received(self, outputs, dev_outputs):
        self.logits, self.offsets = outputs["logits"], outputs["offsets"]
        if len(self.offsets) != len(self.features) + 1 or int(self.offsets[-1]) != len(self.logits):
            raise ValueError(f"{self.run.cache_dir}: the cached teacher outputs do not match the transfer set; "
                             "remove them")
        self.train_lengths = [len(s) for s in self.train]
        self.teacher_train_tags = _tags_from_logits(self.train_windows, self.logits, self.offsets,
                                                    self.train_lengths, self.id2label)
        self.teacher_dev_tags = None
        if self.dev is None:
            return None
        self.teacher_dev_tags = _tags_from_logits(self.dev_windows, dev_outputs["logits"], dev_outputs["offsets"],
                                                  [len(s) for s in self.dev], self.id2label)
        return ner_metrics([s.tags for s in self.dev], self.teacher_dev_tags)

    def after_build(self, model) -> None:
        model.config.extra.update({k: self.head_overrides[k] for k in ("finetuning_task", CONFIG_DOCUMENT_CONTEXT,
                                                                       CONFIG_MAX_SEQ_LENGTH)})

    def collate(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        return _collate(rows, self.logits, self.offsets, self.pad_id)

    def terms(self, out, batch: dict[str, torch.Tensor]) -> Terms:
        return tag_terms(out, batch, self.run.temperature)

    def count(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        return tag_distillation_count(batch)

    def evaluate(self, model):
        batch_size = self.run.eval_batch_size
        if self.dev is not None:
            predicted = predict_window_tags(model, self.dev_windows, [len(s) for s in self.dev], self.id2label,
                                            batch_size, self.pad_id)
            metrics = ner_metrics([s.tags for s in self.dev], predicted)
            metrics["teacher_agreement"] = _agreement(predicted, self.teacher_dev_tags)
            return metrics, predicted
        predicted = predict_window_tags(model, self.train_windows, self.train_lengths, self.id2label, batch_size,
                                        self.pad_id)
        return {"teacher_agreement": _agreement(predicted, self.teacher_train_tags)}, None

    def info(self) -> dict:
        train, extra, augmented = self.train, self.extra, self.augmented
        return {"max_seq_length": self.max_seq_length, "document_context": self.document_context,
                "transfer_windows": len(self.features), "transfer_sentences": len(train) + len(extra) + len(augmented),
                "labelled_sentences": len(train), "unlabeled_sentences": len(extra),
                "augmented_sentences": len(augmented), "augment": self.run.augment_info(len(augmented)),
                "transfer_words": int(self.offsets[-1])}
