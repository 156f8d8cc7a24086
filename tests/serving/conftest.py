"""Tiny random checkpoints (save_pretrained layout) for every pipeline, built once per session."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import torch

from bertforge.modeling import (
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bertforge.tokenization import BertTokenizer

WORDS = ("the a an is was of and to in on at for with by who what where when which did does "
         "paris france capital city london england berlin germany john smith mary jones works lives "
         "company acme river moved born year great good bad movie film story play plays "
         "it this that not very quite really loved hated fun boring").split()


def write_vocab(path: Path) -> Path:
    """A small uncased WordPiece vocabulary: specials, words, letters and their ## pieces, punctuation."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += list(string.ascii_lowercase) + [f"##{c}" for c in string.ascii_lowercase]
    tokens += list(string.digits) + list(".,!?;:'\"()-")
    tokens += [w for w in WORDS if w not in tokens]
    path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return path


def tiny_config(vocab_size: int, **overrides) -> BertConfig:
    values = dict(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=64)
    values.update(overrides)
    return BertConfig(**values)


def save_tiny(directory: Path, model_class, seed: int = 0, extra: dict | None = None, **config) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    vocab = write_vocab(directory / "vocab.txt")
    tokenizer = BertTokenizer(vocab, do_lower_case=True, model_max_length=64)
    tokenizer.save_pretrained(directory)
    torch.manual_seed(seed)
    cfg = tiny_config(len(tokenizer), **config)
    cfg.extra.update(extra or {})
    model = model_class(cfg)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """task -> checkpoint directory of a tiny random model for that pipeline."""
    root = tmp_path_factory.mktemp("tiny_models")
    return {
        "fill-mask": save_tiny(root / "mlm", BertForMaskedLM),
        "classify": save_tiny(root / "classify", BertForSequenceClassification,
                              id2label={0: "negative", 1: "positive"}),
        "regression": save_tiny(root / "regression", BertForSequenceClassification, num_labels=1),
        "tag": save_tiny(root / "tag", BertForTokenClassification,
                         id2label={0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}),
        "answer": save_tiny(root / "answer", BertForQuestionAnswering),
        "answer-v2": save_tiny(root / "answer_v2", BertForQuestionAnswering, extra={"version_2_with_negative": True}),
        "embed": save_tiny(root / "embed", BertModel),
        "multiple-choice": save_tiny(root / "choice", BertForMultipleChoice,
                                     extra={"finetuning_task": "multiple-choice"}),
    }
