"""Distillation (`bertforge distill`): a fine-tuned teacher's task in a smaller, faster student.

A stage beside `tasks`: it reads the task registry (the teacher's family, reader, head and its `distill`
entry) and runs the shared fine-tuning engine; only the CLI imports it. See `run` (the entry points and
the checks), `distiller` (the general distiller every family runs through), `student` (the student's
layers and initialisation), `objectives` (the losses), `cache` (the teacher's outputs, computed once,
memory-mapped), `intermediate` (TinyBERT's hidden-state and attention-map terms), `augment` (more transfer
text made from the training text) and one adaptor module per family (`classify`, `multi_label`, `tag`,
`answer`).
"""

from .distiller import Adaptor, DistillRun, general_distill_task
from .objectives import (binary_label_loss, hard_label_loss, soft_binary_target_loss, soft_target_loss,
                         squared_error_loss)
from .run import adaptor_for, check_teacher, distill, distill_task
from .student import build_student, copy_layers, student_layers

__all__ = ["Adaptor", "DistillRun", "adaptor_for", "binary_label_loss", "build_student", "check_teacher",
           "copy_layers", "distill", "distill_task", "general_distill_task", "hard_label_loss",
           "soft_binary_target_loss", "soft_target_loss", "squared_error_loss", "student_layers"]
