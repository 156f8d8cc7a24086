"""Distilling the tag family (token classification, CoNLL NER): a `FinetuneTask` whose step is the
distillation objective over the tagged words.

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
import json
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .._files import read_text, write_text_atomic
from ..modeling import BertConfig, BertForTokenClassification, load_for_inference
from ..modeling.modes import evaluating
from ..tasks.conll import (CONFIG_DOCUMENT_CONTEXT, CONFIG_MAX_SEQ_LENGTH, DEV_PREDICTIONS, IGNORE_INDEX, TASK_NAME,
                           Sentence, build_windows, collate_windows, ner_metrics, word_piece_ids,
                           write_conll)
from ..tasks.registry import TaskFamily
from ..tasks.tagging import predict_window_tags
from ..tokenization import BertTokenizer
from ..training.finetune import FinetuneTask
from .augment import augmented_transfer
from .cache import cache_key, default_cache_dir, teacher_outputs
from .classify import DISTILL_INFO
from .intermediate import IntermediateTransfer, StudentPass, intermediate_counts, with_intermediate
from .objectives import hard_label_loss, soft_target_loss
from .student import build_student

__all__ = ["augmented_sentences", "read_unlabeled_sentences", "tag_distill_task", "tag_distillation_count",
           "tag_distillation_step", "teacher_word_logits"]


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


def tag_distillation_step(temperature: float, alpha: float, labels_only: bool = False,
                          intermediate: Callable[[], tuple[torch.nn.Module, IntermediateTransfer]] | None = None,
                          intermediate_weight: float = 1.0):
    """The `step_fn` of a tag student: {"distill_loss", "label_loss"} (see the module docstring) over the
    batch's word positions (`word_mask`), and the share of words on which the student's tag is the
    teacher's; `labels_only`: {"label_loss"} alone, unweighted (the control). `intermediate()`: the
    teacher and the run's `IntermediateTransfer`; the teacher then runs on the batch too and
    `intermediate_weight` × its terms ("hidden_loss", "attention_loss", over every real token) are added."""
    def step(model, batch: dict[str, torch.Tensor]):
        student = StudentPass(model, batch, intermediate)
        logits = student.out.logits  # (B, S, K)
        mask, teacher, labels = batch["word_mask"], batch["teacher_logits"], batch["labels"]
        hard = hard_label_loss(logits, labels.clamp(min=0), labels != IGNORE_INDEX)
        with torch.no_grad():
            agree = (logits[mask].argmax(-1) == teacher.argmax(-1)).sum()
        metrics = {"teacher_agreement": (agree, len(teacher))}
        # the teacher's rows are the batch's words in row-major order: logits[mask]'s order
        soft = functools.partial(soft_target_loss, logits[mask], teacher, temperature)
        return student.losses(soft, hard, alpha, labels_only, intermediate_weight), metrics
    return step


def tag_distillation_count(batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """Units behind each term's mean: every word for the soft targets, the tagged ones for the labels; the
    real tokens / (query, key) pairs for the intermediate terms."""
    return {"distill_loss": float(batch["word_mask"].sum()),
            "label_loss": float((batch["labels"] != IGNORE_INDEX).sum()),
            **intermediate_counts(batch["attention_mask"])}


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


def tag_distill_task(family: TaskFamily, teacher_dir: str | os.PathLike, train_file: str | os.PathLike, *,
                     output_dir: str | os.PathLike, dev_file: str | os.PathLike | None = None,
                     unlabeled: Sequence[str | os.PathLike] = (), layers: int | None = None,
                     student: str | None = None, temperature: float = 2.0, alpha: float = 0.5,
                     max_seq_length: int = 128, eval_batch_size: int = 128,
                     cache_dir: str | os.PathLike | None = None, labels_only: bool = False,
                     device: str | None = None, intermediate: Sequence[str] = (),
                     layer_map: Sequence[int] | None = None, intermediate_weight: float = 1.0,
                     augment: int = 0, augment_seed: int = 0,
                     augment_mlm: str | os.PathLike | None = None) -> FinetuneTask:
    """The `FinetuneTask` that distils the tagger in `teacher_dir` into a student (see
    `student.build_student` for `layers` / `student`); the teacher's word logits are computed on `device`
    (default: the GPU if there is one) and cached in `cache_dir` (default: `cache.default_cache_dir`).
    Windows follow the teacher's training (document context or not) at `max_seq_length`.
    `labels_only`: the control, trained on the gold tags alone (see the module docstring).
    `intermediate` ("hidden", "attention"), `layer_map`, `intermediate_weight`: TinyBERT's intermediate
    terms over every real token of a window (`intermediate`; checked by `run.check_options`), the teacher
    running beside the student on each batch. `augment`: that many augmented copies of each training
    sentence's words added to the transfer set as untagged sentences (`augment.augmented_transfer` with
    `augment_seed` and `augment_mlm`; soft targets only)."""
    if labels_only and intermediate:
        raise ValueError("--labels-only with --intermediate: the control is trained on the labels alone")
    teacher_dir = Path(teacher_dir)
    config = BertConfig.from_pretrained(teacher_dir)
    if "feature_based" in config.extra:
        raise ValueError(f"--teacher {teacher_dir}: a feature-based tagger (a BiLSTM over frozen BERT features) "
                         "cannot be distilled; distil a fine-tuned one (bertforge finetune ner)")
    id2label = config.id2label or {i: f"LABEL_{i}" for i in range(config.num_labels)}
    labels = [id2label[i] for i in range(config.num_labels)]
    label_map = {label: i for i, label in enumerate(labels)}
    document_context = bool(config.extra.get(CONFIG_DOCUMENT_CONTEXT, False))

    train = family.reader(train_file)  # the family's reader (conll.read_conll): errors name file:line
    _check_tags(train, labels, train_file, teacher_dir)
    extra = read_unlabeled_sentences(unlabeled)
    dev = family.reader(dev_file) if dev_file is not None else None
    if dev is not None:
        _check_tags(dev, labels, dev_file, teacher_dir)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir(teacher_dir, output_dir)
    augmented = augmented_sentences(cache_dir, train, augment, augment_seed, augment_mlm, first=len(extra),
                                    device=device) if augment else []

    tokenizer = BertTokenizer.from_pretrained(teacher_dir)
    pad_id = tokenizer.pad_token_id
    pieces = word_piece_ids(tokenizer, (w for s in train + extra + augmented + (dev or []) for w in s.words))
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    train_windows = build_windows(train, pieces, max_seq_length, cls, sep, label_map, document_context)
    extra_windows = build_windows(extra + augmented, pieces, max_seq_length, cls, sep, None, document_context)
    for window in extra_windows:  # untagged: every position ignored by the label loss
        window["labels"] = [IGNORE_INDEX] * len(window["input_ids"])
    features = [{**w, "index": i} for i, w in enumerate(train_windows + extra_windows)]
    dev_windows = build_windows(dev, pieces, max_seq_length, cls, sep, None, document_context) if dev else []

    teacher = load_for_inference(BertForTokenClassification, teacher_dir, task=TASK_NAME)

    def outputs_of(windows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
        key = cache_key(teacher_dir, windows, "tag word logits", inputs=("input_ids", "positions"))
        def compute() -> dict[str, np.ndarray]:
            logits, offsets = teacher_word_logits(teacher, windows, eval_batch_size, pad_id)
            return {"logits": logits, "offsets": offsets}
        stored = teacher_outputs(cache_dir, key, compute)
        return stored["logits"], stored["offsets"]

    teacher.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    logits, offsets = outputs_of(features)
    dev_logits, dev_offsets = outputs_of(dev_windows) if dev else (None, None)
    teacher.to("cpu")  # from here on only copied from (the student's initial weights)
    if len(offsets) != len(features) + 1 or int(offsets[-1]) != len(logits):
        raise ValueError(f"{cache_dir}: the cached teacher outputs do not match the transfer set; remove them")

    train_lengths = [len(s) for s in train]
    teacher_train_tags = _tags_from_logits(train_windows, logits, offsets, train_lengths, id2label)
    teacher_dev_tags = teacher_dev = None
    if dev is not None:
        teacher_dev_tags = _tags_from_logits(dev_windows, dev_logits, dev_offsets, [len(s) for s in dev], id2label)
        teacher_dev = ner_metrics([s.tags for s in dev], teacher_dev_tags)
    main = "f1" if dev is not None else "teacher_agreement"
    overrides = {"num_labels": config.num_labels, "id2label": id2label, "finetuning_task": TASK_NAME,
                 CONFIG_DOCUMENT_CONTEXT: document_context, CONFIG_MAX_SEQ_LENGTH: max_seq_length}
    made: dict[str, Any] = {}

    def build_model():
        model, made["student"] = build_student(teacher, layers=layers, student=student, head_overrides=overrides)
        model.config.extra.update({k: overrides[k] for k in ("finetuning_task", CONFIG_DOCUMENT_CONTEXT,
                                                              CONFIG_MAX_SEQ_LENGTH)})
        trained, made["transfer"] = with_intermediate(model, config, intermediate, layer_map)
        return trained

    if intermediate:
        teacher.requires_grad_(False)  # it runs beside the student on every batch, never trained

    def evaluate(model):
        if dev is not None:
            predicted = predict_window_tags(model, dev_windows, [len(s) for s in dev], id2label, eval_batch_size,
                                            pad_id)
            metrics = ner_metrics([s.tags for s in dev], predicted)
            metrics["teacher_agreement"] = _agreement(predicted, teacher_dev_tags)
            return metrics, predicted
        predicted = predict_window_tags(model, train_windows, train_lengths, id2label, eval_batch_size, pad_id)
        return {"teacher_agreement": _agreement(predicted, teacher_train_tags)}, None

    def write_predictions(directory: Path, predicted) -> None:
        write_conll(directory / DEV_PREDICTIONS, dev, predicted)

    def extra_files(directory: Path) -> None:
        info = {"teacher": str(teacher_dir), "task": TASK_NAME, "family": family.name,
                "teacher_layers": config.num_hidden_layers, **made.get("student", {}),
                "objective": "labels only" if labels_only else "soft targets + labels",
                "temperature": temperature, "alpha": alpha, "max_seq_length": max_seq_length,
                "document_context": document_context, "transfer_windows": len(features),
                "transfer_sentences": len(train) + len(extra) + len(augmented), "labelled_sentences": len(train),
                "unlabeled_sentences": len(extra), "augmented_sentences": len(augmented),
                "augment": {"copies": augment, "seed": augment_seed, "mlm": None if augment_mlm is None
                            else str(augment_mlm)} if augmented else None,
                "transfer_words": int(offsets[-1]),
                "teacher_outputs": str(cache_dir), "teacher_dev_metrics": teacher_dev}
        if intermediate:
            info.update(intermediate=list(intermediate), layer_map=list(layer_map),
                        intermediate_weight=intermediate_weight)
        write_text_atomic(directory / DISTILL_INFO, json.dumps(info, indent=2) + "\n")

    return FinetuneTask(
        name=TASK_NAME, build_model=build_model, tokenizer=tokenizer, train_features=features,
        collate=lambda rows: _collate(rows, logits, offsets, pad_id),
        step_fn=tag_distillation_step(temperature, alpha, labels_only,
                                      (lambda: (teacher, made["transfer"])) if intermediate else None,
                                      intermediate_weight),
        evaluate=evaluate, main_metric=main,
        write_predictions=write_predictions if dev is not None else None,
        lengths=[len(f["input_ids"]) for f in features], count_fn=tag_distillation_count, extra_files=extra_files)
