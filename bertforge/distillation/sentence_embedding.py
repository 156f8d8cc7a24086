"""The sentence-embedding family's distillation adaptor: a smaller bi-encoder regressed onto the teacher's
embeddings (sentence-transformers' model distillation, Reimers & Gurevych 2020: MSE between the student's
and the teacher's sentence vectors).

The transfer set is every distinct text of the training file (each column of its pairs or triplets: a text
is embedded alone, so a pair is two transfer rows) and any unlabelled text (one per line). The teacher's
output per row is its embedding, with its own pooling and normalisation (`SentenceEncoder.embed`), computed
once and cached (`cache.teacher_outputs`). The loss of a batch:

* `distill_loss`: the mean squared error between the student's embedding (the teacher's pooling and
  normalisation, which the student inherits in its config) and the teacher's, over every row;
* `label_loss`: none (0): the target is the teacher's vector; gold scores judge the student on dev only.

The student keeps the teacher's hidden size (its layers, or a checkpoint of the same width): the vectors are
compared coordinate by coordinate. Evaluation on --dev-file (scored pairs): Spearman (the main metric) and
Pearson of the student's cosines against the gold scores, and `teacher_agreement`, the Spearman between the
student's and the teacher's cosines; without --dev-file the student is judged by `teacher_cosine`, the mean
cosine between its and the teacher's embeddings of the training texts.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..metrics.glue import spearman
from ..tasks.sentence_embedding import (TASK_NAME, batch_of, cosine_scores, embed_texts, encode, pool,
                                        read_pooling, read_sentence_file, similarity_metrics)
from ..tokenization import BertTokenizer
from .classify import read_unlabeled
from .distiller import Adaptor, DistillRun, Terms

__all__ = ["SentenceEmbeddingAdaptor"]


class SentenceEmbeddingAdaptor(Adaptor):
    """The sentence-embedding family: the teacher's embedding per text, the student's regressed onto it."""

    what = "sentence embeddings"
    objective = "embedding MSE (sentence-transformers' model distillation)"

    def __init__(self, run: DistillRun) -> None:
        super().__init__(run)
        if run.labels_only:
            raise ValueError("--labels-only: a sentence-embedding student has no labels to learn alone (its target "
                             "is the teacher's embedding)")
        self.name = self.teacher_task = TASK_NAME
        self.pooling = pooling = read_pooling(run.teacher_dir)
        if pooling is None:
            raise ValueError(f"--teacher {run.teacher_dir}: declares no pooling (modules.json or config.json's "
                             "sentence_embedding); fine-tune it with `bertforge finetune sentence-embedding`")
        self.max_seq_length = run.max_seq_length or pooling.max_seq_length or 128
        texts = list(dict.fromkeys(text for row in read_sentence_file(run.train_file, scored=None)
                                   for text in row.texts))
        texts += [t for e in read_unlabeled(run.unlabeled) for t in (e.text_a, e.text_b) if t]
        self.texts = texts = list(dict.fromkeys(texts))
        self.tokenizer = tokenizer = BertTokenizer.from_pretrained(run.teacher_dir)
        self.pad_id = self.teacher_pad_id = tokenizer.pad_token_id or 0
        self.features = [{"input_ids": ids, "token_type_ids": [0] * len(ids), "index": i}
                         for i, ids in enumerate(encode(tokenizer, texts, self.max_seq_length))]
        self.teacher_features = self.features
        self.dev = read_sentence_file(run.dev_file, texts=2, scored=True) if run.dev_file is not None else None
        if self.dev is not None:
            dev_texts = [e.texts[0] for e in self.dev] + [e.texts[1] for e in self.dev]
            self.teacher_dev_features = [{"input_ids": ids, "token_type_ids": [0] * len(ids)}
                                         for ids in encode(tokenizer, dev_texts, self.max_seq_length)]
            self.gold = np.array([e.score for e in self.dev])
        self.head_overrides = dict(finetuning_task=TASK_NAME)
        self.main_metric = "spearman" if self.dev is not None else "teacher_cosine"

    def compute(self, teacher, rows: Sequence[dict]) -> dict[str, np.ndarray]:
        """{"embeddings": (N, H) float32}: the teacher's vector of each row (its pooling and normalisation)."""
        device = next(teacher.parameters()).device
        out = np.zeros((len(rows), teacher.config.hidden_size), dtype=np.float32)
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]["input_ids"]))
        with torch.inference_mode():
            for start in range(0, len(order), self.run.eval_batch_size):
                chosen = order[start:start + self.run.eval_batch_size]
                batch = {k: v.to(device) for k, v in batch_of([rows[i]["input_ids"] for i in chosen],
                                                              self.teacher_pad_id).items()}
                out[chosen] = teacher.embed(**batch).float().cpu().numpy()
        return {"embeddings": out}

    def _teacher_cosines(self) -> np.ndarray:
        half = len(self.dev)
        return cosine_scores(self.dev_embeddings[:half], self.dev_embeddings[half:])

    def received(self, outputs, dev_outputs) -> dict[str, float] | None:
        self.embeddings = outputs["embeddings"]
        self.dev_embeddings = dev_outputs["embeddings"] if dev_outputs is not None else None
        return similarity_metrics(self._teacher_cosines(), self.gold) if self.dev is not None else None

    def after_build(self, model) -> None:
        if model.config.hidden_size != self.run.config.hidden_size:
            raise ValueError(f"the student's hidden size {model.config.hidden_size} is not the teacher's "
                             f"{self.run.config.hidden_size}: its embeddings are regressed onto the teacher's "
                             "coordinate by coordinate (use --layers, or a student of the teacher's width)")
        model.sentence_pooling = self.pooling

    def collate(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        batch = batch_of([r["input_ids"] for r in rows], self.pad_id)
        batch["teacher_embeddings"] = torch.from_numpy(
            np.asarray(self.embeddings[[r["index"] for r in rows]], dtype=np.float32))
        return batch

    def _student(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        vectors = pool(hidden, attention_mask, self.pooling.pooling)
        return F.normalize(vectors, dim=-1) if self.pooling.normalize else vectors

    def terms(self, out, batch: dict[str, torch.Tensor]) -> Terms:
        student = self._student(out.last_hidden_state, batch["attention_mask"]).float()
        teacher = batch["teacher_embeddings"].to(student.device)
        with torch.no_grad():
            cosine = F.cosine_similarity(student, teacher, dim=-1)
            metrics = {"teacher_cosine": (cosine.sum(), len(cosine))}
        return (lambda: F.mse_loss(student, teacher)), student.new_zeros(()), metrics

    def count(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        rows = float(len(batch["input_ids"]))
        return {"distill_loss": rows, "label_loss": rows}

    def evaluate(self, model) -> tuple[dict[str, float], Any]:
        module = getattr(model, "module", model)
        batch_size = self.run.eval_batch_size
        if self.dev is None:
            ours = embed_texts(module, self.tokenizer, self.texts, self.max_seq_length, batch_size)
            theirs = np.asarray(self.embeddings, dtype=np.float32)
            return {"teacher_cosine": float(cosine_scores(ours, theirs).mean())}, None
        a = embed_texts(module, self.tokenizer, [e.texts[0] for e in self.dev], self.max_seq_length, batch_size)
        b = embed_texts(module, self.tokenizer, [e.texts[1] for e in self.dev], self.max_seq_length, batch_size)
        cosines = cosine_scores(a, b)
        scores = similarity_metrics(cosines, self.gold)
        scores["teacher_agreement"] = spearman(cosines, self._teacher_cosines())
        return scores, cosines

    def info(self) -> dict[str, Any]:
        return {"pooling": self.pooling.pooling, "normalize": self.pooling.normalize, "transfer_texts": len(self.texts)}
