"""Fixtures shared by the task tests."""

from __future__ import annotations

from pathlib import Path
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


class _Stopped(Exception):
    """Raised into a run to stop it as a kill would: its checkpoints stay, its RUNNING marker too."""


def _stopped_and_resumed(make_task, args, stop_at_evaluation: int) -> tuple[dict, dict]:
    """A run of `make_task()` with `args` stopped during its `stop_at_evaluation`-th evaluation (so that a
    checkpoint saved after an earlier evaluation is the one to resume from), then finished with --resume in the
    same OUT, beside an uninterrupted run into OUT_straight. Returns the uninterrupted and the resumed run's
    final training states and the model config of the checkpoint the resumed run started from."""
    import dataclasses

    from bertforge.training.checkpoint import latest_checkpoint, load_checkpoint
    from bertforge.training.finetune import finetune

    out = Path(args.output_dir)
    straight = out.with_name(out.name + "_straight")
    finetune(make_task(), dataclasses.replace(args, output_dir=straight))
    task, calls = make_task(), []
    evaluate = task.evaluate

    def stops(model):
        calls.append(1)
        if len(calls) == stop_at_evaluation:
            raise _Stopped
        return evaluate(model)

    task.evaluate = stops
    with pytest.raises(_Stopped):
        finetune(task, args)
    assert (out / "RUNNING").is_file()
    resumed_from = load_checkpoint(latest_checkpoint(out / "checkpoints"))[0]["config"]
    finetune(make_task(), dataclasses.replace(args, resume=True))
    assert not (out / "RUNNING").exists()
    return (load_checkpoint(latest_checkpoint(straight / "checkpoints"))[0],
            load_checkpoint(latest_checkpoint(out / "checkpoints"))[0], resumed_from)


@pytest.fixture
def stopped_and_resumed():
    """`(make_task, args, stop_at_evaluation) -> (uninterrupted state, resumed state, config resumed from)`:
    see `_stopped_and_resumed`."""
    return _stopped_and_resumed
