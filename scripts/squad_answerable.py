"""The answerable questions of a SQuAD v2.0 file, written as a v1.1 file (issue 28's v1.1 evaluation set).

The shared v2.0 dev half (`../shared/data/squad/v2.0/dev-v2.0.cs224n-half.json`) holds no article of the
shared training files, so its answerable questions are a v1.1 dev set for a model trained on
`../shared/data/squad/v1.1/train-v1.1.first11.json`. Unanswerable questions (`is_impossible`) are dropped,
and so are paragraphs and articles left with none; everything else is kept as it is, in order.

    python scripts/squad_answerable.py --output runs/squad/dev-v1.1-answerable.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_INPUT = REPO.parent / "shared" / "data" / "squad" / "v2.0" / "dev-v2.0.cs224n-half.json"


def answerable(dataset: dict) -> dict:
    """A v1.1 dataset of `dataset`'s answerable questions (those with an answer and not `is_impossible`)."""
    articles = []
    for article in dataset["data"]:
        paragraphs = []
        for paragraph in article["paragraphs"]:
            qas = [{k: v for k, v in qa.items() if k not in ("is_impossible", "plausible_answers")}
                   for qa in paragraph["qas"] if not qa.get("is_impossible", False) and qa.get("answers")]
            if qas:
                paragraphs.append({**paragraph, "qas": qas})
        if paragraphs:
            articles.append({**article, "paragraphs": paragraphs})
    return {"version": "1.1", "data": articles}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT, help="a SQuAD v2.0 JSON file")
    parser.add_argument("--output", type=Path, required=True, help="the v1.1 JSON file to write (must not exist)")
    args = parser.parse_args(argv)
    if not args.input.is_file():
        parser.error(f"--input {args.input}: not found")
    if args.output.exists():
        parser.error(f"--output {args.output} exists: choose a new path")
    try:
        source = json.loads(args.input.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        parser.error(f"--input {args.input}: not a JSON file ({error})")
    if not isinstance(source, dict) or not isinstance(source.get("data"), list):
        parser.error(f"--input {args.input}: no \"data\" list: not a SQuAD file")
    dataset = answerable(source)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    partial = args.output.with_name(args.output.name + ".partial")
    partial.write_text(json.dumps(dataset, ensure_ascii=False), encoding="utf-8")
    partial.replace(args.output)
    questions = sum(len(p["qas"]) for a in dataset["data"] for p in a["paragraphs"])
    print(json.dumps({"output": str(args.output), "articles": len(dataset["data"]), "questions": questions}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
