"""`bertforge distill` refuses before any teacher work and never writes where it refused (issue 61): an
OUT holding a run, the user's teacher or student checkpoint as the output or the cache, a cache that
cannot be made; the teacher cache's integrity (a checksum, the settings that made it); --temperature and
--augment within stated bounds; a multi-label distillation resumed after an evaluation."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from bertforge.cli import main
from bertforge.distillation import distill, distill_task
from bertforge.distillation import distiller as distiller_module
from bertforge.training.finetune import FinetuneArguments

from .test_distill import encoder, make_teacher, sentences, teacher, write_classify  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("one_thread")


def _snapshot(directory: Path) -> dict[str, str]:
    """Every file under `directory` (relative name -> SHA-256 of its bytes): what "left untouched" compares."""
    return {str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.rglob("*")) if path.is_file()}


@pytest.fixture
def no_teacher_work(monkeypatch):
    """Any teacher load, teacher pass or augmentation fails the test: a refusal must come before them."""
    def fail(*args, **kwargs):
        pytest.fail("teacher work started before the refusal")
    monkeypatch.setattr(distiller_module, "load_for_inference", fail)
    monkeypatch.setattr(distiller_module, "teacher_outputs", fail)
    monkeypatch.setattr(distiller_module, "augmented_transfer", fail)


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bertforge distill: error: ") and "\n" not in err and "Traceback" not in err
    return err


# ---------------------------------------------------------------------------- 6: refusals before any teacher work

def test_an_out_holding_a_run_is_refused_before_the_teacher_pass(teacher, tmp_path, capsys, request):  # noqa: F811
    train = write_classify(tmp_path / "train.csv", sentences(12, 1))
    out = tmp_path / "out"
    command = ["distill", "--teacher", str(teacher), "--train-file", str(train), "--output-dir", str(out),
               "--max-steps", "1", "--batch-size", "12", "--no-progress"]
    assert main(command) == 0
    shutil.rmtree(out / "teacher_outputs")
    before = _snapshot(out)
    request.getfixturevalue("no_teacher_work")  # from here on
    for extra in ([], ["--augment", "2"]):
        assert "already holds a run: pass --resume" in _error(capsys, command + extra)
    assert "holds a single run (log.jsonl), not a learning-rate/seed grid" in _error(capsys, command + ["--seeds", "2"])
    assert not (out / "teacher_outputs").exists() and _snapshot(out) == before
    # a grid whose run directory already holds a run: refused too, naming that run
    grid = tmp_path / "grid"
    shutil.copytree(out, grid / "lr5e-05-seed42")
    assert "lr5e-05-seed42 already holds a run" in _error(capsys, ["distill", "--teacher", str(teacher), "--train-file",
                                                                   str(train), "--output-dir", str(grid), "--seeds",
                                                                   "1", "--lr-grid", "5e-5", "--seed", "42"])
    assert sorted(p.name for p in grid.iterdir()) == ["lr5e-05-seed42"]


def test_the_users_teacher_and_student_are_never_written(encoder, teacher, tmp_path, capsys,  # noqa: F811
                                                         no_teacher_work):
    """--output-dir or --cache-dir naming (or inside) the teacher or a --student checkpoint: refused in one line,
    nothing written into either."""
    train = write_classify(tmp_path / "train.csv", sentences(8, 1))
    student = tmp_path / "student"
    shutil.copytree(encoder, student)
    models = {path: _snapshot(path) for path in (teacher, student)}
    base = ["distill", "--teacher", str(teacher), "--train-file", str(train)]
    cases = [
        (["--student", str(student), "--output-dir", str(student)],
         "--output-dir {s} is the student checkpoint's directory (--student {s})"),
        (["--student", str(student), "--output-dir", str(student / "sub")], "is inside the student checkpoint's"),
        (["--output-dir", str(teacher / "student")], "is inside the teacher's directory"),
        (["--output-dir", str(tmp_path / "o1"), "--cache-dir", str(teacher)],
         "--cache-dir {t} is the teacher's directory (--teacher {t})"),
        (["--output-dir", str(tmp_path / "o2"), "--cache-dir", str(teacher / "cache")], "is inside the teacher's"),
        (["--student", str(student), "--output-dir", str(tmp_path / "o3"), "--cache-dir", str(student)],
         "--cache-dir {s} is the student checkpoint's directory"),
    ]
    for flags, expected in cases:
        assert expected.format(s=student, t=teacher) in _error(capsys, base + flags)
    for path, files in models.items():
        assert _snapshot(path) == files
    assert not any((tmp_path / name).exists() for name in ("o1", "o2", "o3"))
    # the library refuses alike, before the data is read or the teacher loads
    with pytest.raises(ValueError, match="is the student checkpoint's directory"):
        distill_task(teacher, train, output_dir=student, student=str(student))
    with pytest.raises(ValueError, match="--cache-dir .* is the teacher's directory"):
        distill_task(teacher, train, output_dir=tmp_path / "o4", cache_dir=teacher)
    for path, files in models.items():
        assert _snapshot(path) == files


# ---------------------------------------------------------------------------- 5: paths checked before the teacher

def test_a_cache_that_cannot_be_made_is_refused_before_the_teacher(teacher, tmp_path, capsys,  # noqa: F811
                                                                   no_teacher_work):
    train = write_classify(tmp_path / "train.csv", sentences(8, 1))
    out = tmp_path / "out"
    out.mkdir()
    (out / "teacher_outputs").write_text("a file where the default cache goes\n")
    base = ["distill", "--teacher", str(teacher), "--train-file", str(train)]
    assert "teacher_outputs exists and is not a directory" in _error(capsys, base + ["--output-dir", str(out)])
    blocker = tmp_path / "blocker"
    blocker.write_text("x\n")
    assert f"--cache-dir {blocker / 'c'}: {blocker} is not a directory" in \
        _error(capsys, base + ["--output-dir", str(tmp_path / "o"), "--cache-dir", str(blocker / "c")])
    # the library: an unwritable OUT or cache is refused before the teacher loads, not after its pass
    if os.path.isdir("/sys"):
        with pytest.raises(ValueError, match="--output-dir /sys/foo: cannot write in /sys"):
            distill_task(teacher, train, output_dir="/sys/foo")
    with pytest.raises(ValueError, match="teacher_outputs exists and is not a directory"):
        distill_task(teacher, train, output_dir=out)
    with pytest.raises(ValueError, match="already holds a run"):
        (tmp_path / "ran").mkdir()
        (tmp_path / "ran" / "log.jsonl").write_text("{}\n")
        distill(teacher, train, FinetuneArguments(output_dir=tmp_path / "ran", max_steps=1, progress=False))
    assert json.loads((tmp_path / "ran" / "log.jsonl").read_text()) == {}
