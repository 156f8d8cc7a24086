"""Write a randomly initialised copy of a checkpoint: same config and vocabulary, no learned weights.

The control arm of "does pre-training help?": fine-tune the pre-trained model and this copy with the
same recipe and seeds, and the difference is what pre-training bought. Weights follow BERT's
initialisation (truncated normal, std `initializer_range`; LayerNorm 1/0), drawn with `--seed`.

    python scripts/random_init.py --like runs/mini/ours/final --output-dir runs/mini/random
    # -> runs/mini/random/{config.json, model.safetensors, vocab.txt, tokenizer_config.json}
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from bertforge.modeling.config import BertConfig
from bertforge.modeling.heads import BertForPreTraining
from bertforge.tokenization import BertTokenizer


def random_copy(like: Path, output_dir: Path, seed: int) -> BertConfig:
    """Save a `BertForPreTraining` with `like`'s config and fresh weights, and `like`'s tokenizer."""
    if not (like / "vocab.txt").is_file():
        raise FileNotFoundError(f"{like}: no vocab.txt (the copy must tokenize as the original does)")
    if (output_dir / "config.json").exists():
        raise ValueError(f"{output_dir} already holds a model: choose another --output-dir")
    tokenizer = BertTokenizer.from_pretrained(like)  # checks the vocabulary before any weights are written
    config = BertConfig.from_pretrained(like)
    torch.manual_seed(seed)
    BertForPreTraining(config).save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--like", type=Path, required=True, help="checkpoint whose config and vocabulary to copy")
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        config = random_copy(args.like, args.output_dir, args.seed)
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"error: {error}")
    print(f"wrote {args.output_dir}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, seed {args.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
