"""Continued pre-training (`pretrain --init-from MODEL`) on real text: MiniLM (no MLM head), a
`BertForPreTraining` checkpoint saved by transformers (heads kept: the first loss is the peer's), the
architecture and vocabulary checks, a vocabulary extension's new rows, exact resume."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.modeling import BertConfig, BertForSequenceClassification
from bertforge.modeling.pretrained import read_state_dict
from bertforge.pretraining import prepare_pretraining
from bertforge.pretraining.dataset import PretrainingDataset, collate
from bertforge.pretraining.trainer import (
    CONTINUED_LR, PretrainingArguments, check_init_vocabulary, run_pretraining,
)
from bertforge.tokenization import train_vocab

REPO = Path(__file__).resolve().parents[2]
BOOK = REPO.parent / "shared" / "data" / "pretraining" / "books" / "Carroll_Alice_1865.txt"
# Two words of the book bert-base-uncased splits into pieces, given [unused1] and [unused2]'s ids.
NEW_WORDS = {2: ("hatter", ["hat", "##ter"]), 3: ("dormouse", ["dorm", "##ouse"])}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def data(tmp_path_factory, uncased_vocab) -> Path:
    """The book's first chapter as 64-token instances: with MiniLM's vocabulary, with an extension of it
    ([unused1], [unused2] -> hatter, dormouse), and with a vocabulary of its own."""
    if not BOOK.is_file():
        pytest.skip(f"shared data not found: {BOOK}")
    root = tmp_path_factory.mktemp("init-from")
    text = BOOK.read_text(encoding="utf-8")
    chapter = root / "chapter.txt"
    chapter.write_text(text[: len(text) // 12], encoding="utf-8")
    tokens = uncased_vocab.read_text(encoding="utf-8").splitlines()
    for index, (word, _) in NEW_WORDS.items():
        assert tokens[index] == f"[unused{index - 1}]"
        tokens[index] = word
    (root / "extended_vocab.txt").write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    train_vocab([chapter], vocab_size=600, output=root / "own_vocab.txt", show_progress=False)
    for name, vocab in (("uncased", uncased_vocab), ("extended", root / "extended_vocab.txt"),
                        ("own", root / "own_vocab.txt")):
        prepare_pretraining([chapter], vocab, root / name, max_seq_length=64, max_predictions_per_seq=10,
                            dupe_factor=1, progress=False)
    return root


@pytest.fixture(scope="module")
def peer_checkpoint(tmp_path_factory, uncased_vocab) -> Path:
    """A tiny random `BertForPreTraining` saved by transformers (no dropout), with bert-base-uncased's
    vocabulary; its head biases are random too, so that a head not loaded would show."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=37, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
    model = transformers.BertForPreTraining(config)
    with torch.no_grad():
        model.cls.predictions.bias.normal_(0, 1)
        model.cls.seq_relationship.bias.normal_(0, 1)
    directory = tmp_path_factory.mktemp("peer") / "tiny-pretraining"
    model.save_pretrained(directory)
    (directory / "vocab.txt").write_bytes(uncased_vocab.read_bytes())
    return directory


def args_for(root: Path, out: Path, init_from: Path, **overrides) -> PretrainingArguments:
    values = dict(data=root / "uncased", output_dir=out, init_from=init_from, batch_size=4, max_steps=2,
                  log_every=1, save_every=0, progress=False)
    values.update(overrides)
    return PretrainingArguments(**values)


def train_log(out: Path) -> list[dict]:
    return [r for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "loss" in r]


def newly_initialised(caplog) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if "newly initialised" in r.getMessage()]
    return [name for line in lines for name in line.split(": ", 2)[-1].split(", ")]


def test_init_from_minilm_keeps_the_encoder_and_initialises_the_heads(data, minilm_dir, tmp_path, caplog):
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        # lr 0: the final model is the initial one, to the bit.
        run_pretraining(args_for(data, out, minilm_dir, lr=0.0))
    assert sorted(newly_initialised(caplog)) == [
        "cls.predictions.bias", "cls.predictions.transform.LayerNorm.bias", "cls.predictions.transform.LayerNorm.weight",
        "cls.predictions.transform.dense.bias", "cls.predictions.transform.dense.weight", "cls.seq_relationship.bias",
        "cls.seq_relationship.weight"]
    minilm = BertConfig.from_pretrained(minilm_dir).to_dict()
    assert {k: v for k, v in BertConfig.from_pretrained(out / "final").to_dict().items() if k != "architectures"} == \
        {k: v for k, v in minilm.items() if k != "architectures"}
    # The MLM decoder is the word embedding matrix itself: no copy saved to drift apart from it.
    final, _ = read_state_dict(out / "final")
    assert not any("decoder" in name for name in final)
    # A normal checkpoint, that `finetune` loads: the encoder is MiniLM's to the bit.
    assert (out / "final" / "vocab.txt").read_bytes() == (minilm_dir / "vocab.txt").read_bytes()
    classifier = BertForSequenceClassification.from_pretrained(out / "final", num_labels=2).bert.state_dict()
    expected, _ = read_state_dict(minilm_dir)
    expected.pop("embeddings.position_ids", None)
    assert sorted(expected) == sorted(classifier)
    for name, tensor in expected.items():
        assert torch.equal(classifier[name], tensor), name


def test_heads_of_a_pretraining_checkpoint_are_kept(data, peer_checkpoint, tmp_path, caplog):
    """Every instance in one batch: the first logged loss is the peer's BertForPreTraining loss on it."""
    dataset = PretrainingDataset(data / "uncased", seed=0)
    count = len(dataset)
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        run_pretraining(args_for(data, out, peer_checkpoint, batch_size=count, max_steps=1))
    assert newly_initialised(caplog) == []
    first = train_log(out)[0]

    import transformers

    peer = transformers.BertForPreTraining.from_pretrained(peer_checkpoint).eval()
    batch = collate([dataset[i] for i in range(count)])
    labels = torch.full_like(batch["input_ids"], -100)
    valid = batch["masked_lm_labels"] != -100
    rows = torch.arange(count).unsqueeze(1).expand_as(valid)
    labels[rows[valid], batch["masked_lm_positions"][valid]] = batch["masked_lm_labels"][valid]
    with torch.no_grad():
        output = peer(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                      attention_mask=batch["attention_mask"], labels=labels,
                      next_sentence_label=batch["next_sentence_label"])
    assert abs(first["loss"] - output.loss.item()) <= 1e-5, (first["loss"], output.loss.item())


def test_exact_resume_and_the_continued_pretraining_defaults(data, peer_checkpoint, tmp_path):
    straight = tmp_path / "straight"
    run_pretraining(args_for(data, straight, peer_checkpoint, max_steps=10))
    interrupted = tmp_path / "interrupted"
    run_pretraining(args_for(data, interrupted, peer_checkpoint, max_steps=10, save_every=5), stop_at_step=5)
    run_pretraining(args_for(data, interrupted, peer_checkpoint, max_steps=10, save_every=5, resume=True))
    a, b = train_log(straight), train_log(interrupted)
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    # A smaller peak learning rate than from scratch, after a warm-up.
    lrs = [r["lr"] for r in a]
    assert max(lrs) == pytest.approx(CONTINUED_LR) and lrs[0] < CONTINUED_LR


def test_a_disagreeing_config_is_an_error(data, peer_checkpoint, tmp_path, capsys):
    common = ["pretrain", "--data", str(data / "uncased"), "--init-from", str(peer_checkpoint), "--max-steps", "1",
              "--no-progress"]
    assert main([*common, "--config", "tiny", "--output-dir", str(tmp_path / "a")]) == 2
    assert capsys.readouterr().err == (
        f"bertforge pretrain: error: --config tiny disagrees with --init-from {peer_checkpoint / 'config.json'}: "
        "hidden_size=128 (the model: 32), intermediate_size=512 (the model: 37), max_position_embeddings=512 "
        "(the model: 64); the architecture comes from the model: drop --config\n")
    assert not (tmp_path / "a").exists()
    # A config.json with the model's architecture is accepted.
    same = tmp_path / "same.json"
    same.write_text((peer_checkpoint / "config.json").read_text())
    assert main([*common, "--config", str(same), "--output-dir", str(tmp_path / "b")]) == 0


def test_data_of_another_vocabulary_is_an_error_naming_the_one_to_prepare_with(data, peer_checkpoint, tmp_path,
                                                                               capsys):
    assert main(["pretrain", "--data", str(data / "own"), "--init-from", str(peer_checkpoint), "--max-steps", "1",
                 "--output-dir", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    # The data carries the vocabulary it was prepared with (DATA/vocab.txt): the error names that file.
    assert err.startswith(f"bertforge pretrain: error: the data's vocabulary {data / 'own' / 'vocab.txt'} is not "
                          f"--init-from {peer_checkpoint}'s nor an extension of it")
    assert f"prepare it with the model's vocabulary (bertforge prepare-pretraining --vocab " \
           f"{peer_checkpoint / 'vocab.txt'} ...)" in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()
    # Same size, but a word other than [unusedN] replaced: not an extension.
    tokens = (peer_checkpoint / "vocab.txt").read_text(encoding="utf-8").splitlines()
    tokens[tokens.index("the")] = "hatter"
    changed = tmp_path / "changed_vocab.txt"
    changed.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    with pytest.raises(ValueError, match=r"is not --init-from .* nor an extension of it .*\(id 1996: 'hatter' for "
                                         r"the model's 'the'\): prepare it with the model's vocabulary"):
        check_init_vocabulary(peer_checkpoint, changed, [])


def test_an_extended_vocabularys_new_rows_start_as_the_mean_of_their_pieces(data, minilm_dir, tmp_path, caplog):
    assert check_init_vocabulary(minilm_dir, data / "extended_vocab.txt", [PretrainingDataset(data / "extended")]) \
        == {index: word for index, (word, _) in NEW_WORDS.items()}
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="bertforge"):
        run_pretraining(args_for(data, out, minilm_dir, data=data / "extended", vocab=data / "extended_vocab.txt",
                                 lr=0.0))
    minilm = read_state_dict(minilm_dir)[0]["embeddings.word_embeddings.weight"]
    final = read_state_dict(out / "final")[0]["bert.embeddings.word_embeddings.weight"]
    vocab = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    for index, (word, pieces) in NEW_WORDS.items():
        ids = [vocab.index(p) for p in pieces]
        assert torch.allclose(final[index], minilm[ids].mean(0), atol=1e-7), word
        assert f"new word {word!r} (id {index}): embedding row initialised as the mean of {pieces}" in caplog.text
    untouched = [i for i in range(len(vocab)) if i not in NEW_WORDS]
    assert torch.equal(final[untouched], minilm[untouched])
    assert (out / "final" / "vocab.txt").read_bytes() == (data / "extended_vocab.txt").read_bytes()


def test_a_config_file_of_another_vocabulary_size_is_named_as_such(data, peer_checkpoint, tmp_path, capsys):
    other = tmp_path / "other"
    BertConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
               max_position_embeddings=64).save_pretrained(other)
    assert main(["pretrain", "--data", str(data / "uncased"), "--init-from", str(peer_checkpoint), "--config",
                 str(other / "config.json"), "--output-dir", str(tmp_path / "run"), "--no-progress"]) == 2
    assert capsys.readouterr().err.endswith(": vocab_size=1000 (the model: 30522); the architecture comes from the "
                                            "model: drop --config\n")


def test_init_from_a_hub_id(data, peer_checkpoint, tmp_path, hub_cache, add_to_hub_cache, capsys):
    files = {name: (peer_checkpoint / name).read_bytes() for name in ("config.json", "model.safetensors", "vocab.txt")}
    add_to_hub_cache(hub_cache, "acme/tiny-pretraining", "c" * 40, files)
    out = tmp_path / "run"
    assert main(["pretrain", "--data", str(data / "uncased"), "--init-from", "acme/tiny-pretraining", "--output-dir",
                 str(out), "--batch-size", "4", "--max-steps", "1", "--no-progress"]) == 0
    assert "pre-trained " in capsys.readouterr().out
    assert BertConfig.from_pretrained(out / "final").hidden_size == 32
    assert main(["pretrain", "--data", str(data / "uncased"), "--init-from", "acme/missing", "--output-dir",
                 str(tmp_path / "other"), "--no-progress"]) == 2
    assert capsys.readouterr().err.startswith("bertforge pretrain: error: acme/missing: no such local directory, "
                                              "and the Hub model acme/missing is not in the Hub cache")
