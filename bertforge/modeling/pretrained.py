"""Checkpoints in the ecosystem's layout: `config.json` + `model.safetensors` (or `pytorch_model.bin`).

Loading never runs code from a checkpoint: safetensors holds only tensors, and `.bin` files are read
with `torch.load(weights_only=True)`. A base-model checkpoint (keys `embeddings.*`) loads into a head
class (keys `bert.*`) and the other way round.

A checkpoint is checked whole before anything is built (`check_pretrained`, and `from_pretrained`
first of all): config.json's fields, then the layer count and sizes against the weights file's tensor
names and shapes, read from its header (nothing allocated), vocab.txt against the embedding rows, and
every tensor name and shape against the class built on the meta device. An encoder tensor missing,
left over or of another shape means the config and the weights disagree: a ValueError naming the
field, the files and what the weights hold. Head weights the checkpoint lacks are logged as newly
initialised, head tensors the class does not use in one WARNING line.

Wherever a model is named, `resolve_model_dir` turns the name into a directory: a local directory as
given, else a Hugging Face Hub id (`org/name`, optionally `@revision`) fetched through
`huggingface_hub`'s cache (only the files bertforge reads; `HF_HUB_OFFLINE` honoured).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch
from safetensors.torch import load_file
from torch import nn

from .._files import check_finished, save_safetensors
from ..tokenization.vocab import VOCAB_NAME, load_vocab
from .config import CONFIG_NAME, BertConfig
from .hub import (HUB_OPTIONAL, HUB_REQUIRED, HUB_WEIGHTS, LEGACY_WEIGHTS_NAME,  # noqa: F401 (re-exported)
                  WEIGHTS_NAME, resolve_model_dir)

logger = logging.getLogger("bertforge")

# Tensors some checkpoints carry that are not parameters here: buffers, and the MLM decoder that
# is tied to the word embeddings.
T = TypeVar("T")
# A safetensors header larger than this is not one (safetensors itself refuses above 100 MB).
_SAFETENSORS_HEADER_LIMIT = 100_000_000

_DERIVED_KEYS = ("embeddings.position_ids", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


@dataclass
class LoadReport:
    """What `from_pretrained` did not take from the checkpoint, or had to create."""

    newly_initialized: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)


def weights_path(directory: str | os.PathLike) -> Path:
    """The weights file of a checkpoint directory (`model.safetensors`, else `pytorch_model.bin`), or the
    weights file given; FileNotFoundError naming what is missing."""
    path = Path(directory)
    if path.is_dir():
        check_finished(path)  # a failed or killed run's model is not a finished one
        for name in (WEIGHTS_NAME, LEGACY_WEIGHTS_NAME):
            if (path / name).is_file():
                return path / name
        raise FileNotFoundError(f"no {WEIGHTS_NAME} or {LEGACY_WEIGHTS_NAME} in {directory}")
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    return path


def read_state_dict(directory: str | os.PathLike) -> tuple[dict[str, torch.Tensor], Path]:
    """The tensors of a checkpoint directory (or a single weights file) and the file they came from."""
    path = weights_path(directory)
    if path.suffix == ".safetensors":
        try:
            return load_file(path), path
        except Exception as error:  # a corrupt file: say which one
            raise ValueError(f"{path}: cannot read checkpoint ({_first_line(error)})") from None
    return _torch_load(path, "cpu"), path


def read_tensor_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """name -> shape of every tensor in a weights file, read without loading (or allocating) a tensor:
    safetensors' JSON header, or a `.bin` loaded onto the meta device. ValueError naming the file if it
    is not a weights file."""
    path = Path(path)
    if path.suffix != ".safetensors":
        return {name: tuple(tensor.shape) for name, tensor in _torch_load(path, "meta").items()}
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        prefix = handle.read(8)
        length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if not 0 < length <= min(size - 8, _SAFETENSORS_HEADER_LIMIT):
            raise ValueError(f"{path}: not a safetensors file (no valid header length in its first 8 bytes)")
        header = handle.read(length)
    try:
        entries = json.loads(header)
    except (ValueError, RecursionError):
        raise ValueError(f"{path}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(entries, dict):
        raise ValueError(f"{path}: not a safetensors file (its header is not a JSON object)")
    shapes = {}
    for name, entry in entries.items():
        if name == "__metadata__":
            continue
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):
            raise ValueError(f"{path}: not a safetensors file (tensor {name!r} has no valid shape)")
        shapes[name] = tuple(shape)
    return shapes


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _torch_load(path: Path, map_location: str) -> dict[str, torch.Tensor]:
    """A `pytorch_model.bin` state dict, read with `weights_only=True` (never running code from the
    file): ValueError naming the file if it cannot be read, holds other Python objects, or is not a
    mapping of names to tensors."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        # torch's message advises retrying with weights_only=False, which would run the file's code: not ours.
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        reason = next((line for line in lines if "weights_only" not in line and not line.startswith(
            ("Weights only load failed", "Check the documentation"))), "objects other than tensors")
        raise ValueError(f"{path}: refused: the file holds pickled Python objects that are not tensors ({reason}) "
                         f"and loading them could run code; bertforge reads tensors only: where you trust the "
                         f"file, convert it to {WEIGHTS_NAME} (safetensors) and load that") from None
    except Exception as error:  # a corrupt or truncated file: say which one
        raise ValueError(f"{path}: cannot read checkpoint ({_first_line(error)})") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise ValueError(f"{path}: not a state dict (a mapping of tensor names to tensors)")
    return state


def _normalize_key(key: str) -> str:
    # Early PyTorch ports of Google's checkpoints named LayerNorm parameters gamma/beta.
    if key.endswith(".gamma"):
        return key[: -len("gamma")] + "weight"
    if key.endswith(".beta"):
        return key[: -len("beta")] + "bias"
    return key


def _renamed(tensors: dict[str, T], prefix: str) -> dict[str, T]:
    """A checkpoint's names (with their tensors, or shapes) as `prefix`'s class names them: gamma/beta
    renamed, buffers and tied copies dropped, `bert.` added or removed."""
    tensors = {_normalize_key(k): v for k, v in tensors.items()}
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
    return tensors


def _some(items: list[str], shown: int = 3) -> str:
    """The first `shown` of `items` and how many more: an error stays one readable line."""
    return "; ".join(items[:shown]) + (f"; and {len(items) - shown} more" if len(items) > shown else "")


def _groups(keys: list[str]) -> str:
    """Tensor names summarised by module (at most two levels deep): "cls.predictions.* (6), ..."."""
    counts: dict[str, int] = {}
    for key in keys:
        group = ".".join(key.split(".")[:-1][:2]) or key
        counts[group] = counts.get(group, 0) + 1
    return ", ".join(f"{group}.* ({count})" for group, count in counts.items())


# The encoder's own tensors (under a head class's `bert.`): a config and its weights must agree on each.
_ENCODER_PARTS = ("embeddings.", "encoder.")
_LAYER = re.compile(r"encoder\.layer\.(\d+)\.")
# Config fields read off the encoder's tensors: (tensor, axis, field).
_FIELDS_IN_SHAPES = (
    ("embeddings.word_embeddings.weight", 0, "vocab_size"),
    ("embeddings.word_embeddings.weight", 1, "hidden_size"),
    ("embeddings.position_embeddings.weight", 0, "max_position_embeddings"),
    ("embeddings.token_type_embeddings.weight", 0, "type_vocab_size"),
    ("encoder.layer.0.intermediate.dense.weight", 0, "intermediate_size"),
)
# A vocab.txt may be shorter than the embedding matrix by the rows that round vocab_size up for fast
# matrix products (to a multiple of 8 ... 128); more missing tokens mean another vocabulary.
VOCAB_PADDING = 128


def check_encoder_shapes(config: BertConfig, shapes: dict[str, tuple[int, ...]], config_source: str,
                         weights_source: str) -> None:
    """The layer count and the sizes in `config` against a weights file's tensor names and shapes, before
    anything is built: ValueError naming the field, both files and what the weights hold.

    `num_hidden_layers: 100000` against a 6-layer file is refused here in microseconds, where building
    the model first would allocate layers until memory runs out.
    """
    tensors = {k[len("bert."):] if k.startswith("bert.") else k: v for k, v in _renamed(shapes, "").items()}
    layers = sorted({int(match[1]) for key in tensors if (match := _LAYER.match(key))})
    if not layers:
        raise ValueError(f"{weights_source} holds no encoder layers (no encoder.layer.N tensors): not a BERT "
                         f"checkpoint, or not the one {config_source} describes")
    if layers != list(range(len(layers))):
        gap = next(i for i in range(len(layers)) if i not in layers)
        raise ValueError(f"{weights_source}: encoder layer {gap} is missing (the file holds layers "
                         f"{layers[0]} to {layers[-1]} with gaps)")
    if config.num_hidden_layers != len(layers):
        raise ValueError(f"{config_source}: num_hidden_layers is {config.num_hidden_layers} but {weights_source} "
                         f"holds {len(layers)} encoder layers (encoder.layer.0 to encoder.layer.{len(layers) - 1}); "
                         f"the config and the weights disagree")
    disagree = []
    for name, axis, field_name in _FIELDS_IN_SHAPES:
        shape = tensors.get(name)
        if shape is not None and len(shape) == 2 and shape[axis] != getattr(config, field_name):
            disagree.append(f"{field_name} is {getattr(config, field_name)} but {name} has {shape[axis]} "
                            f"{'rows' if axis == 0 else 'columns'}")
    if disagree:
        raise ValueError(f"{config_source} disagrees with {weights_source}: " + _some(disagree))


def check_vocabulary(vocab_file: str | os.PathLike, config: BertConfig, config_source: str) -> dict[str, int]:
    """`vocab.txt` against the config's vocab_size (which the weights' embedding rows have matched):
    ValueError naming both files and both counts when it holds more tokens than there are embeddings
    (their ids would index past the matrix) or many fewer (another vocabulary: words would map to the
    wrong rows, or all to [UNK]); duplicates and missing special tokens are `load_vocab`'s errors."""
    vocab = load_vocab(vocab_file)
    tokens, rows = len(vocab), config.vocab_size
    if tokens > rows:
        raise ValueError(f"{vocab_file} holds {tokens:,} tokens but vocab_size in {config_source} is {rows:,}: "
                         f"the last {tokens - rows:,} token(s) have no embedding row; the vocabulary and the model "
                         f"disagree")
    if rows - tokens >= VOCAB_PADDING:
        raise ValueError(f"{vocab_file} holds {tokens:,} tokens but vocab_size in {config_source} is {rows:,} "
                         f"({rows - tokens:,} rows without a token): not the vocabulary this model was trained "
                         f"with")
    return vocab


def check_pretrained(directory: str | os.PathLike, config: BertConfig | None = None) -> BertConfig:
    """Check a checkpoint directory whole, reading only small files and the weights file's header:
    config.json's fields, the weights' layer count and sizes against them, vocab.txt (if present)
    against the embeddings. Returns the config; ValueError (one line, naming field and file) otherwise.
    Costs milliseconds: run it before long work (tokenizing a data set) that a bad checkpoint would waste.
    """
    directory = Path(directory)
    config_source = str(directory / CONFIG_NAME) if config is None else "the config given"
    if config is None:
        config = BertConfig.from_pretrained(directory)
    _check_checkpoint(directory, config, config_source)
    return config


def _check_checkpoint(directory: Path, config: BertConfig, config_source: str
                      ) -> tuple[Path, dict[str, tuple[int, ...]]]:
    """`check_pretrained`'s checks of `config` (read from `config_source`); (the weights file, its shapes)."""
    weights = weights_path(directory)
    shapes = read_tensor_shapes(weights)
    check_encoder_shapes(config, shapes, config_source, str(weights))
    if directory.is_dir() and (directory / VOCAB_NAME).exists():
        check_vocabulary(directory / VOCAB_NAME, config, config_source)
    return weights, shapes


def match_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor], prefix: str,
                     source: str) -> tuple[dict[str, torch.Tensor], LoadReport]:
    """Rename a checkpoint's tensors to `model`'s parameter names and check their shapes.

    `prefix` is the attribute that holds the encoder in a head class ("bert"), "" for BertModel.
    """
    tensors = _renamed(state_dict, prefix)
    expected = model.state_dict()
    mismatched = [
        f"{key}: checkpoint {tuple(tensors[key].shape)}, model {tuple(expected[key].shape)}"
        for key in expected if key in tensors and tensors[key].shape != expected[key].shape
    ]
    if mismatched:
        raise ValueError(
            f"{source}: tensor shapes disagree with the config ({model.config.hidden_size=}, "
            f"{model.config.num_hidden_layers=}, {model.config.vocab_size=}): " + _some(mismatched)
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
        # Google's modeling.py: truncated normal (±2σ) with σ = initializer_range, zero biases; or, where the
        # config says `initializer: normal`, transformers' plain normal (multi-label's new heads).
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            if self.config.initializer == "normal":
                nn.init.normal_(module.weight, std=std)
            else:
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
        config_source = str(directory / CONFIG_NAME) if config is None else "the config given"
        if config is None:
            config = BertConfig.from_pretrained(directory)
        if config_overrides:
            config = BertConfig.from_dict({**config.to_dict(), **config_overrides})
        # Checked whole before anything is built: the config against the weights file's header and the
        # vocabulary, then every tensor name and shape against the class built on the meta device.
        weights, shapes = _check_checkpoint(directory, config, config_source)
        report = cls._check_tensor_names(config, shapes, config_source, str(weights))
        model = cls(config)
        state_dict, source = read_state_dict(weights)
        tensors, _ = match_state_dict(model, state_dict, cls.base_model_prefix, str(source))
        model.load_state_dict(tensors, strict=False)
        if report.newly_initialized:
            logger.warning("%s: newly initialised from %s (train them before use): %s",
                           cls.__name__, source, ", ".join(report.newly_initialized))
        # The token-level heads are built without the pooler by design (as in transformers): its tensors
        # are left out silently; any other tensor left out is said, summarised, in one line.
        dropped = [k for k in report.unused if not k.startswith(("pooler.", "bert.pooler."))]
        if dropped:
            logger.warning("%s: %d tensors of %s are not used by this class (another head's weights, left out): %s",
                           cls.__name__, len(dropped), source, _groups(dropped))
        model.load_report = report
        return model.eval()

    @classmethod
    def _check_tensor_names(cls, config: BertConfig, shapes: dict[str, tuple[int, ...]], config_source: str,
                            weights_source: str) -> LoadReport:
        """Every tensor of the checkpoint against the parameters of `cls(config)`, built on the meta device
        (no memory): an encoder tensor missing, left over or of another shape is a ValueError (the config
        and the weights disagree); head tensors the class lacks or does not use go into the report."""
        with torch.device("meta"):
            expected = {k: tuple(v.shape) for k, v in cls(config).state_dict().items()}
        tensors = _renamed(shapes, cls.base_model_prefix)
        prefix = f"{cls.base_model_prefix}." if cls.base_model_prefix else ""
        encoder = tuple(prefix + part for part in _ENCODER_PARTS)
        mismatched = [f"{key}: checkpoint {tensors[key]}, config {shape}"
                      for key, shape in expected.items() if key in tensors and tensors[key] != shape]
        if mismatched:
            raise ValueError(f"{weights_source}: tensor shapes disagree with {config_source}: " + _some(mismatched))
        unused = [k for k in tensors if k not in expected]
        missing = [k for k in expected if k not in tensors]
        left_over = [k for k in unused if k.startswith(encoder)]
        if left_over:
            raise ValueError(f"{weights_source} holds encoder tensors that {config_source} leaves unused: "
                             f"{_some(left_over)}; the config and the weights disagree")
        lacking = [k for k in missing if k.startswith(encoder)]
        if lacking:
            raise ValueError(f"{weights_source} lacks encoder tensors that {config_source} needs: {_some(lacking)}")
        return LoadReport(newly_initialized=missing, unused=unused)

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write `config.json` and `model.safetensors` (atomically: a reader never sees half a file)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.config.save_pretrained(directory, architecture=type(self).__name__)
        tensors = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_safetensors(tensors, directory / WEIGHTS_NAME)


__all__ = ["CONFIG_NAME", "LoadReport", "PreTrainedBert", "check_encoder_shapes", "check_pretrained", "check_vocabulary",
           "match_state_dict", "read_state_dict", "read_tensor_shapes", "resolve_model_dir", "weights_path"]
