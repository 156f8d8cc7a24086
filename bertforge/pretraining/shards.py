"""The on-disk format of prepared pre-training data (`bertforge-pretraining/1`).

`DIR/index.json` describes the data (settings, vocabulary size and fingerprint, shards, statistics);
each shard is a set of `.npy` files, row i of each belonging to instance i of the shard:

    shard-00000.input_ids.npy            (N, max_seq_length) uint16 (int32 if vocab_size > 65536), [PAD]-padded
    shard-00000.lengths.npy              (N,) int16   real tokens, [CLS] and [SEP]s included
    shard-00000.segment_b_start.npy      (N,) int16   first token of B (just after the first [SEP])
    shard-00000.next_sentence_labels.npy (N,) int8    0 = IsNext, 1 = NotNext (Google's convention)
    shard-00000.masked_lm_positions.npy  (N, P) int16 static masking only; 0-padded, ascending
    shard-00000.masked_lm_ids.npy        (N, P)       static masking only; the ORIGINAL tokens, 0-padded

With static masking `input_ids` hold the corrupted sequence; with dynamic masking they hold the
plain one and `PretrainingDataset` masks at load time. `wordpiece_continuation.npy` ((vocab_size,)
bool, True for `##` pieces) lets dynamic whole-word masking run without the vocabulary file.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .._files import atomic_open

FORMAT = "bertforge-pretraining/1"
INDEX_NAME = "index.json"
CONTINUATION_NAME = "wordpiece_continuation.npy"
FIELDS = ("input_ids", "lengths", "segment_b_start", "next_sentence_labels")
MASK_FIELDS = ("masked_lm_positions", "masked_lm_ids")
MAX_SEQ_LENGTH_LIMIT = np.iinfo(np.int16).max


def id_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.int32)


def shard_file(directory: str | os.PathLike, name: str, field: str) -> Path:
    return Path(directory) / f"{name}.{field}.npy"


def save_atomic(path: Path, array: np.ndarray) -> None:
    """`array` as a .npy file written atomically; a leftover of an interrupted write is `<name>.part`."""
    with atomic_open(path, "wb", temporary=path.name + ".part") as handle:
        np.save(handle, array, allow_pickle=False)


class ShardWriter:
    """Buffers instances in preallocated rows and writes a shard every `shard_size` instances.

    Rows are filled in place (`next_row`), so an instance is built directly in the buffer.
    """

    def __init__(self, directory: str | os.PathLike, prefix: str, *, shard_size: int, max_seq_length: int,
                 max_predictions_per_seq: int, vocab_size: int, pad_id: int, static: bool):
        self.directory = Path(directory)
        self.prefix = prefix
        self.shard_size = shard_size
        self.seq = max_seq_length
        self.preds = max_predictions_per_seq
        self.dtype = id_dtype(vocab_size)
        self.pad_id = pad_id
        self.static = static
        self.shards: list[tuple[str, int]] = []
        self.count = 0
        self._capacity = 0
        self._allocate(min(shard_size, 1024))

    def _allocate(self, capacity: int) -> None:
        old = self.__dict__.get("_arrays")
        arrays = {
            "input_ids": np.full((capacity, self.seq), self.pad_id, dtype=self.dtype),
            "lengths": np.zeros(capacity, dtype=np.int16),
            "segment_b_start": np.zeros(capacity, dtype=np.int16),
            "next_sentence_labels": np.zeros(capacity, dtype=np.int8),
        }
        if self.static:
            arrays["masked_lm_positions"] = np.zeros((capacity, self.preds), dtype=np.int16)
            arrays["masked_lm_ids"] = np.zeros((capacity, self.preds), dtype=self.dtype)
        if old is not None:
            for key, array in arrays.items():
                array[:self.count] = old[key][:self.count]
        self._arrays = arrays
        self._capacity = capacity

    def next_row(self) -> int:
        """Index of a fresh ([PAD]-filled) row to fill; call `commit` once it is filled."""
        if self.count == self._capacity:
            self._allocate(min(self.shard_size, 2 * self._capacity))
        return self.count

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        return self._arrays

    def commit(self) -> None:
        self.count += 1
        if self.count == self.shard_size:
            self.flush()

    def flush(self) -> None:
        if self.count == 0:
            return
        name = f"{self.prefix}-{len(self.shards):05d}"
        for field, array in self._arrays.items():
            save_atomic(shard_file(self.directory, name, field), array[:self.count])
        self.shards.append((name, self.count))
        self.count = 0
        self._arrays["input_ids"].fill(self.pad_id)
        for field in ("masked_lm_positions", "masked_lm_ids"):
            if field in self._arrays:
                self._arrays[field].fill(0)
