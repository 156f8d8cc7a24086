"""benchmarks/distill.py, the distillation study driver, on a tiny random teacher and a few rows: every run it
makes is a real `bertforge` run whose results it reports as written; a second call reads finished runs back
instead of running them again; throughput, speed-ups and the plot are computed from what was measured."""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "distill.py"

POSITIVE = ["good", "great", "fine", "lovely"]
NEGATIVE = ["bad", "awful", "poor", "dull"]
FILLER = ["the", "film", "was", "a", "plot", "very", "story", "and"]
NAMES = ["paris", "london", "john", "mary"]
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ","] + POSITIVE + NEGATIVE + FILLER + NAMES


def write_sst2(glue: Path, train: int, dev: int) -> None:
    rng = random.Random(0)
    (glue / "SST-2").mkdir(parents=True)
    for name, count in (("train.tsv", train), ("dev.tsv", dev)):
        lines = ["sentence\tlabel"]
        for _ in range(count):
            label = rng.random() < 0.5
            words = rng.choices(FILLER, k=rng.randint(2, 5)) + [rng.choice(POSITIVE if label else NEGATIVE)]
            rng.shuffle(words)
            lines.append(f"{' '.join(words)} \t{int(label)}")
        (glue / "SST-2" / name).write_text("\n".join(lines) + "\n")


def write_conll(conll: Path, train: int, dev: int) -> None:
    rng = random.Random(1)
    conll.mkdir(parents=True)
    for name, count in (("train.txt", train), ("valid.txt", dev)):
        lines = ["-DOCSTART- -X- -X- O", ""]
        for _ in range(count):
            for _ in range(rng.randint(2, 5)):
                word = rng.choice(FILLER + NAMES)
                tag = "O" if word in FILLER else ("B-LOC" if word in ("paris", "london") else "B-PER")
                lines.append(f"{word} NN O {tag}")
            lines.append("")
        (conll / name).write_text("\n".join(lines) + "\n")


def run_script(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=900)


@pytest.fixture(scope="module")
def study(tmp_path_factory, save_tiny_checkpoint):
    """One tiny study: 2 seeds x 1 layer count x both objectives per task, throughput and the plot."""
    root = tmp_path_factory.mktemp("distill_study")
    model = save_tiny_checkpoint(root / "encoder", WORDS, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                 max_position_embeddings=128)  # the commands' max length
    write_sst2(root / "glue", train=48, dev=20)
    write_conll(root / "conll", train=24, dev=10)
    tasks = "sst2,conll"
    flags = ["--keep", str(root / "keep"), "--model", str(model), "--glue-dir", str(root / "glue"), "--conll-dir",
             str(root / "conll"), "--tasks", tasks, "--layers", "1", "--seeds", "0,1", "--teacher-epochs", "1",
             "--student-epochs", "1", "--threads", "1"]
    done = run_script(*flags, "--throughput", "--repeats", "1", "--plot", str(root / "plot.png"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1
    return {"root": root, "flags": flags, "result": json.loads(lines[0]), "tasks": tasks.split(",")}


def test_every_run_is_reported_as_written_and_summarised(study):
    result, keep = study["result"], study["root"] / "keep"
    assert result["benchmark"] == "distill" and list(result["study"]) == study["tasks"]
    for task, entry in result["study"].items():
        metric = entry["metric"]
        teacher = json.loads((keep / task / "teacher" / "eval_results.json").read_text())
        assert entry["teacher"]["score"] == teacher["metrics"][metric]
        # seed-major: seed 0 of both objectives, then seed 1
        assert [r["name"] for r in entry["runs"]] == ["L1-distill-seed0", "L1-labels-seed0", "L1-distill-seed1",
                                                      "L1-labels-seed1"]
        for run in entry["runs"]:
            written = json.loads((keep / task / run["name"] / "eval_results.json").read_text())
            assert run["score"] == written["metrics"][metric]
            assert run["teacher_agreement"] == written["metrics"].get("teacher_agreement")
            assert run["wall_seconds"] == written["wall_seconds"] and run["process_seconds"] > 0
            info = json.loads((keep / task / run["name"] / "distillation.json").read_text())
            assert info["objective"] == ("labels only" if run["objective"] == "labels" else "soft targets + labels")
            assert info["teacher_outputs"] == str(keep / task / "teacher_outputs")  # one cache for all students
        assert len(entry["summary"]) == 2
        for row in entry["summary"]:
            scores = [r["score"] for r in entry["runs"] if r["objective"] == row["objective"]]
            assert row["seeds"] == [0, 1]
            assert row["score"]["mean"] == pytest.approx(statistics.mean(scores))
            assert row["score"]["std"] == pytest.approx(statistics.stdev(scores))
            assert row["pct_of_teacher"] == pytest.approx(100 * statistics.mean(scores) / entry["teacher"]["score"])


def test_throughput_speedups_and_plot(study):
    result = study["result"]
    assert (study["root"] / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for task in study["tasks"]:
        models = result["throughput"][task]["models"]
        assert list(models) == ["teacher", "L1"] and models["L1"]["seed"] == 0
        assert models["L1"]["dir"].endswith("L1-distill-seed0")
        teacher = models["teacher"]["dtypes"]
        for dtype in ("fp32", "bf16", "int8"):
            student = models["L1"]["dtypes"][dtype]
            assert student["examples_per_s"] > 0 and len(student["seconds"]) == 1
            rows = result["throughput"][task]["rows"]
            assert student["examples_per_s"] == pytest.approx(rows / student["seconds"][0])
            assert student["speedup_vs_teacher_same_dtype"] == pytest.approx(
                student["examples_per_s"] / teacher[dtype]["examples_per_s"])
            assert student["speedup_vs_teacher_fp32"] == pytest.approx(
                student["examples_per_s"] / teacher["fp32"]["examples_per_s"])
        if task == "sst2":  # the fp32 pipeline's dev accuracy: a fraction of the 20 dev rows
            assert result["throughput"][task]["rows"] == 20
            assert round(teacher["fp32"]["dev_score"] * 20, 6) == int(round(teacher["fp32"]["dev_score"] * 20))


def test_a_second_call_reads_finished_runs_back(study):
    keep = study["root"] / "keep"
    logs = {p: p.stat().st_mtime_ns for p in keep.glob("*/*.log")}
    assert logs  # every run wrote its log
    done = run_script(*study["flags"])
    assert done.returncode == 0, done.stderr
    again = json.loads(done.stdout)
    assert again["study"] == study["result"]["study"]
    assert {p: p.stat().st_mtime_ns for p in keep.glob("*/*.log")} == logs  # nothing ran again


def test_finished_only_reads_back_and_runs_nothing(study):
    """--finished-only: a seed never run is left out of the summary instead of being run."""
    keep = study["root"] / "keep"
    logs = {p: p.stat().st_mtime_ns for p in keep.glob("*/*.log")}
    flags = list(study["flags"])
    flags[flags.index("--seeds") + 1] = "0,1,2"
    done = run_script(*flags, "--finished-only")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert {p: p.stat().st_mtime_ns for p in keep.glob("*/*.log")} == logs
    assert not list(keep.glob("*/*seed2*"))
    for task in study["tasks"]:
        assert result["study"][task]["summary"] == study["result"]["study"][task]["summary"]


def test_bad_options_fail_before_any_run(tmp_path):
    done = run_script("--keep", str(tmp_path / "keep"), "--model", str(tmp_path), "--plot", str(tmp_path / "p.png"))
    assert done.returncode == 2 and "--plot needs --throughput" in done.stderr
    done = run_script("--keep", str(tmp_path / "keep"), "--model", str(tmp_path), "--tasks", "mnli")
    assert done.returncode == 2 and "unknown mnli" in done.stderr
    done = run_script("--keep", str(tmp_path / "keep"), "--model", str(tmp_path), "--glue-dir", str(tmp_path),
                      "--tasks", "sst2")
    assert done.returncode == 2 and "SST-2/train.tsv: no such file" in done.stderr
    assert not (tmp_path / "keep").exists()


def test_goal_reads_the_3_layer_distilled_student():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import distill
    finally:
        sys.path.remove(str(SCRIPT.parent))

    def row(layers, objective, augment, mean, pct):
        return {"layers": layers, "objective": objective, "augment": augment, "score": {"mean": mean},
                "pct_of_teacher": pct}

    def rate(per_s, score, teacher_fp32=None):
        return {"examples_per_s": per_s, "dev_score": score,
                **({} if teacher_fp32 is None else {"speedup_vs_teacher_fp32": per_s / teacher_fp32})}

    result = {"study": {"sst2": {"summary": [row(3, "distill", 0, 0.89, 98.9), row(3, "distill", 8, 0.90, 100.0),
                                             row(3, "labels", 0, 0.95, 105.0), row(2, "distill", 0, 0.95, 105.0)]}},
              "throughput": {"sst2": {"models": {
                  "teacher": {"dtypes": {"fp32": rate(100, 0.9), "int8": rate(150, 0.9)}},
                  "L3": {"dtypes": {"fp32": rate(210, 0.90, 100), "int8": rate(390, 0.88, 100)},
                         "bound": {"layers_only": 2.3, "with_pre_post": 2.2}}}}}}
    got = distill.goal(result)["sst2"]
    assert got["bound_fp32"] == {"layers_only": 2.3, "with_pre_post": 2.2}  # the 3-layer student's, passed on
    assert got["augment"] == 8 and got["objective"] == "distill"  # the best distilled 3-layer row, never the
    # control or the 2-layer one; with the intermediate terms it is a distilled student too
    summary = result["study"]["sst2"]["summary"]
    summary.append(row(3, "intermediate", 0, 0.905, 100.5))
    assert distill.goal(result)["sst2"]["objective"] == "intermediate"
    summary.pop()
    assert got["fp32"]["pct_of_teacher"] == pytest.approx(100.0) and got["fp32"]["speedup_vs_teacher_fp32"] == 2.1
    assert got["fp32"]["met"]
    assert got["int8"]["pct_of_teacher"] == pytest.approx(100.0 * 0.88 / 0.90)  # 97.78: kept, but 3.9x < 4x
    assert got["int8"]["speedup_vs_teacher_fp32"] == pytest.approx(3.9) and not got["int8"]["met"]


def test_the_conll_part_scores_entities(study):
    assert "conll" in study["tasks"]
    entry = study["result"]["study"]["conll"]
    assert entry["metric"] == "f1" and 0 <= entry["teacher"]["score"] <= 1
    for model in study["result"]["throughput"]["conll"]["models"].values():
        for measured in model["dtypes"].values():  # the pipeline's words are the file's here: F1 is scored
            assert measured["dev_score"] is not None and 0 <= measured["dev_score"] <= 1


def test_the_bound_counts_each_models_layer_work(study):
    """Work from the pipeline's own features: SST-2's last layer reads [CLS] (one row a sentence), CoNLL's each
    word's first piece (every word of this vocabulary is one piece); the bound is the work ratio, then the
    measured pre- and postprocessing added on both sides."""
    root, result = study["root"], study["result"]
    teacher_layers = json.loads((root / "encoder" / "config.json").read_text())["num_hidden_layers"]
    sentences = [block.split("\n") for block in (root / "conll" / "valid.txt").read_text().split("\n\n")]
    words = [len(lines) for lines in sentences if lines[0] and not lines[0].startswith("-DOCSTART-")]
    for task, rows in (("sst2", 20), ("conll", sum(words))):
        models = result["throughput"][task]["models"]
        teacher, student = models["teacher"], models["L1"]
        work = teacher["work"]
        assert work == student["work"] | {"units": work["units"]} and work["last_layer_rows"] == rows
        if task == "conll":
            assert work["tokens"] == sum(words) + 2 * len(words)  # [CLS] and [SEP] around each sentence
        share = work["last_layer_rows"] / work["tokens"]
        assert work["units"] == pytest.approx(teacher_layers - 1 + (3 + 9 * share) / 12)
        assert student["work"]["units"] == pytest.approx((3 + 9 * share) / 12)
        assert teacher["layers"] == teacher_layers and student["layers"] == 1
        for model in (teacher, student):
            assert all(value > 0 for value in model["stages_fp32_ms_per_example"].values())
        bound = student["bound"]
        assert bound["layers_only"] == pytest.approx(work["units"] / student["work"]["units"])


def test_bound_by_hand():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import distill
    finally:
        sys.path.remove(str(SCRIPT.parent))
    teacher = {"work": {"units": 6.0}, "stages_fp32_ms_per_example": {"preprocess": 0.1, "run": 3.0, "postprocess": 0.1}}
    student = {"work": {"units": 3.0}, "stages_fp32_ms_per_example": {"preprocess": 0.1, "run": 1.4, "postprocess": 0.1}}
    got = distill.bound(teacher, student)
    assert got["layers_only"] == pytest.approx(2.0)
    assert got["with_pre_post"] == pytest.approx(3.2 / 1.7)  # the teacher's forward pass halved, 0.2 ms beside


def test_the_intermediate_objective_adds_tinybert_terms(tmp_path):
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import distill
    finally:
        sys.path.remove(str(SCRIPT.parent))
    args = distill.argparse.Namespace(keep=tmp_path, glue_dir=tmp_path, conll_dir=tmp_path, threads=1, student_epochs=2,
                                      lr=None, augment_mlm=None)
    command = distill.student_command(args, "sst2", tmp_path / "s", 3, "intermediate", 0, 0)
    assert command[command.index("--intermediate") + 1] == "hidden,attention" and "--labels-only" not in command
    assert "--intermediate" not in distill.student_command(args, "sst2", tmp_path / "s", 3, "distill", 0, 0)
    assert distill.student_name(3, "intermediate", 0, 1) == "L3-intermediate-seed1"
