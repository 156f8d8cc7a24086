"""Checkpoints in the ecosystem's layout: `config.json` + `model.safetensors` (or `pytorch_model.bin`).

Loading never runs code from a checkpoint: safetensors holds only tensors, and `.bin` files are read
with `torch.load(weights_only=True)`. A base-model checkpoint (keys `embeddings.*`) loads into a head
class (keys `bert.*`) and the other way round; head weights that the checkpoint lacks are reported
as newly initialised, and a tensor whose shape disagrees with the config is an error naming it.

Wherever a model is named, `resolve_model_dir` turns the name into a directory: a local directory as
given, else a Hugging Face Hub id (`org/name`, optionally `@revision`) fetched through
`huggingface_hub`'s cache (only the files bertforge reads; `HF_HUB_OFFLINE` honoured).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from .._files import check_finished, save_safetensors
from .config import CONFIG_NAME, BertConfig
from .hub import (HUB_OPTIONAL, HUB_REQUIRED, HUB_WEIGHTS, LEGACY_WEIGHTS_NAME,  # noqa: F401 (re-exported)
                  WEIGHTS_NAME, resolve_model_dir)

logger = logging.getLogger("bertforge")

# Tensors some checkpoints carry that are not parameters here: buffers, and the MLM decoder that
# is tied to the word embeddings.
_DERIVED_KEYS = ("embeddings.position_ids", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


@dataclass
class LoadReport:
    """What `from_pretrained` did not take from the checkpoint, or had to create."""

    newly_initialized: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)


def read_state_dict(directory: str | os.PathLike) -> tuple[dict[str, torch.Tensor], Path]:
    """The tensors of a checkpoint directory (or a single weights file) and the file they came from."""
    path = Path(directory)
    if path.is_dir():
        check_finished(path)  # a failed or killed run's model is not a finished one
        for name in (WEIGHTS_NAME, LEGACY_WEIGHTS_NAME):
            if (path / name).is_file():
                path = path / name
                break
        else:
            raise FileNotFoundError(f"no {WEIGHTS_NAME} or {LEGACY_WEIGHTS_NAME} in {directory}")
    elif not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        if path.suffix == ".safetensors":
            return load_file(path), path
        return torch.load(path, map_location="cpu", weights_only=True), path
    except Exception as error:  # a corrupt file: say which one
        raise ValueError(f"{path}: cannot read checkpoint ({error})") from None


def _normalize_key(key: str) -> str:
    # Early PyTorch ports of Google's checkpoints named LayerNorm parameters gamma/beta.
    if key.endswith(".gamma"):
        return key[: -len("gamma")] + "weight"
    if key.endswith(".beta"):
        return key[: -len("beta")] + "bias"
    return key


def match_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor], prefix: str,
                     source: str) -> tuple[dict[str, torch.Tensor], LoadReport]:
    """Rename a checkpoint's tensors to `model`'s parameter names and check their shapes.

    `prefix` is the attribute that holds the encoder in a head class ("bert"), "" for BertModel.
    """
    tensors = {_normalize_key(k): v for k, v in state_dict.items()}
    if "cls.predictions.bias" not in tensors and "cls.predictions.decoder.bias" in tensors:
        tensors["cls.predictions.bias"] = tensors["cls.predictions.decoder.bias"]
    for key in list(tensors):
        if key.endswith(_DERIVED_KEYS):
            del tensors[key]
    checkpoint_is_base = not any(k.startswith("bert.") for k in tensors)
    if prefix and checkpoint_is_base:
        tensors = {(f"{prefix}.{k}" if k.startswith(("embeddings.", "encoder.", "pooler.")) else k): v
                   for k, v in tensors.items()}
    elif not prefix and not checkpoint_is_base:
        tensors = {k[len("bert."):] if k.startswith("bert.") else k: v for k, v in tensors.items()}

    expected = model.state_dict()
    mismatched = [
        f"  {key}: checkpoint {tuple(tensors[key].shape)}, model {tuple(expected[key].shape)}"
        for key in expected if key in tensors and tensors[key].shape != expected[key].shape
    ]
    if mismatched:
        raise ValueError(
            f"{source}: tensor shapes disagree with the config ({model.config.hidden_size=}, "
            f"{model.config.num_hidden_layers=}, {model.config.vocab_size=}):\n" + "\n".join(mismatched)
        )
    report = LoadReport(
        newly_initialized=[k for k in expected if k not in tensors],
        unused=[k for k in tensors if k not in expected],
    )
    return {k: v for k, v in tensors.items() if k in expected}, report


class PreTrainedBert(nn.Module):
    """Weight initialisation and checkpoint I/O shared by BertModel and every head."""

    # Attribute holding the encoder in a head class; "" for BertModel itself.
    base_model_prefix = "bert"

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.load_report: LoadReport | None = None

    def _init_module(self, module: nn.Module) -> None:
        # Google's modeling.py: truncated normal (±2σ) with σ = initializer_range, zero biases.
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.trunc_normal_(module.weight, std=std, a=-2 * std, b=2 * std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def init_weights(self) -> None:
        # A head class's encoder initialised itself when it was built.
        for name, child in self.named_children():
            if name != self.base_model_prefix:
                child.apply(self._init_module)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, config: BertConfig | None = None, **config_overrides):
        """Build the model from `directory/config.json` and load `model.safetensors` (or `.bin`) into it.

        `config_overrides` replace config fields, e.g. `num_labels=3` for a new classifier head.
        `directory` may also name a Hub model (see `resolve_model_dir`).
        """
        directory = Path(directory)
        if not directory.exists():  # (a weights file is taken as it is)
            directory = resolve_model_dir(directory)
        if config is None:
            config = BertConfig.from_pretrained(directory)
        if config_overrides:
            config = BertConfig.from_dict({**config.to_dict(), **config_overrides})
        model = cls(config)
        state_dict, source = read_state_dict(directory)
        tensors, report = match_state_dict(model, state_dict, cls.base_model_prefix, str(source))
        model.load_state_dict(tensors, strict=False)
        if report.newly_initialized:
            logger.warning("%s: newly initialised from %s (train them before use): %s",
                           cls.__name__, source, ", ".join(report.newly_initialized))
        if report.unused:
            logger.info("%s: unused weights in %s: %s", cls.__name__, source, ", ".join(report.unused))
        model.load_report = report
        return model.eval()

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write `config.json` and `model.safetensors` (atomically: a reader never sees half a file)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.config.save_pretrained(directory, architecture=type(self).__name__)
        tensors = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_safetensors(tensors, directory / WEIGHTS_NAME)


__all__ = ["CONFIG_NAME", "LoadReport", "PreTrainedBert", "read_state_dict", "match_state_dict", "resolve_model_dir"]
