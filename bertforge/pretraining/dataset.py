"""`PretrainingDataset`: the instances written by `prepare-pretraining`, memory-mapped.

    dataset = PretrainingDataset("data/pretraining", seed=0)
    dataset.check_compatible(config.vocab_size, vocab_fingerprint(tokenizer.vocab), 128)
    loader = DataLoader(dataset, batch_size=32, shuffle=True, collate_fn=collate)
    for epoch in range(epochs):
        dataset.set_epoch(epoch)   # before iterating; see the note on DataLoader workers
        for batch in loader: ...

Each item is a dict of int64 tensors: `input_ids`, `token_type_ids`, `attention_mask` (S,),
`masked_lm_positions` (P,) (0-padded), `masked_lm_labels` (P,) (the original token ids, -100 where
padded), `next_sentence_label` () (0 = IsNext, 1 = NotNext). `collate` stacks a batch and cuts
the columns beyond its longest real length.

Dynamic masking (`--masking dynamic`): the shards hold plain sequences and item i of epoch e is
masked with `numpy.random.default_rng([seed, e, i])`: the same every time it is read in that epoch
(exact resume), different from one epoch to the next. DataLoader workers hold copies of the
dataset: call `set_epoch` before the loader's iterator is created (the default, non-persistent
workers copy the dataset at each epoch's start); with `persistent_workers=True` the workers would
keep the epoch they started with.
"""

from __future__ import annotations

import bisect
import json
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from .masking import mask_instance
from .shards import CONTINUATION_NAME, FIELDS, FORMAT, INDEX_NAME, MASK_FIELDS, shard_file

IGNORE_INDEX = -100


class PretrainingDataset(Dataset):
    """Random access to prepared pre-training instances; shards are opened lazily with mmap."""

    def __init__(self, path: str | os.PathLike, seed: int = 0):
        path = Path(path)
        if path.is_file() and path.name == INDEX_NAME:
            path = path.parent
        index_file = path / INDEX_NAME
        if not index_file.is_file():
            raise FileNotFoundError(f"no pre-training data at {path}: {INDEX_NAME} not found "
                                    "(run `bertforge prepare-pretraining`)")
        try:
            index = json.loads(index_file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{index_file}: not valid JSON ({error})") from None
        if index.get("format") != FORMAT:
            raise ValueError(f"{index_file}: format {index.get('format')!r}, expected {FORMAT!r}")
        self.path = path
        self.index = index
        self.seed = int(seed)
        self.epoch = 0
        self.max_seq_length = int(index["max_seq_length"])
        self.max_predictions_per_seq = int(index["max_predictions_per_seq"])
        self.masking = index["masking"]
        self._names = [shard["name"] for shard in index["shards"]]
        counts = [int(shard["num_instances"]) for shard in index["shards"]]
        self._starts = [0]
        for count in counts:
            self._starts.append(self._starts[-1] + count)
        self._length = self._starts[-1]
        if self._length != int(index["num_instances"]):
            raise ValueError(f"{index_file}: shards hold {self._length} instances, num_instances says "
                             f"{index['num_instances']}")
        self._fields = FIELDS + (MASK_FIELDS if self.masking == "static" else ())
        for name in self._names:
            for field in self._fields:
                if not shard_file(path, name, field).is_file():
                    raise FileNotFoundError(f"pre-training shard file missing: {shard_file(path, name, field)}")
        self._shards: list[dict[str, np.ndarray] | None] = [None] * len(self._names)
        self._continuation = None
        if self.masking == "dynamic" and index.get("whole_word_mask"):
            self._continuation = np.load(path / index.get("continuation_file", CONTINUATION_NAME))
        specials = index.get("special_ids", {})
        self._mask_id = int(specials.get("mask", 4))

    # ------------------------------------------------------------------ bookkeeping

    def __len__(self) -> int:
        return self._length

    def set_epoch(self, epoch: int) -> None:
        """Choose the dynamic masks of `epoch` (no effect on statically masked data)."""
        self.epoch = int(epoch)

    def check_compatible(self, vocab_size: int, vocab_hash: str | None = None,
                         max_seq_length: int | None = None) -> None:
        """Raise ValueError if the data was not made for this vocabulary / sequence length."""
        index = self.index
        where = f"pre-training data {self.path}"
        if int(index["vocab_size"]) != int(vocab_size):
            raise ValueError(f"{where} was made with a vocabulary of {index['vocab_size']} tokens but the model has "
                             f"vocab_size={vocab_size}: rebuild it with the model's vocab.txt")
        if vocab_hash is not None and index["vocab_hash"] != vocab_hash:
            raise ValueError(f"{where} was made with a different vocabulary (vocab_hash {index['vocab_hash']}, "
                             f"expected {vocab_hash}): same size, other tokens or order; rebuild it with the "
                             "model's vocab.txt")
        if max_seq_length is not None and self.max_seq_length != int(max_seq_length):
            raise ValueError(f"{where} has max_seq_length={self.max_seq_length} but training expects "
                             f"max_seq_length={max_seq_length}: rebuild it with --max-seq-length {max_seq_length}")

    def _shard(self, k: int) -> dict[str, np.ndarray]:
        shard = self._shards[k]
        if shard is None:
            shard = {field: np.load(shard_file(self.path, self._names[k], field), mmap_mode="r")
                     for field in self._fields}
            self._shards[k] = shard
        return shard

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_shards"] = [None] * len(self._names)  # re-opened lazily in the receiving process
        return state

    # ------------------------------------------------------------------ items

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        i = int(i)
        if i < 0:
            i += self._length
        if not 0 <= i < self._length:
            raise IndexError(f"index {i} out of range for {self._length} instances")
        k = bisect.bisect_right(self._starts, i) - 1
        row = i - self._starts[k]
        shard = self._shard(k)
        input_ids = np.array(shard["input_ids"][row], dtype=np.int64)
        length = int(shard["lengths"][row])
        b_start = int(shard["segment_b_start"][row])
        P = self.max_predictions_per_seq
        positions = np.zeros(P, dtype=np.int64)
        labels = np.full(P, IGNORE_INDEX, dtype=np.int64)
        if self.masking == "static":
            stored = np.asarray(shard["masked_lm_positions"][row], dtype=np.int64)
            real = stored > 0
            positions[real] = stored[real]
            labels[real] = np.asarray(shard["masked_lm_ids"][row], dtype=np.int64)[real]
        else:
            rng = np.random.default_rng([self.seed, self.epoch, i])
            chosen, originals = mask_instance(
                input_ids, length, b_start, rng, vocab_size=int(self.index["vocab_size"]), mask_id=self._mask_id,
                masked_lm_prob=float(self.index["masked_lm_prob"]), max_predictions_per_seq=P,
                continuation=self._continuation)
            positions[:len(chosen)] = chosen
            labels[:len(chosen)] = originals
        token_type_ids = np.zeros(self.max_seq_length, dtype=np.int64)
        token_type_ids[b_start:length] = 1
        attention_mask = np.zeros(self.max_seq_length, dtype=np.int64)
        attention_mask[:length] = 1
        return {
            "input_ids": torch.from_numpy(input_ids),
            "token_type_ids": torch.from_numpy(token_type_ids),
            "attention_mask": torch.from_numpy(attention_mask),
            "masked_lm_positions": torch.from_numpy(positions),
            "masked_lm_labels": torch.from_numpy(labels),
            "next_sentence_label": torch.tensor(int(shard["next_sentence_labels"][row]), dtype=torch.long),
        }


def collate(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack items and trim the sequence columns to the batch's longest real length."""
    if not batch:
        raise ValueError("collate got an empty batch")
    out = {key: torch.stack([item[key] for item in batch]) for key in batch[0]}
    longest = int(out["attention_mask"].sum(dim=1).max())
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        out[key] = out[key][:, :longest].contiguous()
    return out
