"""The shared padding and softmax helpers: the batches every collate builds from them, and softmax
values in each dtype the tasks write."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertforge.tasks import classify_features, conll, multiple_choice, squad_data
from bertforge.tasks.arrays import attention_mask, pad_inputs, pad_rows, padded_inputs, softmax

ROWS = [[2, 7, 8, 3], [2, 9, 3], [2, 3]]
TYPES = [[0, 0, 1, 1], [0, 0, 0], [0, 0]]


def test_pad_rows_left_aligns_and_fills():
    out = pad_rows(ROWS, value=5)
    assert out.dtype == np.int64 and out.shape == (3, 4)
    assert out.tolist() == [[2, 7, 8, 3], [2, 9, 3, 5], [2, 3, 5, 5]]
    assert pad_rows(ROWS, 0, width=6).shape == (3, 6)
    assert pad_rows([], 0).shape == (0, 0)
    assert attention_mask([4, 3, 2], 4).tolist() == [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]]


def test_pad_inputs_and_the_collates_built_on_it():
    batch = pad_inputs(ROWS, TYPES, pad_token_id=1)
    assert batch["input_ids"].tolist() == [[2, 7, 8, 3], [2, 9, 3, 1], [2, 3, 1, 1]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]]
    with pytest.raises(ValueError, match="empty batch"):
        pad_inputs([], None)
    features = [{"input_ids": r, "token_type_ids": t, "label": i % 2} for i, (r, t) in enumerate(zip(ROWS, TYPES))]
    tensors = padded_inputs(features, 1)
    for name, value in batch.items():
        assert tensors[name].dtype == torch.long and tensors[name].tolist() == value.tolist()
    # Every task's collate pads the same way and adds its own labels.
    classified = classify_features.collate(features, 1)
    assert classified["input_ids"].tolist() == batch["input_ids"].tolist()
    assert classified["labels"].tolist() == [0, 1, 0]
    spans = squad_data.collate([dict(f, start_position=1, end_position=2) for f in features], 1)
    assert spans["attention_mask"].tolist() == batch["attention_mask"].tolist()
    assert spans["start_positions"].tolist() == [1, 1, 1]
    windows = conll.collate_windows([{"input_ids": r, "labels": [0] * len(r)} for r in ROWS], 1)
    assert windows["input_ids"].tolist() == batch["input_ids"].tolist()
    assert windows["token_type_ids"].abs().sum() == 0
    assert windows["labels"].tolist()[2] == [0, 0, -100, -100]  # padding is ignored by the loss
    choices = multiple_choice.collate([{"input_ids": ROWS[:2], "token_type_ids": TYPES[:2], "label": 1},
                              {"input_ids": ROWS[1:], "token_type_ids": TYPES[1:], "label": 0}], 1)
    assert choices["input_ids"].shape == (2, 2, 4)
    assert choices["input_ids"][1].tolist() == [[2, 9, 3, 1], [2, 3, 1, 1]]
    assert choices["attention_mask"][0].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert choices["labels"].tolist() == [1, 0]


def test_softmax_in_each_dtype():
    logits = np.array([[1.0, 2.0, 3.0], [1000.0, 1000.0, 0.0]], dtype=np.float32)
    p = softmax(logits)
    assert p.dtype == np.float32 and np.allclose(p.sum(-1), 1.0)
    np.testing.assert_allclose(p[0], torch.softmax(torch.from_numpy(logits[0]), -1).numpy(), rtol=1e-6)
    assert p[1].tolist() == pytest.approx([0.5, 0.5, 0.0])  # large logits do not overflow
    wide = softmax([0.1, 0.2], dtype=np.float64)
    assert wide.dtype == np.float64 and wide[1] == pytest.approx(np.exp(0.2) / (np.exp(0.1) + np.exp(0.2)), rel=1e-15)
    columns = softmax(logits[:1].T, axis=0)
    np.testing.assert_allclose(columns[:, 0], p[0], rtol=1e-6)
