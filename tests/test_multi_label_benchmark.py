"""benchmarks/multi_label.py --ceiling on a tiny checkpoint and GoEmotions-shaped file: the tokens it counts are
the file's, the peer's batches are padded as transformers' LengthGroupedSampler orders them, and the speed-up
is the ratio of the two sides' work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "i", "love", "hate", "this", "so", "much", "ok", "!"]


def test_ceiling_counts_tokens_and_layer_work(tmp_path, save_tiny_checkpoint):
    import random

    model = save_tiny_checkpoint(tmp_path / "model", WORDS)
    rng = random.Random(0)
    rows = [" ".join(rng.choices(WORDS[5:], k=rng.randint(1, 12))) for _ in range(100)]
    data = tmp_path / "data"
    data.mkdir()
    (data / "emotions.txt").write_text("joy\nanger\n")
    (data / "train.tsv").write_text("".join(f"{text}\t{i % 2}\tid{i}\n" for i, text in enumerate(rows)))
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "multi_label.py"), "--ceiling", "--model",
                           str(model), "--data", str(data), "--seeds", "0,1"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    lengths = [len(text.split()) + 2 for text in rows]  # each word one token, [CLS] and [SEP]
    assert result["examples"] == 100 and result["real_tokens"] == sum(lengths)
    layers = json.loads((model / "config.json").read_text())["num_hidden_layers"]
    assert result["layer_units_per_token"] == {"ours": pytest.approx(layers - 1 + 2 / 12), "peer": layers}
    for padded in result["peer_padded_tokens"].values():  # 100 rows: batches of 32, each at its longest row
        assert sum(lengths) <= padded <= 32 * 3 * max(lengths) + 4 * max(lengths)
    padding = sum(result["peer_padded_tokens"].values()) / 2 / sum(lengths)
    assert result["peer_padding"] == pytest.approx(padding)
    assert result["equal_kernels_speedup"] == pytest.approx(padding * layers / (layers - 1 + 2 / 12))


def test_reference_loop_learns_a_toy_task_and_reports_each_epoch(tmp_path, save_tiny_checkpoint):
    """benchmarks/multi_label_reference.py (the plain loop issue 64 compares against) on a tiny checkpoint: one
    JSON with every epoch's dev scores, the loss curve falling, and a cue-word task learnt."""
    import random

    model = save_tiny_checkpoint(tmp_path / "model", WORDS)
    rng = random.Random(0)
    data = tmp_path / "data"
    data.mkdir()
    (data / "emotions.txt").write_text("joy\nanger\nsurprise\nneutral\n")
    cues = ("love", "hate", "!")  # each label's word; a row without one is "neutral"
    for name, count in (("train.tsv", 320), ("dev.tsv", 64)):
        lines = []
        for i in range(count):
            labels = [k for k in range(3) if rng.random() < 0.3]
            words = rng.choices(["i", "this", "so", "much", "ok"], k=3) + [cues[k] for k in labels]
            labels = labels or [3]
            rng.shuffle(words)
            lines.append(f"{' '.join(words)}\t{','.join(map(str, labels))}\tid{i}\n")
        (data / name).write_text("".join(lines))
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "multi_label_reference.py"), "--model",
                           str(model), "--data", str(data), "--output", str(tmp_path / "result.json"), "--epochs", "3",
                           "--batch-size", "16", "--lr", "5e-3", "--threads", "1", "--log-every", "5"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert [e["epoch"] for e in result["evals"]] == [1, 2, 3] and result["steps"] == 3 * (320 // 16)
    assert result["adam_epsilon"] == 1e-8 and result["metrics"] == result["evals"][-1]
    assert result["train_loss"][-1][1] < result["train_loss"][0][1]
    assert result["metrics"]["macro_f1"] > 0.6  # learnt: predicting every label everywhere scores about 0.4
    per_label = result["metrics"]["per_label_f1"]  # each label's F1, averaging to the macro figure
    assert len(per_label) == 4 and sum(per_label.values()) / 4 == pytest.approx(result["metrics"]["macro_f1"])
    import numpy as np
    from bertforge.tasks.multi_label import multi_label_metrics

    probabilities = np.load(tmp_path / "dev_probabilities.npy")  # the last evaluation's, scoring as reported
    gold = np.zeros((64, 4), dtype=bool)
    for row, line in enumerate((data / "dev.tsv").read_text().splitlines()):
        gold[row, [int(i) for i in line.split("\t")[1].split(",")]] = True
    scores = multi_label_metrics(probabilities >= result["metrics"]["threshold"], gold)
    assert probabilities.shape == (64, 4) and scores["f1_macro"] == pytest.approx(result["metrics"]["macro_f1"], abs=1e-6)


def test_moments_reports_adams_second_moments_against_epsilon(tmp_path, save_tiny_checkpoint):
    """benchmarks/multi_label_moments.py on a tiny checkpoint: every reported root of v̂ is positive and finite,
    shares are fractions, and the JSON file is what it prints."""
    model = save_tiny_checkpoint(tmp_path / "model", WORDS)
    data = tmp_path / "data"
    data.mkdir()
    (data / "emotions.txt").write_text("joy\nanger\n")
    rows = [f"i love this so much\t{'0,1' if i % 3 else i % 2}\tid{i}\n" for i in range(96)]  # some with both
    (data / "train.tsv").write_text("".join(rows))
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "multi_label_moments.py"), "--model", str(model),
                           "--data", str(data), "--steps", "3", "--threads", "1", "--output", str(tmp_path / "m.json")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result == json.loads((tmp_path / "m.json").read_text()) and result["steps"] == 3
    assert "classifier.weight" in result["tensors"] and 0.0 <= result["share_below_1e-6"] <= 1.0
    for row in result["tensors"].values():
        assert 0.0 < row["median_root_v"] < 1.0 and 0.0 <= row["share_below_1e-6"] <= 1.0
