"""Build a real four-way multiple-choice task from public-domain books, in SWAG's CSV layout.

Each example: a passage of a few consecutive sentences of a book (`sent1`), its true next sentence, and
three sentences drawn from elsewhere in the same book (far from the passage, so none is a near
neighbour). The four candidates are shuffled; `label` is the position of the true one. Because the
distractors come from the same book (same characters, names, style), picking the right sentence takes
reading the passage, not spotting the book: a coherence task of SWAG's shape.

    python scripts/make_book_choice.py --output-dir /tmp/book_choice
    bertforge finetune multiple-choice --train-file /tmp/book_choice/train.csv \\
        --dev-file /tmp/book_choice/val.csv --model MODEL --output-dir OUT

Train and dev are split BY BOOK (no book in both), so dev accuracy measures generalisation to unseen
books. Deterministic for a seed. Writes `train.csv`, `val.csv` and `info.json` (counts, the books
of each split, the settings) into `--output-dir`, which must lie outside the repository.

Candidate sentences are filtered to 4-40 words holding a lower-case letter (this drops chapter
headings and tables of contents); the true next sentence and the distractors pass the same filter,
so length alone does not give the answer away.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bertforge.pretraining.text import split_sentences, text_paragraphs  # noqa: E402
from bertforge.tasks.multiple_choice import ChoiceExample, write_swag_file  # noqa: E402

DEFAULT_BOOKS = REPO / ".." / "shared" / "data" / "pretraining" / "books"


def book_sentences(path: Path) -> list[str]:
    """The book's sentences in order (paragraphs joined from the hard-wrapped text, split by blingfire)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    return [s for paragraph in text_paragraphs(text) for s in split_sentences(paragraph)]


def usable(sentence: str, min_words: int, max_words: int) -> bool:
    words = len(sentence.split())
    return min_words <= words <= max_words and any(c.islower() for c in sentence)


def book_examples(name: str, sentences: list[str], rng: random.Random, *, limit: int, passage: int,
                  min_words: int, max_words: int, min_distance: int, max_context_words: int = 80,
                  num_choices: int = 4) -> list[ChoiceExample]:
    """Up to `limit` examples from one book: passages at random non-overlapping positions."""
    ok = [usable(s, min_words, max_words) for s in sentences]
    pool = [i for i, good in enumerate(ok) if good]
    # A passage start i: sentences i .. i+passage-1 are the context, i+passage is the answer.
    starts = [i for i in range(len(sentences) - passage) if ok[i + passage]
              and all(sentences[j].strip() for j in range(i, i + passage))]
    rng.shuffle(starts)
    taken: set[int] = set()
    examples = []
    for i in starts:
        if len(examples) >= limit:
            break
        if any(j in taken for j in range(i, i + passage + 1)):
            continue  # passages do not overlap: each sentence is context or answer at most once
        answer = i + passage
        # Keep the passage's end (what the answer follows): drop its first sentences while it is too long.
        first = i
        while first < answer - 1 and sum(len(sentences[j].split()) for j in range(first, answer)) > max_context_words:
            first += 1
        far = [j for j in rng.sample(pool, min(len(pool), 64)) if abs(j - answer) > min_distance
               and sentences[j] != sentences[answer]]
        distractors = list(dict.fromkeys(sentences[j] for j in far))[:num_choices - 1]
        if len(distractors) < num_choices - 1:
            continue
        label = rng.randrange(num_choices)
        endings = distractors[:label] + [sentences[answer]] + distractors[label:]
        taken.update(range(i, answer + 1))
        context = " ".join(sentences[first:answer])
        examples.append(ChoiceExample(guid=f"{name}-{answer}", context=context, start="", endings=endings,
                                      label=label, video_id=name, fold_ind=str(answer), startphrase=context,
                                      gold_source="gold"))
    return examples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", required=True, help="where train.csv, val.csv, info.json go (not the repo)")
    parser.add_argument("--books-dir", default=str(DEFAULT_BOOKS), help="*.txt books (default: the shared books)")
    parser.add_argument("--dev-books", type=int, default=8, help="books held out for dev")
    parser.add_argument("--train-per-book", type=int, default=1000, help="at most N training examples per book")
    parser.add_argument("--dev-per-book", type=int, default=100, help="at most N dev examples per book")
    parser.add_argument("--passage-sentences", type=int, default=3, help="sentences of context before the answer")
    parser.add_argument("--max-context-words", type=int, default=60,
                        help="drop the passage's first sentences while it has more words (its last one stays)")
    parser.add_argument("--min-words", type=int, default=4)
    parser.add_argument("--max-words", type=int, default=40)
    parser.add_argument("--min-distance", type=int, default=20,
                        help="distractors lie more than N sentences from the answer")
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args(argv)

    output = Path(args.output_dir).resolve()
    if output == REPO or REPO in output.parents:
        parser.error(f"--output-dir {output} is inside the repository; write the data elsewhere")
    books = sorted(Path(args.books_dir).glob("*.txt"))
    if len(books) <= args.dev_books:
        parser.error(f"{len(books)} book(s) in {args.books_dir}: need more than --dev-books {args.dev_books}")
    rng = random.Random(args.seed)
    shuffled = books[:]
    rng.shuffle(shuffled)
    dev_books, train_books = sorted(shuffled[:args.dev_books]), sorted(shuffled[args.dev_books:])

    def build(paths: list[Path], limit: int, split: str) -> list[ChoiceExample]:
        examples = []
        for path in paths:
            # One generator per book, seeded by (seed, book): adding a book does not change the others.
            book_rng = random.Random(f"{args.seed}:{path.stem}")
            examples.extend(book_examples(path.stem, book_sentences(path), book_rng, limit=limit,
                                          passage=args.passage_sentences, min_words=args.min_words,
                                          max_words=args.max_words, min_distance=args.min_distance,
                                          max_context_words=args.max_context_words))
        random.Random(f"{args.seed}:{split}").shuffle(examples)  # books interleaved within the file
        for n, example in enumerate(examples):
            example.index = str(n)
        return examples

    train = build(train_books, args.train_per_book, "train")
    dev = build(dev_books, args.dev_per_book, "val")
    write_swag_file(output / "train.csv", train)
    write_swag_file(output / "val.csv", dev)
    labels = [e.label for e in dev]
    info = {"train_examples": len(train), "dev_examples": len(dev),
            "train_books": [p.stem for p in train_books], "dev_books": [p.stem for p in dev_books],
            "dev_label_counts": [labels.count(k) for k in range(4)], "settings": vars(args)}
    (output / "info.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {output}: {len(train)} train examples from {len(train_books)} books, "
          f"{len(dev)} dev examples from {len(dev_books)} other books (chance: 25%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
