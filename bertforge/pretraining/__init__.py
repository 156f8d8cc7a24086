"""Pre-training data: instances for masked LM and next-sentence prediction, made from raw text.

`prepare_pretraining` (the `bertforge prepare-pretraining` command) writes them to a directory;
`PretrainingDataset` and `collate` read them back for training.
"""

from .dataset import IGNORE_INDEX, PretrainingDataset, collate
from .prepare import prepare_pretraining
from .shards import FORMAT

__all__ = ["FORMAT", "IGNORE_INDEX", "PretrainingDataset", "collate", "prepare_pretraining"]
