"""Write a randomly initialised copy of a checkpoint: same config and vocabulary, no learned weights.

The control arm of "does pre-training help?": fine-tune the pre-trained model and this copy with the
same recipe and seeds, and the difference is what pre-training bought. Weights follow BERT's
initialisation (truncated normal, std `initializer_range`; LayerNorm 1/0), drawn with `--seed`.

    python scripts/random_init.py --like runs/mini/ours/final --output-dir runs/mini/random
    # -> runs/mini/random/{config.json, model.safetensors, vocab.txt, tokenizer_config.json}
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch

from bertforge.modeling.config import BertConfig
from bertforge.modeling.heads import BertForPreTraining

TOKENIZER_FILES = ("vocab.txt", "tokenizer_config.json")


def random_copy(like: Path, output_dir: Path, seed: int) -> Path:
    """Save a `BertForPreTraining` with `like`'s config and fresh weights, plus `like`'s tokenizer files."""
    if not (like / "vocab.txt").is_file():
        raise FileNotFoundError(f"{like}: no vocab.txt (the copy must tokenize as the original does)")
    config = BertConfig.from_pretrained(like)
    torch.manual_seed(seed)
    BertForPreTraining(config).save_pretrained(output_dir)
    for name in TOKENIZER_FILES:
        if (like / name).is_file():  # tokenizer_config.json is optional
            shutil.copy(like / name, output_dir / name)
    return output_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--like", type=Path, required=True, help="checkpoint whose config and vocabulary to copy")
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        out = random_copy(args.like, args.output_dir, args.seed)
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"error: {error}")
    config = BertConfig.from_pretrained(out)
    print(f"wrote {out}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, seed {args.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
