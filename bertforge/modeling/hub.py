"""Models named by Hugging Face Hub id: `resolve_model_dir` turns a name into a local directory.

A local directory wins; otherwise `org/name` (optionally `@revision`) is fetched through
`huggingface_hub`'s cache, only the files bertforge reads, with `HF_HUB_OFFLINE` honoured. The
functions look `huggingface_hub`'s download and cache calls up at call time (`huggingface_hub.x`),
so that a test can stand in for the network.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import huggingface_hub
import huggingface_hub.constants
from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RemoteEntryNotFoundError

__all__ = ["HUB_OPTIONAL", "HUB_REQUIRED", "HUB_WEIGHTS", "LEGACY_WEIGHTS_NAME", "WEIGHTS_NAME", "resolve_model_dir"]

WEIGHTS_NAME = "model.safetensors"
LEGACY_WEIGHTS_NAME = "pytorch_model.bin"

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
        return bool(huggingface_hub.constants.HF_HUB_OFFLINE)
    return value.strip().upper() in {"1", "ON", "YES", "TRUE"}


def _hub_cache() -> str:
    """HF_HUB_CACHE (or HF_HOME/hub) as the environment says now, else huggingface_hub's default."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return huggingface_hub.constants.HF_HUB_CACHE


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
    cache = _hub_cache()

    def cached(filename: str) -> str | None:
        found = huggingface_hub.try_to_load_from_cache(repo_id, filename, cache_dir=cache, revision=revision)
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
    cache = _hub_cache()

    def fetch(filename: str) -> str | None:
        try:
            return huggingface_hub.hf_hub_download(repo_id, filename, revision=revision, cache_dir=cache)
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
