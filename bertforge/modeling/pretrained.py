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
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from .._files import check_finished, save_safetensors
from .config import CONFIG_NAME, BertConfig

logger = logging.getLogger("bertforge")

WEIGHTS_NAME = "model.safetensors"
LEGACY_WEIGHTS_NAME = "pytorch_model.bin"
# Tensors some checkpoints carry that are not parameters here: buffers, and the MLM decoder that
# is tied to the word embeddings.
_DERIVED_KEYS = ("embeddings.position_ids", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


# What bertforge reads from a Hub model: the config, one weights file, the tokenizer's two files.
HUB_REQUIRED = ("config.json",)
HUB_WEIGHTS = (WEIGHTS_NAME, LEGACY_WEIGHTS_NAME)
HUB_OPTIONAL = ("vocab.txt", "tokenizer_config.json")
# `name` or `org/name` (the Hub's repository id rules), then an optional `@revision`.
_HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*(?:/[A-Za-z0-9][\w.-]*)?)(?:@(?P<revision>[\w./-]+))?")


def _hub_offline() -> bool:
    """HF_HUB_OFFLINE as the environment says now (huggingface_hub reads it once, at import)."""
    value = os.environ.get("HF_HUB_OFFLINE")
    if value is None:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    return value.strip().upper() in {"1", "ON", "YES", "TRUE"}


def _hub_cache() -> str:
    """HF_HUB_CACHE (or HF_HOME/hub) as the environment says now, else huggingface_hub's default."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def resolve_model_dir(name_or_path: str | os.PathLike) -> Path:
    """The local directory holding model `name_or_path`: the directory itself, or a Hub model's snapshot.

    A local directory always wins. Otherwise a name like `google-bert/bert-base-uncased` (optionally
    `@revision`: a branch, tag or commit) is fetched through huggingface_hub's cache (HF_HUB_CACHE),
    only config.json, model.safetensors (else pytorch_model.bin), vocab.txt and tokenizer_config.json;
    with HF_HUB_OFFLINE=1 only the cache is read. Raises FileNotFoundError naming what is missing and
    how to get it.
    """
    path = Path(name_or_path)
    if path.is_dir():
        return path
    name = str(name_or_path)
    match = _HUB_ID.fullmatch(name)
    if match is None or path.exists():
        raise FileNotFoundError(f"model directory not found: {name}")
    repo_id, revision = match["repo"], match["revision"]
    if _hub_offline():
        return _cached_snapshot(name, repo_id, revision)
    return _download_snapshot(name, repo_id, revision)


def _download_command(repo_id: str, revision: str | None) -> str:
    files = " ".join((*HUB_REQUIRED, WEIGHTS_NAME, *HUB_OPTIONAL))
    return f"hf download {repo_id}{f' --revision {revision}' if revision else ''} {files}"


def _hub_model(name: str, repo_id: str, revision: str | None) -> str:
    return f"{name}: no such local directory, and the Hub model {repo_id}" + (
        f" (revision {revision})" if revision else "")


def _cached_snapshot(name: str, repo_id: str, revision: str | None) -> Path:
    """HF_HUB_OFFLINE: the snapshot in the cache that holds the config and a weights file, or an error."""
    from huggingface_hub import try_to_load_from_cache

    cache = _hub_cache()

    def cached(filename: str) -> str | None:
        found = try_to_load_from_cache(repo_id, filename, cache_dir=cache, revision=revision)
        return found if isinstance(found, str) else None  # (not cached, or cached as absent)

    config = cached(HUB_REQUIRED[0])
    weights = next((found for found in map(cached, HUB_WEIGHTS) if found), None)
    if config is None or weights is None:
        what = "is not" if config is None else f"has no {' or '.join(HUB_WEIGHTS)}"
        raise FileNotFoundError(
            f"{_hub_model(name, repo_id, revision)} {what} in the Hub cache {cache} while HF_HUB_OFFLINE=1: "
            f"unset HF_HUB_OFFLINE to download it, or run `{_download_command(repo_id, revision)}` where the "
            "Hub is reachable")
    return Path(config).parent


def _download_snapshot(name: str, repo_id: str, revision: str | None) -> Path:
    """Online: the files bertforge reads, fetched into (or found in) huggingface_hub's cache."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RemoteEntryNotFoundError

    cache = _hub_cache()

    def fetch(filename: str) -> str | None:
        try:
            return hf_hub_download(repo_id, filename, revision=revision, cache_dir=cache)
        except RemoteEntryNotFoundError:  # the repository has no such file
            return None

    where = _hub_model(name, repo_id, revision)
    try:
        config = fetch(HUB_REQUIRED[0])
        if config is None:
            raise FileNotFoundError(f"{where} has no config.json: not a BERT checkpoint")
        weights = next((found for found in map(fetch, HUB_WEIGHTS) if found), None)
        if weights is None:
            raise FileNotFoundError(f"{where} has no {' or '.join(HUB_WEIGHTS)}")
        for filename in HUB_OPTIONAL:
            fetch(filename)
    except LocalEntryNotFoundError as error:  # no network, and nothing cached
        raise FileNotFoundError(f"{where} cannot be downloaded and is not in the Hub cache {cache}: "
                                f"{str(error).splitlines()[0]}") from None
    except HfHubHTTPError as error:  # no such repository or revision, gated, ...
        raise FileNotFoundError(f"{where} cannot be fetched: {str(error).splitlines()[0]}") from None
    return Path(config).parent


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
