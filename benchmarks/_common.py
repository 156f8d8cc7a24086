"""Helpers that the benchmark scripts share, so that each does not carry its own copy.

The scripts are run as files (`python benchmarks/pretrain.py`), not as modules of a package: Python
then puts their folder first on `sys.path`, which is what lets them `from _common import ...`
from any working directory. The leading underscore says this file is not a benchmark itself.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
from pathlib import Path


def log(message: str) -> None:
    """Progress for a person watching: stderr, since stdout carries the one JSON line of results."""
    print(message, file=sys.stderr, flush=True)


def cpu_model() -> str:
    """The CPU's marketing name, so that results from different machines can be told apart."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def quiet_libraries() -> None:
    """Leave stderr to our own progress: bertforge's and transformers' warnings and progress bars off."""
    logging.getLogger("bertforge").setLevel(logging.ERROR)
    import transformers  # here, not at the top: the benchmarks that never call this need not load it

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def load_average(warn_above: float = 1.5) -> float:
    """The 1-minute load average, with a warning above `warn_above`: other work on the machine
    distorts the timings."""
    load = os.getloadavg()[0]
    if load > warn_above:
        log(f"warning: load average {load:.2f} on {os.cpu_count()} CPUs: timings will be noisy")
    return load
