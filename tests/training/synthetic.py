"""A synthetic stand-in for prepared pre-training data, with the API of `PretrainingDataset`.

Random token sequences of random real length, 15% of their tokens masked (80% [MASK], 10% random,
10% kept), a random NSP label: enough for the engine's tests, which check the loop's arithmetic,
not what the model learns (the pre-training tests use real prepared text).
"""

from __future__ import annotations

import numpy as np
import torch

PAD, CLS, SEP, MASK = 0, 2, 3, 4


class SyntheticPretrainingData:
    def __init__(self, size: int = 64, vocab_size: int = 128, max_seq_length: int = 32,
                 max_predictions_per_seq: int = 5, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.index = {"max_seq_length": max_seq_length, "max_predictions_per_seq": max_predictions_per_seq,
                      "vocab_size": vocab_size, "vocab_hash": "synthetic", "masking": "static",
                      "num_instances": size}
        self.items = []
        for _ in range(size):
            length = int(rng.integers(max_seq_length // 2, max_seq_length + 1))
            ids = rng.integers(5, vocab_size, size=length)
            ids[0], ids[-1] = CLS, SEP
            split = int(rng.integers(2, length - 2))
            ids[split] = SEP
            types = np.zeros(length, dtype=np.int64)
            types[split + 1:] = 1
            candidates = [i for i in range(1, length - 1) if i != split]
            count = int(rng.integers(1, max_predictions_per_seq + 1))
            positions = np.sort(rng.choice(candidates, size=count, replace=False))
            labels = ids[positions].copy()
            for p in positions:
                r = rng.random()
                ids[p] = MASK if r < 0.8 else (rng.integers(5, vocab_size) if r < 0.9 else ids[p])
            pad = max_seq_length - length
            item = {
                "input_ids": np.pad(ids, (0, pad)), "token_type_ids": np.pad(types, (0, pad)),
                "attention_mask": np.pad(np.ones(length, dtype=np.int64), (0, pad)),
                "masked_lm_positions": np.pad(positions, (0, max_predictions_per_seq - count)),
                "masked_lm_labels": np.pad(labels, (0, max_predictions_per_seq - count), constant_values=-100),
                "next_sentence_label": np.int64(rng.integers(0, 2)),
            }
            self.items.append({k: torch.as_tensor(np.asarray(v), dtype=torch.int64) for k, v in item.items()})
        self.epochs_seen: list[int] = []
        self.read: list[int] = []  # indices in the order they were read

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        self.read.append(int(i))
        return self.items[i]

    def set_epoch(self, epoch: int) -> None:
        self.epochs_seen.append(epoch)

    def check_compatible(self, vocab_size, vocab_hash, max_seq_length) -> None:
        if vocab_size != self.index["vocab_size"]:
            raise ValueError("vocab size mismatch")


def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    batch = {k: torch.stack([item[k] for item in items]) for k in items[0]}
    longest = int(batch["attention_mask"].sum(1).max())
    for k in ("input_ids", "token_type_ids", "attention_mask"):
        batch[k] = batch[k][:, :longest].contiguous()
    return batch
