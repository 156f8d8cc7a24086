"""`bertforge distill` for the tag family (CoNLL NER teachers): the teacher's word logits cached flat with
per-window offsets and read back, the first loss against a hand computation, the command end to end on
real CoNLL-2003 sentences, and the student as a normal `ner` checkpoint (predict, pipeline)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge import pipeline
from bertforge.cli import main
from bertforge.distillation import build_student, distill_task
from bertforge.distillation import tag as tag_distiller
from bertforge.distillation import cache as cache_module
from bertforge.modeling import BertForTokenClassification
from bertforge.tasks.conll import read_conll
from bertforge.tokenization import BertTokenizer
from bertforge.training import finetune as engine
from bertforge.training.finetune import FinetuneArguments, finetune

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "john", "mary", "smith", "paris", "london", "visited",
         "is", "nice", "in", "the", "city", "met", "##s", "##ton"]
LABELS = ["O", "B-LOC", "B-PER", "I-PER"]

TRAIN = """-DOCSTART- O

john X B-PER
smith X I-PER
visited X O
parisss X B-LOC
. X O

london X B-LOC
is X O
nice X O

mary X B-PER
met X O
johnston X B-PER
in X O
the X O
city X O
. X O
"""
DEV = """mary X B-PER
visited X O
london X B-LOC

the X O
city X O
is X O
nice X O
"""
UNLABELED = "mary smith met john in parisss\n\n  the city is nice  \n"


def _softmax(values):
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    return [e / sum(exps) for e in exps]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, save_tiny_checkpoint) -> Path:
    """A random 4-layer encoder (no dropout) with a token-classification head saved as `bertforge finetune
    ner` saves one (finetuning_task "ner", the tags as id2label); weights far from the initial ones, so a
    2-layer student's outputs differ from the teacher's."""
    encoder = save_tiny_checkpoint(tmp_path_factory.mktemp("encoder"), WORDS, num_hidden_layers=4,
                                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(1)
    model = BertForTokenClassification.from_pretrained(
        encoder, num_labels=len(LABELS), id2label=dict(enumerate(LABELS)), finetuning_task="ner",
        ner_document_context=False, ner_max_seq_length=32)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("dense.weight") or name.startswith("classifier."):
                parameter.normal_(0.0, 3.0 if name.startswith("classifier.") else 0.3)
    directory = tmp_path_factory.mktemp("teacher")
    model.save_pretrained(directory)
    BertTokenizer.from_pretrained(encoder).save_pretrained(directory)
    return directory


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    paths = {"train": tmp_path / "train.txt", "dev": tmp_path / "dev.txt", "more": tmp_path / "more.txt"}
    for key, text in (("train", TRAIN), ("dev", DEV), ("more", UNLABELED)):
        paths[key].write_text(text)
    return paths


def _word_logits(model, tokenizer, words: list[str]) -> torch.Tensor:
    """The model's logits at each word's first sub-token, the sentence alone in [CLS] ... [SEP] (words
    tokenized one by one, as the paper's tagging does)."""
    ids, positions = [tokenizer.cls_token_id], []
    for word in words:
        positions.append(len(ids))
        ids += tokenizer.encode(word)["input_ids"][1:-1]
    ids.append(tokenizer.sep_token_id)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, positions].double()


# ---------------------------------------------------------------------------- the cache

def test_teacher_word_logits_are_cached_flat_with_offsets_and_read_back(teacher, files, tmp_path, monkeypatch):
    calls = []
    real = tag_distiller.teacher_word_logits

    def counting(*args, **kwargs):
        calls.append(len(args[1]))
        return real(*args, **kwargs)

    monkeypatch.setattr(tag_distiller, "teacher_word_logits", counting)

    def task(out: str, **options):
        # max_seq_length 6: the 7-word sentence needs two windows (whole words, the rest as context)
        return distill_task(teacher, files["train"], dev_file=files["dev"], unlabeled=[files["more"]],
                            output_dir=tmp_path / out, layers=1, max_seq_length=6, **options)

    first = task("a")
    features = first.train_features
    words = [w for s in read_conll(files["train"]) for w in s.words] + UNLABELED.split()
    assert len(features) > 5 and sum(len(f["positions"]) for f in features) == len(words) == 25
    assert calls == [len(features), 2]  # the transfer set and the dev file, once each
    stored = sorted((tmp_path / "a" / "teacher_outputs").iterdir())
    assert len(stored) == 2
    store = next(d for d in stored if np.load(d / "offsets.npy").shape == (len(features) + 1,))
    meta = json.loads((store / "meta.json").read_text())
    assert {name: {k: v for k, v in info.items() if k != "sha256"} for name, info in meta["arrays"].items()} == \
        {"logits": {"shape": [25, 4], "dtype": "float32"}, "offsets": {"shape": [len(features) + 1], "dtype": "int64"}}
    offsets = np.load(store / "offsets.npy")
    logits = np.load(store / "logits.npy", mmap_mode="r")
    assert offsets[0] == 0 and offsets[-1] == 25 and np.all(np.diff(offsets) == [len(f["positions"]) for f in features])
    # each window's rows are the teacher's logits at its word positions, run on that window alone
    model = BertForTokenClassification.from_pretrained(teacher).eval()
    for i, feature in enumerate(features):
        with torch.no_grad():
            expected = model(torch.tensor([feature["input_ids"]])).logits[0, feature["positions"]].numpy()
        np.testing.assert_allclose(logits[offsets[i]:offsets[i + 1]], expected, rtol=1e-5, atol=1e-5)
    # a batch carries its windows' rows in the order of its word mask
    batch = first.collate([features[3], features[0]])
    assert batch["word_mask"].sum() == len(batch["teacher_logits"])
    np.testing.assert_array_equal(batch["teacher_logits"].numpy(), np.concatenate(
        [logits[offsets[3]:offsets[4]], logits[offsets[0]:offsets[1]]]))
    # read back, not recomputed: the same OUT again (as --resume), then students sharing --cache-dir
    task("a")
    assert calls == [len(features), 2]
    shared = task("b", cache_dir=tmp_path / "shared")
    assert calls == [len(features), 2] * 2
    again = task("c", cache_dir=tmp_path / "shared")
    assert calls == [len(features), 2] * 2
    assert torch.equal(shared.collate(features[:4])["teacher_logits"], again.collate(features[:4])["teacher_logits"])
    # held memory-mapped: no dense (windows, sequence, K) array is ever built
    arrays = cache_module.teacher_outputs(tmp_path / "shared", sorted(p.name for p in (tmp_path / "shared").iterdir()
                                                                      if not p.name.startswith("."))[0],
                                          lambda: pytest.fail("recomputed"))
    assert all(isinstance(a, np.memmap) and not a.flags.writeable for a in arrays.values())


# ---------------------------------------------------------------------------- the first loss

def test_the_students_first_loss_on_a_hand_built_batch(teacher, files, tmp_path):
    """The engine's first logged loss (the 2-layer student as initialised, the whole transfer set in one
    batch) equals the objective by hand: T² · mean KL over every word (the --unlabeled lines' too) and
    alpha · mean cross-entropy over the tagged words, each at the word's first sub-token."""
    temperature, alpha = 3.0, 0.7
    task = distill_task(teacher, files["train"], output_dir=tmp_path / "out", layers=2, unlabeled=[files["more"]],
                        temperature=temperature, alpha=alpha, cache_dir=tmp_path / "cache")
    assert len(task.train_features) == 5
    finetune(task, FinetuneArguments(output_dir=tmp_path / "out", max_steps=1, batch_size=5, log_every=1,
                                     progress=False, lr=1e-3))
    first = json.loads((tmp_path / "out" / "log.jsonl").read_text().splitlines()[0])

    tokenizer = BertTokenizer.from_pretrained(teacher)
    model = BertForTokenClassification.from_pretrained(teacher).eval()
    student = build_student(model, layers=2)[0].eval()
    sentences = [(s.words, s.tags) for s in read_conll(files["train"])]
    sentences += [(line.split(), None) for line in UNLABELED.splitlines() if line.strip()]
    kls, ces = [], []
    for words, tags in sentences:
        t, s = _word_logits(model, tokenizer, words).tolist(), _word_logits(student, tokenizer, words).tolist()
        for k in range(len(words)):
            p, q = _softmax([v / temperature for v in t[k]]), _softmax([v / temperature for v in s[k]])
            kls.append(sum(pi * math.log(pi / qi) for pi, qi in zip(p, q)))
            if tags is not None:
                ces.append(-math.log(_softmax(s[k])[LABELS.index(tags[k])]))
    assert len(kls) == 25 and len(ces) == 15
    soft = temperature ** 2 * sum(kls) / len(kls)
    hard = alpha * sum(ces) / len(ces)
    assert first["step"] == 1 and soft > 0.05 and hard > 0.05  # the student is not the teacher yet
    assert first["distill_loss"] == pytest.approx(soft, rel=1e-4)
    assert first["label_loss"] == pytest.approx(hard, rel=1e-4)
    assert first["loss"] == pytest.approx(soft + hard, rel=1e-4)
    info = json.loads((tmp_path / "out" / "distillation.json").read_text())
    assert (info["labelled_sentences"], info["unlabeled_sentences"], info["transfer_words"]) == (3, 2, 25)
    assert info["teacher_layers"] == [0, 2] and info["family"] == "tag"
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert set(results["metrics"]) == {"teacher_agreement"}  # no --dev-file: agreement on the training file
    # the control: the same student on the tags alone, the cross-entropy unweighted
    control = distill_task(teacher, files["train"], output_dir=tmp_path / "control", layers=2, labels_only=True,
                           unlabeled=[files["more"]], alpha=alpha, cache_dir=tmp_path / "cache")
    finetune(control, FinetuneArguments(output_dir=tmp_path / "control", max_steps=1, batch_size=5, log_every=1,
                                        progress=False, lr=1e-3))
    first = json.loads((tmp_path / "control" / "log.jsonl").read_text().splitlines()[0])
    assert "distill_loss" not in first and first["loss"] == pytest.approx(hard / alpha, rel=1e-4)


def test_a_tag_the_teacher_never_learned_is_one_line_naming_the_file_and_line(teacher, files, tmp_path, capsys):
    files["dev"].write_text(DEV.replace("london X B-LOC", "london X B-MISC"))
    assert main(["distill", "--teacher", str(teacher), "--output-dir", str(tmp_path / "out"), "--train-file",
                 str(files["train"]), "--dev-file", str(files["dev"]), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"bertforge distill: error: {files['dev']}:3: tag 'B-MISC' is not one of the labels of --teacher "
                   f"{teacher} (O B-LOC B-PER I-PER): the teacher never learned to predict it")
    assert not (tmp_path / "out" / "teacher_outputs").exists()  # refused before the teacher ran
    # a feature-based tagger (`finetune ner --feature-based`: a BiLSTM over frozen features) is no teacher
    bilstm = tmp_path / "bilstm"
    shutil.copytree(teacher, bilstm)
    config = json.loads((bilstm / "config.json").read_text())
    (bilstm / "config.json").write_text(json.dumps({**config, "feature_based": {"features": "last"}}))
    assert main(["distill", "--teacher", str(bilstm), "--output-dir", str(tmp_path / "out"), "--train-file",
                 str(files["train"]), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"bertforge distill: error: --teacher {bilstm}: a feature-based tagger") and "\n" not in err


# ---------------------------------------------------------------------------- the command end to end

def _conll_sentences(path: Path, count: int, keep=lambda tags: True) -> list[str]:
    """The first `count` sentences of a CoNLL file (as its lines) whose tags pass `keep`."""
    blocks, current = [], []
    for line in path.read_text(encoding="utf-8").splitlines() + [""]:
        if line.strip() and not line.startswith("-DOCSTART-"):
            current.append(line)
        elif current:
            if keep({row.split()[-1] for row in current}):
                blocks.append("\n".join(current))
            current = []
        if len(blocks) == count:
            break
    return blocks


@pytest.fixture(scope="module")
def conll(shared_data, tmp_path_factory) -> dict[str, Path]:
    """30 training sentences of the real CoNLL-2003 and 12 validation sentences whose tags those have
    (read in place; the few sentences written to a scratch directory)."""
    source = shared_data / "conll2003"
    directory = tmp_path_factory.mktemp("conll")
    train = _conll_sentences(source / "train.txt", 30)
    tags = {row.split()[-1] for block in train for row in block.splitlines()}
    dev = _conll_sentences(source / "valid.txt", 12, lambda found: found <= tags)
    (directory / "train.txt").write_text("\n\n".join(train) + "\n")
    (directory / "dev.txt").write_text("\n\n".join(dev) + "\n")
    words = [" ".join(row.split()[0] for row in block.splitlines()) for block in dev[:4]]
    (directory / "test.txt").write_text("\n\n".join("\n".join(w) for w in (s.split() for s in words)) + "\n")
    return {"train": directory / "train.txt", "dev": directory / "dev.txt", "test": directory / "test.txt"}


@pytest.fixture(scope="module")
def ner_teacher(conll, uncased_vocab, save_tiny_checkpoint, tmp_path_factory) -> Path:
    """A tiny 4-layer encoder with bert-base-uncased's vocabulary, fine-tuned on the sentences by the CLI."""
    tokens = uncased_vocab.read_text(encoding="utf-8").splitlines()
    encoder = save_tiny_checkpoint(tmp_path_factory.mktemp("uncased"), tokens, num_hidden_layers=4)
    out = tmp_path_factory.mktemp("runs") / "teacher"
    assert main(["finetune", "ner", "--model", str(encoder), "--train-file", str(conll["train"]), "--dev-file",
                 str(conll["dev"]), "--output-dir", str(out), "--epochs", "1", "--batch-size", "8", "--lr", "1e-3",
                 "--max-seq-length", "48", "--no-progress"]) == 0
    return out


def test_distill_end_to_end_on_conll_sentences(conll, ner_teacher, tmp_path, capsys, monkeypatch):
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "a.txt").write_text("Peter Blackburn visited Brussels on Thursday .\n"
                                             "The European Commission said nothing .\n")
    student = tmp_path / "student"
    command = ["distill", "--teacher", str(ner_teacher), "--output-dir", str(student), "--layers", "2",
               "--train-file", str(conll["train"]), "--dev-file", str(conll["dev"]),
               "--unlabeled", str(tmp_path / "text" / "*.txt"), "--max-steps", "3", "--max-seq-length", "48",
               "--no-progress", "--cache-dir", str(tmp_path / "teacher-cache")]
    seen = []
    real = engine.finetune_grid
    monkeypatch.setattr(engine, "finetune_grid", lambda task, args, *grid: seen.append(args) or real(task, args, *grid))
    assert main(command) == 0
    assert "ner: best at" in capsys.readouterr().out
    config = json.loads((student / "config.json").read_text())
    teacher_config = json.loads((ner_teacher / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["finetuning_task"] == "ner"
    assert config["architectures"] == ["BertForTokenClassification"]
    assert config["id2label"] == teacher_config["id2label"] and config["ner_max_seq_length"] == 48
    results = json.loads((student / "eval_results.json").read_text())
    assert {"f1", "precision", "recall", "accuracy", "teacher_agreement"} <= set(results["metrics"])
    assert 0 <= results["metrics"]["teacher_agreement"] <= 1
    info = json.loads((student / "distillation.json").read_text())
    assert info["teacher_layers"] == [0, 2] and info["labelled_sentences"] == 30 and info["unlabeled_sentences"] == 2
    assert {"f1", "precision", "recall", "accuracy"} <= set(info["teacher_dev_metrics"])
    dev_lines = [line for line in conll["dev"].read_text().splitlines() if line.strip()]
    predicted = [line for line in (student / "dev_predictions.txt").read_text().splitlines() if line.strip()]
    assert len(predicted) == len(dev_lines)
    # the tag family's recipe for the flags not given: batch 16 (classify's is 32), lr 5e-5, 3 epochs
    assert (seen[0].batch_size, seen[0].lr, seen[0].epochs, seen[0].max_steps) == (16, 5e-5, 3.0, 3)
    # a normal `ner` checkpoint: predict (a labelled file is scored, an unlabelled one tagged), the pipeline
    assert main(["predict", "--model", str(student), "--input", str(conll["dev"]), "--output",
                 str(tmp_path / "dev.out")]) == 0
    assert "entity F1" in capsys.readouterr().out
    assert main(["predict", "--model", str(student), "--input", str(conll["test"]), "--output",
                 str(tmp_path / "test.out")]) == 0
    rows = [line.split() for line in (tmp_path / "test.out").read_text().splitlines() if line.strip()]
    test_words = [line for line in conll["test"].read_text().splitlines() if line.strip()]
    assert len(rows) == len(test_words) and all(len(r) == 2 and r[1] in config["id2label"].values() for r in rows)
    words = pipeline("ner", model=student)(["Peter Blackburn visited Brussels ."], aggregation="none")[0]
    assert [w["word"] for w in words] == ["Peter", "Blackburn", "visited", "Brussels", "."]
    # a second student of the same teacher reads the teacher's outputs back from the shared --cache-dir
    monkeypatch.setattr(tag_distiller, "teacher_word_logits", lambda *a, **k: pytest.fail("teacher recomputed"))
    command[command.index(str(student))] = str(tmp_path / "student2")
    command[command.index("--layers") + 1] = "1"
    assert main(command + ["--labels-only"]) == 0
    assert json.loads((tmp_path / "student2" / "config.json").read_text())["num_hidden_layers"] == 1
    assert json.loads((tmp_path / "student2" / "distillation.json").read_text())["objective"] == "labels only"
