"""The training engine shared by pre-training and every fine-tuning task.

- `Trainer`: the loop (loop.py), with its evaluation (evaluation.py), its checkpoints,
  resume and divergence handling (state.py) and its logging windows (window.py);
- `Phase`, `epoch_permutation`, `length_grouped_order`: the order training reads its data in (order.py);
- `TrainingSettings`, `TrainingArguments`, `RunSettings`: every training setting, declared once (settings.py);
- `build_optimizer`, `parameter_groups`: AdamW with BERT's weight-decay exclusions (optim.py);
- `linear_schedule`, `budget_schedule`: linear warm-up and decay over the steps or a time budget (schedule.py);
- `save_checkpoint`, `load_checkpoint`, `latest_checkpoint`: atomic training checkpoints (checkpoint.py).
"""

from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .distributed import DistributedContext
from .loop import NonFiniteLossError, Trainer, TrainResult
from .optim import build_optimizer, parameter_groups
from .order import Phase, epoch_permutation, length_grouped_order
from .schedule import budget_schedule, linear_schedule
from .settings import RunSettings, TrainingArguments, TrainingSettings

__all__ = [
    "Trainer", "TrainingArguments", "TrainingSettings", "RunSettings", "Phase", "TrainResult", "NonFiniteLossError",
    "DistributedContext",
    "build_optimizer", "parameter_groups", "linear_schedule", "budget_schedule", "save_checkpoint", "load_checkpoint",
    "latest_checkpoint", "epoch_permutation", "length_grouped_order",
]
