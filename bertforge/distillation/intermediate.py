"""Intermediate-layer transfer (TinyBERT, Jiao et al. 2020, §3.1): the student's hidden states and
attention maps pulled to the teacher's, layer by layer, beside the soft targets.

A layer map m sends student layer i (0-based, as `student.student_layers` numbers them) to teacher
layer m(i). Two terms, each the sum over the mapped layers of a mean squared error over real tokens
(padding is left out, so a term does not depend on how a batch is padded):

* `hidden`: MSE(H_s W_h, H_t) between the output of student layer i and that of teacher layer m(i), plus
  the embedding layer's outputs (0 -> 0). W_h (H_s x H_t) is a learned projection, present only when the
  widths differ (TinyBERT's W_h); it is trained with the student but is not part of it: the saved
  student stays a normal checkpoint (`WithTransfer.save_pretrained` saves the student alone).
* `attention`: MSE between the attention probabilities (B, A, S, S) of student layer i and teacher layer
  m(i), over every head and every (real query, real key) pair; the number of heads must match.
  TinyBERT's paper uses the unnormalised scores; here the probabilities, as MiniLM does (with a KL):
  they are what the model returns (`output_attentions`; the fused kernels never materialise scores),
  they lie in [0, 1] whatever the head size, and a masked key is exactly 0 in both models, where a
  score would be the dtype's lowest value and need special handling.

The teacher runs alongside the student on each batch for these terms (with gradients off): its hidden
states and attention maps, (L+1)·S·H and L·A·S² numbers per example, cannot be cached for a whole
transfer set the way its logits are; the soft-target logits still come from the cache.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from ..modeling import BertConfig
from .student import student_config, student_layers

__all__ = ["INTERMEDIATE_KINDS", "IntermediateTransfer", "StudentPass", "WithTransfer", "intermediate_losses", "layer_map_for",
           "intermediate_counts", "parse_intermediate", "parse_layer_map", "teacher_intermediate_losses",
           "uniform_layer_map", "with_intermediate"]

INTERMEDIATE_KINDS = ("hidden", "attention")


def parse_intermediate(text: str) -> tuple[str, ...]:
    """`--intermediate hidden,attention` (either or both) -> the kinds, in INTERMEDIATE_KINDS' order."""
    kinds = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [kind for kind in kinds if kind not in INTERMEDIATE_KINDS]
    if not kinds or unknown:
        raise ValueError(f"--intermediate {text}: give hidden, attention or hidden,attention")
    return tuple(kind for kind in INTERMEDIATE_KINDS if kind in kinds)


def uniform_layer_map(teacher_layers: int, student_layers: int) -> list[int]:
    """TinyBERT's uniform map g(i) = i·L/N (1-based, layer i of N to layer i·L/N of L), 0-based here:
    student layer i -> teacher layer (i+1)·L//N - 1 (L=6, N=3: 1, 3, 5; the last layers meet)."""
    return [(i + 1) * teacher_layers // student_layers - 1 for i in range(student_layers)]


def parse_layer_map(text: str, student_layers: int, teacher_layers: int) -> list[int]:
    """`--layer-map 0,2,4`: the teacher layer (0-based) of each student layer, one per student layer, in
    order. ValueError, one line, on anything else."""
    parts = [part.strip() for part in text.split(",")]
    try:
        layer_map = [int(part) for part in parts]
    except ValueError:
        raise ValueError(f"--layer-map {text}: give one teacher layer number per student layer, comma-separated "
                         "(e.g. 0,2,4)") from None
    if len(layer_map) != student_layers:
        raise ValueError(f"--layer-map {text}: {len(layer_map)} layers given, the student has {student_layers}")
    bad = [layer for layer in layer_map if not 0 <= layer < teacher_layers]
    if bad:
        raise ValueError(f"--layer-map {text}: teacher layer {bad[0]} does not exist (the teacher has "
                         f"{teacher_layers} layers: 0 to {teacher_layers - 1})")
    return layer_map


def layer_map_for(teacher: BertConfig, layers: int | None, student: str | None, text: str | None,
                  keep_last: bool = False) -> list[int]:
    """The layer map of a student (`--layers` / `--student`, as `student.build_student` takes them):
    `--layer-map` when given; else, for the teacher's own layers (--layers N, or the default), the
    teacher layers the student started from (`student.student_layers`, `keep_last` as the family's);
    else TinyBERT's uniform map."""
    count = student_config(teacher, layers, student).num_hidden_layers
    if text is not None:
        return parse_layer_map(text, count, teacher.num_hidden_layers)
    if student is None:
        return student_layers(teacher.num_hidden_layers, count, keep_last)
    return uniform_layer_map(teacher.num_hidden_layers, count)


class IntermediateTransfer(nn.Module):
    """What the intermediate terms learn: W_h, the hidden-state projection (H_s -> H_t), only when the
    widths differ; and what they are: the kinds and the layer map. ValueError, one line, for attention
    maps between models with different numbers of heads."""

    def __init__(self, student: BertConfig, teacher: BertConfig, kinds: Sequence[str], layer_map: Sequence[int]):
        super().__init__()
        if "attention" in kinds and student.num_attention_heads != teacher.num_attention_heads:
            raise ValueError(f"--intermediate attention: the student has {student.num_attention_heads} attention "
                             f"heads, the teacher {teacher.num_attention_heads}; their maps pair head by head")
        self.kinds, self.layer_map = tuple(kinds), list(layer_map)
        self.projection = (nn.Linear(student.hidden_size, teacher.hidden_size, bias=False)
                           if "hidden" in kinds and student.hidden_size != teacher.hidden_size else None)


def intermediate_losses(transfer: IntermediateTransfer, student_out, teacher_out,
                        attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """{"hidden_loss", "attention_loss"} (those of `transfer.kinds`; see the module docstring) from the
    outputs of the student and the teacher called with output_hidden_states / output_attentions on the
    same batch; `attention_mask` (B, S), 1 = real token."""
    real = attention_mask.bool()
    tokens = real.sum().clamp(min=1)
    losses = {}
    if "hidden" in transfer.kinds:
        pairs = [(0, 0)] + [(i + 1, m + 1) for i, m in enumerate(transfer.layer_map)]  # 0: the embeddings
        total = 0.0
        for s, t in pairs:
            ours, theirs = student_out.hidden_states[s].float(), teacher_out.hidden_states[t].float()
            if transfer.projection is not None:
                ours = transfer.projection(ours)
            squared = (ours - theirs).pow(2).sum(-1)  # (B, S)
            total = total + squared[real].sum() / (tokens * theirs.shape[-1])
        losses["hidden_loss"] = total
    if "attention" in transfer.kinds:
        pair_mask = (real[:, :, None] & real[:, None, :])[:, None]  # (B, 1, S, S): real query, real key
        heads = student_out.attentions[0].shape[1]
        count = (pair_mask.sum() * heads).clamp(min=1)
        total = 0.0
        for i, m in enumerate(transfer.layer_map):
            ours, theirs = student_out.attentions[i].float(), teacher_out.attentions[m].float()
            total = total + ((ours - theirs).pow(2) * pair_mask).sum() / count
        losses["attention_loss"] = total
    return losses


def teacher_intermediate_losses(teacher: nn.Module, transfer: IntermediateTransfer, student_out,
                                inputs: dict[str, torch.Tensor], weight: float = 1.0) -> dict[str, torch.Tensor]:
    """`weight` × `intermediate_losses` of a batch, the teacher run on it beside the student (whose outputs,
    `student_out`, came from `inputs` with the hidden states / attention maps of `transfer.kinds`): the
    step of a family whose student takes --intermediate. The teacher moves to the batch's device first."""
    device = inputs["input_ids"].device
    if next(teacher.parameters()).device != device:
        teacher.to(device)
    # no torch.no_grad(): the teacher's weights require no gradient (so no graph is kept), and with autograd
    # on it runs the reference plan, whose hidden states are never buffers reused in place
    theirs = teacher(**inputs, output_hidden_states="hidden" in transfer.kinds,
                     output_attentions="attention" in transfer.kinds)
    return {name: weight * value for name, value in
            intermediate_losses(transfer, student_out, theirs, inputs["attention_mask"]).items()}


class StudentPass:
    """One step's forward pass of the student on a batch, and the step's loss terms from it.

    `intermediate()` (a run with --intermediate): the teacher and the run's `IntermediateTransfer`; the
    student then also returns the hidden states / attention maps the transfer compares, and `losses`
    adds the teacher's intermediate terms. `out`: the student's outputs."""

    def __init__(self, model: nn.Module, batch: dict[str, torch.Tensor],
                 intermediate: Callable[[], tuple[nn.Module, IntermediateTransfer]] | None = None) -> None:
        self.teacher, self.transfer = intermediate() if intermediate is not None else (None, None)
        kinds = self.transfer.kinds if self.transfer is not None else ()
        self.inputs = {name: batch[name] for name in ("input_ids", "token_type_ids", "attention_mask")}
        self.out = model(**self.inputs, output_hidden_states="hidden" in kinds, output_attentions="attention" in kinds)

    def losses(self, soft: Callable[[], torch.Tensor], hard: torch.Tensor, alpha: float, labels_only: bool,
               intermediate_weight: float = 1.0) -> dict[str, torch.Tensor]:
        """{"label_loss": hard} alone, unweighted, for the labels-only control; else {"distill_loss": soft(),
        "label_loss": alpha × hard} and, with a transfer, `intermediate_weight` × the teacher's intermediate
        terms ("hidden_loss", "attention_loss")."""
        if labels_only:
            return {"label_loss": hard}
        losses = {"distill_loss": soft(), "label_loss": alpha * hard}
        if self.transfer is not None:
            losses.update(teacher_intermediate_losses(self.teacher, self.transfer, self.out, self.inputs,
                                                      intermediate_weight))
        return losses


def intermediate_counts(attention_mask: torch.Tensor) -> dict[str, float]:
    """The units behind each intermediate term's mean (a `count_fn`'s share): the real tokens for the hidden
    states, the (real query, real key) pairs for the attention maps."""
    lengths = attention_mask.sum(-1).double()
    return {"hidden_loss": float(lengths.sum()), "attention_loss": float(lengths.pow(2).sum())}


class WithTransfer(nn.Module):
    """The student being trained plus what only training needs (`IntermediateTransfer`'s projection):
    one module for the engine's optimizer and checkpoints (so --resume restores the projection too),
    while the model saved as the result, and what evaluation calls, is the student alone."""

    def __init__(self, student: nn.Module, transfer: IntermediateTransfer):
        super().__init__()
        self.student, self.transfer = student, transfer

    @property
    def config(self) -> BertConfig:
        return self.student.config

    def forward(self, *args, **kwargs):
        return self.student(*args, **kwargs)

    def save_pretrained(self, directory, *args, **kwargs):
        return self.student.save_pretrained(directory, *args, **kwargs)


def with_intermediate(student: nn.Module, teacher_config: BertConfig, kinds: Sequence[str],
                      layer_map: Sequence[int] | None) -> tuple[nn.Module, IntermediateTransfer | None]:
    """The module the engine trains: the student alone without `kinds`, else the student wrapped with the
    `IntermediateTransfer` of its projections (`WithTransfer`: saved and evaluated as the student alone);
    and that transfer (None without `kinds`)."""
    if not kinds:
        return student, None
    transfer = IntermediateTransfer(student.config, teacher_config, kinds, layer_map)
    return WithTransfer(student, transfer), transfer
