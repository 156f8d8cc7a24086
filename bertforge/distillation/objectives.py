"""The distillation objective (Hinton et al. 2015, "Distilling the Knowledge in a Neural Network").

The student learns the teacher's soft targets: the teacher's distribution at temperature T,
softmax(z_t / T), against the student's, softmax(z_s / T), by KL(teacher_T || student_T), multiplied by
T² so that its gradients keep their size as T changes (Hinton et al. §2: the soft targets' gradients
scale as 1/T²). Where an example has a label, the usual loss against it is added with a weight alpha.
A regression head has no distribution: the student's output is pulled to the teacher's by the squared
error (Tang et al. 2019 distil BERT into a BiLSTM with the squared error on logits).

Every function takes logits of shape (..., K) and reduces over all leading axes, optionally only where
`mask` is true, so the same terms serve a sentence's logits (B, K), a tag per token (B, S, K, masked to
the labelled tokens) and a span's start/end distributions (B, S: softmax over positions, K = S).

Independent labels (a multi-label head: a sigmoid per label) have no distribution over K: each label is
its own two-class distribution, so the soft target of label k is the teacher's sigmoid(z_t,k / T) and the
student's sigmoid(z_s,k / T) learns it by binary cross-entropy (`soft_binary_target_loss`, again × T²),
the gold label sets by the usual binary cross-entropy (`binary_label_loss`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["TEMPERATURE_RANGE", "binary_label_loss", "check_temperature", "hard_label_loss", "soft_binary_target_loss",
           "soft_target_loss", "squared_error_loss"]

# The temperatures the soft-target loss takes (Hinton et al. use 1 to 20; DistilBERT 2, TinyBERT 1). Below 0.1
# the soft targets are the teacher's argmax to float32's precision and the T² scale makes the term vanish
# (1e-30 trains on nothing); above 100 every soft target is uniform to within a percent for logits of
# ordinary size, and T² overflows float32 long before 1e30 (a NaN loss at the first step).
TEMPERATURE_RANGE = (0.1, 100.0)


def check_temperature(temperature: float, flag: str = "--temperature") -> None:
    """ValueError, one line naming `flag`, unless `temperature` lies in TEMPERATURE_RANGE."""
    low, high = TEMPERATURE_RANGE
    if not (math.isfinite(temperature) and low <= temperature <= high):
        raise ValueError(f"{flag} must be a positive number from {low:g} to {high:g} (the soft targets' softmax "
                         f"temperature; 1 to 20 is usual), got {temperature:g}")


def _rows(values: torch.Tensor, mask: torch.Tensor | None, trailing: int) -> torch.Tensor:
    """`values` flattened to rows of its last `trailing` axes, keeping the rows where `mask` is true."""
    rows = values.reshape(-1, *values.shape[values.dim() - trailing:]) if trailing else values.reshape(-1)
    return rows if mask is None else rows[mask.reshape(-1).bool()]


def soft_target_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float,
                     mask: torch.Tensor | None = None) -> torch.Tensor:
    """T² · mean over rows of KL(softmax(teacher / T) || softmax(student / T)), in float32.

    Rows: every leading position of the (..., K) logits, or those where `mask` (the leading shape) is
    true; 0 when no row is left (a batch whose rows are all masked trains nothing here)."""
    student = _rows(student_logits.float(), mask, 1)
    teacher = _rows(teacher_logits.float(), mask, 1)
    if student.shape[0] == 0:
        return student_logits.sum() * 0.0
    log_q = F.log_softmax(student / temperature, dim=-1)
    log_p = F.log_softmax(teacher / temperature, dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    return kl.mean() * temperature ** 2


def squared_error_loss(student_values: torch.Tensor, target_values: torch.Tensor,
                       mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean squared error over the rows where `mask` is true (all without one), in float32; 0 when none.
    A regression head's (B, 1) output against the teacher's (B, 1), or against its (B,) labels."""
    student = _rows(student_values.float().reshape(target_values.shape), mask, 0)
    target = _rows(target_values.float(), mask, 0)
    if student.shape[0] == 0:
        return student_values.sum() * 0.0
    return F.mse_loss(student, target)


def hard_label_loss(student_logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """Cross-entropy of the student's (..., K) logits against integer labels (the leading shape), over the
    rows where `mask` is true (all without one); 0 when none."""
    student = _rows(student_logits.float(), mask, 1)
    target = _rows(labels.long(), mask, 0)
    if student.shape[0] == 0:
        return student_logits.sum() * 0.0
    return F.cross_entropy(student, target)


def soft_binary_target_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float,
                            mask: torch.Tensor | None = None) -> torch.Tensor:
    """T² · mean over rows and labels of BCE(sigmoid(student / T), sigmoid(teacher / T)), in float32: the
    teacher's per-label probabilities at temperature T as soft targets of independent labels (a
    multi-label head). Rows as `soft_target_loss`; 0 when no row is left."""
    student = _rows(student_logits.float(), mask, 1)
    teacher = _rows(teacher_logits.float(), mask, 1)
    if student.shape[0] == 0:
        return student_logits.sum() * 0.0
    targets = torch.sigmoid(teacher / temperature)
    return F.binary_cross_entropy_with_logits(student / temperature, targets) * temperature ** 2


def binary_label_loss(student_logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None = None
                      ) -> torch.Tensor:
    """Mean binary cross-entropy of the student's (..., K) logits against (..., K) 0/1 targets (a multi-hot
    label set per row), over the rows where `mask` is true (all without one); 0 when none."""
    student = _rows(student_logits.float(), mask, 1)
    target = _rows(targets.float(), mask, 1)
    if student.shape[0] == 0:
        return student_logits.sum() * 0.0
    return F.binary_cross_entropy_with_logits(student, target)
