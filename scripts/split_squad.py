"""Split a SQuAD JSON file by article into a train part and an eval part.

No SQuAD training set can be had here, so the shared half of the v2.0 dev set
(`../shared/data/squad/v2.0/dev-v2.0.cs224n-half.json`, 16 articles, 6,078 questions) is split into
two official-format files. Whole articles go to one part or the other, never both: questions about
the same passage (often paraphrases of each other) on both sides would leak answers from training
into evaluation. Deterministic for a seed.

    python scripts/split_squad.py --output-dir /tmp/squad-split
    # -> /tmp/squad-split/train.json, /tmp/squad-split/eval.json and the counts of each part

The articles are shuffled with `--seed`, then given to the train part until it holds
`--train-fraction` of the questions (at least one article goes to each part).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_INPUT = REPO.parent / "shared" / "data" / "squad" / "v2.0" / "dev-v2.0.cs224n-half.json"


def counts(articles: list[dict]) -> dict[str, int]:
    questions = [qa for article in articles for p in article["paragraphs"] for qa in p["qas"]]
    answerable = sum(not qa.get("is_impossible", False) for qa in questions)
    return {"articles": len(articles), "paragraphs": sum(len(a["paragraphs"]) for a in articles),
            "questions": len(questions), "answerable": answerable, "unanswerable": len(questions) - answerable}


def split(articles: list[dict], train_fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train articles, eval articles), each in the file's order."""
    if len(articles) < 2:
        raise ValueError("need at least two articles to split by article")
    order = list(range(len(articles)))
    random.Random(seed).shuffle(order)
    sizes = [counts([a])["questions"] for a in articles]
    target = train_fraction * sum(sizes)
    chosen, total = set(), 0
    for index in order:
        if chosen and (total >= target or len(chosen) == len(articles) - 1):
            break
        chosen.add(index)
        total += sizes[index]
    train = [a for i, a in enumerate(articles) if i in chosen]
    held_out = [a for i, a in enumerate(articles) if i not in chosen]
    return train, held_out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT, help=f"SQuAD JSON (default: {DEFAULT_INPUT})")
    parser.add_argument("--output-dir", type=Path, required=True, help="where train.json and eval.json go "
                        "(outside the repository)")
    parser.add_argument("--train-fraction", type=float, default=0.5, help="share of the questions for training")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not 0 < args.train_fraction < 1:
        parser.error("--train-fraction must be between 0 and 1")
    output_dir = args.output_dir.resolve()
    if output_dir == REPO or REPO in output_dir.parents:
        parser.error(f"{output_dir} is inside the repository: data files stay out of it")
    if not args.input.is_file():
        parser.error(f"input not found: {args.input}")
    root = json.loads(args.input.read_text(encoding="utf-8"))
    train, held_out = split(root["data"], args.train_fraction, args.seed)
    output_dir.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", train), ("eval", held_out)):
        path = output_dir / f"{name}.json"
        path.write_text(json.dumps({"version": root.get("version", "v2.0"), "data": part}, ensure_ascii=False),
                        encoding="utf-8")
        c = counts(part)
        print(f"{name}: {path}: {c['articles']} articles, {c['paragraphs']} paragraphs, {c['questions']} questions "
              f"({c['answerable']} answerable, {c['unanswerable']} unanswerable); "
              f"articles: {', '.join(a['title'] for a in part)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
