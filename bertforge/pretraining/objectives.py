"""What one pre-training step computes: the masked-LM + next-sentence loss (`MaskedLMStep`) or the
left-to-right LM ablation (`LeftToRightStep`), with the accuracies logged beside them, and the
perplexity a log record derives from its MLM loss. `run_pretraining` (trainer.py) hands one of these
to the shared Trainer as its `step_fn`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..modeling.heads import IGNORE_INDEX


def _accuracy(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, counted) over the labels that are not IGNORE_INDEX."""
    valid = labels != IGNORE_INDEX
    return ((logits.argmax(-1) == labels) & valid).sum(), valid.sum()


class MaskedLMStep:
    """Masked LM (+ NSP): the paper's objective, or MLM only (`nsp=False`).

    `unpad=True`: the encoder computes only the real tokens of each instance (the `short_seq_prob`
    targets leave some padding in a batch); the losses are the padded path's to rounding
    (tests/modeling/test_inference_paths.py), and a step costs less on CPU (see BENCHMARKS.md,
    "Pre-training step"). `unpad=False` keeps the padded path.
    """

    def __init__(self, nsp: bool = True, unpad: bool = True):
        self.nsp, self.unpad = nsp, unpad

    def __call__(self, model: nn.Module, batch: dict[str, torch.Tensor]):
        out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                    attention_mask=batch["attention_mask"], masked_lm_positions=batch["masked_lm_positions"],
                    masked_lm_labels=batch["masked_lm_labels"],
                    next_sentence_label=batch["next_sentence_label"] if self.nsp else None, unpad=self.unpad)
        losses = {"mlm_loss": out.mlm_loss}
        with torch.no_grad():
            metrics = {"mlm_accuracy": _accuracy(out.prediction_logits, batch["masked_lm_labels"])}
            if self.nsp:
                losses["nsp_loss"] = out.nsp_loss
                metrics["nsp_accuracy"] = _accuracy(out.seq_relationship_logits, batch["next_sentence_label"])
        return losses, metrics

    def counts(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """Over what each loss is a mean: the masked tokens, and the sentence pairs."""
        counts = {"mlm_loss": float((batch["masked_lm_labels"] != IGNORE_INDEX).sum())}
        if self.nsp:
            counts["nsp_loss"] = float(len(batch["next_sentence_label"]))
        return counts

    def eval(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        losses, metrics = self(model, batch)
        counts = {"mlm_loss": metrics["mlm_accuracy"][1]}
        if self.nsp:
            counts["nsp_loss"] = len(batch["next_sentence_label"])
        return {**{name: (value.float() * counts[name], counts[name]) for name, value in losses.items()}, **metrics}


def unmasked_input_ids(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The instance's original tokens: the masked-LM labels written back at their positions."""
    ids = batch["input_ids"].clone()
    positions, labels = batch["masked_lm_positions"], batch["masked_lm_labels"]
    valid = labels != IGNORE_INDEX
    ids.scatter_(1, positions, torch.where(valid, labels, ids.gather(1, positions)))
    return ids


def next_token_labels(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Position t is labelled with token t + 1; the last real token and padding with IGNORE_INDEX."""
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[:, :-1] = torch.where(attention_mask[:, 1:].bool(), input_ids[:, 1:], IGNORE_INDEX)
    return labels


class LeftToRightStep:
    """The paper's LTR ablation: next-token prediction with a causal (is_causal=True) encoder, no NSP."""

    nsp = False

    def __call__(self, model: nn.Module, batch: dict[str, torch.Tensor]):
        ids = unmasked_input_ids(batch)
        labels = next_token_labels(ids, batch["attention_mask"])
        out = model(input_ids=ids, token_type_ids=batch["token_type_ids"], attention_mask=batch["attention_mask"],
                    labels=labels)
        with torch.no_grad():
            accuracy = _accuracy(out.prediction_logits, labels[labels != IGNORE_INDEX])
        return {"lm_loss": out.mlm_loss}, {"lm_accuracy": accuracy}

    def counts(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        # Every real token but the last of each sequence is predicted.
        return {"lm_loss": float(batch["attention_mask"].sum() - len(batch["attention_mask"]))}

    def eval(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        losses, metrics = self(model, batch)
        count = metrics["lm_accuracy"][1]
        return {"lm_loss": (losses["lm_loss"].float() * count, count), **metrics}


def perplexity(record: dict[str, Any]) -> dict[str, float]:
    """eval_perplexity = exp(eval masked-LM (or LM) loss)."""
    for name in ("eval_mlm_loss", "eval_lm_loss"):
        if name in record:
            return {"eval_perplexity": math.exp(min(record[name], 700.0))}
    return {}


# -- the run ---------------------------------------------------------------------------------------
