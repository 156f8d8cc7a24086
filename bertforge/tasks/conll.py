"""CoNLL data for token classification (§4.3): reader, writer, sub-word windows, batches, metrics.

What fine-tuning (`bertforge.tasks.tag`) and the feature-based approach
(`bertforge.tasks.feature_based`) share, so that neither imports the other:

* `read_conll(path)`: the CoNLL column format (`word POS chunk TAG`, whitespace-separated, a blank line
  between sentences, `-DOCSTART-` lines between documents). Any number of columns: the word is the
  first, the tag the last. IOB1 tags (an entity starts with I- unless it follows one of its own type)
  are converted to IOB2 on reading, so the model always learns "B- starts an entity"; IOB2 and BIOES
  pass unchanged. A malformed line is an error naming `file:line`.
* The paper's tagging: each word is tokenized on its own, the first sub-token carries the word's label,
  the other sub-tokens get -100 (ignored by the loss) and are never read at prediction.
* `build_windows`: one model input per sentence (`[CLS] pieces [SEP]`). With `document_context`, the
  rest of the window is filled with the neighbouring tokens of the same document, half on each side
  (the other side takes what one side cannot use), and only the centre sentence is labelled and
  predicted: the paper's "maximal document context". A sentence longer than a window is cut into
  consecutive chunks of whole words, each chunk predicted in its own window (with the rest of the
  sentence, or document, as context), so no word is ever dropped from the evaluation.
* `ner_metrics`: entity-level precision, recall and F1 with conlleval's semantics (seqeval's
  `get_entities` is conlleval's chunk logic: an I- after O or another type starts an entity), micro
  over all entities and per entity type, plus token accuracy.
"""

from __future__ import annotations

import io
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
from seqeval.metrics.sequence_labeling import get_entities

from .._files import check_finished, read_text, write_text_atomic
from ..modeling.pretrained import check_pretrained, resolve_model_dir
from ..tokenization import BertTokenizer
from ..tokenization._read import read_json_object
from .arrays import pad_inputs, pad_rows

logger = logging.getLogger("bertforge")

__all__ = ["CONFIG_DOCUMENT_CONTEXT", "CONFIG_MAX_SEQ_LENGTH", "DEV_PREDICTIONS", "DOCSTART", "IGNORE_INDEX",
           "TASK_NAME", "NerData", "Sentence", "build_windows", "collate_windows", "label_list_from", "labelled_tokens",
           "ner_metrics", "prepare_ner_data", "read_conll", "read_for_prediction", "read_model_config", "to_iob2",
           "word_piece_ids", "write_conll"]

DOCSTART = "-DOCSTART-"
IGNORE_INDEX = -100  # the label of sub-tokens after the first and of context tokens (see heads.IGNORE_INDEX)
_TAG = re.compile(r"^(O|[BIES]-\S+)$")
# Keys of config.json that record how a NER model was trained, so that `predict` windows the same way.
CONFIG_DOCUMENT_CONTEXT = "ner_document_context"
CONFIG_MAX_SEQ_LENGTH = "ner_max_seq_length"
DEV_PREDICTIONS = "dev_predictions.txt"
# `finetuning_task` in the config.json of a NER model, fine-tuned (`tagging`) or feature-based (`feature_based`).
TASK_NAME = "ner"


# ---------------------------------------------------------------------------- reading and writing

@dataclass
class Sentence:
    """One sentence of a CoNLL file.

    `columns[i]` is word i's line split on whitespace (word first; gold tag last in a labelled file),
    kept as read so that predictions can be written back next to it. `tags` are the gold tags in IOB2
    (converted when the file is IOB1), None for an unlabelled file. `document` is the index of its
    document (-DOCSTART- separated; 0 throughout in a file without -DOCSTART-). `docstart` holds the
    columns of the -DOCSTART- line just before this sentence, if any (written back by `write_conll`).
    """

    columns: list[list[str]]
    tags: list[str] | None
    document: int
    line: int  # 1-based line of the first word in its file
    docstart: list[str] | None = None

    @property
    def words(self) -> list[str]:
        return [c[0] for c in self.columns]

    def __len__(self) -> int:
        return len(self.columns)


def to_iob2(tags: Sequence[str]) -> list[str]:
    """IOB1 -> IOB2: an I-X that does not continue an entity of type X (it follows O, the start of the
    sentence, or another type) becomes B-X. The identity on IOB2 and on BIOES tags."""
    out = []
    previous = "O"
    for tag in tags:
        if tag.startswith("I-"):
            kind = tag[2:]
            if previous == "O" or previous[2:] != kind or previous[0] not in "BI":
                tag = "B-" + kind
        out.append(tag)
        previous = tag
    return out


def read_conll(path: str | os.PathLike, labelled: bool = True) -> list[Sentence]:
    """The sentences of a CoNLL file, in order.

    `labelled`: the last column is the gold tag (`O`, or B-/I-/E-/S- and a type), read as IOB2.
    Every word line must have the same number of columns as the file's first (two at least when
    labelled). Errors name the file and line: a line with a different number of columns, a tag that
    is not a tag, a file without sentences.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"CoNLL file not found: {path}")
    sentences: list[Sentence] = []
    columns: list[list[str]] = []
    width: int | None = None
    document, documents_seen = 0, 0
    first_line, docstart = 0, None

    def close() -> None:
        nonlocal columns, docstart
        if columns:
            tags = to_iob2([c[-1] for c in columns]) if labelled else None
            sentences.append(Sentence(columns, tags, document, first_line, docstart))
            docstart = None
        columns = []

    with io.StringIO(read_text(path), newline=None) as handle:
        for number, raw in enumerate(handle, start=1):
            fields = raw.split()
            if not fields:
                close()
                continue
            if fields[0] == DOCSTART:
                close()
                # The first -DOCSTART- opens document 0; each later one the next document.
                document = documents_seen
                documents_seen += 1
                docstart = fields
                continue
            if width is None:
                width = len(fields)
                if labelled and width < 2:
                    raise ValueError(f"{path}:{number}: one column ({raw.strip()!r}); a labelled CoNLL file has "
                                     f"the word first and the tag last (e.g. 'word POS chunk TAG')")
            elif len(fields) != width:
                raise ValueError(f"{path}:{number}: {len(fields)} columns where the file has {width} "
                                 f"({raw.rstrip()!r})")
            if labelled and not _TAG.match(fields[-1]):
                raise ValueError(f"{path}:{number}: last column {fields[-1]!r} is not a tag (O, or B-/I-/E-/S- "
                                 f"and a type, e.g. B-PER)")
            if not columns:
                first_line = number
            columns.append(fields)
    close()
    if not sentences:
        raise ValueError(f"{path}: no sentences")
    return sentences


def label_list_from(sentences: Iterable[Sentence]) -> list[str]:
    """The tags seen, as the label list (label id i = entry i): "O" first, then by entity type, each
    type's tags in B, I, E, S order. Deterministic for a given set of tags."""
    seen = {tag for s in sentences for tag in (s.tags or ())}
    order = {"B": 0, "I": 1, "E": 2, "S": 3}
    rest = sorted(seen - {"O"}, key=lambda t: (t[2:], order[t[0]]))
    return ["O"] + rest


def write_conll(path: str | os.PathLike, sentences: Sequence[Sentence], predictions: Sequence[Sequence[str]]) -> Path:
    """Each word's columns as read plus its predicted tag (conlleval's input when the file was labelled),
    a blank line after each sentence, -DOCSTART- lines kept (with "O" as their prediction)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    for sentence, tags in zip(sentences, predictions, strict=True):
        if len(tags) != len(sentence):
            raise ValueError(f"sentence at line {sentence.line}: {len(tags)} predicted tags for {len(sentence)} words")
        if sentence.docstart is not None:
            lines += [" ".join(sentence.docstart + ["O"]), ""]
        lines += [" ".join(columns + [tag]) for columns, tag in zip(sentence.columns, tags)]
        lines.append("")
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------------------- sub-words and windows

def word_piece_ids(tokenizer, words: Iterable[str]) -> dict[str, list[int]]:
    """WordPiece ids of each distinct word, tokenized on its own (as the pre-tokenizer would split it in a
    sentence). A word the tokenizer reduces to nothing (e.g. only control characters) gets [UNK], so
    that every word has a first sub-token to carry its label."""
    unique = list(dict.fromkeys(words))
    rows = tokenizer.encode_batch(unique, truncation=False, padding=False) if unique else []
    return {word: (row["input_ids"][1:-1] or [tokenizer.unk_token_id]) for word, row in zip(unique, rows)}


def build_windows(sentences: Sequence[Sentence], pieces: dict[str, list[int]], max_seq_length: int,
                  cls_id: int, sep_id: int, label_map: dict[str, int] | None = None,
                  document_context: bool = False) -> list[dict]:
    """The model inputs of `sentences` (see the module docstring), NOT padded.

    Each window is `{"input_ids": [CLS] ... [SEP], "sentence": s, "word_start": j, "positions": [p...],
    and with a `label_map` "labels"}`: it predicts words j, j+1, ... of sentence s, the first sub-token of
    word j+k being at `positions[k]`; `labels` is -100 everywhere except at those positions (the gold
    tag's id). Without `document_context` the context is the sentence alone.
    """
    budget = max_seq_length - 2  # [CLS] and [SEP]
    if budget < 1:
        raise ValueError(f"max_seq_length={max_seq_length} leaves no room for a token")
    if document_context:
        groups: dict[int, list[int]] = {}
        for index, sentence in enumerate(sentences):
            groups.setdefault(sentence.document, []).append(index)
        group_list = list(groups.values())
    else:
        group_list = [[index] for index in range(len(sentences))]
    windows = []
    for group in group_list:
        # The group's tokens as one stream; a word longer than a window keeps its first `budget` pieces.
        stream: list[int] = []
        offsets: dict[int, list[int]] = {}  # sentence -> stream offset of each word, then the end
        for s in group:
            starts = []
            for word in sentences[s].words:
                starts.append(len(stream))
                stream.extend(pieces[word][:budget])
            offsets[s] = starts + [len(stream)]
        for s in group:
            starts = offsets[s]
            tags = sentences[s].tags if label_map is not None else None
            n_words = len(starts) - 1
            j = 0
            while j < n_words:
                k = j + 1  # the chunk: words j..k-1, as many as fit
                while k < n_words and starts[k + 1] - starts[j] <= budget:
                    k += 1
                begin, end = starts[j], starts[k]
                free = budget - (end - begin)
                # Centre the chunk; what one side cannot use goes to the other.
                left = min(begin, free // 2)
                right = min(len(stream) - end, free - left)
                left = min(begin, free - right)
                input_ids = [cls_id] + stream[begin - left:end + right] + [sep_id]
                positions = [1 + left + starts[t] - begin for t in range(j, k)]
                window = {"input_ids": input_ids, "sentence": s, "word_start": j, "positions": positions}
                if tags is not None:
                    labels = [IGNORE_INDEX] * len(input_ids)
                    for position, tag in zip(positions, tags[j:k]):
                        labels[position] = label_map[tag]
                    window["labels"] = labels
                windows.append(window)
                j = k
    return windows


def collate_windows(windows: Sequence[dict], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """A batch padded to its longest window: `input_ids`, `token_type_ids` (zeros), `attention_mask`
    (B, S) int64, and `labels` (B, S) int64 with -100 on padding when the windows are labelled."""
    rows = [w["input_ids"] for w in windows]
    batch = {name: torch.from_numpy(value) for name, value in pad_inputs(rows, None, pad_token_id).items()}
    if "labels" in windows[0]:
        batch["labels"] = torch.from_numpy(pad_rows([w["labels"] for w in windows], IGNORE_INDEX))
    return batch


def labelled_tokens(batch: dict[str, torch.Tensor]) -> int:
    """The `count_fn` of token classification: the loss is a mean over the labelled first sub-tokens."""
    return int((batch["labels"] != IGNORE_INDEX).sum())

# ---------------------------------------------------------------------------- metrics

def ner_metrics(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict[str, float]:
    """conlleval's scores of tag sequences (one per sentence), as fractions.

    `precision`, `recall`, `f1`: over all entities, an entity counting as correct only when its type
    and both boundaries match a gold entity; `precision_T`, `recall_T`, `f1_T` for each entity type T
    found in either; `accuracy`: of the tags, word by word. Entities are read with conlleval's chunk
    rules (seqeval's `get_entities`), so IOB1 and IOB2 sequences are both scored right.
    """
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted")
    counts: dict[str, list[int]] = {}  # type -> [correct, predicted, gold]
    words = right = 0
    for index, (g, p) in enumerate(zip(gold, predicted)):
        if len(g) != len(p):
            raise ValueError(f"sentence {index}: {len(g)} gold tags but {len(p)} predicted")
        words += len(g)
        right += sum(a == b for a, b in zip(g, p))
        gold_entities, predicted_entities = set(get_entities(list(g))), set(get_entities(list(p)))
        for kind, *_ in gold_entities:
            counts.setdefault(kind, [0, 0, 0])[2] += 1
        for entity in predicted_entities:
            entry = counts.setdefault(entity[0], [0, 0, 0])
            entry[1] += 1
            entry[0] += entity in gold_entities

    def scores(correct: int, n_predicted: int, n_gold: int) -> tuple[float, float, float]:
        precision = correct / n_predicted if n_predicted else 0.0
        recall = correct / n_gold if n_gold else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return precision, recall, f1

    total = [sum(c[i] for c in counts.values()) for i in range(3)]
    precision, recall, f1 = scores(*total)
    metrics = {"f1": f1, "precision": precision, "recall": recall, "accuracy": right / words if words else 0.0}
    for kind in sorted(counts):
        p, r, f = scores(*counts[kind])
        metrics.update({f"f1_{kind}": f, f"precision_{kind}": p, f"recall_{kind}": r})
    return metrics


# ---------------------------------------------------------------------------- data of both approaches

@dataclass
class NerData:
    """What fine-tuning and the feature-based approach share: the sentences, the label list and the windows."""

    tokenizer: Any
    train: list[Sentence]
    dev: list[Sentence]
    labels: list[str]
    train_windows: list[dict]
    dev_windows: list[dict]
    max_seq_length: int
    document_context: bool
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def label_map(self) -> dict[str, int]:
        return {label: i for i, label in enumerate(self.labels)}

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.labels))


def prepare_ner_data(model_dir: str | os.PathLike, train_file: str | os.PathLike, dev_file: str | os.PathLike, *,
                     document_context: bool = False, max_seq_length: int = 128,
                     max_train_examples: int | None = None, unseen_dev_tags: str = "error") -> NerData:
    """Read both files, take the label list from the training file, and window both.

    `max_train_examples` keeps the first N training sentences (document context then comes from those).
    A dev tag that the training sentences never have is refused (`check_dev_tags`), or with
    `unseen_dev_tags="warn"` logged (for subsets drawn by a program, as `bertforge reproduce` does).
    """
    train = read_conll(train_file)
    if max_train_examples is not None:
        train = train[:max_train_examples]
    dev = read_conll(dev_file)
    labels = label_list_from(train)
    try:
        check_dev_tags(dev, labels, dev_file, train_file, max_train_examples)
    except ValueError as error:
        if unseen_dev_tags != "warn":
            raise
        logger.warning("%s", error)
    check_pretrained(resolve_model_dir(model_dir))  # the checkpoint whole, before its data is tokenized
    tokenizer = BertTokenizer.from_pretrained(resolve_model_dir(model_dir))
    pieces = word_piece_ids(tokenizer, (w for s in train + dev for w in s.words))
    label_map = {label: i for i, label in enumerate(labels)}
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    train_windows = build_windows(train, pieces, max_seq_length, cls, sep, label_map, document_context)
    dev_windows = build_windows(dev, pieces, max_seq_length, cls, sep, None, document_context)
    return NerData(tokenizer, train, dev, labels, train_windows, dev_windows, max_seq_length, document_context)


def check_dev_tags(dev: Sequence[Sentence], labels: Sequence[str], dev_file: str | os.PathLike,
                   train_file: str | os.PathLike, max_train_examples: int | None = None) -> None:
    """ValueError naming the dev file's line and the tag, for the first dev tag that is not a training label:
    the model has no output for it, so every such entity would count as missed and the dev F1 that picks
    the best epoch would be wrong without a word (a typo such as B-PRE, or a type absent from training)."""
    known = set(labels)
    for sentence in dev:
        for offset, tag in enumerate(sentence.tags or ()):
            if tag not in known:
                source = f"the first {max_train_examples} sentences of {train_file}" if max_train_examples \
                    else str(train_file)
                raw = sentence.columns[offset][-1]
                shown = repr(tag) if raw == tag else f"{raw!r} ({tag} in IOB2)"
                raise ValueError(f"{dev_file}:{sentence.line + offset}: tag {shown} never appears in {source} "
                                 f"(its tags: {' '.join(labels)}): the model could not predict it; fix the tag "
                                 "or add training sentences with it")


# ---------------------------------------------------------------------------- reading for prediction

def read_model_config(model_dir: str | os.PathLike) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    check_finished(model_dir)  # a failed or killed run's model is not a finished one
    if not path.exists():
        raise FileNotFoundError(f"no config.json in {model_dir}")
    return read_json_object(path, "model config")


def _looks_labelled(path: Path, labels: Sequence[str]) -> bool:
    """Whether the last column of every word line is a tag of the model's kind (then it is the gold tag)."""
    kinds = {label[2:] for label in labels if label != "O"}
    with io.StringIO(read_text(path), newline=None) as handle:
        for raw in handle:
            fields = raw.split()
            if not fields or fields[0] == DOCSTART:
                continue
            if len(fields) < 2 or not _TAG.match(fields[-1]) or (fields[-1] != "O" and fields[-1][2:] not in kinds):
                return False
    return True


def read_for_prediction(input_file: str | os.PathLike, labels: Sequence[str]) -> tuple[list[Sentence], bool]:
    """The sentences of a file to tag, and whether its last column is a gold tag of the model's kind."""
    labelled = _looks_labelled(Path(input_file), labels) if Path(input_file).is_file() else False
    return read_conll(input_file, labelled=labelled), labelled
