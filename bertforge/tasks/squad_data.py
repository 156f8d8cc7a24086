"""SQuAD data (§4.2, §4.3): settings, the reader of the official JSON, features and batches.

* `read_squad_file(path)`: the official JSON (`data/title/paragraphs/context/qas/answers`,
  `is_impossible`, `plausible_answers`) as `SquadExample`s; malformed input is reported with the
  file and question id.
* `convert_examples_to_features(...)`: `[CLS] question [SEP] passage window [SEP]` rows (Google's
  `run_squad.py`); see `bertforge.tasks.answer` for the whole flow.
* `collate(features)`: a padded batch (the model inputs from `bertforge.tasks.arrays`).
"""

from __future__ import annotations

import bisect
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from .._files import read_text
from .classify_features import pad_batch
from .windows import windows

logger = logging.getLogger("bertforge")

__all__ = ["MAX_UNALIGNED_FRACTION", "VERSIONS", "SquadExample", "SquadFeatures", "SquadFile", "SquadSettings",
           "check_alignment", "collate", "convert_examples_to_features", "read_squad_file"]

VERSIONS = ("1.1", "2.0")


@dataclass
class SquadSettings:
    """Google's `run_squad.py` flags, with its defaults. Saved with a fine-tuned model (config.json
    key "squad") so that prediction uses what training used."""

    max_seq_length: int = 384  # tokens per window, specials included
    doc_stride: int = 128  # tokens between the starts of consecutive passage windows
    max_query_length: int = 64  # question tokens kept
    n_best_size: int = 20  # candidate starts/ends per window, and entries of the n-best list
    max_answer_length: int = 30  # tokens in an answer span
    null_score_diff_threshold: float = 0.0  # v2.0: answer "" when null score - best span score > this

    def check(self, flags: bool = False) -> None:
        """ValueError for settings that cannot work, naming the field (`flags`: as the CLI's --flag)."""
        def name(field_name: str) -> str:
            return "--" + field_name.replace("_", "-") if flags else field_name

        for field_name in ("max_seq_length", "doc_stride", "max_query_length", "n_best_size", "max_answer_length"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"{name(field_name)} must be at least 1, got {getattr(self, field_name)}")
        if self.max_seq_length <= self.max_query_length + 3:
            raise ValueError(f"{name('max_seq_length')} ({self.max_seq_length}) must exceed {name('max_query_length')} "
                             f"({self.max_query_length}) + 3 ([CLS] and two [SEP]) to leave room for the passage")
        # A stride as long as a window's passage part leaves no overlap: an answer across the boundary
        # of two windows would be wholly in neither.
        window = self.max_seq_length - self.max_query_length - 3
        if self.doc_stride >= window:
            raise ValueError(f"{name('doc_stride')} ({self.doc_stride}) must be less than {name('max_seq_length')} - "
                             f"{name('max_query_length')} - 3 = {window} (the passage tokens of a window) so that "
                             f"windows overlap, e.g. {name('doc_stride')} {max(1, window // 2)}")


# ---------------------------------------------------------------------------- reading

@dataclass
class SquadExample:
    """One question. `answers` are the gold (text, answer_start) pairs, empty when unanswerable;
    the first one is the training target (as Hugging Face's run_qa; Google's demands exactly one)."""

    qas_id: str
    question: str
    context: str
    answers: list[tuple[str, int]] = field(default_factory=list)
    is_impossible: bool = False
    title: str = ""
    paragraph: int = 0  # index of its paragraph in the file: the questions of a paragraph share its tokens


@dataclass
class SquadFile:
    """A read SQuAD file: its examples, the `data` list itself (what the official metrics read) and
    the file's `version` field."""

    path: Path
    examples: list[SquadExample]
    dataset: list[dict]
    version: str | None = None

    @property
    def num_answerable(self) -> int:
        return sum(not e.is_impossible for e in self.examples)


def read_squad_file(path: str | os.PathLike, require_answers: bool = True) -> SquadFile:
    """Read an official SQuAD JSON file (v1.1 or v2.0 layout); errors name the file and question.

    With `require_answers` (training and evaluation data) a question needs answers or
    `is_impossible: true`; without, unlabelled questions are read too (for prediction).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SQuAD file not found: {path}")
    try:
        root = json.loads(read_text(path))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{error.lineno}: not a JSON file ({error})") from None
    if not isinstance(root, dict) or not isinstance(root.get("data"), list):
        raise ValueError(f"{path}: not a SQuAD file (expected {{\"version\": ..., \"data\": [articles]}})")
    examples: list[SquadExample] = []
    seen: set[str] = set()
    paragraph_index = 0
    for a, article in enumerate(root["data"]):
        title = article.get("title", "") if isinstance(article, dict) else ""
        where = f"{path}: data[{a}] ({title!r})"
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise ValueError(f"{where}: an article needs a list of 'paragraphs'")
        for p, paragraph in enumerate(article["paragraphs"]):
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("context"), str) \
                    or not isinstance(paragraph.get("qas"), list):
                raise ValueError(f"{where}, paragraphs[{p}]: a paragraph needs a 'context' string and a 'qas' list")
            context = paragraph["context"]
            for q, qa in enumerate(paragraph["qas"]):
                qid = qa.get("id") if isinstance(qa, dict) else None
                if not isinstance(qid, str) or not qid:
                    raise ValueError(f"{where}, paragraphs[{p}], qas[{q}]: no question 'id' (a string)")
                where_q = f"{path}: question {qid}"
                if qid in seen:
                    raise ValueError(f"{where_q}: the id appears twice")
                seen.add(qid)
                if not isinstance(qa.get("question"), str):
                    raise ValueError(f"{where_q}: no 'question' text")
                answers = qa.get("answers", [])
                impossible = qa.get("is_impossible", False)
                if not isinstance(answers, list) or not isinstance(impossible, bool):
                    raise ValueError(f"{where_q}: 'answers' must be a list and 'is_impossible' true or false")
                gold = []
                for answer in answers:
                    if not isinstance(answer, dict) or not isinstance(answer.get("text"), str) \
                            or isinstance(answer.get("answer_start"), bool) \
                            or not isinstance(answer.get("answer_start"), int):
                        raise ValueError(f"{where_q}: an answer needs 'text' (string) and 'answer_start' (integer), "
                                         f"got {answer!r}")
                    gold.append((answer["text"], answer["answer_start"]))
                if impossible and gold:
                    raise ValueError(f"{where_q}: is_impossible is true but it has answers "
                                     f"(an unanswerable question's spans belong in 'plausible_answers')")
                if require_answers and not impossible and not gold:
                    raise ValueError(f"{where_q}: no answers and not marked is_impossible")
                examples.append(SquadExample(qid, qa["question"], context, gold, impossible, title, paragraph_index))
            paragraph_index += 1
    if not examples:
        raise ValueError(f"{path}: no questions (its 'data' holds no article with a question)")
    return SquadFile(path, examples, root["data"], root.get("version"))


# ---------------------------------------------------------------------------- features

@dataclass
class SquadFeatures:
    """Model rows and what postprocessing needs to map their outputs back to the passages.

    `features[k]` is a dict: `input_ids`, `token_type_ids` (lists, unpadded, `[CLS] Q [SEP] window
    [SEP]`), `example_index`, `window_index` and `context_offset` (position of the window's first
    passage token in `input_ids`), and for training `start_position`/`end_position` (0 = [CLS]).
    For example i: `offsets[i]` are the [start, end) character spans of its passage's tokens,
    `spans[i]` its windows as [start, end) passage-token indices. `skipped` lists the training
    questions left out as (id, reason).
    """

    features: list[dict]
    offsets: list[list[tuple[int, int]]]
    spans: list[list[tuple[int, int]]]
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def lengths(self) -> list[int]:
        return [len(f["input_ids"]) for f in self.features]


def _strip_specials(rows: list[dict], key: str) -> list[list]:
    return [row[key][1:-1] for row in rows]


def _answer_tokens(example: SquadExample, offsets: Sequence[tuple[int, int]], ends: list[int],
                   starts: list[int]) -> tuple[int, int] | str:
    """The [first, last] passage-token indices of the example's first answer, or why it cannot be
    aligned."""
    text, start_char = example.answers[0]
    end_char = start_char + len(text)
    if not text.strip():
        return "empty answer text"
    if start_char < 0 or end_char > len(example.context) or example.context[start_char:end_char] != text:
        found = example.context[max(0, start_char):max(0, end_char)]
        return f"answer {text!r} is not at answer_start {start_char} (the passage has {found!r} there)"
    first = bisect.bisect_right(ends, start_char)  # the first token ending after the answer starts
    last = bisect.bisect_left(starts, end_char) - 1  # the last token starting before it ends
    if first >= len(offsets) or last < first:
        return f"no token covers answer {text!r} at characters [{start_char}, {end_char})"
    return first, last


def convert_examples_to_features(examples: Sequence[SquadExample], tokenizer, settings: SquadSettings | None = None,
                                 is_training: bool = False) -> SquadFeatures:
    """Token rows for `examples` (see `SquadFeatures`).

    Each paragraph is tokenized once (its questions share it) and everything in one `encode_batch`
    call per kind, so a whole SQuAD dev file converts in seconds. With `is_training`, an example
    whose answer cannot be aligned is logged, listed in `skipped` and gets no feature.
    """
    settings = settings or SquadSettings()
    settings.check()
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    questions = _strip_specials(tokenizer.encode_batch(
        [e.question for e in examples], max_length=settings.max_query_length + 2, truncation="longest_first",
        padding=False), "input_ids")
    # One tokenization per distinct paragraph (index + text: two paragraphs may share a text).
    paragraph_of: dict[tuple[int, str], int] = {}
    for e in examples:
        paragraph_of.setdefault((e.paragraph, e.context), len(paragraph_of))
    rows = tokenizer.encode_batch([text for _, text in paragraph_of], truncation=False, padding=False,
                                  return_offsets=True)
    paragraph_ids = _strip_specials(rows, "input_ids")
    paragraph_offsets = [[tuple(o) for o in offsets] for offsets in _strip_specials(rows, "offsets")]
    paragraph_bounds = [([o[1] for o in offsets], [o[0] for o in offsets]) for offsets in paragraph_offsets]

    result = SquadFeatures([], [], [])
    for index, (example, question) in enumerate(zip(examples, questions)):
        p = paragraph_of[(example.paragraph, example.context)]
        ids, offsets = paragraph_ids[p], paragraph_offsets[p]
        spans = windows(len(ids), settings.max_seq_length - len(question) - 3, settings.doc_stride)
        result.offsets.append(offsets)
        result.spans.append(spans)
        answer = None
        if is_training and not example.is_impossible:
            answer = _answer_tokens(example, offsets, *paragraph_bounds[p])
            if isinstance(answer, str):
                result.skipped.append((example.qas_id, answer))
                continue
        context_offset = len(question) + 2
        head = [cls, *question, sep]
        for w, (start, end) in enumerate(spans):
            feature = {"input_ids": head + ids[start:end] + [sep],
                       "token_type_ids": [0] * context_offset + [1] * (end - start + 1),
                       "example_index": index, "window_index": w, "context_offset": context_offset}
            if is_training:
                if answer is not None and start <= answer[0] and answer[1] < end:
                    feature["start_position"] = context_offset + answer[0] - start
                    feature["end_position"] = context_offset + answer[1] - start
                else:  # unanswerable, or the answer is not (wholly) in this window: point at [CLS]
                    feature["start_position"] = feature["end_position"] = 0
            result.features.append(feature)
    if result.skipped:
        shown = "; ".join(f"{qid}: {why}" for qid, why in result.skipped[:5])
        logger.warning("skipped %d of %d training questions whose answer cannot be aligned (%s%s)",
                       len(result.skipped), len(examples), shown, " ..." if len(result.skipped) > 5 else "")
    return result


# Training questions whose answer may fail to align before the file is refused: the official files
# align all but a handful; a file past this share has wrong offsets (e.g. counted in bytes, or
# against another version of the passages) and would train on little or nothing.
MAX_UNALIGNED_FRACTION = 0.01


def check_alignment(skipped: Sequence[tuple[str, str]], examples: Sequence[SquadExample],
                    path: str | os.PathLike) -> None:
    """Refuse training data in which more than `MAX_UNALIGNED_FRACTION` of the answerable questions
    have an answer that cannot be found at its `answer_start`: ValueError naming the file, the count
    and the first few question ids with the reason."""
    answerable = sum(1 for e in examples if not e.is_impossible)
    if skipped and len(skipped) > MAX_UNALIGNED_FRACTION * answerable:
        shown = "; ".join(f"{qid}: {why}" for qid, why in skipped[:3])
        raise ValueError(f"{path}: {len(skipped)} of {answerable} answers cannot be aligned with their passage "
                         f"(more than {MAX_UNALIGNED_FRACTION:.0%}); first: {shown}")


def collate(features: Sequence[dict], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """A batch padded to its longest row: `input_ids`, `token_type_ids`, `attention_mask` (B, S) int64,
    and for training rows `start_positions`, `end_positions` (B,) int64."""
    batch = pad_batch(features, pad_token_id)
    if "start_position" in features[0]:
        batch["start_positions"] = torch.tensor([f["start_position"] for f in features], dtype=torch.long)
        batch["end_positions"] = torch.tensor([f["end_position"] for f in features], dtype=torch.long)
    return batch
