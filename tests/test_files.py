"""bertforge._files: the atomic writes every stage shares (atomic_open, atomic_path, write_text_atomic)."""

from __future__ import annotations

import os
import stat

import pytest

from bertforge._files import atomic_open, atomic_path, default_mode, write_text_atomic


def test_atomic_open_replaces_the_file_only_when_the_block_ends(tmp_path):
    path = tmp_path / "state.bin"
    path.write_bytes(b"old")
    with atomic_open(path, "wb") as file:
        file.write(b"new")
        assert path.read_bytes() == b"old"  # not yet: a reader sees the previous content
    assert path.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.bin"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "state.bin"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="interrupted"):
        with atomic_open(path, "wb", fsync=True) as file:
            file.write(b"half")
            raise RuntimeError("interrupted")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.bin"]


def test_a_fixed_temporary_name_is_used_and_cleaned(tmp_path):
    path = tmp_path / "shard.npy"
    with pytest.raises(ValueError):
        with atomic_open(path, "wb", temporary="shard.npy.part") as file:
            assert os.path.basename(file.name) == "shard.npy.part"
            raise ValueError
    assert not (tmp_path / "shard.npy.part").exists() and not path.exists()


def test_atomic_path_gives_open_s_permissions_even_if_the_writer_makes_the_file_owner_only(tmp_path):
    path = tmp_path / "model.safetensors"
    with atomic_path(path) as temporary:
        with open(temporary, "wb") as file:
            file.write(b"x")
        os.chmod(temporary, 0o600)  # as safetensors leaves its files
    assert path.read_bytes() == b"x"
    assert stat.S_IMODE(path.stat().st_mode) == default_mode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_write_text_atomic_keeps_newlines_as_written(tmp_path):
    path = tmp_path / "vocab.txt"
    write_text_atomic(path, "a\r\nb\n")
    assert path.read_bytes() == b"a\r\nb\n"
    assert stat.S_IMODE(path.stat().st_mode) == default_mode()
