"""`bertforge distill` refuses before any teacher work and never writes where it refused (issue 61): an
OUT holding a run, the user's teacher or student checkpoint as the output or the cache, a cache that
cannot be made; the teacher cache's integrity (a checksum, the settings that made it); --temperature and
--augment within stated bounds; a multi-label distillation resumed after an evaluation."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge._files import own_directory
from bertforge.cli import build_parser, main
from bertforge.distillation import distill, distill_task
from bertforge.distillation import augment as augment_module
from bertforge.distillation import cache as cache_module
from bertforge.distillation import distiller as distiller_module
from bertforge.training.finetune import FinetuneArguments
from bertforge.training.loop import Trainer

from ..tasks.conftest import _stopped_and_resumed
from .test_augment import goemotions  # noqa: F401 (a fixture: GoEmotions rows and a multi-label teacher)
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


def test_an_out_in_use_by_another_run_is_refused_before_the_teacher_pass(teacher, tmp_path, capsys,  # noqa: F811
                                                                         no_teacher_work):
    train = write_classify(tmp_path / "train.csv", sentences(8, 1))
    out = tmp_path / "out"
    with own_directory(out, "bertforge distill (another)"):
        err = _error(capsys, ["distill", "--teacher", str(teacher), "--train-file", str(train), "--output-dir",
                              str(out)])
        assert f"{out} is in use by another run (process {os.getpid()}: bertforge distill (another))" in err
        with pytest.raises(ValueError, match="is in use by another run"):
            distill(teacher, train, FinetuneArguments(output_dir=out, max_steps=1, progress=False))
        assert sorted(p.name for p in out.iterdir()) == [".bertforge-lock"]


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


# ---------------------------------------------------------------------------- 8: the teacher cache's integrity

@pytest.mark.parametrize("damage", ["zeros", "nan", "truncated", "settings"])
def test_a_damaged_teacher_cache_is_reported_and_recomputed(teacher, tmp_path, caplog, damage):  # noqa: F811
    """logits.npy overwritten (zeros or NaN of the same size, cut short) or meta.json's settings changed: one
    warning line, the outputs computed again, the same teacher dev metrics as the intact cache's."""
    train = write_classify(tmp_path / "train.csv", sentences(24, 1))
    dev = write_classify(tmp_path / "dev.csv", sentences(16, 2))
    cache = tmp_path / "cache"
    command = ["distill", "--teacher", str(teacher), "--train-file", str(train), "--dev-file", str(dev),
               "--cache-dir", str(cache), "--max-steps", "1", "--batch-size", "24", "--no-progress"]
    assert main(command + ["--output-dir", str(tmp_path / "a")]) == 0
    first = json.loads((tmp_path / "a" / "distillation.json").read_text())["teacher_dev_metrics"]
    entries = sorted(p for p in cache.iterdir() if not p.name.startswith("."))
    intact = {entry: np.load(entry / "logits.npy").copy() for entry in entries}
    for entry, logits in intact.items():
        path = entry / "logits.npy"
        if damage == "zeros":
            np.save(path, np.zeros_like(logits))
        elif damage == "nan":
            np.save(path, np.full_like(logits, np.nan))
        elif damage == "truncated":
            path.write_bytes(path.read_bytes()[:-8])
        else:
            meta = json.loads((entry / "meta.json").read_text())
            meta["settings"]["what"] = "something else"
            (entry / "meta.json").write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        assert main(command + ["--output-dir", str(tmp_path / "b")]) == 0
    warnings = [r.getMessage() for r in caplog.records if "are damaged" in r.getMessage()]
    assert len(warnings) == 2 and all("\n" not in w and "computing them again" in w for w in warnings)
    assert json.loads((tmp_path / "b" / "distillation.json").read_text())["teacher_dev_metrics"] == first
    for entry, logits in intact.items():  # repaired in place: the next student reads them back
        np.testing.assert_array_equal(np.load(entry / "logits.npy"), logits)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        assert main(command + ["--output-dir", str(tmp_path / "c")]) == 0
    assert not [r for r in caplog.records if "are damaged" in r.getMessage()]


def test_the_cache_store_verifies_and_refuses_non_finite_outputs(tmp_path):
    settings = {"what": "x", "rows": 3}
    arrays = cache_module.teacher_outputs(tmp_path, "k", lambda: {"x": np.arange(6.0).reshape(3, 2)}, rows=3,
                                          settings=settings)
    meta = json.loads((tmp_path / "k" / "meta.json").read_text())
    assert meta["settings"] == settings and len(meta["arrays"]["x"]["sha256"]) == 64
    assert arrays["x"].tolist() == [[0, 1], [2, 3], [4, 5]]
    # other settings under the same key: not trusted, recomputed
    again = cache_module.teacher_outputs(tmp_path, "k", lambda: {"x": np.ones((3, 2))}, rows=3,
                                         settings={"what": "y", "rows": 3})
    assert again["x"].tolist() == [[1, 1]] * 3
    # a teacher whose outputs hold NaN or +inf: refused, nothing stored (-inf: a position without probability)
    with pytest.raises(ValueError, match=r"the teacher's outputs hold 2 NaN or \+inf value\(s\) in 'x'"):
        cache_module.teacher_outputs(tmp_path, "bad", lambda: {"x": np.array([np.nan, np.inf, -np.inf])})
    assert not (tmp_path / "bad").exists() and not list(tmp_path.glob(".bad*"))
    kept = cache_module.teacher_outputs(tmp_path, "masked", lambda: {"x": np.array([0.5, -np.inf], np.float32)})
    assert kept["x"].tolist() == [0.5, -np.inf]


def test_temperature_is_bounded_and_a_diverged_distillation_names_its_causes(teacher, tmp_path, capsys,  # noqa: F811
                                                                              monkeypatch):
    train = write_classify(tmp_path / "train.csv", sentences(24, 1))
    base = ["distill", "--teacher", str(teacher), "--train-file", str(train), "--output-dir", str(tmp_path / "out"),
            "--max-steps", "3", "--batch-size", "8", "--no-progress", "--cache-dir", str(tmp_path / "cache")]
    distill_parser = build_parser()._subparsers._group_actions[0].choices["distill"]
    assert "from 0.1 to 100" in " ".join(distill_parser.format_help().split())  # the bound, stated in --help
    for value in ("1e30", "1e-30", "nan", "0", "-1", "200"):
        err = _error(capsys, base + ["--temperature", value])
        assert "--temperature must be a positive number from 0.1 to 100" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()
    with pytest.raises(ValueError, match="--temperature must be a positive number from 0.1 to 100"):
        distill_task(teacher, train, output_dir=tmp_path / "lib", temperature=1e30)
    # a loss that turns NaN: exit 1 (a failed run, not a usage error), one line naming the distillation's causes
    original = Trainer._optimizer_step

    def diverges_at_step_2(self, step_loss):
        original(self, step_loss * float("nan") if self.step >= 1 else step_loss)

    monkeypatch.setattr(Trainer, "_optimizer_step", diverges_at_step_2)
    assert main(base + ["--temperature", "3"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("bertforge distill: error: the loss is not finite (NaN or inf) at step 2") and "\n" not in err
    assert "--temperature 3" in err and f"cached in {tmp_path / 'cache'}" in err and "--lr" in err


# ---------------------------------------------------------------------------- 7: --augment within stated bounds

def test_augment_is_bounded_before_any_text_is_made(teacher, tmp_path, capsys, monkeypatch):  # noqa: F811
    train = write_classify(tmp_path / "train.csv", sentences(12, 1))
    base = ["distill", "--teacher", str(teacher), "--train-file", str(train), "--output-dir", str(tmp_path / "out"),
            "--max-steps", "1", "--batch-size", "12", "--no-progress"]
    distill_parser = build_parser()._subparsers._group_actions[0].choices["distill"]
    assert "N at most 100, and at most 2,000,000 augmented texts in all" in " ".join(distill_parser.format_help().split())

    def fail(*args, **kwargs):
        pytest.fail("work started before the refusal")
    monkeypatch.setattr(distiller_module, "load_for_inference", fail)
    monkeypatch.setattr(distiller_module, "teacher_outputs", fail)
    monkeypatch.setattr(augment_module, "iter_augmented", fail)
    for value in ("100000000", "101", "-1"):
        assert "--augment must be 0 or more, at most 100 copies of each training text" in _error(capsys, base + ["--augment", value])
    with pytest.raises(ValueError, match="--augment must be 0 or more, at most 100"):
        distill_task(teacher, train, output_dir=tmp_path / "lib", augment=10 ** 8)
    # the total: copies × training texts, judged once the file is read, before any copy is made
    monkeypatch.setattr(augment_module, "MAX_AUGMENTED_TEXTS", 100)
    assert "--augment 10: 10 copies of 12 training texts are 120 augmented texts, over the limit of 100 (the " \
        "transfer set is held in memory); give at most 8" in _error(capsys, base + ["--augment", "10"])
    assert not (tmp_path / "out").exists()


def test_augmented_texts_are_streamed_to_the_cache_and_read_back(tmp_path, monkeypatch):
    examples = [(text, None) for text, _ in sentences(30, 4)]
    rows = augment_module.augmented_transfer(tmp_path, examples, 5, seed=3)
    assert rows == augment_module.augment_texts(examples, 5, 3, augment_module.unigram_words([t for t, _ in examples]))
    stored, = tmp_path.glob("augmented-*.json")
    lines = stored.read_text().splitlines()
    assert len(lines) == 150 + 2 and [tuple(r) for r in json.loads(stored.read_text())] == rows  # one row a line
    monkeypatch.setattr(augment_module, "iter_augmented", lambda *a, **k: pytest.fail("made again"))
    assert augment_module.augmented_transfer(tmp_path, examples, 5, seed=3) == rows
    # a write that fails midway leaves no file that could be read back as finished
    monkeypatch.undo()
    real = augment_module.iter_augmented

    def dies(*args, **kwargs):
        for count, row in enumerate(real(*args, **kwargs)):
            if count == 20:
                raise RuntimeError("killed")
            yield row
    monkeypatch.setattr(augment_module, "iter_augmented", dies)
    with pytest.raises(RuntimeError, match="killed"):
        augment_module.augmented_transfer(tmp_path / "b", examples, 5, seed=3)
    assert not [p for p in (tmp_path / "b").iterdir() if p.name.startswith("augmented-")]


# ---------------------------------------------------------------------------- 1: a multi-label student resumes

@pytest.mark.parametrize("per_label", [False, True])
def test_a_multi_label_distillation_stopped_after_an_evaluation_resumes(goemotions, tmp_path, per_label):
    """The student's evaluation tunes its decision threshold(s) into its config (`LEARNED_BY_EVALUATION`); a
    distillation stopped after one resumes from the checkpoint saved after it and ends with the weights,
    thresholds and best model of a run never stopped."""
    data, teacher = goemotions
    if per_label:  # a teacher with a threshold per label: the student tunes one per label too
        teacher = Path(shutil.copytree(teacher, tmp_path / "teacher", ignore=shutil.ignore_patterns("checkpoints")))
        config = json.loads((teacher / "config.json").read_text())
        config["multi_label_thresholds"] = {name: 0.3 for name in config["id2label"].values()}
        (teacher / "config.json").write_text(json.dumps(config))

    def make_task():
        return distill_task(teacher, data / "train.tsv", dev_file=data / "dev.tsv", output_dir=tmp_path / "out",
                            layers=1, max_seq_length=32, cache_dir=tmp_path / "cache")

    args = FinetuneArguments(output_dir=tmp_path / "out", lr=1e-3, epochs=3, batch_size=8, progress=False,
                             log_every=1, save_every=3)
    # 40 rows: 5 steps an epoch, evaluations at steps 5, 10, 15; stopped in the one at step 10, resumed from step 9
    straight, resumed, resumed_from = _stopped_and_resumed(make_task, args, stop_at_evaluation=2)
    assert resumed_from["multi_label_threshold"] is not None and \
        ("multi_label_thresholds" in resumed_from) == per_label
    assert resumed["step"] == straight["step"] == 15
    for name, tensor in straight["model"].items():
        assert torch.equal(resumed["model"][name], tensor), name
    assert resumed["config"] == straight["config"]
    for name in ("config.json", "eval_results.json", "distillation.json"):
        mine, theirs = (json.loads((directory / name).read_text()) for directory in (tmp_path / "out",
                                                                                      tmp_path / "out_straight"))
        mine.pop("wall_seconds", None), theirs.pop("wall_seconds", None)
        assert mine == theirs, name


def test_a_multi_label_distill_command_killed_after_an_evaluation_resumes(goemotions, tmp_path, monkeypatch):
    """The command's form: killed just after its checkpoint at step 6 (evaluated at step 5, the tuned
    threshold in the checkpoint's config), `--resume` finishes the run, its OUT checked before the teacher's
    pass as any OUT and accepted, the teacher's outputs read back."""
    data, teacher = goemotions
    out = tmp_path / "student"
    command = ["distill", "--teacher", str(teacher), "--output-dir", str(out), "--layers", "1", "--train-file",
               str(data / "train.tsv"), "--dev-file", str(data / "dev.tsv"), "--epochs", "2", "--batch-size", "8",
               "--max-seq-length", "32", "--no-progress", "--save-every", "3", "--lr", "1e-3"]
    save = Trainer.save

    def save_then_die(self, *args, **kwargs):
        save(self, *args, **kwargs)
        if self.step == 6:
            raise RuntimeError("killed")

    monkeypatch.setattr(Trainer, "save", save_then_die)
    with pytest.raises(RuntimeError, match="killed"):
        main(command)
    monkeypatch.setattr(Trainer, "save", save)
    saved = torch.load(out / "checkpoints" / "checkpoint-00000006.pt", weights_only=False)["config"]
    teacher_threshold = json.loads((teacher / "config.json").read_text())["multi_label_threshold"]
    assert saved["multi_label_threshold"] != teacher_threshold  # what the fresh student's config holds
    assert main(command + ["--resume"]) == 0
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in log) == 10 and not (out / "RUNNING").exists()


# ---------------------------------------------------------------------------- 10: the refusal's reason, the modes

def test_student_vocab_for_a_multi_label_teacher_names_the_real_reason(goemotions, save_tiny_checkpoint, tmp_path):
    data, teacher = goemotions
    vocab = (teacher / "vocab.txt").read_text(encoding="utf-8").splitlines()
    student = save_tiny_checkpoint(tmp_path / "student", vocab[:-1] + ["qqxyzzy"])  # another vocabulary
    with pytest.raises(ValueError) as error:
        distill_task(teacher, data / "train.tsv", output_dir=tmp_path / "out", student=str(student),
                     student_vocab=True)
    message = str(error.value)
    assert message.startswith("--student-vocab: not for a 'multi-label' teacher: its outputs are per sentence")
    assert "per token or span" not in message and "(supported: classify)" in message


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_cache_directories_and_files_get_the_umasks_mode(teacher, tmp_path, umask):  # noqa: F811
    """A --cache-dir shared by a team: every directory and file in it as `mkdir`/`open` make them under the
    umask (0755/0644 under 022, 0775/0664 under 002), not mkdtemp's owner-only 0700."""
    train = write_classify(tmp_path / "train.csv", sentences(12, 1))
    cache = tmp_path / "shared" / "cache"
    previous = os.umask(umask)
    try:
        distill_task(teacher, train, output_dir=tmp_path / "out", layers=1, cache_dir=cache, augment=1)
    finally:
        os.umask(previous)
    made = [cache.parent, *cache.rglob("*")]
    assert len(made) >= 5  # shared/, cache/, the entry, its logits.npy and meta.json, the augmented texts
    for path in made:
        expected = (0o777 if path.is_dir() else 0o666) & ~umask
        assert path.stat().st_mode & 0o777 == expected, (path, oct(path.stat().st_mode))
