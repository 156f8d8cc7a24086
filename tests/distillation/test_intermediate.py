"""`bertforge distill --intermediate` (TinyBERT's hidden-state and attention-map terms) and
`--student-vocab` (a student checkpoint with its own vocabulary): the terms against a hand computation,
zero for a copy of the teacher, the layer map and its errors, runs end to end, and the refusals."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from bertforge.cli import main
from bertforge.distillation import distill_task
from bertforge.distillation.intermediate import (IntermediateTransfer, intermediate_losses, layer_map_for,
                                                 parse_intermediate, parse_layer_map, uniform_layer_map)
from bertforge.distillation.run import check_options
from bertforge.distillation.student import build_student
from bertforge.modeling import BertConfig, BertForSequenceClassification
from bertforge.tasks.registry import resolve
from bertforge.tokenization import BertTokenizer
from bertforge.training.finetune import FinetuneArguments, finetune
from bertforge.training.loop import Trainer

from .test_distill import WORDS, _error, make_teacher, sentences, write_classify

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, save_tiny_checkpoint):
    """A 4-layer, 32-wide, 2-head classify teacher (no dropout) over the word vocabulary."""
    encoder = save_tiny_checkpoint(tmp_path_factory.mktemp("encoder"), WORDS, num_hidden_layers=4,
                                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return make_teacher(encoder, tmp_path_factory.mktemp("teacher"))


@pytest.fixture(scope="module")
def narrow(tmp_path_factory, save_tiny_checkpoint):
    """A 2-layer, 16-wide, 2-head encoder with the teacher's vocabulary (a student whose width differs)."""
    return save_tiny_checkpoint(tmp_path_factory.mktemp("narrow"), WORDS, num_hidden_layers=2, hidden_size=16,
                                intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _batch(tokenizer, texts):
    rows = [tokenizer.encode(text)["input_ids"] for text in texts]
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    return ids, (ids != 0).long(), [len(r) for r in rows]


# ---------------------------------------------------------------------------- the terms

def test_the_terms_equal_a_hand_computation(teacher, narrow):
    """hidden: Σ over (embeddings 0 -> 0, then i -> m(i)) of the mean over real tokens and the teacher's
    width of (h_s W - h_t)²; attention: Σ over mapped layers of the mean over heads and (real query, real
    key) pairs of (a_s - a_t)². Computed here example by example, each alone (no padding at all)."""
    tokenizer = BertTokenizer.from_pretrained(teacher)
    texts = ["good film", "the plot was very dull and bad", "a lovely story"]
    ids, mask, lengths = _batch(tokenizer, texts)
    big = BertForSequenceClassification.from_pretrained(teacher).eval()
    small = BertForSequenceClassification.from_pretrained(narrow, num_labels=2).eval()
    layer_map = [1, 3]
    torch.manual_seed(0)
    transfer = IntermediateTransfer(small.config, big.config, ("hidden", "attention"), layer_map)
    assert transfer.projection.weight.shape == (32, 16)  # H_t x H_s: a Linear from the student's width
    with torch.no_grad():
        ours = small(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        theirs = big(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        got = intermediate_losses(transfer, ours, theirs, mask)
        hidden_sums, attention_sums = [0.0] * 3, [0.0] * 2
        tokens = pairs = 0
        w = transfer.projection.weight.double()
        for row, length in enumerate(lengths):
            alone = ids[row:row + 1, :length]
            s = small(alone, output_hidden_states=True, output_attentions=True)
            t = big(alone, output_hidden_states=True, output_attentions=True)
            for k, (a, b) in enumerate([(0, 0), (1, 2), (2, 4)]):  # hidden_states index: layer + 1
                hidden_sums[k] += float(((s.hidden_states[a][0].double() @ w.T - t.hidden_states[b][0].double())
                                         ** 2).sum())
            for k, (a, b) in enumerate(zip([0, 1], layer_map)):
                attention_sums[k] += float(((s.attentions[a][0].double() - t.attentions[b][0].double()) ** 2).sum())
            tokens += length
            pairs += 2 * length * length  # two heads
    hidden = sum(value / (tokens * 32) for value in hidden_sums)
    attention = sum(value / pairs for value in attention_sums)
    assert hidden > 0.01 and attention > 1e-8  # random tiny models: near-uniform maps
    assert got["hidden_loss"].item() == pytest.approx(hidden, rel=1e-4)
    assert got["attention_loss"].item() == pytest.approx(attention, rel=1e-4)
    # one kind alone gives its term alone; the same width needs no projection
    only = IntermediateTransfer(small.config, big.config, ("attention",), layer_map)
    assert only.projection is None and set(intermediate_losses(only, ours, theirs, mask)) == {"attention_loss"}


def test_the_terms_are_zero_for_a_copy_of_the_teacher(teacher):
    model = BertForSequenceClassification.from_pretrained(teacher).eval()
    student = build_student(model, layers=4)[0].eval()  # every layer, identity map
    transfer = IntermediateTransfer(student.config, model.config, ("hidden", "attention"), [0, 1, 2, 3])
    assert transfer.projection is None
    ids, mask, _ = _batch(BertTokenizer.from_pretrained(teacher), ["good film", "a very dull plot and it was bad"])
    with torch.no_grad():
        ours = student(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        theirs = model(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    losses = intermediate_losses(transfer, ours, theirs, mask)
    assert losses["hidden_loss"].item() == pytest.approx(0.0, abs=1e-10)
    assert losses["attention_loss"].item() == pytest.approx(0.0, abs=1e-10)
    # a map off by one layer is not zero
    shifted = IntermediateTransfer(student.config, model.config, ("hidden", "attention"), [1, 2, 3, 3])
    assert all(v.item() > 1e-8 for v in intermediate_losses(shifted, ours, theirs, mask).values())


@pytest.mark.parametrize("precision", [torch.float32, torch.bfloat16])
def test_attention_maps_with_autograd_on_cpu(teacher, precision):
    """The student's call in training (autograd on, autocast in bf16) returns attention probabilities
    and hidden states that give a finite term with a gradient."""
    model = BertForSequenceClassification.from_pretrained(teacher).eval()
    student = build_student(model, layers=2)[0].train()
    transfer = IntermediateTransfer(student.config, model.config, ("hidden", "attention"), [0, 2])
    ids, mask, _ = _batch(BertTokenizer.from_pretrained(teacher), ["good film", "a very dull plot"])
    model.requires_grad_(False)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == torch.bfloat16):
        ours = student(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        theirs = model(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        losses = intermediate_losses(transfer, ours, theirs, mask)
    assert ours.attentions[0].shape == (2, 2, ids.shape[1], ids.shape[1])
    total = losses["hidden_loss"] + losses["attention_loss"]
    assert torch.isfinite(total)
    total.backward()
    grad = student.bert.encoder.layer[0].attention.self.query.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    assert all(p.grad is None for p in model.parameters())  # the teacher is never trained


# ---------------------------------------------------------------------------- the layer map

def test_layer_maps_and_their_errors(teacher, narrow):
    assert uniform_layer_map(6, 3) == [1, 3, 5] and uniform_layer_map(12, 4) == [2, 5, 8, 11]
    assert uniform_layer_map(4, 4) == [0, 1, 2, 3]
    assert parse_layer_map("0, 2,3", 3, 4) == [0, 2, 3]
    assert parse_intermediate("attention,hidden") == ("hidden", "attention")
    assert parse_intermediate("hidden") == ("hidden",)
    for text, message in (("a,b", "one teacher layer number per student layer"),
                          ("0,1,2", "3 layers given, the student has 2"), ("0,4", "teacher layer 4 does not exist"),
                          ("-1,2", "teacher layer -1 does not exist")):
        with pytest.raises(ValueError, match=f"--layer-map {text}: .*{message}"):
            parse_layer_map(text, 2, 4)
    for text in ("", "hidden,logits", "attentions"):
        with pytest.raises(ValueError, match="--intermediate .*give hidden, attention or hidden,attention"):
            parse_intermediate(text)
    config = BertConfig.from_pretrained(teacher)
    # --layers N (or the default): the layers the student started from; a preset or checkpoint: uniform
    assert layer_map_for(config, 2, None, None) == [0, 2]
    assert layer_map_for(config, None, None, None) == [0, 2]
    assert layer_map_for(config, 3, None, None) == [0, 1, 2]
    assert layer_map_for(config, None, str(narrow), None) == [1, 3]
    assert layer_map_for(config, None, "tiny", None) == [1, 3]  # tiny: 2 layers
    assert layer_map_for(config, 2, None, "3,3") == [3, 3]
    with pytest.raises(ValueError, match="--intermediate attention: the student has 4 attention heads, the teacher 2"):
        IntermediateTransfer(BertConfig.from_dict({**config.to_dict(), "num_attention_heads": 4}), config,
                             ("attention",), [0, 1, 2, 3])
    # hidden states alone pair any numbers of heads
    IntermediateTransfer(BertConfig.from_dict({**config.to_dict(), "num_attention_heads": 4}), config, ("hidden",),
                         [0, 1, 2, 3])


# ---------------------------------------------------------------------------- runs

def test_distill_with_intermediate_terms(teacher, narrow, tmp_path, capsys, monkeypatch):
    train = write_classify(tmp_path / "train.csv", sentences(16, 4))
    out = tmp_path / "student"
    command = ["distill", "--teacher", str(teacher), "--output-dir", str(out), "--student", str(narrow),
               "--train-file", str(train), "--intermediate", "hidden,attention", "--intermediate-weight", "2",
               "--epochs", "2", "--batch-size", "8", "--log-every", "1", "--no-progress", "--lr", "1e-3",
               "--save-every", "2"]
    assert main(command) == 0
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    steps = [r for r in log if "loss" in r]
    assert len(steps) == 4
    for record in steps:
        assert {"distill_loss", "label_loss", "hidden_loss", "attention_loss"} <= set(record)
        assert record["loss"] == pytest.approx(record["distill_loss"] + record["label_loss"] + record["hidden_loss"]
                                               + record["attention_loss"], rel=1e-4)
    assert steps[-1]["hidden_loss"] < steps[0]["hidden_loss"]  # the projection and the student learn the term
    info = json.loads((out / "distillation.json").read_text())
    assert info["intermediate"] == ["hidden", "attention"] and info["layer_map"] == [1, 3]
    assert info["intermediate_weight"] == 2.0
    # the student is a normal checkpoint: no projection in its weights; loads and predicts
    with safe_open(str(out / "model.safetensors"), "pt") as weights:
        names = list(weights.keys())
    assert not any("projection" in n or n.startswith(("student.", "transfer.")) for n in names)
    model = BertForSequenceClassification.from_pretrained(out)
    assert model.config.hidden_size == 16 and model.config.num_hidden_layers == 2
    test = tmp_path / "test.csv"
    test.write_text("text\ngood film\nbad plot\n")
    assert main(["predict", "--model", str(out), "--input", str(test), "--output", str(tmp_path / "p.tsv")]) == 0
    assert len((tmp_path / "p.tsv").read_text().splitlines()) == 3
    # killed after its checkpoint of step 2 and resumed: the projection comes back with the student (the
    # engine's checkpoints hold both), so steps 3 and 4 are the uninterrupted run's
    save = Trainer.save

    def save_then_die(self, *args, **kwargs):
        save(self, *args, **kwargs)
        if self.step == 2:
            raise RuntimeError("killed")

    monkeypatch.setattr(Trainer, "save", save_then_die)
    again = tmp_path / "again"
    command[command.index(str(out))] = str(again)
    with pytest.raises(RuntimeError, match="killed"):
        main(command)
    monkeypatch.setattr(Trainer, "save", save)
    assert main(command + ["--resume"]) == 0
    resumed = [json.loads(line) for line in (again / "log.jsonl").read_text().splitlines()]
    resumed = {r["step"]: r for r in resumed if "loss" in r}
    for record in steps:
        for name in ("hidden_loss", "attention_loss", "loss"):
            assert resumed[record["step"]][name] == pytest.approx(record[name], rel=1e-5), (record["step"], name)


@pytest.mark.parametrize("kinds,precision", [("hidden,attention", "fp32"), ("hidden", "fp32"), ("hidden", "bf16")])
def test_the_first_intermediate_terms_of_a_run(teacher, tmp_path, kinds, precision):
    """The engine's first logged hidden_loss / attention_loss (--layers 2: the map [0, 2] the student
    started from, whole batch in one step) equal `intermediate_losses` on the student as initialised;
    hidden states alone run the student unpadded (the engine's default), bf16 under CPU autocast."""
    rows = [("good film", "1"), ("the plot was dull", "0"), ("a lovely story", "1"), ("very poor", "0")]
    train = write_classify(tmp_path / "train.csv", rows)
    task = distill_task(teacher, train, output_dir=tmp_path / "out", layers=2, intermediate=kinds,
                        intermediate_weight=0.5, cache_dir=tmp_path / "cache")
    batch = task.collate(list(task.train_features))
    finetune(task, FinetuneArguments(output_dir=tmp_path / "out", max_steps=1, batch_size=4, log_every=1,
                                     progress=False, lr=1e-3, precision=precision))
    first = json.loads((tmp_path / "out" / "log.jsonl").read_text().splitlines()[0])
    model = BertForSequenceClassification.from_pretrained(teacher).eval()
    student = build_student(model, layers=2)[0].eval()
    transfer = IntermediateTransfer(student.config, model.config, ("hidden", "attention"), [0, 2])
    inputs = dict(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                  attention_mask=batch["attention_mask"], output_hidden_states=True, output_attentions=True)
    with torch.no_grad():
        expected = intermediate_losses(transfer, student(**inputs), model(**inputs), batch["attention_mask"])
    assert expected["hidden_loss"].item() > 1e-3
    rel = 1e-4 if precision == "fp32" else 5e-2
    assert first["hidden_loss"] == pytest.approx(0.5 * expected["hidden_loss"].item(), rel=rel)
    if "attention" in kinds:
        assert first["attention_loss"] == pytest.approx(0.5 * expected["attention_loss"].item(), rel=rel)
    else:
        assert "attention_loss" not in first


# ---------------------------------------------------------------------------- --student-vocab

def test_student_vocab_end_to_end_and_its_refusals(teacher, save_tiny_checkpoint, tmp_path, capsys):
    """A student with its own vocabulary (other ids for the same words, and words split into pieces the
    teacher's vocabulary does not have): its features are its tokenizer's, the teacher's logits the teacher's
    on its own ids, example by example; without --student-vocab the run is refused."""
    specials = WORDS[:7]
    pieces = ["fi", "##lm", "go", "##od", "lo", "##vely"]
    own = specials + pieces + sorted(set(WORDS[7:]) - {"film", "good", "lovely"}, reverse=True)
    student = save_tiny_checkpoint(tmp_path / "own", own, num_hidden_layers=2)
    rows = sentences(12, 7) + [("good film", "1"), ("a lovely film", "1")]
    train = write_classify(tmp_path / "train.csv", rows)
    dev = write_classify(tmp_path / "dev.csv", sentences(6, 8))
    common = ["--teacher", str(teacher), "--train-file", str(train), "--student", str(student)]
    # refused without --student-vocab, naming both vocabularies and the flag
    err = _error(capsys, ["distill", *common, "--output-dir", str(tmp_path / "refused")])
    assert f"its vocabulary ({student / 'vocab.txt'}) differs from the teacher's ({teacher / 'vocab.txt'})" in err
    assert "--student-vocab" in err
    assert "--student-vocab: give --student DIR" in _error(capsys, ["distill", "--teacher", str(teacher),
                                                                    "--train-file", str(train), "--output-dir",
                                                                    str(tmp_path / "x"), "--student-vocab"])
    assert "the two models' tokens differ" in _error(capsys, ["distill", *common, "--output-dir", str(tmp_path / "x"),
                                                             "--student-vocab", "--intermediate", "hidden"])
    assert "--labels-only with --intermediate" in _error(capsys, ["distill", "--teacher", str(teacher), "--train-file",
                                                                  str(train), "--output-dir", str(tmp_path / "x"),
                                                                  "--labels-only", "--intermediate", "hidden"])
    assert "--layer-map: give --intermediate" in _error(capsys, ["distill", "--teacher", str(teacher), "--train-file",
                                                                 str(train), "--output-dir", str(tmp_path / "x"),
                                                                 "--layer-map", "0,2"])
    assert "--layer-map 0,9: teacher layer 9 does not exist" in _error(
        capsys, ["distill", "--teacher", str(teacher), "--train-file", str(train), "--output-dir", str(tmp_path / "x"),
                 "--intermediate", "hidden", "--layer-map", "0,9"])
    assert "the student has 4 attention heads, the teacher 2" in _error(
        capsys, ["distill", "--teacher", str(teacher), "--train-file", str(train), "--output-dir", str(tmp_path / "x"),
                 "--intermediate", "attention", "--student", "mini"])  # mini: 4 heads, the teacher 2
    # other families: per-token outputs would need an alignment
    config = BertConfig.from_pretrained(teacher)
    with pytest.raises(ValueError, match="--student-vocab: not for a 'tag' teacher: .*alignment"):
        check_options(teacher, resolve("tag"), config, None, str(student), student_vocab=True)
    with pytest.raises(ValueError, match="--intermediate: not supported for a 'multi-label' teacher"):
        check_options(teacher, resolve("multi-label"), config, 2, None, intermediate="hidden")
    # the features: the student's ids; the teacher's logits: the teacher's on its own ids
    task = distill_task(teacher, train, output_dir=tmp_path / "t", student=str(student), student_vocab=True,
                        cache_dir=tmp_path / "cache")
    ours, theirs = BertTokenizer.from_pretrained(student), BertTokenizer.from_pretrained(teacher)
    last = task.train_features[-1]
    assert last["input_ids"] == ours.encode("a lovely film")["input_ids"]
    assert ours.convert_ids_to_tokens(last["input_ids"]) == ["[CLS]", "a", "lo", "##vely", "fi", "##lm", "[SEP]"]
    model = BertForSequenceClassification.from_pretrained(teacher).eval()
    batch = task.collate(list(task.train_features[-2:]))
    for row, (text, _) in enumerate(rows[-2:]):
        with torch.no_grad():
            expected = model(torch.tensor([theirs.encode(text)["input_ids"]])).logits[0]
        torch.testing.assert_close(batch["teacher_logits"][row], expected, atol=1e-5, rtol=0)
    # the command end to end: the student keeps its own vocabulary
    out = tmp_path / "student"
    assert main(["distill", *common, "--output-dir", str(out), "--student-vocab", "--dev-file", str(dev),
                 "--epochs", "1", "--batch-size", "7", "--no-progress"]) == 0
    assert (out / "vocab.txt").read_text().splitlines() == own
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == len(own) and config["finetuning_task"] == "classify"
    info = json.loads((out / "distillation.json").read_text())
    assert info["student_vocab"] == str(student / "vocab.txt") and info["init"] == f"checkpoint {student}"
    assert {"accuracy", "teacher_agreement"} <= set(json.loads((out / "eval_results.json").read_text())["metrics"])
    dev_rows = sentences(6, 8)  # the teacher's dev score: on its own tokenization
    with torch.no_grad():
        right = [int(model(torch.tensor([theirs.encode(text)["input_ids"]])).logits[0].argmax()) == int(label)
                 for text, label in dev_rows]
    assert info["teacher_dev_metrics"]["accuracy"] == pytest.approx(sum(right) / len(right))
    test = tmp_path / "test.csv"
    test.write_text("text\ngood film\nbad plot\n")
    assert main(["predict", "--model", str(out), "--input", str(test), "--output", str(tmp_path / "p.tsv")]) == 0
