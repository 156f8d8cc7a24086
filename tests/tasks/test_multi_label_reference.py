"""bertforge's multi-label fine-tuning against the reference loop, on the same batches.

The reference is what a user writes from transformers' documentation: `BertForSequenceClassification`
(multi-label), torch's `AdamW` at its defaults but for weight decay 0.01 off LayerNorm and biases, a
linear warm-up and decay, clipping at 1.0 (benchmarks/multi_label_reference.py runs it at full size).
Both sides start from one checkpoint (its classifier included) with dropout off and read the same
batches in the same order, so bertforge's engine (optimizer, schedule, clipping, the unpadded encoder)
must follow the loop's trajectory to float rounding. At AdamW's ε of 1e-6 (the paper's) it does not:
MiniLM's lower-layer gradients on GoEmotions' 28 labels are near 1e-6, where ε shrinks their updates."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bertforge.cli import main
from bertforge.modeling import BertForSequenceClassification
from bertforge.modeling.heads import MULTI_LABEL
from bertforge.tasks.multi_label import (convert_examples, multi_hot, multi_label_metrics, multi_label_task, sigmoid,
                                         tune_thresholds)
from bertforge.tasks.multi_label_reader import read_label_names, read_multi_label_file
from bertforge.training.order import epoch_permutation

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

TRAIN_ROWS, DEV_ROWS, BATCH, SEED, LR = 480, 300, 16, 3, 1e-4
# Largest weight difference after 30 steps: bertforge's and the loop's run differ by float rounding alone;
# with ε 1e-6 the lower layers' updates shrink and the gap is far above this.
WEIGHT_TOLERANCE = 2e-5
# Dev macro-F1 (one tuned threshold), points: the same trajectory must give the same score.
F1_BAND = 0.5


@pytest.fixture(scope="module")
def setup(tmp_path_factory, minilm_dir, shared_data):
    """GoEmotions subsets and a starting checkpoint (MiniLM with a seeded 28-label head, dropout off)."""
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("reference")
    data = shared_data / "goemotions"
    for name, rows in (("train.tsv", TRAIN_ROWS), ("dev.tsv", DEV_ROWS)):
        lines = (data / name).read_text(encoding="utf-8").splitlines(keepends=True)[:rows]
        (root / name).write_text("".join(lines), encoding="utf-8")
    names = read_label_names(data / "emotions.txt")
    torch.manual_seed(0)
    start = BertForSequenceClassification.from_pretrained(
        minilm_dir, num_labels=len(names), id2label=dict(enumerate(names)), problem_type=MULTI_LABEL,
        finetuning_task="multi-label", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    start.save_pretrained(root / "start")
    shutil.copy(minilm_dir / "vocab.txt", root / "start" / "vocab.txt")
    return root, data / "emotions.txt"


def run_ours(root: Path, labels: Path, output: str, *flags: str) -> tuple[dict, dict]:
    """`bertforge finetune multi-label` at its recipe (the user's defaults), on the same data and order."""
    main(["finetune", "multi-label", "--train-file", str(root / "train.tsv"), "--dev-file", str(root / "dev.tsv"),
          "--labels", str(labels), "--model", str(root / "start"), "--output-dir", str(root / output),
          "--lr", str(LR), "--epochs", "1", "--batch-size", str(BATCH), "--seed", str(SEED), "--no-progress", *flags])
    weights = load_file(root / output / "model.safetensors")
    return weights, json.loads((root / output / "eval_results.json").read_text())["metrics"]


def run_reference(root: Path, labels: Path, epochs: int = 1) -> tuple[dict, float]:
    """The plain loop on bertforge's batches (its features, collate and each epoch's order)."""
    import transformers

    task = multi_label_task(root / "start", root / "train.tsv", root / "dev.tsv", labels_file=labels)
    model = transformers.BertForSequenceClassification.from_pretrained(root / "start")
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=LR)
    steps = TRAIN_ROWS // BATCH
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, int(np.ceil(0.1 * steps * epochs)),
                                                             steps * epochs)
    model.train()
    for epoch in range(epochs):
        order = epoch_permutation(len(task.train_features), SEED, epoch).tolist()
        for step in range(steps):
            batch = task.collate([task.train_features[i] for i in order[step * BATCH:(step + 1) * BATCH]])
            model(**batch).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    model.eval()
    features = dev_features(root, labels, task)  # batched as bertforge batches them
    with torch.no_grad():
        logits = torch.cat([model(**{k: v for k, v in task.collate(features[i:i + 64]).items() if k != "labels"})
                            .logits for i in range(0, len(features), 64)])
    probabilities = sigmoid(logits.numpy())
    gold = multi_hot([f["label"] for f in features], logits.shape[1])
    macro = multi_label_metrics(probabilities >= tune_thresholds(probabilities, gold), gold)["f1_macro"]
    return {n: p.detach() for n, p in model.state_dict().items()}, macro


def dev_features(root: Path, labels: Path, task) -> list[dict]:
    label_list = read_label_names(labels)
    dev, _ = read_multi_label_file(root / "dev.tsv", label_list=label_list)
    return convert_examples(dev, task.tokenizer, 128)


def max_difference(ours: dict, reference: dict) -> float:
    shared = [name for name in ours if name in reference and ours[name].shape == reference[name].shape]
    assert len(shared) > 90  # every encoder weight, the pooler and the classifier
    return max(float((ours[name].float() - reference[name].float()).abs().max()) for name in shared)


def test_finetuning_follows_the_reference_loop(setup):
    root, labels = setup
    reference, reference_f1 = run_reference(root, labels)
    ours, metrics = run_ours(root, labels, "ours")
    assert max_difference(ours, reference) < WEIGHT_TOLERANCE
    assert abs(metrics["f1_macro"] - reference_f1) * 100 < F1_BAND
    # The comparison can fail: the paper's ε of 1e-6 leaves the trajectory (issue 64's cause).
    damped, _ = run_ours(root, labels, "eps-1e-6", "--adam-epsilon", "1e-6")
    assert max_difference(damped, reference) > 5 * WEIGHT_TOLERANCE


def test_two_epochs_with_an_evaluation_between_follow_the_reference_loop(setup):
    """Across an epoch's end (a dev evaluation, the best model saved, a new epoch order) the trajectory stays
    the loop's: nothing the evaluation or the saving does reaches training. The last step's weights are read
    from the final training checkpoint (OUT's model.safetensors is the best epoch's, which may be the first)."""
    root, labels = setup
    reference, _ = run_reference(root, labels, epochs=2)
    main(["finetune", "multi-label", "--train-file", str(root / "train.tsv"), "--dev-file", str(root / "dev.tsv"),
          "--labels", str(labels), "--model", str(root / "start"), "--output-dir", str(root / "two-epochs"),
          "--lr", str(LR), "--epochs", "2", "--batch-size", str(BATCH), "--seed", str(SEED), "--no-progress",
          "--save-every", "100000"])  # no checkpoint on the way; one at the last step
    log = [json.loads(line) for line in (root / "two-epochs" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "eval_f1_macro" in r] == [TRAIN_ROWS // BATCH, 2 * TRAIN_ROWS // BATCH]
    (final,) = (root / "two-epochs" / "checkpoints").glob("checkpoint-*.pt")
    state = torch.load(final, map_location="cpu", weights_only=False)
    assert state["step"] == 2 * TRAIN_ROWS // BATCH
    assert max_difference(state["model"], reference) < WEIGHT_TOLERANCE
