"""Downstream tasks with a signal at this scale: built from Shakespeare's plays, dev from plays never pre-trained on.

A from-scratch model pre-trained for minutes on a CPU shows nothing on SST-2, but it does on text of its
own domain. So each of the paper's task shapes gets a task made from the plays; training examples come
from the pre-training plays, dev examples only from the held-out ones (`quickstart.HELD_OUT`: one comedy,
one history, one tragedy), so dev measures text neither stage saw:

    genre         single sentence   a passage of >= 80 words -> comedy / history / tragedy (the quickstart's)
                                    [the paper's SST-2 shape]
    reply         sentence pair     speech A, speech B -> is B the reply to A, or a speech from elsewhere in
                                    the same play? [MNLI / QNLI / MRPC's shape; next-sentence-like]
    continuation  multiple choice   two or three speeches -> which of four speeches comes next (three
                                    distractors from the same play, far away) [SWAG's shape]
    names         token tagging     which words of a speech are a character's name (PER entities)
                                    [the token-level task standing in for SQuAD's spans]

Character names: a word of a play's speaker labels ("LADY MACBETH" -> "Macbeth", "Lady") that is written
capitalised in the play's speeches and never in lower case ("lady", "king", "first" are dropped that way).
The text is lower-cased by the uncased vocabulary, so the model cannot see capitals: in the held-out plays
(Macbeth, Banquo, Malvolio, Bolingbroke) it must tell names from context.

Everything is deterministic for a seed; `build_tasks` writes the examples as files (JSONL, SWAG CSV,
CoNLL) into a directory, which the fine-tuning reads back.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from .._files import write_text_atomic
from ..corpus import Play
from ..quickstart import HELD_OUT, genre_passages
from ..tasks.multiple_choice import ChoiceExample, write_swag_file
from ..tasks.classify_reader import InputExample

TASK_NAMES = ("genre", "reply", "continuation", "names")
# The paper's task each one stands in for (its shape), shown in table.md.
PAPER_SHAPE = {"genre": "single sentence (SST-2)", "reply": "sentence pair (MNLI, QNLI, MRPC)",
               "continuation": "multiple choice (SWAG)", "names": "token / span (SQuAD, NER)"}
METRIC = {"genre": "accuracy", "reply": "accuracy", "continuation": "accuracy", "names": "f1"}
_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*|[^\sA-Za-z]")
MAX_SPEECH_WORDS = 60  # a pair or choice segment keeps a speech's first N words


def is_held_out(play: Play) -> bool:
    """Whether the play is one of the held-out ones (dev examples; never pre-trained on)."""
    return any(play.title.lower() == h.lower() for h in HELD_OUT)


def _clip(text: str, words: int = MAX_SPEECH_WORDS, keep_end: bool = False) -> str:
    parts = text.split()
    return " ".join(parts[-words:] if keep_end else parts[:words])


def _sample(items: list, limit: int, rng: random.Random) -> list:
    """At most `limit` of `items`, a seeded random choice kept in its original order."""
    if len(items) <= limit:
        return items
    return [items[i] for i in sorted(rng.sample(range(len(items)), limit))]


def _far(i: int, n: int, min_distance: int, rng: random.Random) -> int:
    """A random index of range(n) more than `min_distance` from `i` (one must exist)."""
    while True:
        j = rng.randrange(n)
        if abs(j - i) > min_distance:
            return j


# ---------------------------------------------------------------------------- the four tasks

def reply_pairs(play: Play, rng: random.Random, min_distance: int = 10) -> list[InputExample]:
    """Sentence pairs of one play: (speech i, speech i+1 by another speaker) labelled "reply", or (speech i,
    a speech more than `min_distance` speeches away) labelled "other", each with probability 1/2."""
    examples, n = [], len(play.speeches)
    for i in range(n - 1):
        if play.speakers[i] == play.speakers[i + 1] or n <= 2 * min_distance + 2:
            continue
        if rng.random() < 0.5:
            second, label = i + 1, "reply"
        else:
            second, label = _far(i, n, min_distance, rng), "other"
        examples.append(InputExample(f"{play.title}-{i}", _clip(play.speeches[i], keep_end=True),
                                     _clip(play.speeches[second]), label))
    return examples


def continuation_choices(play: Play, rng: random.Random, context_speeches: int = 2, min_distance: int = 20,
                         num_choices: int = 4) -> list[ChoiceExample]:
    """Four-way continuations of one play: `context_speeches` consecutive speeches (their last 80 words),
    the true next speech and three from more than `min_distance` speeches away, shuffled."""
    examples, n = [], len(play.speeches)
    if n <= 2 * min_distance + num_choices:
        return examples
    for answer in range(context_speeches, n, context_speeches + 1):  # non-overlapping passages
        far: set[int] = set()
        while len(far) < num_choices - 1:
            j = _far(answer, n, min_distance, rng)
            if play.speeches[j] != play.speeches[answer]:
                far.add(j)
        distractors = [_clip(play.speeches[j]) for j in sorted(far)]
        label = rng.randrange(num_choices)
        context = _clip(" ".join(play.speeches[answer - context_speeches:answer]), 80, keep_end=True)
        endings = distractors[:label] + [_clip(play.speeches[answer])] + distractors[label:]
        examples.append(ChoiceExample(guid=f"{play.title}-{answer}", context=context, start="", endings=endings,
                                      label=label, video_id=play.title, fold_ind=str(answer)))
    return examples


def character_names(play: Play) -> set[str]:
    """Words of the play's speaker labels that its speeches write capitalised and never in lower case."""
    words = [w for speech in play.speeches for w in _WORD.findall(speech)]
    lower = {w for w in words if w.islower()}
    capitalised = {w for w in words if w[:1].isupper()}
    candidates = {part.capitalize() for speaker in set(play.speakers) for part in re.findall(r"[A-Za-z]+", speaker)}
    return {w for w in candidates if len(w) >= 3 and w in capitalised and w.lower() not in lower}


def name_sentences(play: Play) -> list[tuple[list[str], list[str]]]:
    """(words, IOB2 tags) per speech: consecutive name words are one PER entity."""
    names = character_names(play)
    sentences = []
    for speech in play.speeches:
        words = _WORD.findall(_clip(speech))
        tags, previous = [], False
        for word in words:
            name = word in names
            tags.append(("I-PER" if previous else "B-PER") if name else "O")
            previous = name
        if words:
            sentences.append((words, tags))
    return sentences


def name_examples(plays: list[Play], limit: int, rng: random.Random) -> list[tuple[list[str], list[str]]]:
    """Every speech holding a name, and as many without (speeches with no name teach precision), at most `limit`."""
    with_names, without = [], []
    for play in plays:
        for words, tags in name_sentences(play):
            (with_names if any(t != "O" for t in tags) else without).append((words, tags))
    chosen = with_names + _sample(without, len(with_names), rng)
    rng.shuffle(chosen)
    return chosen[:limit]


# ---------------------------------------------------------------------------- files

@dataclass
class TaskFiles:
    """Where `build_tasks` put each task's train and dev files, and their sizes."""

    directory: Path
    counts: dict[str, dict[str, int]]

    def path(self, task: str, split: str) -> Path:
        """The file of a task's split ("train" or "dev")."""
        suffix = {"continuation": "csv", "names": "txt"}.get(task, "jsonl")
        return self.directory / task / f"{split}.{suffix}"


def _write_jsonl(path: Path, examples: list[InputExample]) -> None:
    rows = [{"text": e.text_a, **({"text_pair": e.text_b} if e.text_b is not None else {}), "label": e.label}
            for e in examples]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def _write_conll(path: Path, sentences: list[tuple[list[str], list[str]]]) -> None:
    lines = ["-DOCSTART- O", ""]
    for words, tags in sentences:
        lines.extend(f"{w} {t}" for w, t in zip(words, tags))
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, "\n".join(lines) + "\n")


def read_jsonl_examples(path: Path, split: str) -> list[InputExample]:
    """The InputExamples `_write_jsonl` wrote."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [InputExample(f"{split}-{i}", r["text"], r.get("text_pair"), r["label"]) for i, r in enumerate(rows)]


def build_tasks(plays: list[Play], directory: Path, max_train: int, max_dev: int, seed: int,
                max_choice: int | None = None) -> TaskFiles:
    """Write the four tasks' train and dev files into `directory` (dev from the held-out plays only): at most
    `max_train` training examples per task (`max_choice` for the four-way continuation, if smaller) and
    `max_dev` dev examples."""
    train_plays = [p for p in plays if not is_held_out(p)]
    dev_plays = [p for p in plays if is_held_out(p)]
    rng = lambda task, split: random.Random(f"{seed}:{task}:{split}")  # noqa: E731 (one stream per file)
    files = TaskFiles(directory, {})
    genre_train, genre_dev = genre_passages(plays)
    splits = {"genre": (genre_train, genre_dev)}
    splits["reply"] = tuple([e for p in ps for e in reply_pairs(p, rng("reply", name))]
                            for name, ps in (("train", train_plays), ("dev", dev_plays)))
    for task, (train, dev) in splits.items():
        train = _sample(train, max_train, rng(task, "train-sample"))
        dev = _sample(dev, max_dev, rng(task, "dev-sample"))
        _write_jsonl(files.path(task, "train"), train)
        _write_jsonl(files.path(task, "dev"), dev)
        files.counts[task] = {"train": len(train), "dev": len(dev)}
    choices = {}
    for name, ps in (("train", train_plays), ("dev", dev_plays)):
        examples = [e for p in ps for e in continuation_choices(p, rng("continuation", name))]
        limit = min(max_train, max_choice or max_train) if name == "train" else max_dev
        examples = _sample(examples, limit, rng("continuation", f"{name}-sample"))
        for n, example in enumerate(examples):
            example.index = str(n)
        write_swag_file(files.path("continuation", name), examples)
        choices[name] = len(examples)
    files.counts["continuation"] = choices
    names = {"train": name_examples(train_plays, max_train, rng("names", "train")),
             "dev": name_examples(dev_plays, max_dev, rng("names", "dev"))}
    for split, sentences in names.items():
        _write_conll(files.path("names", split), sentences)
    files.counts["names"] = {split: len(s) for split, s in names.items()}
    files.counts["names"]["dev_entities"] = sum(tags.count("B-PER") for _, tags in names["dev"])
    info = {"held_out_plays": list(HELD_OUT), "seed": seed, "counts": files.counts,
            "paper_shape": PAPER_SHAPE, "metric": METRIC}
    write_text_atomic(directory / "info.json", json.dumps(info, indent=2) + "\n")
    return files


def load_task_files(directory: Path) -> TaskFiles:
    """The TaskFiles of a directory `build_tasks` wrote."""
    info = json.loads((directory / "info.json").read_text(encoding="utf-8"))
    return TaskFiles(directory, info["counts"])


__all__ = ["METRIC", "PAPER_SHAPE", "TASK_NAMES", "TaskFiles", "build_tasks", "character_names", "load_task_files",
           "name_sentences", "read_jsonl_examples"]
