"""BertConfig: the hyper-parameters of a BERT encoder, stored as Hugging Face's `config.json`.

The field names are those of the ecosystem's `config.json`, so a checkpoint directory written by
bertforge loads in Hugging Face transformers and the other way round. Keys that bertforge does not
use are kept in `extra` and written back on save: nothing a user had in the file is lost.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._files import check_finished
from ..tokenization._read import read_json_object, shown
from .hub import resolve_model_dir

CONFIG_NAME = "config.json"

# (layers L, hidden H, heads A) of the paper's and Turc et al.'s "well-read students" sizes.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
# How the weights a checkpoint lacks (a new head's) are drawn, both with std initializer_range: Google's
# truncated normal (cut at ±2σ, so its std is 0.88σ; the paper's, the default) or transformers' plain normal.
INITIALIZERS = ("truncated_normal", "normal")

# The config.json values that an evaluation on dev learns and writes into a fine-tuned model's config, each a
# path of keys: multi-label's decision thresholds (global and per label) and SQuAD 2.0's no-answer threshold
# (inside `squad`, beside the settings that do define the run). They belong to the model (predict, the
# pipelines and the server read them) but not to what defines a training run (architecture, vocabulary, task,
# labels): a run interrupted after an evaluation must resume although its checkpoint holds them and the
# resumed run's fresh model does not. This is the one place they are declared; `run_defining` leaves them
# out of a comparison and `restore_learned` carries them over.
LEARNED_BY_EVALUATION: tuple[tuple[str, ...], ...] = (
    ("multi_label_threshold",), ("multi_label_thresholds",), ("squad", "null_score_diff_threshold"))


def run_defining(values: dict[str, Any]) -> dict[str, Any]:
    """A config's values (`BertConfig.to_dict()`, or a checkpoint's copy of it) without those an evaluation
    learns (`LEARNED_BY_EVALUATION`): what two runs must share to be the same run. `values` is not changed."""
    values = dict(values)
    for path in LEARNED_BY_EVALUATION:
        parent = values
        for key in path[:-1]:
            child = parent.get(key)
            if not isinstance(child, dict):
                break
            parent[key] = child = dict(child)  # copied on the way down: the caller's dicts stay as they were
            parent = child
        else:
            parent.pop(path[-1], None)
    return values


def learned_values(values: dict[str, Any]) -> dict[tuple[str, ...], Any]:
    """The values at `LEARNED_BY_EVALUATION`'s paths that `values` (a config as a dict) holds, by path."""
    found = {}
    for path in LEARNED_BY_EVALUATION:
        node: Any = values
        for key in path:
            if not isinstance(node, dict) or key not in node:
                break
            node = node[key]
        else:
            found[path] = node
    return found


def restore_learned(config: "BertConfig", values: dict[str, Any]) -> None:
    """Set in `config.extra` what an evaluation had learned in `values` (a checkpoint's config as a dict), e.g.
    on resume: the model continues with the thresholds it had when the checkpoint was saved."""
    for path, value in learned_values(values).items():
        node = config.extra
        for key in path[:-1]:
            child = node.get(key)
            node[key] = child = dict(child) if isinstance(child, dict) else {}
            node = child
        node[path[-1]] = value


# The fields that count something (tokens, units, layers, labels): whole numbers of at least 1. The
# upper bound only keeps a typo from reaching torch as a size it cannot allocate or even represent.
_COUNTS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
           "max_position_embeddings", "type_vocab_size", "num_labels")
_MAX_COUNT = 2**31 - 1


def _is_int(value: Any) -> bool:
    """A whole number as JSON or numpy gives one; `true` is not a count, nor is 64.0."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _checked_labels(id2label: Any) -> dict[int, str] | None:
    """`id2label` with int keys: an object mapping the ids 0 .. n-1 (as JSON's strings or ints), each
    once, to distinct label names; ValueError otherwise (a gap would leave a class without a name)."""
    if id2label is None:
        return None
    if not isinstance(id2label, dict) or not id2label:
        raise ValueError(f'id2label must be a non-empty object {{"0": label, "1": label, ...}}, got {shown(id2label)}')
    labels: dict[int, str] = {}
    for key, label in id2label.items():
        if _is_int(key):
            index = int(key)
        elif isinstance(key, str) and key.strip().isdecimal() and key.strip().isascii():
            index = int(key)
        else:
            raise ValueError(f"id2label's keys must be the class ids 0, 1, ..., got {shown(key)}")
        if not isinstance(label, str):
            raise ValueError(f"id2label[{shown(key)}] must be a label name (a string), got {shown(label)}")
        if index in labels:
            raise ValueError(f"id2label gives class {index} twice")
        labels[index] = label
    missing = sorted(set(range(len(labels))) - set(labels))
    if missing:
        raise ValueError(f"id2label's ids must be 0 to {len(labels) - 1} without gaps; {missing[0]} is missing "
                         f"(ids given: {shown(sorted(labels))})")
    seen: set[str] = set()
    for name in labels.values():
        if name in seen:
            raise ValueError(f"id2label names two classes {shown(name)}; label names must differ")
        seen.add(name)
    return dict(sorted(labels.items()))


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"  # the exact erf GELU, as Google's modeling.py
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    initializer: str = "truncated_normal"  # one of INITIALIZERS; written to config.json only when not this
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    # The paper's left-to-right ablation (§5.1): every token attends only to its left.
    is_causal: bool = False
    # Task heads.
    num_labels: int = 2
    id2label: dict[int, str] | None = None
    classifier_dropout: float | None = None
    # Anything else found in config.json (architectures, model_type, transformers_version, ...).
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.id2label = _checked_labels(self.id2label)
        if self.id2label is not None:
            self.num_labels = len(self.id2label)
        self.check()

    def check(self) -> None:
        """Every field's type and range: ValueError naming the first field that cannot work.

        A value of the wrong type (`"512"`, `64.0`, `true` for a count) or out of range (0 layers, a
        NaN initializer_range, pad_token_id outside the vocabulary) would otherwise fail deep inside the
        model's construction, or worse, build a model that silently computes something else.
        """
        for name in _COUNTS:
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"{name} must be a whole number of at least 1, got {shown(value)}")
            if value > _MAX_COUNT:
                raise ValueError(f"{name} must be at most {_MAX_COUNT:,}, got {value:,}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if not isinstance(self.hidden_act, str) or self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {shown(self.hidden_act)} is not one of {ACTIVATIONS}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            value = getattr(self, name)
            if value is None and name == "classifier_dropout":
                continue
            if not _is_real(value) or not 0 <= value < 1:
                raise ValueError(f"{name} must be a number in [0, 1), got {shown(value)}")
        if self.initializer not in INITIALIZERS:
            raise ValueError(f"initializer must be one of {INITIALIZERS}, got {shown(self.initializer)}")
        for name in ("initializer_range", "layer_norm_eps"):
            value = getattr(self, name)
            if not _is_real(value) or not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number above 0, got {shown(value)}")
        if self.pad_token_id is not None and (not _is_int(self.pad_token_id)
                                              or not 0 <= self.pad_token_id < self.vocab_size):
            raise ValueError(f"pad_token_id must be a token id, from 0 to vocab_size - 1 "
                             f"({self.vocab_size - 1}), or null, got {shown(self.pad_token_id)}")
        if not isinstance(self.is_causal, bool):
            raise ValueError(f"is_causal must be true or false, got {shown(self.is_causal)}")

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def label2id(self) -> dict[str, int] | None:
        return None if self.id2label is None else {v: k for k, v in self.id2label.items()}

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "BertConfig":
        """A config from the paper's sizes (tiny ... large): FFN 4H, the BERT-base vocabulary."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        layers, hidden, heads = PRESETS[name]
        values = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                      intermediate_size=4 * hidden)
        values.update(overrides)
        return cls(**values)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "BertConfig":
        if not isinstance(values, dict):
            raise ValueError(f"a config must be a JSON object, not {type(values).__name__}")
        values = dict(values)
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        extra = values.pop("extra", {})
        if not isinstance(extra, dict):
            raise ValueError(f"extra must be an object, got {shown(extra)}")
        extra = dict(extra)
        kwargs = {key: value for key, value in values.items() if key in known}
        extra.update({key: value for key, value in values.items() if key not in known})
        # transformers writes label2id beside id2label; it is derived, so not kept twice.
        extra.pop("label2id", None)
        if extra.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(
                f"position_embedding_type={extra['position_embedding_type']!r} is not BERT's; "
                "only 'absolute' (learned positions) is supported"
            )
        if extra.get("is_decoder"):
            kwargs.setdefault("is_causal", True)
        return cls(**kwargs, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        values = {"model_type": "bert", **self.extra, **values}
        if self.id2label is None:
            del values["id2label"]
        else:
            values["id2label"] = {str(k): v for k, v in self.id2label.items()}
            values["label2id"] = self.label2id
        if values["classifier_dropout"] is None:
            del values["classifier_dropout"]
        if values["initializer"] == INITIALIZERS[0]:  # the default: configs stay as transformers writes them
            del values["initializer"]
        return values

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "BertConfig":
        """The config in a `config.json`: ValueError naming the file and the field at fault if the file
        is not a regular file of JSON (bounded in size: a link to /dev/zero is refused, not read) or a
        field's type or range is wrong."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"config file not found: {path}")
        values = read_json_object(path, "model config")
        try:
            return cls.from_dict(values)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{path}: {error}") from None

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> "BertConfig":
        """`directory/config.json` (or a config file); `directory` may name a Hub model (`resolve_model_dir`)."""
        directory = Path(directory)
        if not directory.exists():
            directory = resolve_model_dir(directory)
        if directory.is_dir():
            check_finished(directory)  # a failed or killed run's model is not a finished one
            return cls.from_json_file(directory / CONFIG_NAME)
        return cls.from_json_file(directory)

    def save_pretrained(self, directory: str | os.PathLike, architecture: str | None = None) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        values = self.to_dict()
        if architecture is not None:
            values["architectures"] = [architecture]
        (directory / CONFIG_NAME).write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")
