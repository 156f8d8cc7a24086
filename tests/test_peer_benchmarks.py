"""benchmarks/peer.py, the peer's `Trainer` side of every task family, end to end on a tiny checkpoint and a
handful of toy examples (1 epoch, 1 thread): each family's command under the name the docs cite (glue_peer.py,
multi_label_peer.py, ner_peer.py, squad_peer.py) and as `peer.py FAMILY` prints one JSON line with the keys its
readers use and a metric in range, and writes each seed's result; the TrainingArguments each family declares
are the ones its script set before the scripts became one module."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "i", "love", "hate", "this", "so", "much", "ok", "!",
         "alice", "bob", "met", "in", "paris", "rome", "at", "acme", "who", "where", "did", "go", "to", "?", "."]
PEOPLE, PLACES = ("alice", "bob"), ("paris", "rome")


def write_glue(root: Path, rows: int = 48, seed: int = 0) -> Path:
    """SST-2 (a sentence, a 0/1 label: "love" or "hate" decides) and STS-B (a pair, a 0-5 score) in the GLUE
    layout bertforge's reader takes: ROOT/SST-2/{train,dev}.tsv, ROOT/STS-B/{train,dev}.tsv with headers."""
    rng = random.Random(seed)
    for task, header in (("SST-2", "sentence\tlabel"),
                         ("STS-B", "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t"
                                   "sentence2\tscore")):
        (root / task).mkdir(parents=True, exist_ok=True)
        for split, count in (("train", rows), ("dev", rows // 3)):
            lines = [header]
            for i in range(count):
                label = rng.randint(0, 1)
                words = rng.choices(["i", "this", "so", "much", "ok"], k=rng.randint(1, 6)) + [("hate", "love")[label]]
                rng.shuffle(words)
                if task == "SST-2":
                    lines.append(f"{' '.join(words)}\t{label}")
                else:
                    other = rng.choices(["i", "this", "so", "love", "hate"], k=rng.randint(2, 5))
                    lines.append(f"{i}\tmain\tf\t2012\t{i}\tnone\tnone\t{' '.join(words)}\t{' '.join(other)}\t"
                                 f"{rng.uniform(0, 5):.2f}")
            (root / task / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def write_goemotions(root: Path, rows: int = 48, seed: int = 0) -> Path:
    """GoEmotions' layout: emotions.txt and {train,dev}.tsv rows of text, comma-separated label ids, an id."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    (root / "emotions.txt").write_text("joy\nanger\nsurprise\nneutral\n", encoding="utf-8")
    cues = ("love", "hate", "!")
    for split, count in (("train", rows), ("dev", rows // 3)):
        lines = []
        for i in range(count):
            labels = [k for k in range(3) if rng.random() < 0.3]
            words = rng.choices(["i", "this", "so", "much", "ok"], k=3) + [cues[k] for k in labels]
            rng.shuffle(words)
            lines.append(f"{' '.join(words)}\t{','.join(map(str, labels or [3]))}\tid{i}\n")
        (root / f"{split}.tsv").write_text("".join(lines), encoding="utf-8")
    return root


def write_conll(root: Path, sentences: int = 32, seed: int = 0) -> Path:
    """CoNLL files (word, POS, chunk, tag; a blank line between sentences): people and places to tag."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for name, count in (("train.txt", sentences), ("valid.txt", sentences // 2)):
        lines = ["-DOCSTART- -X- -X- O", ""]
        for _ in range(count):
            person, place = rng.choice(PEOPLE), rng.choice(PLACES)
            words = [(person, "B-PER"), ("met", "O"), (rng.choice(PEOPLE), "B-PER"), ("in", "O"), (place, "B-LOC")]
            if rng.random() < 0.5:
                words += [("at", "O"), ("acme", "B-ORG")]
            lines += [f"{word} NN O {tag}" for word, tag in words + [(".", "O")]] + [""]
        (root / name).write_text("\n".join(lines), encoding="utf-8")
    return root


def write_squad(path: Path, questions: int = 16, unanswerable: bool = True, seed: int = 0) -> Path:
    """A SQuAD-format file: one paragraph per question ("alice met bob in paris . ..."), asked who or where;
    with `unanswerable`, every fourth question (about someone absent) has no answer (SQuAD 2.0)."""
    rng = random.Random(seed)
    paragraphs = []
    for i in range(questions):
        person, other, place = rng.choice(PEOPLE), rng.choice(PEOPLE), rng.choice(PLACES)
        context = f"{person} met {other} in {place} . " + " ".join(rng.choices(["i", "love", "this", "so", "ok"], k=8))
        impossible = unanswerable and i % 4 == 3
        if impossible:
            question, answers = "where did acme go ?", []
        elif i % 2:
            question, answers = f"where did {person} go ?", [{"text": place, "answer_start": context.index(place)}]
        else:
            question, answers = f"who met {other} ?", [{"text": person, "answer_start": 0}]
        qa = {"id": f"q{i}", "question": question, "answers": answers}
        paragraphs.append({"context": context, "qas": [qa | ({"is_impossible": impossible} if unanswerable else {})]})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": "v2.0" if unanswerable else "1.1",
                                "data": [{"title": "toy", "paragraphs": paragraphs}]}), encoding="utf-8")
    return path


def run_peer(script: str, *arguments: str | Path) -> dict:
    """`python benchmarks/SCRIPT ARGUMENTS...`; its stdout is one JSON line, returned parsed."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *map(str, arguments)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout[-2000:]  # nothing but the JSON line: the Trainer's logs go to stderr
    return json.loads(lines[0])


def in_range(value, low: float = 0.0, high: float = 1.0) -> bool:
    return isinstance(value, float) and low <= value <= high


class Built(Exception):
    """Raised by the stand-in Trainer once a family has built everything it hands to the Trainer."""


# Each family's TrainingArguments as its script set them before the four became one module (the shared recipe:
# warm-up 10%, weight decay 0.01, clipping 1.0, linear decay, AdamW's epsilon 1e-6, no reporting)
SHARED = {"warmup_steps": 0.1, "weight_decay": 0.01, "max_grad_norm": 1.0, "lr_scheduler_type": "linear",
          "adam_epsilon": 1e-6, "report_to": [], "dataloader_num_workers": 0, "disable_tqdm": True}
DECLARED = {
    "glue": {"learning_rate": 2e-5, "per_device_train_batch_size": 32, "num_train_epochs": 3.0, "seed": 5,
             "data_seed": None, "per_device_eval_batch_size": 128, "eval_strategy": "epoch", "logging_steps": 50,
             "logging_strategy": "steps", "save_strategy": "no", "save_total_limit": 1, "use_cpu": True,
             "bf16": False, "train_sampling_strategy": "random"},
    "multi-label": {"learning_rate": 5e-5, "per_device_train_batch_size": 32, "num_train_epochs": 3.0, "seed": 5,
                    "data_seed": None, "per_device_eval_batch_size": 128, "eval_strategy": "epoch",
                    "logging_steps": 50, "save_strategy": "no", "save_total_limit": None, "use_cpu": True},
    "ner": {"learning_rate": 5e-5, "per_device_train_batch_size": 16, "num_train_epochs": 3.0, "seed": 5,
            "data_seed": 5, "per_device_eval_batch_size": 128, "eval_strategy": "epoch", "logging_strategy": "epoch",
            "save_strategy": "no", "train_sampling_strategy": "random"},
    "squad": {"learning_rate": 5e-5, "per_device_train_batch_size": 48, "num_train_epochs": 2.0, "seed": 5,
              "data_seed": 5, "eval_strategy": "no", "logging_strategy": "epoch", "save_strategy": "no"},
}


def test_each_family_builds_the_trainer_its_script_built(tmp_path, save_tiny_checkpoint, monkeypatch):
    """Every family's TrainingArguments at its defaults (and with the flags that change them), its model class,
    collator and rows, up to the Trainer (a stand-in that stops there: nothing trains)."""
    import importlib

    monkeypatch.syspath_prepend(str(REPO))
    from benchmarks import peer

    importlib.import_module("transformers").Trainer  # loading it puts another module object in sys.modules
    transformers = importlib.import_module("transformers")  # the one `import transformers` gives from now on

    built = {}

    def stand_in(**kwargs):
        built.update(kwargs)
        raise Built

    monkeypatch.setattr(transformers, "Trainer", stand_in)
    monkeypatch.setattr(peer, "setup", lambda threads: None)  # this process's threads and logging stay as they are
    model = save_tiny_checkpoint(tmp_path / "model", WORDS)
    glue, goemotions = write_glue(tmp_path / "glue"), write_goemotions(tmp_path / "goemotions")
    conll = write_conll(tmp_path / "conll")
    squad = write_squad(tmp_path / "squad.json", 8)
    out = str(tmp_path / "out")
    commands = {
        "glue": ["--task", "sst2", "--data-dir", glue, "--max-seq-length", "32"],
        "multi-label": ["--data-dir", goemotions, "--max-seq-length", "32"],
        "ner": ["--train-file", conll / "train.txt", "--dev-file", conll / "valid.txt"],
        "squad": ["--train-file", squad, "--dev-file", squad, "--max-seq-length", "48", "--doc-stride", "16"],
    }
    seeds = {"glue": ["--seeds", "5"], "multi-label": ["--seeds", "5"], "ner": ["--seed", "5"],
             "squad": ["--seed", "5"]}
    expected_model = {"glue": "BertForSequenceClassification", "multi-label": "BertForSequenceClassification",
                      "ner": "BertForTokenClassification", "squad": "BertForQuestionAnswering"}
    for family, flags in commands.items():
        built.clear()
        with pytest.raises(Built):
            peer.main([family, "--model", str(model), "--output-dir", out, *seeds[family], *map(str, flags)])
        arguments = built["args"].to_dict()
        assert {k: arguments[k] for k in SHARED} == SHARED, family
        assert {k: arguments[k] for k in DECLARED[family]} == DECLARED[family], family
        assert arguments["output_dir"] == str(Path(out) / ("trainer" if family == "squad" else "seed5"))
        assert type(built["model"]).__name__ == expected_model[family]
        row = built["train_dataset"][0]
        assert {"input_ids", "attention_mask", "token_type_ids"} <= set(row)
        if family in ("glue", "multi-label"):  # padded to --max-seq-length, the peer's default (run_glue's)
            assert len(row["input_ids"]) == 32 and built["data_collator"] is None
            assert set(row) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
    assert built["eval_dataset"] is None and {"start_positions", "end_positions"} <= set(row)  # SQuAD evaluates itself

    # The flags that change the recipe: the peer at its best settings, checkpoints, another epsilon
    built.clear()
    with pytest.raises(Built):
        peer.main(["glue", "--model", str(model), "--output-dir", out, "--seeds", "5", *map(str, commands["glue"]),
                   "--dynamic-padding", "--group-by-length", "--bf16", "--save-steps", "9", "--adam-epsilon", "1e-8"])
    arguments = built["args"].to_dict()
    assert arguments["train_sampling_strategy"] == "group_by_length" and arguments["bf16"] is True
    assert arguments["save_strategy"] == "steps" and arguments["save_steps"] == 9 and arguments["adam_epsilon"] == 1e-8
    assert type(built["data_collator"]).__name__ == "DataCollatorWithPadding"
    assert len({len(r["input_ids"]) for r in built["train_dataset"]}) > 1  # each row its own length
    built.clear()
    with pytest.raises(Built):
        peer.main(["ner", "--model", str(model), "--output-dir", out, "--seed", "5", *map(str, commands["ner"]),
                   "--sampling", "group_by_length", "--warmup-ratio", "0.2", "--device", "cpu", "--progress"])
    arguments = built["args"].to_dict()
    assert arguments["train_sampling_strategy"] == "group_by_length" and arguments["warmup_steps"] == 0.2
    assert arguments["use_cpu"] is True and arguments["disable_tqdm"] is False


CLASSIFICATION_KEYS = {"benchmark", "framework", "lr", "epochs", "batch_size", "max_seq_length", "threads",
                       "padding", "group_by_length", "bf16", "summary", "runs"}


@pytest.mark.parametrize("task, best", [pytest.param("sst2", True, marks=pytest.mark.slow), ("stsb", False)])
def test_glue_peer(tmp_path, save_tiny_checkpoint, task, best):
    """glue_peer.py as RESULTS.md cites it (a classification task at the peer's best settings, and the
    regression task padded to the maximum length): its keys, each seed's file, the metric in range."""
    model = save_tiny_checkpoint(tmp_path / "model", WORDS)
    data = write_glue(tmp_path / "glue")
    out = tmp_path / "out"
    result = run_peer("glue_peer.py", "--task", task, "--model", model, "--data-dir", data, "--seeds", "42,43",
                      "--epochs", "1", "--threads", "1", "--max-seq-length", "32", "--output-dir", out,
                      *(["--dynamic-padding", "--group-by-length", "--bf16"] if best else []))
    assert set(result) == CLASSIFICATION_KEYS | {"task"} and result["benchmark"] == "glue_peer"
    assert result["padding"] == ("batch" if best else "max_length") and result["bf16"] is best
    assert result["group_by_length"] is best and result["task"] == task and result["threads"] == 1
    metric = "accuracy" if task == "sst2" else "pearson"
    assert [r["seed"] for r in result["runs"]] == [42, 43] and result["summary"][metric]["n"] == 2
    for run in result["runs"]:
        assert set(run) == {"seed", "metrics", "epoch", "wall_seconds", "evals", "train_loss"}
        assert in_range(run["metrics"][metric], -1.0, 1.0) and run["epoch"] == 1.0 and run["wall_seconds"] > 0
        assert [e["epoch"] for e in run["evals"]] == [1.0] and "loss" not in run["metrics"]
        assert json.loads((out / f"seed{run['seed']}.json").read_text()) == run
    if task == "sst2":
        assert in_range(result["runs"][0]["metrics"]["accuracy"])
        # --resume reuses the seeds already run, and prints the same JSON
        again = run_peer("glue_peer.py", "--task", task, "--model", model, "--data-dir", data, "--seeds", "42,43",
                         "--epochs", "1", "--threads", "1", "--max-seq-length", "32", "--output-dir", out,
                         "--dynamic-padding", "--group-by-length", "--bf16", "--resume")
        assert again["runs"] == result["runs"]


def test_multi_label_peer(tmp_path, save_tiny_checkpoint):
    """multi_label_peer.py as benchmarks/multi_label.py calls it: the JSON line, each seed's file (which
    multi_label.py reads) and each epoch's dev probabilities beside it."""
    model = save_tiny_checkpoint(tmp_path / "model", WORDS)
    data = write_goemotions(tmp_path / "goemotions")
    out = tmp_path / "out"
    result = run_peer("multi_label_peer.py", "--model", model, "--data-dir", data, "--output-dir", out,
                      "--seeds", "0", "--epochs", "1", "--threads", "1", "--max-seq-length", "32",
                      "--dynamic-padding", "--group-by-length")
    assert set(result) == CLASSIFICATION_KEYS | {"data"} and result["benchmark"] == "multi_label_peer"
    assert result["data"] == "goemotions" and set(result["summary"]) == {"macro_f1", "micro_f1"}
    run, = result["runs"]
    assert set(run) == {"seed", "metrics", "epoch", "wall_seconds", "evals", "train_loss"}
    assert set(run["metrics"]) == {"macro_f1", "micro_f1", "threshold"} and run["epoch"] == 1.0
    assert in_range(run["metrics"]["macro_f1"]) and in_range(run["metrics"]["micro_f1"])
    assert 0.01 <= run["metrics"]["threshold"] <= 0.99
    assert json.loads((out / "seed0.json").read_text()) == run
    import numpy as np

    saved = np.load(out / "seed0" / "dev_epoch1.npz")
    assert saved["probabilities"].shape == saved["labels"].shape == (16, 4)


def test_ner_peer(tmp_path, save_tiny_checkpoint):
    """ner_peer.py as RESULTS.md cites it (plus two seeds and toy sizes): the JSON line's keys, summary.json,
    each seed's file, the entity F1 in range and the dev sentences all scored."""
    model = save_tiny_checkpoint(tmp_path / "model", WORDS)
    data = write_conll(tmp_path / "conll")
    out = tmp_path / "out"
    result = run_peer("ner_peer.py", "--model", model, "--train-file", data / "train.txt", "--dev-file",
                      data / "valid.txt", "--output-dir", out, "--seed", "42", "--seeds", "2", "--num-threads", "1",
                      "--epochs", "1", "--batch-size", "8", "--max-seq-length", "32")
    assert set(result) == {"peer", "model", "train_sentences", "dev_sentences", "hyperparameters", "f1", "runs"}
    assert result["train_sentences"] == 32 and result["dev_sentences"] == 16 and result["f1"]["n"] == 2
    assert set(result["hyperparameters"]) == {"lr", "epochs", "batch_size", "max_seq_length", "warmup_ratio",
                                              "weight_decay", "sampling"}
    assert [r["seed"] for r in result["runs"]] == [42, 43]
    summary = json.loads((out / "summary.json").read_text())
    assert {k: v for k, v in summary.items() if k != "runs"} == {k: v for k, v in result.items() if k != "runs"}
    for short, run in zip(result["runs"], summary["runs"]):
        assert set(short) == {"seed", "f1", "best_epoch", "seconds"} and in_range(short["f1"])
        assert {k: run[k] for k in short} == short and run["dev_sentences_truncated"] == 0
        assert [e["epoch"] for e in run["epochs"]] == [1.0] and {"f1", "precision", "recall"} <= set(run["epochs"][0])
        assert json.loads((out / f"seed{run['seed']}.json").read_text()) == run


@pytest.mark.parametrize("version", ["2.0", "1.1"])
def test_squad_peer(tmp_path, save_tiny_checkpoint, version):
    """squad_peer.py (and `peer.py squad`) on a SQuAD-format file written here: run_qa's windows, utils_qa's
    answers, the official scores (and, for 2.0, the no-answer odds), the files beside them, and the metrics in
    range."""
    model = save_tiny_checkpoint(tmp_path / "model", WORDS)
    v2 = version == "2.0"
    train = write_squad(tmp_path / "train.json", 24, unanswerable=v2)
    dev = write_squad(tmp_path / "dev.json", 12, unanswerable=v2, seed=1)
    out = tmp_path / "out"
    command = ["squad_peer.py"] if v2 else ["peer.py", "squad"]  # the cited name, and the family of peer.py
    result = run_peer(*command, "--model", model, "--train-file", train, "--dev-file", dev, "--version",
                      version, "--output-dir", out, "--epochs", "1", "--batch-size", "8", "--max-seq-length", "48",
                      "--doc-stride", "16", "--num-threads", "1")
    assert set(result) == {"peer", "model", "version", "train_questions", "train_windows", "eval_questions",
                           "eval_windows", "hyperparameters", "best_epoch", "metrics", "official",
                           "always_no_answer", "seconds"}
    assert result["train_questions"] == 24 and result["eval_questions"] == 12 and result["best_epoch"] == 1.0
    assert result["train_windows"] >= 24 and result["eval_windows"] >= 12
    metrics = result["metrics"]
    assert in_range(metrics["exact_match"]) and in_range(metrics["f1"]) and metrics["f1"] >= metrics["exact_match"]
    assert result["official"]["f1"] == pytest.approx(100 * metrics["f1"])
    if v2:
        assert {"HasAns_f1", "NoAns_f1", "best_f1", "best_f1_thresh"} <= set(metrics)
        assert result["always_no_answer"]["exact"] == pytest.approx(100 * 3 / 12)  # 3 of 12 unanswerable
    else:  # v1.1's official keys
        assert set(result["official"]) == {"exact_match", "f1"} and result["always_no_answer"]["exact_match"] == 0.0
    predictions = json.loads((out / "predictions.json").read_text())
    assert sorted(predictions) == sorted(f"q{i}" for i in range(12))
    assert (out / "null_odds.json").exists() is v2 and (out / "nbest_predictions.json").exists()
    assert [e["epoch"] for e in json.loads((out / "summary.json").read_text())["epochs"]] == [1.0]


def test_squad_peer_refuses_unanswerable_questions_as_v1(tmp_path, save_tiny_checkpoint):
    model = save_tiny_checkpoint(tmp_path / "model", WORDS)
    train = write_squad(tmp_path / "train.json", 8)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(BENCHMARKS / "peer.py"), "squad", "--model", str(model),
                           "--train-file", str(train), "--dev-file", str(train), "--version", "1.1", "--output-dir",
                           str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode != 0 and "use --version 2.0" in done.stderr
