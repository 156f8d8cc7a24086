"""Fixtures shared by the task tests."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny models run best on one thread, and on a busy machine extra OpenMP threads only wait for
    cores; the process's setting is restored afterwards. Not autouse: a test module opts in with
    `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
