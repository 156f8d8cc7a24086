"""benchmarks/finetune.py's measurement of a side: the child's peak memory, and a failing side stops
the benchmark instead of being read as a result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
TOUCH = "import numpy as np; a = np.ones(({mb} << 20) // 8); print(int(a.sum()))"


def measure(command: list[str], capture: bool) -> list:
    """run_measured as the benchmark uses it: from the script's own small process (a child's peak counts
    from the resident memory of the process that starts it, so pytest's own would hide it)."""
    probe = (f"import json, sys; sys.path.insert(0, {str(BENCHMARKS)!r}); import finetune; "
             f"print(json.dumps(finetune.run_measured({command!r}, capture={capture})))")
    return json.loads(subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                                     text=True).stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss is in KB on Linux only")
def test_peak_memory_is_the_childs():
    stdout, big = measure([sys.executable, "-c", TOUCH.format(mb=300)], capture=True)
    assert stdout.strip() == str((300 << 20) // 8)
    _, small = measure([sys.executable, "-c", TOUCH.format(mb=10)], capture=False)
    assert 300 <= big < 400 and small < 100


def test_failing_side_raises():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import finetune
    finally:
        sys.path.remove(str(BENCHMARKS))
    with pytest.raises(subprocess.CalledProcessError):
        finetune.run_measured([sys.executable, "-c", "raise SystemExit(3)"], capture=True)
