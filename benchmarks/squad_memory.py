"""Peak memory of SQuAD fine-tuning at sequence length 384 with a BERT-Base-size model, batch 8, on CPU.

The question a user with a laptop asks: does fine-tuning BERT-Base on SQuAD fit in 8 GB? Peak RSS
is set by the longest batches, so this trains on the questions of the two longest passages of the
training file (every window of them is long: most are the full 384 tokens) and evaluates on a few
passages of the dev file. The model is a randomly initialised `base` preset (12 layers, hidden 768,
110M parameters) with the vocabulary of `--model-vocab`: memory does not depend on the weights' values,
and no base checkpoint ships on PyPI.

It runs `bertforge finetune squad` in a child process, padded (`--no-unpad`: every step is 8 × the
batch's longest window), and reports the child's peak resident set size (`ru_maxrss`). One JSON line.

    python scripts/split_squad.py --output-dir runs/squad-split
    python benchmarks/squad_memory.py --model-vocab MINILM --train-file runs/squad-split/train.json \
        --dev-file runs/squad-split/eval.json     # ~8 min on one thread
    python benchmarks/squad_memory.py --quick     # seconds: the test, backs no figure

`--quick`: the `tiny` preset with MiniLM's vocabulary, toy SQuAD 2.0 train and dev files of Shakespeare's
speeches (written in a temporary directory), batch 4, 2 steps.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _common import cpu_model, log, minilm_dir, quick_squad  # noqa: E402


def longest_passages(path: Path, count: int) -> dict:
    """An official-format SQuAD dict holding only the `count` longest passages of `path` (by characters)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    passages = [(len(p["context"]), i, a["title"], p) for i, a in enumerate(data["data"]) for p in a["paragraphs"]]
    chosen = sorted(passages, key=lambda t: (-t[0], t[1]))[:count]
    return {"version": data.get("version", "v2.0"),
            "data": [{"title": title, "paragraphs": [p]} for _, _, title, p in chosen]}


def first_passages(path: Path, count: int) -> dict:
    """The first `count` passages of the first article of `path`: a small dev set."""
    data = json.loads(path.read_text(encoding="utf-8"))
    article = data["data"][0]
    return {"version": data.get("version", "v2.0"),
            "data": [{"title": article["title"], "paragraphs": article["paragraphs"][:count]}]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-vocab", type=Path, help="a checkpoint directory whose vocab.txt and "
                        "tokenizer_config.json the random base model uses (required unless --quick)")
    parser.add_argument("--train-file", type=Path, help="SQuAD v2.0 JSON (the split's train part; "
                        "required unless --quick)")
    parser.add_argument("--dev-file", type=Path, help="SQuAD v2.0 JSON (the split's eval part; "
                        "required unless --quick)")
    parser.add_argument("--preset", default="base")
    parser.add_argument("--passages", type=int, default=2, help="longest training passages to train on")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="keep the run's directory here instead of a temporary one")
    parser.add_argument("--quick", action="store_true", help="the tiny preset, toy SQuAD files, batch 4, 2 steps")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="squad-memory-quick-") as scratch:
        if args.quick:
            args.model_vocab, args.preset, args.batch_size, args.max_steps = minilm_dir(), "tiny", 4, 2
            args.train_file = quick_squad(Path(scratch) / "train.json", questions=24)
            args.dev_file = quick_squad(Path(scratch) / "dev.json", questions=8, first=24)
        elif not (args.model_vocab and args.train_file and args.dev_file):
            parser.error("--model-vocab, --train-file and --dev-file are required (or --quick)")
        return run(args)


def run(args: argparse.Namespace) -> int:
    if not (args.model_vocab / "vocab.txt").is_file():
        raise SystemExit(f"--model-vocab {args.model_vocab}: no vocab.txt there")

    import torch

    from bertforge.modeling import BertConfig, BertForPreTraining
    from bertforge.tasks.squad_data import SquadSettings, convert_examples_to_features, read_squad_file
    from bertforge.tokenization import BertTokenizer

    settings = SquadSettings()
    work = Path(tempfile.mkdtemp(prefix="squad_memory_"))
    try:
        model_dir = work / "model"
        torch.manual_seed(0)
        BertForPreTraining(BertConfig.preset(args.preset)).save_pretrained(model_dir)
        for name in ("vocab.txt", "tokenizer_config.json"):
            if (args.model_vocab / name).exists():  # tokenizer_config.json is optional (lower-casing default)
                shutil.copy(args.model_vocab / name, model_dir / name)
        train, dev = work / "train.json", work / "dev.json"
        train_data = longest_passages(args.train_file, args.passages)
        train.write_text(json.dumps(train_data), encoding="utf-8")
        lengths = convert_examples_to_features(read_squad_file(train).examples, BertTokenizer.from_pretrained(
            model_dir), settings, is_training=True).lengths
        dev.write_text(json.dumps(first_passages(args.dev_file, 4)), encoding="utf-8")
        output_dir = args.keep or work / "run"
        command = [sys.executable, "-m", "bertforge", "finetune", "squad", "--train-file", str(train),
                   "--dev-file", str(dev), "--version", "2.0", "--model", str(model_dir),
                   "--output-dir", str(output_dir), "--batch-size", str(args.batch_size),
                   "--max-steps", str(args.max_steps), "--eval-batch-size", str(args.batch_size),
                   "--num-threads", str(args.threads), "--no-unpad", "--no-progress"]
        log(" ".join(command))
        began = time.perf_counter()
        subprocess.run(command, check=True, stdout=sys.stderr)
        seconds = time.perf_counter() - began
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # Linux: KiB
        steps = [json.loads(line) for line in (output_dir / "log.jsonl").read_text().splitlines()]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "benchmark": "squad_memory", **({"quick": True} if args.quick else {}),
        "preset": args.preset, "max_seq_length": settings.max_seq_length,
        "doc_stride": settings.doc_stride,
        "batch_size": args.batch_size, "max_steps": args.max_steps, "padded": True,
        "train_questions": sum(len(p["qas"]) for a in train_data["data"] for p in a["paragraphs"]),
        "train_windows": len(lengths), "train_windows_at_384": sum(n == settings.max_seq_length for n in lengths),
        "peak_rss_gib": round(peak_kib / 2**20, 3), "peak_rss_kib": peak_kib,
        "final_loss": next((s["loss"] for s in reversed(steps) if "loss" in s), None),
        "seconds": round(seconds, 1), "threads": args.threads, "cpu": cpu_model(),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
