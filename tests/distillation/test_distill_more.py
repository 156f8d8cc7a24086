"""`bertforge distill --augment N` for the tag family (augmented copies of each training sentence's words,
untagged, soft targets only, kept beside the teacher's outputs and read back) and `--intermediate` for
the tag and answer families (TinyBERT's terms in their steps: the first logged terms against
`intermediate_losses` on the student as initialised)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.distillation import augment as augment_module
from bertforge.distillation import distill_task
from bertforge.distillation import tag as tag_distiller
from bertforge.distillation.augment import augment_texts, unigram_words
from bertforge.distillation.intermediate import IntermediateTransfer, intermediate_losses
from bertforge.distillation.student import build_student
from bertforge.modeling import BertForQuestionAnswering, BertForTokenClassification
from bertforge.tasks.conll import IGNORE_INDEX, read_conll
from bertforge.tokenization import BertTokenizer
from bertforge.training.finetune import FinetuneArguments, finetune

from .test_augment import mlm  # noqa: F401 (a fixture: a tiny MLM whose first prediction is "zebra")
from .test_distill_tag import LABELS, TRAIN, WORDS

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tag_teacher(tmp_path_factory, save_tiny_checkpoint) -> Path:
    """A random 4-layer, 2-head tagger (no dropout) saved as `finetune ner` saves one, its weights far from
    the initial ones (so a 2-layer student's hidden states differ from the teacher's)."""
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
def train(tmp_path) -> Path:
    path = tmp_path / "train.txt"
    path.write_text(TRAIN)
    return path


# ---------------------------------------------------------------------------- --augment for the tag family

def test_tag_augment_grows_the_transfer_set_and_is_read_back(tag_teacher, train, tmp_path, monkeypatch):
    sentences = read_conll(train)
    assert len(sentences) == 3
    task = distill_task(tag_teacher, train, output_dir=tmp_path / "a", layers=1, augment=3, augment_seed=5,
                        cache_dir=tmp_path / "cache")
    features = task.train_features
    assert len(features) == 3 + 3 * 3  # one window per sentence: the file's, then 3 copies of each
    # the copies are augment_texts' of each sentence's words (its seed, the file's unigram words), in order
    texts = [" ".join(s.words) for s in sentences]
    expected = augment_texts([(t,) for t in texts], 3, 5, unigram_words(texts))
    tokenizer = BertTokenizer.from_pretrained(tag_teacher)
    for feature, (text,) in zip(features[3:], expected):
        words = text.split()
        assert len(feature["positions"]) == len(words)
        ids = [tokenizer.cls_token_id] + [i for w in words for i in tokenizer.encode(w)["input_ids"][1:-1]
                                          or [tokenizer.unk_token_id]] + [tokenizer.sep_token_id]
        assert feature["input_ids"] == ids
        assert set(feature["labels"]) == {IGNORE_INDEX}  # untagged: soft targets only
    assert any("[MASK]" in text for (text,) in expected) and expected != [(t,) for t in texts for _ in range(3)]
    # the teacher's soft targets cover the copies' words too; the gold tags only the file's
    batch = task.collate(features)
    assert len(batch["teacher_logits"]) == sum(len(f["positions"]) for f in features)
    assert int((batch["labels"] != IGNORE_INDEX).sum()) == sum(len(s) for s in sentences)
    stored = list((tmp_path / "cache").glob("augmented-*.json"))
    assert len(stored) == 1 and [tuple(r) for r in json.loads(stored[0].read_text())] == expected
    # a second student reads the augmented set (and the teacher's outputs) back: neither is made again
    monkeypatch.setattr(augment_module, "augment_texts", lambda *a, **k: pytest.fail("augmented again"))
    monkeypatch.setattr(tag_distiller, "teacher_word_logits", lambda *a, **k: pytest.fail("teacher recomputed"))
    again = distill_task(tag_teacher, train, output_dir=tmp_path / "b", layers=2, augment=3, augment_seed=5,
                         cache_dir=tmp_path / "cache")
    assert [f["input_ids"] for f in again.train_features] == [f["input_ids"] for f in features]
    monkeypatch.undo()
    # determinism: the same --augment-seed in a fresh cache, the same set; another seed, another one
    same = distill_task(tag_teacher, train, output_dir=tmp_path / "c", layers=1, augment=3, augment_seed=5)
    other = distill_task(tag_teacher, train, output_dir=tmp_path / "d", layers=1, augment=3, augment_seed=6)
    assert [f["input_ids"] for f in same.train_features] == [f["input_ids"] for f in features]
    assert [f["input_ids"] for f in other.train_features] != [f["input_ids"] for f in features]


def test_tag_augment_from_the_command(tag_teacher, train, mlm, tmp_path, monkeypatch):
    calls = []
    real = tag_distiller.teacher_word_logits
    monkeypatch.setattr(tag_distiller, "teacher_word_logits",
                        lambda *a, **k: calls.append(len(a[1])) or real(*a, **k))
    out = tmp_path / "student"
    command = ["distill", "--teacher", str(tag_teacher), "--train-file", str(train), "--layers", "2",
               "--augment", "2", "--max-steps", "2", "--batch-size", "4", "--no-progress", "--cache-dir",
               str(tmp_path / "cache"), "--output-dir", str(out)]
    assert main(command) == 0
    assert calls == [3 + 2 * 3]  # the file and its copies, once
    info = json.loads((out / "distillation.json").read_text())
    assert (info["labelled_sentences"], info["augmented_sentences"], info["transfer_sentences"]) == (3, 6, 9)
    assert info["augment"] == {"copies": 2, "seed": 0, "mlm": None}
    assert main(command[:-1] + [str(tmp_path / "second"), "--seed", "7"]) == 0
    assert calls == [9]  # read back for the second student
    assert main(command[:-1] + [str(tmp_path / "third"), "--augment-seed", "1"]) == 0
    assert calls == [9, 9]  # another augmentation seed: another transfer set
    # --augment-mlm: TinyBERT's replacements, the MLM's predictions (a one-piece word becomes "zebra")
    assert main(command[:-1] + [str(tmp_path / "fourth"), "--augment-mlm", str(mlm)]) == 0
    assert json.loads((tmp_path / "fourth" / "distillation.json").read_text())["augment"]["mlm"] == str(mlm)
    stored = [json.loads(p.read_text()) for p in (tmp_path / "cache").glob("augmented-*.json")]
    assert len(stored) == 3 and sum(any("zebra" in text for (text,) in rows) for rows in stored) == 1


# ---------------------------------------------------------------------------- --intermediate: tag, answer

def _first_log(task, out: Path, batch_size: int, precision: str = "fp32") -> dict:
    finetune(task, FinetuneArguments(output_dir=out, max_steps=1, batch_size=batch_size, log_every=1,
                                     progress=False, lr=1e-3, precision=precision))
    return json.loads((out / "log.jsonl").read_text().splitlines()[0])


def _expected(teacher_model, batch, layer_map) -> dict[str, float]:
    """`intermediate_losses` of the 2-layer student as initialised (`build_student`) against the teacher."""
    student = build_student(teacher_model, layers=2)[0].eval()
    transfer = IntermediateTransfer(student.config, teacher_model.config, ("hidden", "attention"), layer_map)
    inputs = dict(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                  attention_mask=batch["attention_mask"], output_hidden_states=True, output_attentions=True)
    with torch.no_grad():
        losses = intermediate_losses(transfer, student(**inputs), teacher_model(**inputs), batch["attention_mask"])
    return {name: value.item() for name, value in losses.items()}


@pytest.mark.parametrize("kinds,precision", [("hidden,attention", "fp32"), ("hidden", "fp32"), ("hidden", "bf16")])
def test_the_first_intermediate_terms_of_a_tag_run(tag_teacher, train, tmp_path, kinds, precision):
    """hidden states alone run the student unpadded (the engine's default); bf16 under CPU autocast."""
    task = distill_task(tag_teacher, train, output_dir=tmp_path / "out", layers=2, intermediate=kinds,
                        intermediate_weight=0.5, cache_dir=tmp_path / "cache")
    batch = task.collate(list(task.train_features))
    first = _first_log(task, tmp_path / "out", len(task.train_features), precision)
    expected = _expected(BertForTokenClassification.from_pretrained(tag_teacher).eval(), batch, [0, 2])
    assert expected["hidden_loss"] > 1e-3 and expected["attention_loss"] > 1e-6
    rel = 1e-4 if precision == "fp32" else 5e-2
    assert first["hidden_loss"] == pytest.approx(0.5 * expected["hidden_loss"], rel=rel)
    if "attention" in kinds:
        assert first["attention_loss"] == pytest.approx(0.5 * expected["attention_loss"], rel=rel)
    else:
        assert "attention_loss" not in first
    assert first["loss"] == pytest.approx(sum(first[k] for k in ("distill_loss", "label_loss", "hidden_loss",
                                                                 "attention_loss") if k in first), rel=1e-4)
    info = json.loads((tmp_path / "out" / "distillation.json").read_text())
    assert info["intermediate"] == kinds.split(",") and info["layer_map"] == [0, 2]
    # the saved student is the tagger alone (no projection, no wrapper), a normal `ner` checkpoint
    model = BertForTokenClassification.from_pretrained(tmp_path / "out")
    assert model.config.num_hidden_layers == 2 and model.config.extra["finetuning_task"] == "ner"


@pytest.fixture(scope="module")
def squad_file(shared_data, tmp_path_factory) -> Path:
    """The first SQuAD v1.1 article's first paragraph (read in place, written to a scratch directory)."""
    source = json.loads((shared_data / "squad/v1.1/train-v1.1.first11.json").read_text(encoding="utf-8"))
    article = source["data"][0]
    path = tmp_path_factory.mktemp("squad") / "train.json"
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": article["title"],
                                                           "paragraphs": article["paragraphs"][:1]}]}))
    return path


@pytest.fixture(scope="module")
def qa_teacher(uncased_vocab, save_tiny_checkpoint, tmp_path_factory) -> Path:
    """A random 4-layer, 2-head QA model over bert-base-uncased's vocabulary saved as `finetune squad` saves
    one (finetuning_task "squad", its window settings), its weights far from the initial ones."""
    tokens = uncased_vocab.read_text(encoding="utf-8").splitlines()
    encoder = save_tiny_checkpoint(tmp_path_factory.mktemp("uncased"), tokens, num_hidden_layers=4,
                                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(2)
    model = BertForQuestionAnswering.from_pretrained(encoder, finetuning_task="squad", squad=dict(
        max_seq_length=64, doc_stride=16, max_query_length=16))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("dense.weight"):
                parameter.normal_(0.0, 0.3)
    directory = tmp_path_factory.mktemp("qa_teacher")
    model.save_pretrained(directory)
    BertTokenizer.from_pretrained(encoder).save_pretrained(directory)
    return directory


def test_the_first_intermediate_terms_of_an_answer_run(qa_teacher, squad_file, tmp_path, capsys):
    task = distill_task(qa_teacher, squad_file, output_dir=tmp_path / "out", layers=2,
                        intermediate="hidden,attention", intermediate_weight=2.0, cache_dir=tmp_path / "cache")
    features = task.train_features
    assert 4 < len(features) < 200
    batch = task.collate(list(features))
    first = _first_log(task, tmp_path / "out", len(features))
    expected = _expected(BertForQuestionAnswering.from_pretrained(qa_teacher).eval(), batch, [0, 2])
    assert expected["hidden_loss"] > 1e-3
    assert first["hidden_loss"] == pytest.approx(2.0 * expected["hidden_loss"], rel=1e-4)
    assert first["attention_loss"] == pytest.approx(2.0 * expected["attention_loss"], rel=1e-4)
    info = json.loads((tmp_path / "out" / "distillation.json").read_text())
    assert info["intermediate"] == ["hidden", "attention"] and info["intermediate_weight"] == 2.0
    assert BertForQuestionAnswering.from_pretrained(tmp_path / "out").config.num_hidden_layers == 2
    # the command takes --intermediate for an answer teacher; --labels-only with it is refused in one line
    assert main(["distill", "--teacher", str(qa_teacher), "--train-file", str(squad_file), "--output-dir",
                 str(tmp_path / "cli"), "--intermediate", "hidden", "--max-steps", "1", "--no-progress",
                 "--cache-dir", str(tmp_path / "cache")]) == 0
    assert json.loads((tmp_path / "cli" / "distillation.json").read_text())["intermediate"] == ["hidden"]
    capsys.readouterr()
    assert main(["distill", "--teacher", str(qa_teacher), "--train-file", str(squad_file), "--output-dir",
                 str(tmp_path / "x"), "--intermediate", "hidden", "--labels-only"]) == 2
    assert "--labels-only with --intermediate" in capsys.readouterr().err
