import sys

import pytest

from bertforge.training import memory


def test_opt_out_by_environment(monkeypatch):
    monkeypatch.setattr(memory, "_applied", False)
    monkeypatch.setenv(memory.ENV_SWITCH, "0")
    assert memory.keep_freed_memory() is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_applies_on_glibc_and_tensors_still_work(monkeypatch):
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc")
    monkeypatch.setattr(memory, "_applied", False)
    monkeypatch.delenv(memory.ENV_SWITCH, raising=False)
    assert memory.keep_freed_memory() is True
    assert memory.keep_freed_memory() is True  # idempotent
    import torch

    big = torch.ones(64 * 1024 * 1024 // 4)  # above glibc's largest mmap threshold (32 MB)
    assert float(big.sum()) == big.numel()
    del big
