"""`bertforge distill --augment` (Tang et al. 2019 / TinyBERT's augmented transfer set) and the multi-label
distiller: the augmentation's determinism, rates and n-gram windows, TinyBERT's MLM replacements, the
per-label soft-target loss against a hand computation, and both end to end through the CLI."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

import pytest
import torch

from bertforge import pipeline
from bertforge.cli import main
from bertforge.distillation import augment as augment_module
from bertforge.distillation import binary_label_loss, distill_task, soft_binary_target_loss
from bertforge.distillation import classify as classify_distiller
from bertforge.distillation.augment import (MASK, AugmentRates, MaskedLmCandidates, augment_texts, check_masked_lm,
                                            unigram_words)
from bertforge.modeling import BertConfig, BertForMaskedLM, BertForSequenceClassification
from bertforge.tasks.registry import TASKS
from bertforge.tokenization import BertTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

POSITIVE, NEGATIVE = ["good", "great", "fine", "lovely"], ["bad", "awful", "poor", "dull"]
FILLER = ["the", "film", "was", "a", "plot", "very", "quite", "story"]
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ","] + POSITIVE + NEGATIVE + FILLER


def sentences(count: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        label = rng.random() < 0.5
        words = rng.choices(FILLER, k=rng.randint(2, 6)) + [rng.choice(POSITIVE if label else NEGATIVE)]
        rows.append((" ".join(words), "1" if label else "0"))
    return rows


def write_classify(path: Path, rows) -> Path:
    path.write_text("\n".join(["text,label"] + [f"{text},{label}" for text, label in rows]) + "\n")
    return path


def make_teacher(encoder: Path, directory: Path) -> Path:
    """`encoder` with a random classify head, saved as a fine-tuned model would be (these tests need a
    teacher's outputs, not good ones)."""
    torch.manual_seed(1)
    model = BertForSequenceClassification.from_pretrained(encoder, finetuning_task="classify", num_labels=2,
                                                          id2label={0: "0", 1: "1"},
                                                          problem_type="single_label_classification")
    model.save_pretrained(directory)
    BertTokenizer.from_pretrained(encoder).save_pretrained(directory)
    return directory


# ---------------------------------------------------------------------------- the augmentation

def test_augmentation_is_deterministic_for_a_seed():
    texts = [(" ".join(f"w{i}" for i in range(j, j + 12)), None) for j in range(20)] + [("a pair here", "and there")]
    unigram = unigram_words(["u1 u2 u3 u3"])
    first = augment_texts(texts, 3, seed=7, unigram=unigram)
    assert first == augment_texts(texts, 3, seed=7, unigram=unigram)  # the same seed: the same set
    assert first != augment_texts(texts, 3, seed=8, unigram=unigram)
    assert len(first) == 3 * len(texts) and first[-1][1] is not None and first[0][1] is None
    # copy c of text i depends on (seed, i, c) only: the first texts' copies do not change when more follow
    assert augment_texts(texts[:5], 3, seed=7, unigram=unigram) == first[:15]


def test_the_rates_are_as_set_on_a_large_sample():
    words = [f"w{i}" for i in range(20)]
    unigram = [f"u{i}" for i in range(1000)]  # a replacement is told from a kept word by its name
    out = augment_texts([(" ".join(words), None)] * 2000, 1, seed=0, unigram=unigram)
    whole = [row[0].split() for row in out if len(row[0].split()) == 20]
    ngram_share = 1 - len(whole) / len(out)
    assert ngram_share == pytest.approx(0.25, abs=0.04)  # a 1-5 word window kept, p 0.25
    tokens = [word for row in whole for word in row]
    assert sum(t == MASK for t in tokens) / len(tokens) == pytest.approx(0.1, abs=0.01)
    assert sum(t.startswith("u") for t in tokens) / len(tokens) == pytest.approx(0.1, abs=0.01)
    kept = [(row[i], words[i]) for row in whole for i in range(20) if row[i].startswith("w")]
    assert all(a == b for a, b in kept)  # a word is kept in place or changed, never moved
    # rates are settings: none at all leaves every text as it was
    none = AugmentRates(mask=0.0, replace=0.0, ngram=0.0)
    assert augment_texts([(" ".join(words), None)] * 5, 2, 0, unigram, rates=none) == [(" ".join(words), None)] * 10


def test_ngram_windows_are_contiguous_subsequences():
    words = [f"w{i}" for i in range(12)]
    only_ngrams = AugmentRates(mask=0.0, replace=0.0, ngram=1.0)
    out = [row[0].split() for row in augment_texts([(" ".join(words), None)] * 400, 1, 3, [], rates=only_ngrams)]
    for window in out:
        start = words.index(window[0])
        assert window == words[start:start + len(window)]
    assert {len(window) for window in out} == {1, 2, 3, 4, 5}
    # a text as short as the window drawn is kept whole
    short = augment_texts([("one two", None)] * 50, 1, 3, [], rates=only_ngrams)
    assert all(row[0] in ("one", "two", "one two") for row in short)


MLM_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "zebra", "##ing", "walk", "the", "a", "dog", "cat", "runs",
             "fast", "slow", "red", "blue", "big", "small", "old", "new", "sun", "moon", "tree", "road", "car", "house"]


@pytest.fixture(scope="module")
def mlm(tmp_path_factory) -> Path:
    """A tiny random MLM whose output bias makes "zebra" its first prediction everywhere."""
    directory = tmp_path_factory.mktemp("mlm")
    (directory / "vocab.txt").write_text("\n".join(MLM_WORDS) + "\n")
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=len(MLM_WORDS), hidden_size=32, num_hidden_layers=1,
                                       num_attention_heads=2, intermediate_size=64, max_position_embeddings=64))
    with torch.no_grad():
        model.cls.predictions.bias[MLM_WORDS.index("zebra")] = 100.0
    model.save_pretrained(directory)
    BertTokenizer(directory / "vocab.txt", do_lower_case=True).save_pretrained(directory)
    return directory


def test_augment_mlm_replaces_with_the_models_predictions(mlm, tmp_path):
    words = "the dog walking fast".split()  # "walking" is two pieces (walk ##ing): no MLM candidate
    assert MaskedLmCandidates(str(mlm), top_k=1)(words, 1) == ["zebra"]
    candidates = MaskedLmCandidates(str(mlm))
    top = candidates(words, 3)
    assert len(top) == 15 and top[0] == "zebra"  # TinyBERT's K = 15
    assert not any(t.startswith("##") or t.startswith("[") for t in top)
    # the same as the model's own top predictions at that position masked, special tokens and ## left out
    model = BertForMaskedLM.from_pretrained(mlm).eval()
    ids = torch.tensor([[2, 8, 10, 7, 6, 4, 3]])  # [CLS] the dog walk ##ing [MASK] [SEP]
    with torch.no_grad():
        logits = model(ids).logits[0, 5]
    allowed = [i for i, w in enumerate(MLM_WORDS) if not (w.startswith("##") or w.startswith("["))]
    expected = [MLM_WORDS[i] for i in sorted(allowed, key=lambda i: -float(logits[i]))[:15]]
    assert top == expected
    assert candidates(words, 2) == []
    # in the augmentation: every replaced one-piece word is the forced prediction; the two-piece word a unigram draw
    only_replace = AugmentRates(mask=0.0, replace=1.0, ngram=0.0)
    out = augment_texts([(" ".join(words), None)] * 5, 2, 0, ["u"], MaskedLmCandidates(str(mlm), top_k=1),
                        rates=only_replace)
    assert out == [("zebra zebra u zebra", None)] * 10
    # a checkpoint without an MLM head is refused before any work
    encoder = tmp_path / "encoder"
    BertForMaskedLM.from_pretrained(mlm).bert.save_pretrained(encoder)
    (encoder / "vocab.txt").write_text((mlm / "vocab.txt").read_text())
    with pytest.raises(ValueError, match="has no masked-LM head"):
        check_masked_lm(encoder)
    check_masked_lm(mlm)


# ---------------------------------------------------------------------------- the multi-label objective

def test_soft_binary_target_loss_equals_a_hand_computation():
    student = [[1.0, -0.5, 2.0], [0.2, 0.1, -1.0]]
    teacher = [[0.5, 0.0, 3.0], [-1.0, 2.0, 0.0]]
    temperature = 2.0

    def sig(x):
        return 1 / (1 + math.exp(-x))

    def bce(s, t):
        q, p = sig(s / temperature), sig(t / temperature)
        return -(p * math.log(q) + (1 - p) * math.log(1 - q))

    rows = [[bce(s, t) for s, t in zip(srow, trow)] for srow, trow in zip(student, teacher)]
    expected = temperature ** 2 * sum(map(sum, rows)) / 6
    got = soft_binary_target_loss(torch.tensor(student), torch.tensor(teacher), temperature)
    assert got.item() == pytest.approx(expected, rel=1e-6)
    masked = soft_binary_target_loss(torch.tensor(student), torch.tensor(teacher), temperature,
                                     torch.tensor([True, False]))
    assert masked.item() == pytest.approx(temperature ** 2 * sum(rows[0]) / 3, rel=1e-6)
    # the gold label sets: binary cross-entropy at T = 1 over the labelled rows
    gold = [[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]
    hand = -sum(g * math.log(sig(s)) + (1 - g) * math.log(1 - sig(s)) for s, g in zip(student[1], gold[1])) / 3
    assert binary_label_loss(torch.tensor(student), torch.tensor(gold), torch.tensor([False, True])).item() == \
        pytest.approx(hand, rel=1e-6)
    assert binary_label_loss(torch.tensor(student), torch.tensor(gold), torch.tensor([False, False])).item() == 0


# ---------------------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def goemotions(shared_data, uncased_vocab, save_tiny_checkpoint, tmp_path_factory) -> tuple[Path, Path]:
    """40 GoEmotions training and 16 dev rows (written to a scratch directory) and a tiny 2-layer teacher
    fine-tuned on them by `bertforge finetune multi-label`."""
    source = shared_data / "goemotions"
    directory = tmp_path_factory.mktemp("goemotions")
    for name, count in (("train.tsv", 40), ("dev.tsv", 16)):
        with open(source / name, encoding="utf-8") as handle:
            (directory / name).write_text("".join(next(handle) for _ in range(count)), encoding="utf-8")
    encoder = save_tiny_checkpoint(tmp_path_factory.mktemp("uncased"), uncased_vocab.read_text(encoding="utf-8")
                                   .splitlines())
    teacher = tmp_path_factory.mktemp("runs") / "teacher"
    assert main(["finetune", "multi-label", "--train-file", str(directory / "train.tsv"), "--dev-file",
                 str(directory / "dev.tsv"), "--labels", str(source / "emotions.txt"), "--model", str(encoder),
                 "--output-dir", str(teacher), "--epochs", "1", "--max-seq-length", "32", "--lr", "1e-3",
                 "--no-progress"]) == 0
    return directory, teacher


def test_distill_a_multi_label_teacher_end_to_end(goemotions, tmp_path, capsys, monkeypatch):
    data, teacher = goemotions
    teacher_config = json.loads((teacher / "config.json").read_text())
    student = tmp_path / "student"
    # no --labels: GoEmotions' label ids index the teacher's id2label
    command = ["distill", "--teacher", str(teacher), "--output-dir", str(student), "--layers", "1",
               "--train-file", str(data / "train.tsv"), "--dev-file", str(data / "dev.tsv"), "--epochs", "1",
               "--batch-size", "16", "--max-seq-length", "32", "--no-progress", "--augment", "2",
               "--cache-dir", str(tmp_path / "cache")]
    assert main(command) == 0
    assert "multi-label: best at epoch 1" in capsys.readouterr().out
    config = json.loads((student / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["finetuning_task"] == "multi-label"
    assert config["problem_type"] == "multi_label_classification" and config["id2label"] == teacher_config["id2label"]
    results = json.loads((student / "eval_results.json").read_text())["metrics"]
    assert {"f1_macro", "f1_macro_teacher_threshold", "teacher_agreement", "threshold"} <= set(results)
    assert 0 <= results["teacher_agreement"] <= 1
    # the threshold re-tuned on dev for the student is the one kept with it
    assert config["multi_label_threshold"] == results["threshold"]
    info = json.loads((student / "distillation.json").read_text())
    assert info["transfer_examples"] == 40 + 2 * 40 and info["augmented_examples"] == 80
    assert info["augment"] == {"copies": 2, "seed": 0, "mlm": None} and info["family"] == "multi-label"
    assert info["teacher_thresholds"] == [teacher_config["multi_label_threshold"]] * 28
    assert set(info["teacher_dev_metrics"]) >= {"f1_macro", "f1_micro"}
    assert len((student / "dev_predictions.jsonl").read_text().splitlines()) == 16
    # a normal multi-label checkpoint: predict reads its threshold; the pipeline takes it
    assert main(["predict", "--model", str(student), "--input", str(data / "dev.tsv"),
                 "--output", str(tmp_path / "p.tsv")]) == 0
    assert len((tmp_path / "p.tsv").read_text().splitlines()) == 17
    scores = pipeline("classify", model=student)(["I love this"])[0]["scores"]
    assert list(scores) == [teacher_config["id2label"][str(i)] for i in range(28)]
    # a second student reads the augmented texts and the teacher's outputs back from the shared cache
    monkeypatch.setattr(classify_distiller, "teacher_logits", lambda *a, **k: pytest.fail("teacher recomputed"))
    monkeypatch.setattr(augment_module, "augment_texts", lambda *a, **k: pytest.fail("augmented again"))
    command[command.index(str(student))] = str(tmp_path / "student2")
    assert main(command + ["--seed", "5"]) == 0
    assert json.loads((tmp_path / "student2" / "distillation.json").read_text())["transfer_examples"] == 120


def test_augment_grows_the_transfer_set_and_one_cache_serves_two_students(encoder, mlm, tmp_path, monkeypatch):
    teacher = make_teacher(encoder, tmp_path / "teacher")
    train = write_classify(tmp_path / "train.csv", sentences(16, 1))
    calls = []
    real = classify_distiller.teacher_logits
    monkeypatch.setattr(classify_distiller, "teacher_logits",
                        lambda *a, **k: calls.append(len(a[1])) or real(*a, **k))
    cache = tmp_path / "cache"
    command = ["distill", "--teacher", str(teacher), "--train-file", str(train), "--epochs", "1", "--batch-size", "8",
               "--no-progress", "--cache-dir", str(cache), "--augment", "3"]
    assert main(command + ["--output-dir", str(tmp_path / "a"), "--layers", "1"]) == 0
    assert calls == [16 + 3 * 16]  # the training file and its augmented copies, once
    info = json.loads((tmp_path / "a" / "distillation.json").read_text())
    assert info["transfer_examples"] == 64 and info["augmented_examples"] == 48 and info["labelled_examples"] == 16
    # another student (another size, another training seed): the same augmented set, the teacher not run again
    assert main(command + ["--output-dir", str(tmp_path / "b"), "--layers", "2", "--seed", "3"]) == 0
    assert calls == [64]
    # another --augment-seed is another transfer set (computed again); --augment-mlm draws from the MLM
    assert main(command + ["--output-dir", str(tmp_path / "c"), "--layers", "1", "--augment-seed", "1"]) == 0
    assert calls == [64, 64]
    stored = sorted(cache.glob("augmented-*.json"))
    assert len(stored) == 2
    first, second = (json.loads(path.read_text()) for path in stored)
    assert first != second and len(first) == len(second) == 48
    assert main(command + ["--output-dir", str(tmp_path / "d"), "--layers", "1", "--augment-mlm", str(mlm)]) == 0
    info = json.loads((tmp_path / "d" / "distillation.json").read_text())
    assert info["augment"]["mlm"] == str(mlm) and info["augmented_examples"] == 48
    assert len(list(cache.glob("augmented-*.json"))) == 3 and calls == [64, 64, 64]


def test_the_multi_label_students_first_loss_on_a_hand_built_batch(goemotions, tmp_path):
    data, teacher = goemotions
    task = distill_task(teacher, data / "train.tsv", output_dir=tmp_path / "out", layers=1, temperature=3.0,
                        alpha=0.25, max_seq_length=32, augment=1)
    assert len(task.train_features) == 80  # 40 rows, then their 40 augmented copies
    mask_id = BertTokenizer.from_pretrained(teacher).vocab["[MASK]"]  # a masked word is the teacher's [MASK]
    assert not any(mask_id in f["input_ids"] for f in task.train_features[:40])
    assert any(mask_id in f["input_ids"] for f in task.train_features[40:])
    batch = task.collate([task.train_features[0], task.train_features[40]])  # a labelled row, an augmented one
    assert batch["label_mask"].tolist() == [True, False]
    gold = next(open(data / "train.tsv", encoding="utf-8")).split("\t")[1].split(",")
    assert torch.nonzero(batch["labels"][0]).flatten().tolist() == sorted(map(int, gold))
    model = task.build_model()
    model.eval()
    teacher_threshold = json.loads((teacher / "config.json").read_text())["multi_label_threshold"]
    assert model.config.extra["multi_label_threshold"] == teacher_threshold  # without dev: the teacher's
    losses, _ = task.step_fn(model, batch)
    with torch.no_grad():
        ids = [torch.tensor([f["input_ids"]]) for f in (task.train_features[0], task.train_features[40])]
        student = [model(input_ids=i).logits[0] for i in ids]
        expected_teacher = [BertForSequenceClassification.from_pretrained(teacher).eval()(input_ids=i).logits[0]
                            for i in ids]
    torch.testing.assert_close(batch["teacher_logits"], torch.stack(expected_teacher), atol=1e-5, rtol=0)
    t = 3.0
    soft = sum(-(torch.sigmoid(z / t) * torch.log(torch.sigmoid(s / t))
                 + (1 - torch.sigmoid(z / t)) * torch.log(1 - torch.sigmoid(s / t))).mean()
               for s, z in zip(student, expected_teacher)) / 2 * t * t
    hard = -(batch["labels"][0] * torch.log(torch.sigmoid(student[0]))
             + (1 - batch["labels"][0]) * torch.log(1 - torch.sigmoid(student[0]))).mean()
    assert losses["distill_loss"].item() == pytest.approx(soft.item(), rel=1e-4)
    assert losses["label_loss"].item() == pytest.approx(0.25 * hard.item(), rel=1e-4)


def test_augment_flags_are_checked_before_any_work(encoder, teacher_for_errors, tmp_path, capsys, monkeypatch):
    from bertforge.cli import distill as cli_distill
    monkeypatch.setattr(cli_distill, "run", lambda args: pytest.fail("work started"))
    train = write_classify(tmp_path / "train.csv", sentences(8, 1))
    common = ["distill", "--teacher", str(teacher_for_errors), "--output-dir", str(tmp_path / "out"),
              "--train-file", str(train)]
    for extra, message in ((["--augment", "-1"], "--augment must be 0 or more"),
                           (["--augment", "2", "--labels-only"], "--labels-only cannot learn from"),
                           (["--augment-mlm", str(teacher_for_errors)], "--augment-mlm needs --augment N"),
                           (["--augment", "1", "--augment-mlm", str(teacher_for_errors)], "has no masked-LM head")):
        assert main(common + extra) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("bertforge distill: error: ") and message in err and "\n" not in err
    # a family whose distillation does not augment its transfer set (yet) says so
    family = TASKS["classify"]
    monkeypatch.setitem(TASKS, "classify", dataclasses.replace(family, distill=dataclasses.replace(family.distill,
                                                                                                    augment=False)))
    assert main(common + ["--augment", "1"]) == 2
    assert "--augment: the classify family's transfer set is not augmented yet (supported: multi-label, tag)" in \
        capsys.readouterr().err


@pytest.fixture
def teacher_for_errors(encoder, tmp_path) -> Path:
    return make_teacher(encoder, tmp_path / "teacher")


@pytest.fixture(scope="module")
def encoder(tmp_path_factory, save_tiny_checkpoint) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("encoder"), WORDS, num_hidden_layers=4,
                                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
