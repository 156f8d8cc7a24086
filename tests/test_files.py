"""bertforge._files: the atomic writes every stage shares (atomic_open, atomic_path, write_text_atomic,
save_safetensors): symlinks followed, special files refused, a full disk named in one line; and the lock
that gives an output directory to one run (issue 49, items 5, 6 and 8)."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

import bertforge._files as files
from bertforge._checks import check_output
from bertforge._files import (LOCK, DiskFullError, atomic_open, atomic_path, default_mode, is_disk_full, own_directory,
                              save_safetensors, write_target, write_text_atomic)


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


# ---------------------------------------------------------------------------- symlinks and special files

def test_a_symlink_is_followed_its_target_replaced_and_the_link_kept(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = elsewhere / "real.txt"
    target.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    write_text_atomic(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new"
    with atomic_path(link) as temporary:
        assert os.path.dirname(temporary) == str(elsewhere)  # the temporary file is beside the target
        with open(temporary, "w") as file:
            file.write("newer")
    assert link.is_symlink() and target.read_text() == "newer"
    save_safetensors({"w": torch.ones(2)}, link)
    assert link.is_symlink() and torch.equal(load_file(target)["w"], torch.ones(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "link.txt"]
    assert sorted(p.name for p in elsewhere.iterdir()) == ["real.txt"]
    # A dangling link: the file it names is created, as open() would.
    dangling = tmp_path / "dangling"
    dangling.symlink_to(elsewhere / "new.txt")
    write_text_atomic(dangling, "made")
    assert dangling.is_symlink() and (elsewhere / "new.txt").read_text() == "made"


def test_a_fifo_is_refused_before_anything_is_written(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "to-pipe"
    link.symlink_to(fifo)
    calls = []
    for path in (fifo, link):
        with pytest.raises(ValueError, match=r"is a FIFO \(named pipe\), not a regular file: refusing to write"):
            with atomic_open(path, "w") as file:
                calls.append(file)  # never reached: refused before the temporary file exists
        with pytest.raises(ValueError, match="is a FIFO"):
            write_text_atomic(path, "x")
        with pytest.raises(ValueError, match="is a FIFO"):
            save_safetensors({"w": torch.ones(1)}, path)
    assert calls == []
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe", "to-pipe"]  # no temporary left
    with pytest.raises(ValueError, match=f"{link} \\(-> {fifo}\\) is a FIFO"):
        write_target(link)


def test_a_directory_and_a_device_are_refused_by_a_check_that_writes_nothing(tmp_path):
    with pytest.raises(ValueError, match="is a directory, not a regular file"):
        write_target(tmp_path)
    # /dev/null is only stat'ed: the check raises before any file is opened or created.
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    with pytest.raises(ValueError, match="^/dev/null is a character device, not a regular file"):
        write_target("/dev/null")
    link = tmp_path / "null"
    link.symlink_to("/dev/null")
    with pytest.raises(ValueError, match="is a character device"):
        write_target(link)
    with pytest.raises(ValueError, match="--output /dev/null is a character device"):
        check_output("/dev/null", [], overwrite=True)
    with pytest.raises(ValueError, match=f"--output-file {link} \\(-> /dev/null\\) is a character device"):
        check_output(link, [], overwrite=True, flag="--output-file")
    assert write_target(tmp_path / "new.txt") == str(tmp_path / "new.txt")


# ---------------------------------------------------------------------------- a full disk

def _full_torch_save(state, file):
    """torch.save on a full disk: its writer fails while handling the file's ENOSPC."""
    file.write(b"PK")
    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0") from None


def test_a_full_disk_is_one_error_naming_the_file_and_the_old_content_survives(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"previous")
    with pytest.raises(DiskFullError) as caught:
        with atomic_open(path, "wb", fsync=True) as file:
            _full_torch_save({}, file)
    assert str(caught.value) == f"no space left on device writing {path}"
    assert caught.value.errno == errno.ENOSPC
    with pytest.raises(DiskFullError, match=f"no space left on device writing {tmp_path / 'm.txt'}$"):
        with atomic_open(tmp_path / "m.txt", "w") as file:
            raise OSError(errno.ENOSPC, "No space left on device")

    def full_save_file(tensors, filename, metadata=None):  # safetensors' error on a full disk
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                              'message: "No space left on device" })')

    monkeypatch.setattr(files, "save_file", full_save_file)
    model = tmp_path / "model.safetensors"
    model.write_bytes(b"old model")
    with pytest.raises(DiskFullError, match=f"writing {model}$"):
        save_safetensors({"w": torch.ones(1)}, model)
    assert path.read_bytes() == b"previous" and model.read_bytes() == b"old model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "model.safetensors"]
    # Other errors pass through unchanged.
    with pytest.raises(RuntimeError, match="interrupted"):
        with atomic_open(path, "wb"):
            raise RuntimeError("interrupted")
    assert not is_disk_full(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))


# ---------------------------------------------------------------------------- one run per output directory

HOLDER = textwrap.dedent("""
    import sys
    from bertforge._files import own_directory
    with own_directory(sys.argv[1], "the first run"):
        print("holding", flush=True)
        sys.stdin.read()  # until the test closes stdin
""")


def _hold(directory) -> subprocess.Popen:
    """Another process holding `directory` (as a running pretrain or finetune does), until its stdin closes."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(files.__file__).rsplit("/bertforge/", 1)[0],
                                                                  os.environ.get("PYTHONPATH")) if p)}
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env=env)
    assert process.stdout.readline() == "holding\n"
    return process


def test_a_second_run_is_refused_while_the_first_holds_the_directory(tmp_path):
    out = tmp_path / "out"
    first = _hold(out)
    try:
        assert (out / LOCK).read_text() == f"process {first.pid}: the first run\n"
        with pytest.raises(ValueError) as caught:
            with own_directory(out, "the second run"):
                pytest.fail("the second run got the directory")
        assert str(caught.value) == (f"{out} is in use by another run (process {first.pid}: the first run): wait "
                                     "for it to end, or choose another output directory")
    finally:
        first.stdin.close()
        assert first.wait(timeout=60) == 0
    assert not (out / LOCK).exists()  # released and removed on exit
    with own_directory(out, "the second run"):
        assert (out / LOCK).read_text() == f"process {os.getpid()}: the second run\n"
    assert not out.exists()  # each run created it and left nothing in it


def test_the_lock_is_released_when_the_run_fails_and_a_killed_holder_leaves_it_free(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with own_directory(out, "a failing run"):
            (out / "log.jsonl").write_text("{}\n")
            raise RuntimeError("failed")
    with own_directory(out, "the next run"):
        pass
    killed = _hold(out)
    killed.kill()  # SIGKILL: no clean-up runs, the stale file stays, the kernel drops the lock
    killed.wait(timeout=60)
    assert (out / LOCK).exists()
    with own_directory(out, "after a kill"):
        assert (out / LOCK).read_text() == f"process {os.getpid()}: after a kill\n"
    # A directory the run created is removed when the run left nothing in it; one it found is kept.
    fresh = tmp_path / "fresh"
    with own_directory(fresh, "refused at once"):
        pass
    assert not fresh.exists() and out.is_dir()
