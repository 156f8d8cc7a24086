"""`bertforge distill` of teachers saved by Hugging Face transformers (the test-only peer): a
BertForTokenClassification or BertForQuestionAnswering fine-tuned there writes neither finetuning_task
nor problem_type in its config.json; its head tensors and `architectures` say what it is. Tiny models
built and saved by transformers here (no network) distil end to end on real CoNLL-2003 / SQuAD rows; a
bare encoder (no head tensors), all-MiniLM-L6-v2 included, is still refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.distillation.run import check_teacher
from bertforge.modeling.pretrained import read_tensor_shapes

from .test_distill import _error
from .test_distill_tag import _conll_sentences

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=128)


def _save_peer(model_class, directory: Path, vocab: Path, **config) -> Path:
    """A randomly initialised transformers model of `model_class` (seed 0) over `vocab`, saved as
    transformers saves a fine-tuned one (save_pretrained: config.json + model.safetensors) with vocab.txt."""
    torch.manual_seed(0)
    tokens = vocab.read_text(encoding="utf-8").splitlines()
    model = model_class(transformers.BertConfig(vocab_size=len(tokens), **TINY, **config))
    model.save_pretrained(directory)
    shutil.copy(vocab, directory / "vocab.txt")
    return directory


@pytest.fixture(scope="module")
def conll(shared_data, tmp_path_factory) -> dict[str, Path]:
    """12 training and 6 validation sentences of the real CoNLL-2003 (read in place)."""
    source = shared_data / "conll2003"
    directory = tmp_path_factory.mktemp("conll")
    (directory / "train.txt").write_text("\n\n".join(_conll_sentences(source / "train.txt", 12)) + "\n")
    (directory / "dev.txt").write_text("\n\n".join(_conll_sentences(source / "valid.txt", 6)) + "\n")
    return {"train": directory / "train.txt", "dev": directory / "dev.txt"}


@pytest.fixture(scope="module")
def squad_files(shared_data, tmp_path_factory) -> tuple[Path, Path]:
    """The first SQuAD v1.1 article's first paragraph as a training file, its next one as a dev file."""
    source = json.loads((shared_data / "squad/v1.1/train-v1.1.first11.json").read_text(encoding="utf-8"))
    directory = tmp_path_factory.mktemp("squad")
    article = source["data"][0]
    files = []
    for name, paragraphs in (("train", article["paragraphs"][:1]), ("dev", article["paragraphs"][1:2])):
        data = {"version": "1.1", "data": [{"title": article["title"], "paragraphs": paragraphs}]}
        (directory / f"{name}.json").write_text(json.dumps(data), encoding="utf-8")
        files.append(directory / f"{name}.json")
    return files[0], files[1]


NER_TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]


def test_a_transformers_tagger_distils_end_to_end(conll, uncased_vocab, tmp_path, capsys):
    teacher = _save_peer(transformers.BertForTokenClassification, tmp_path / "teacher", uncased_vocab,
                         num_labels=len(NER_TAGS), id2label=dict(enumerate(NER_TAGS)),
                         label2id={t: i for i, t in enumerate(NER_TAGS)})
    config = json.loads((teacher / "config.json").read_text())
    assert not config.get("finetuning_task") and not config.get("problem_type")  # as transformers saves it
    assert config["architectures"] == ["BertForTokenClassification"]
    family, _, _ = check_teacher(teacher)
    assert family.name == "tag"
    student = tmp_path / "student"
    assert main(["distill", "--teacher", str(teacher), "--output-dir", str(student), "--layers", "2",
                 "--train-file", str(conll["train"]), "--dev-file", str(conll["dev"]), "--max-steps", "2",
                 "--batch-size", "8", "--max-seq-length", "48", "--no-progress"]) == 0
    assert "ner: best at" in capsys.readouterr().out
    out = json.loads((student / "config.json").read_text())
    assert out["finetuning_task"] == "ner" and out["num_hidden_layers"] == 2
    assert out["id2label"] == {str(i): t for i, t in enumerate(NER_TAGS)}
    info = json.loads((student / "distillation.json").read_text())
    assert info["family"] == "tag" and info["teacher_layers"] == [0, 2] and info["labelled_sentences"] == 12
    assert {"f1", "teacher_agreement"} <= set(json.loads((student / "eval_results.json").read_text())["metrics"])
    # the student loads back in transformers, as the teacher came
    peer = transformers.BertForTokenClassification.from_pretrained(student)
    assert peer.config.num_hidden_layers == 2 and peer.config.id2label[1] == "B-PER"


def test_a_transformers_qa_model_distils_end_to_end(squad_files, uncased_vocab, tmp_path, capsys):
    train, dev = squad_files
    teacher = _save_peer(transformers.BertForQuestionAnswering, tmp_path / "teacher", uncased_vocab)
    config = json.loads((teacher / "config.json").read_text())
    assert not config.get("finetuning_task") and not config.get("problem_type")
    family, _, _ = check_teacher(teacher)
    assert family.name == "answer"
    student = tmp_path / "student"
    assert main(["distill", "--teacher", str(teacher), "--output-dir", str(student), "--layers", "2",
                 "--train-file", str(train), "--dev-file", str(dev), "--max-steps", "2", "--batch-size", "8",
                 "--max-seq-length", "128", "--doc-stride", "32", "--no-progress"]) == 0
    assert "squad: best at" in capsys.readouterr().out
    out = json.loads((student / "config.json").read_text())
    assert out["finetuning_task"] == "squad" and out["version_2_with_negative"] is False  # 1.1: the default
    assert out["architectures"] == ["BertForQuestionAnswering"] and out["num_hidden_layers"] == 2
    info = json.loads((student / "distillation.json").read_text())
    assert info["family"] == "answer" and info["version"] == "1.1" and info["teacher_layers"] == [0, 2]
    assert {"exact_match", "f1", "teacher_agreement"} <= set(json.loads((student / "eval_results.json").read_text())
                                                              ["metrics"])


def test_a_checkpoint_without_head_tensors_is_refused(minilm_dir, uncased_vocab, tmp_path, capsys):
    """A bare encoder (all-MiniLM-L6-v2 as published; a transformers BertModel), a tagger whose weights lost
    their head, and a transformers sequence classifier that never took a labelled step (its problem_type
    unset): each is refused in one line before any work."""
    train = tmp_path / "train.txt"
    train.write_text("EU B-ORG\nrejects O\n")
    common = ["--output-dir", str(tmp_path / "out"), "--train-file", str(train)]
    assert "not a fine-tuned model" in _error(capsys, ["distill", "--teacher", str(minilm_dir), *common])
    bare = _save_peer(transformers.BertModel, tmp_path / "bare", uncased_vocab)
    untrained = _save_peer(transformers.BertForSequenceClassification, tmp_path / "untrained", uncased_vocab)
    capsys.readouterr()  # transformers' progress bars
    assert "not a fine-tuned model" in _error(capsys, ["distill", "--teacher", str(bare), *common])
    # a tagger's config.json over a bare encoder's weights: the architecture alone does not make a teacher
    headless = tmp_path / "headless"
    shutil.copytree(bare, headless)
    config = json.loads((headless / "config.json").read_text())
    (headless / "config.json").write_text(json.dumps({**config, "architectures": ["BertForTokenClassification"]}))
    assert not any(name.startswith("classifier.") for name in read_tensor_shapes(headless / "model.safetensors"))
    assert "not a fine-tuned model" in _error(capsys, ["distill", "--teacher", str(headless), *common])
    assert "not a fine-tuned model" in _error(capsys, ["distill", "--teacher", str(untrained), *common])
    assert not (tmp_path / "out").exists()
