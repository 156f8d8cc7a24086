"""BertConfig: the hyper-parameters of a BERT encoder, stored as Hugging Face's `config.json`.

The field names are those of the ecosystem's `config.json`, so a checkpoint directory written by
bertforge loads in Hugging Face transformers and the other way round. Keys that bertforge does not
use are kept in `extra` and written back on save: nothing a user had in the file is lost.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._files import check_finished
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
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not one of {ACTIVATIONS}")
        if self.id2label is not None:
            self.id2label = {int(k): v for k, v in self.id2label.items()}
            self.num_labels = len(self.id2label)

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
        values = dict(values)
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        extra = dict(values.pop("extra", {}))
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
        return values

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "BertConfig":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file not found: {path}")
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not valid JSON ({error})") from None
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
