"""The student: a smaller copy of the teacher (DistilBERT's initialisation), a preset, or a checkpoint.

DistilBERT (Sanh et al. 2019, §3) initialises its 6-layer student from BERT-base by taking one layer out
of two. `student_layers(L, N)` generalises that to any N ≤ L: teacher layer ⌊i·L/N⌋ for student layer i,
evenly spaced from the first layer (L=12, N=6: 0, 2, 4, 6, 8, 10, DistilBERT's; L=6, N=3: 0, 2, 4; L=6,
N=2: 0, 3; L=6, N=4: 0, 1, 3, 4). Everything outside the layers (the embeddings, the pooler, the task
head) is copied as it is, so the student starts as a shallower teacher. A family whose output is the last
layer's space itself (a bi-encoder's embedding, regressed coordinate by coordinate onto the teacher's) keeps
the teacher's last layer instead (`keep_last`): the first and the last, the rest evenly between (L=6, N=3:
0, 3, 5), so that the student starts in the space it must reach.

The student may instead be a preset size (`tiny` ... `large`: randomly initialised, the teacher's
vocabulary; its embeddings are copied when their shapes match) or a checkpoint directory (a small
pre-trained BERT, Turc et al.'s "well-read students"), which must share the teacher's vocabulary: token
ids mean the same in both only then, and the teacher's outputs are computed on the teacher's ids. With
--student-vocab a checkpoint with its own vocabulary is taken for a sentence-level task (classify): each
example is tokenized twice, the teacher's logits on the teacher's ids, the student's features on its own.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from ..modeling import PRESETS, BertConfig
from ..modeling.pretrained import check_pretrained, resolve_model_dir
from ..tokenization import vocab_fingerprint

__all__ = ["build_student", "check_student", "copy_layers", "student_config", "student_layers"]

_LAYER = "encoder.layer."


def student_layers(teacher_layers: int, layers: int, keep_last: bool = False) -> list[int]:
    """The teacher layer each of `layers` student layers starts from: ⌊i · L / N⌋, evenly spaced from
    layer 0 (one layer out of two for N = L/2, DistilBERT's choice); with `keep_last`, ⌊i · (L − 1) / (N − 1)
    + ½⌋, the first and the last layer and the rest evenly between (N = 1: the last). ValueError when N is
    not in 1..L."""
    if not 1 <= layers <= teacher_layers:
        raise ValueError(f"--layers {layers}: the teacher has {teacher_layers} layers; choose 1 to {teacher_layers}")
    if keep_last:
        if layers == 1:
            return [teacher_layers - 1]
        return [(2 * i * (teacher_layers - 1) + layers - 1) // (2 * (layers - 1)) for i in range(layers)]
    return [i * teacher_layers // layers for i in range(layers)]


def copy_layers(teacher: nn.Module, student: nn.Module, layer_map: Sequence[int]) -> None:
    """Load into `student` every tensor of `teacher`, with student layer i taking teacher layer
    `layer_map[i]`; teacher layers not in the map are left out. Strict: every student tensor is set."""
    state = {}
    for key, value in teacher.state_dict().items():
        head, found, rest = key.partition(_LAYER)
        if not found:
            state[key] = value
            continue
        index, _, name = rest.partition(".")
        for student_index, teacher_index in enumerate(layer_map):
            if int(index) == teacher_index:
                state[f"{head}{_LAYER}{student_index}.{name}"] = value
    student.load_state_dict({k: v.detach().clone() for k, v in state.items()}, strict=True)


def check_student(teacher_dir: str | os.PathLike, teacher_config: BertConfig, layers: int | None,
                  student: str | None, student_vocab: bool = False) -> None:
    """The choice of student judged before anything loads: --layers within the teacher's, a preset's name,
    or a checkpoint that shares the teacher's vocabulary, or has its own with `student_vocab`
    (--student-vocab: the student reads its own tokenization of each example) (ValueError, one line,
    naming the flag)."""
    if student_vocab and (student is None or student in PRESETS):
        raise ValueError("--student-vocab: give --student DIR, a checkpoint with its own vocab.txt (a preset or "
                         "--layers student uses the teacher's vocabulary)")
    if layers is not None:
        student_layers(teacher_config.num_hidden_layers, layers)
        return
    if student is None or student in PRESETS:
        return
    directory = resolve_model_dir(student)
    if not Path(directory).is_dir():
        raise FileNotFoundError(f"--student {student}: neither a preset ({', '.join(PRESETS)}) nor a checkpoint "
                                "directory")
    check_pretrained(directory)
    ours, theirs = Path(directory) / "vocab.txt", Path(resolve_model_dir(teacher_dir)) / "vocab.txt"
    if not ours.is_file():
        raise FileNotFoundError(f"--student {student}: no vocab.txt (the student must share the teacher's vocabulary)")
    if vocab_fingerprint(ours) != vocab_fingerprint(theirs) and not student_vocab:
        raise ValueError(f"--student {student}: its vocabulary ({ours}) differs from the teacher's ({theirs}); pass "
                         "--student-vocab to give the student its own tokenization of each example (classify "
                         "teachers)")


def student_config(teacher_config: BertConfig, layers: int | None, student: str | os.PathLike | None) -> BertConfig:
    """The student's architecture (as `build_student` will make it) without building it: the teacher's with
    `layers` (default: half, rounded up), a preset's shape, or a checkpoint's config.json."""
    if student is None:
        count = layers if layers is not None else (teacher_config.num_hidden_layers + 1) // 2
        return BertConfig.from_dict({**teacher_config.to_dict(), "num_hidden_layers": count})
    if str(student) in PRESETS:
        count, hidden, heads = PRESETS[str(student)]
        return BertConfig.from_dict({**teacher_config.to_dict(), "num_hidden_layers": count, "hidden_size": hidden,
                                     "num_attention_heads": heads, "intermediate_size": 4 * hidden})
    return BertConfig.from_pretrained(resolve_model_dir(student))


def build_student(teacher: nn.Module, *, layers: int | None = None, student: str | os.PathLike | None = None,
                  head_overrides: dict | None = None, keep_last: bool = False) -> tuple[nn.Module, dict]:
    """The student model (the teacher's head class) and what it was made from (for distillation.json).

    `layers`: the teacher's architecture with that many layers, from `student_layers` (the default, N = L/2
    rounded up, when neither is given; `keep_last`: the family keeps the teacher's last layer). `student`: a preset name (random weights; embeddings copied when
    their shapes match) or a checkpoint directory (its encoder, a new head configured as the teacher's:
    `head_overrides`, e.g. num_labels, id2label, problem_type, finetuning_task)."""
    head_class = type(teacher)
    config = teacher.config
    if student is None:
        count = layers if layers is not None else (config.num_hidden_layers + 1) // 2
        layer_map = student_layers(config.num_hidden_layers, count, keep_last)
        student_config = BertConfig.from_dict({**config.to_dict(), "num_hidden_layers": count})
        model = head_class(student_config)
        copy_layers(teacher, model, layer_map)
        return model, {"init": "teacher layers", "teacher_layers": layer_map}
    overrides = dict(head_overrides or {})
    if str(student) in PRESETS:
        count, hidden, heads = PRESETS[str(student)]
        model = head_class(BertConfig.from_dict({**config.to_dict(), "num_hidden_layers": count, "hidden_size": hidden,
                                                 "num_attention_heads": heads, "intermediate_size": 4 * hidden}))
        copied = _copy_matching(teacher, model, "bert.embeddings.")
        return model, {"init": f"preset {student}", "copied": copied}
    directory = resolve_model_dir(student)
    model = head_class.from_pretrained(directory, **overrides)
    return model, {"init": f"checkpoint {directory}"}


def _copy_matching(source: nn.Module, target: nn.Module, prefix: str) -> list[str]:
    """Copy `source`'s tensors under `prefix` into `target` where the names and shapes match; their names."""
    theirs, ours = source.state_dict(), target.state_dict()
    copied = [k for k in ours if k.startswith(prefix) and k in theirs and theirs[k].shape == ours[k].shape]
    with torch.no_grad():
        for key in copied:
            ours[key].copy_(theirs[key])
    return copied
