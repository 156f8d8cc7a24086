"""A checkpoint is checked whole before it is built (issue #49, items 4, 8 and 9's refused pickle).

Every `config.json` field's type and range, the layer count and sizes against the weights file's tensor
names and shapes (read from its header: nothing allocated), every checkpoint tensor used or reported,
`vocab.txt` against vocab_size and the embeddings, `tokenizer_config.json`'s settings. Each refusal is
one ValueError line naming the field (or tensor, or line) and the file; most cases run on a copy of the
real all-MiniLM-L6-v2 checkpoint whose weights file is linked, not copied.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertforge.modeling import (BertConfig, BertForMaskedLM, BertForPreTraining, BertForSequenceClassification,
                                BertModel)
from bertforge.modeling.pretrained import check_pretrained, read_tensor_shapes
from bertforge.tokenization import BertTokenizer, load_vocab



def _edit_config(directory: Path, **changes) -> None:
    path = directory / "config.json"
    values = json.loads(path.read_text())
    values.update(changes)
    path.write_text(json.dumps(values))  # (NaN is written as JSON's NaN token, which Python's json reads)


def _refused(directory: Path, model_class=BertModel) -> str:
    with pytest.raises(ValueError) as error:
        model_class.from_pretrained(directory)
    message = str(error.value)
    assert "\n" not in message, message  # one line
    return message


@pytest.fixture
def tiny_dir(tmp_path) -> Path:
    torch.manual_seed(3)
    directory = tmp_path / "tiny"
    BertModel(BertConfig.preset("tiny", vocab_size=64)).save_pretrained(directory)
    return directory


# ----------------------------------------------------------------------------- config.json fields

@pytest.mark.parametrize("changes, message", [
    ({"vocab_size": 0}, "vocab_size must be a whole number of at least 1, got 0"),
    ({"vocab_size": -5}, "vocab_size must be a whole number of at least 1, got -5"),
    ({"num_attention_heads": 0}, "num_attention_heads must be a whole number of at least 1, got 0"),
    ({"num_attention_heads": 5}, "hidden_size (384) must be a multiple of num_attention_heads (5)"),
    ({"hidden_size": 64.0}, "hidden_size must be a whole number of at least 1, got 64.0"),
    ({"max_position_embeddings": "512"}, 'max_position_embeddings must be a whole number of at least 1, got "512"'),
    ({"layer_norm_eps": "1e-12"}, 'layer_norm_eps must be a finite number above 0, got "1e-12"'),
    ({"initializer_range": math.nan}, "initializer_range must be a finite number above 0, got NaN"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be a whole number of at least 1, got 0"),
    ({"num_hidden_layers": -1}, "num_hidden_layers must be a whole number of at least 1, got -1"),
    ({"num_hidden_layers": True}, "num_hidden_layers must be a whole number of at least 1, got true"),
    ({"num_hidden_layers": 10**40}, "num_hidden_layers must be at most 2,147,483,647"),
    ({"id2label": ["neg", "pos"]}, 'id2label must be a non-empty object {"0": label, "1": label, ...}'),
    ({"id2label": {"0": "neg", "2": "pos"}}, "id2label's ids must be 0 to 1 without gaps; 1 is missing"),
    ({"id2label": {"0": "neg", "x": "pos"}}, "id2label's keys must be the class ids 0, 1, ..., got \"x\""),
    ({"id2label": {"0": "same", "1": "same"}}, 'id2label names two classes "same"'),
    ({"pad_token_id": 30522}, "pad_token_id must be a token id, from 0 to vocab_size - 1 (30521), or null, got 30522"),
    ({"hidden_act": "swish"}, "hidden_act \"swish\" is not one of"),
    ({"hidden_dropout_prob": 1.5}, "hidden_dropout_prob must be a number in [0, 1), got 1.5"),
    ({"type_vocab_size": None}, "type_vocab_size must be a whole number of at least 1, got null"),
    ({"is_causal": "no"}, 'is_causal must be true or false, got "no"'),
])
def test_each_config_field_is_checked_naming_field_and_file(minilm_copy, changes, message):
    _edit_config(minilm_copy, **changes)
    for model_class in (BertModel, BertForSequenceClassification):
        assert _refused(minilm_copy, model_class).startswith(f"{minilm_copy / 'config.json'}: {message}")
    # The library's config reader says the same.
    with pytest.raises(ValueError, match=r"^" + str(minilm_copy / "config.json").replace(".", r"\.")):
        BertConfig.from_pretrained(minilm_copy)


def test_a_config_built_in_code_is_checked_too():
    with pytest.raises(ValueError, match="num_attention_heads must be a whole number of at least 1, got 0"):
        BertConfig(num_attention_heads=0)
    with pytest.raises(ValueError, match="pad_token_id must be a token id"):
        BertConfig(vocab_size=10, pad_token_id=10)
    assert BertConfig(pad_token_id=None).pad_token_id is None  # (no padding row: allowed)
    config = BertConfig(id2label={"1": "pos", "0": "neg"})
    assert config.id2label == {0: "neg", 1: "pos"} and config.num_labels == 2


@pytest.mark.parametrize("kind", ["dev zero", "fifo", "huge", "not an object", "deep", "directory"])
def test_a_config_file_that_is_not_a_small_json_object_is_refused_at_once(minilm_copy, kind):
    path = minilm_copy / "config.json"
    path.unlink()
    if kind == "dev zero":
        path.symlink_to("/dev/zero")
        expected = "not a regular file"
    elif kind == "fifo":
        os.mkfifo(path)
        expected = "not a regular file"
    elif kind == "huge":
        with open(path, "wb") as handle:  # sparse: 17 MiB of zeros that take no disk
            handle.truncate(17 << 20)
        expected = "17,825,792 bytes, larger than a model config can be (16,777,216 at most)"
    elif kind == "not an object":
        path.write_text("[1, 2]")
        expected = "the model config must be a JSON object ({...}), not list"
    elif kind == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
        expected = "not valid JSON"
    else:
        path.mkdir()
        expected = "not a regular file"
    start = time.perf_counter()
    message = _refused(minilm_copy)
    assert time.perf_counter() - start < 1.0
    assert message.startswith(f"{path}: ") and expected in message


# ----------------------------------------------------------------------------- config against weights

def test_a_layer_count_the_weights_do_not_hold_is_refused_naming_both_files(minilm_copy):
    _edit_config(minilm_copy, num_hidden_layers=3)
    message = _refused(minilm_copy)
    assert message == (f"{minilm_copy / 'config.json'}: num_hidden_layers is 3 but {minilm_copy / 'model.safetensors'} "
                       f"holds 6 encoder layers (encoder.layer.0 to encoder.layer.5); the config and the weights "
                       f"disagree")
    # The head classes and the up-front check say the same.
    assert _refused(minilm_copy, BertForSequenceClassification) == message
    with pytest.raises(ValueError) as error:
        check_pretrained(minilm_copy)
    assert str(error.value) == message


def test_a_huge_layer_count_is_refused_in_well_under_a_second(minilm_copy):
    """Before: 41 s of building layers until memory ran out."""
    _edit_config(minilm_copy, num_hidden_layers=100_000)
    start = time.perf_counter()
    message = _refused(minilm_copy)
    elapsed = time.perf_counter() - start
    assert "num_hidden_layers is 100000 but" in message and "holds 6 encoder layers" in message
    assert elapsed < 1.0, f"{elapsed:.2f} s"


def test_sizes_are_read_from_the_header_without_loading(minilm_dir):
    shapes = read_tensor_shapes(minilm_dir / "model.safetensors")
    assert shapes["embeddings.word_embeddings.weight"] == (30522, 384)
    assert shapes["encoder.layer.5.intermediate.dense.weight"] == (1536, 384)
    assert shapes == {k: tuple(v.shape) for k, v in load_file(minilm_dir / "model.safetensors").items()}


def test_pytorch_bin_layer_count_and_shapes(minilm_dir, tmp_path):
    directory = tmp_path / "bin"
    directory.mkdir()
    shutil.copy(minilm_dir / "config.json", directory / "config.json")
    torch.save(load_file(minilm_dir / "model.safetensors"), directory / "pytorch_model.bin")
    assert BertModel.from_pretrained(directory).load_report.unused == []
    _edit_config(directory, num_hidden_layers=12)
    message = _refused(directory)
    assert message.startswith(f"{directory / 'config.json'}: num_hidden_layers is 12 but "
                              f"{directory / 'pytorch_model.bin'} holds 6 encoder layers")


def test_an_encoder_tensor_the_config_leaves_unused_is_an_error(tiny_dir):
    tensors = load_file(tiny_dir / "model.safetensors")
    tensors["encoder.layer.1.attention.self.rotary.weight"] = torch.zeros(4)
    save_file(tensors, tiny_dir / "model.safetensors")
    message = _refused(tiny_dir)
    assert message == (f"{tiny_dir / 'model.safetensors'} holds encoder tensors that {tiny_dir / 'config.json'} "
                       f"leaves unused: encoder.layer.1.attention.self.rotary.weight; the config and the weights "
                       f"disagree")


def test_a_missing_encoder_tensor_is_an_error(tiny_dir):
    tensors = load_file(tiny_dir / "model.safetensors")
    del tensors["embeddings.token_type_embeddings.weight"]
    save_file(tensors, tiny_dir / "model.safetensors")
    assert _refused(tiny_dir) == (f"{tiny_dir / 'model.safetensors'} lacks encoder tensors that "
                                  f"{tiny_dir / 'config.json'} needs: embeddings.token_type_embeddings.weight")


def test_a_tensor_shape_no_field_explains_is_named(tiny_dir):
    tensors = load_file(tiny_dir / "model.safetensors")
    tensors["encoder.layer.1.attention.self.query.weight"] = torch.zeros(64, 128)
    save_file(tensors, tiny_dir / "model.safetensors")
    message = _refused(tiny_dir, BertForSequenceClassification)
    assert message == (f"{tiny_dir / 'model.safetensors'}: tensor shapes disagree with {tiny_dir / 'config.json'}: "
                       f"bert.encoder.layer.1.attention.self.query.weight: checkpoint (64, 128), config (128, 128)")


def test_head_tensors_another_class_leaves_out_are_one_warning(tiny_dir, tmp_path, caplog):
    torch.manual_seed(5)
    config = BertConfig.preset("tiny", vocab_size=64, id2label={0: "neg", 1: "pos", 2: "mixed"})
    BertForSequenceClassification(config).save_pretrained(tmp_path / "classifier")
    with caplog.at_level(logging.INFO, logger="bertforge"):
        model = BertModel.from_pretrained(tmp_path / "classifier")  # for features: the head is not wanted
    warnings = [r.getMessage() for r in caplog.records if r.name == "bertforge" and r.levelno >= logging.WARNING]
    assert warnings == [f"BertModel: 2 tensors of {tmp_path / 'classifier' / 'model.safetensors'} are not used by "
                        f"this class (another head's weights, left out): classifier.* (2)"]
    assert sorted(model.load_report.unused) == ["classifier.bias", "classifier.weight"]


def test_a_pickle_that_is_not_only_tensors_is_refused_with_our_advice(tiny_dir):
    class Code:
        def __reduce__(self):
            return (os.getcwd, ())

    (tiny_dir / "model.safetensors").unlink()
    torch.save({"embeddings.word_embeddings.weight": torch.zeros(2), "x": Code()}, tiny_dir / "pytorch_model.bin")
    message = _refused(tiny_dir)
    assert message.startswith(f"{tiny_dir / 'pytorch_model.bin'}: refused: the file holds pickled Python objects")
    assert "getcwd" in message and "convert it to model.safetensors" in message
    assert "weights_only" not in message  # torch's advice (retry unsafely) is not repeated


# ----------------------------------------------------------------------------- vocab.txt

def _write_vocab(directory: Path, tokens: list[str]) -> Path:
    path = directory / "vocab.txt"
    path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return path


def test_a_vocabulary_much_smaller_than_the_embeddings_is_refused(minilm_copy):
    tokens = (minilm_copy / "vocab.txt").read_text(encoding="utf-8").splitlines()
    _write_vocab(minilm_copy, tokens[:1000])
    message = _refused(minilm_copy)
    assert message == (f"{minilm_copy / 'vocab.txt'} holds 1,000 tokens but vocab_size in "
                       f"{minilm_copy / 'config.json'} is 30,522 (29,522 rows without a token): not the vocabulary "
                       f"this model was trained with")
    with pytest.raises(ValueError) as error:
        check_pretrained(minilm_copy)
    assert str(error.value) == message


def test_a_vocabulary_larger_than_the_embeddings_is_refused(minilm_copy):
    tokens = (minilm_copy / "vocab.txt").read_text(encoding="utf-8").splitlines()
    _write_vocab(minilm_copy, tokens + ["newword1", "newword2"])
    assert _refused(minilm_copy) == (f"{minilm_copy / 'vocab.txt'} holds 30,524 tokens but vocab_size in "
                                     f"{minilm_copy / 'config.json'} is 30,522: the last 2 token(s) have no embedding "
                                     f"row; the vocabulary and the model disagree")


def test_embedding_rows_rounded_up_beyond_the_vocabulary_are_allowed(minilm_copy):
    """vocab_size padded to a multiple of 8 ... 128 for fast matrix products: the extra rows have no token."""
    tokens = (minilm_copy / "vocab.txt").read_text(encoding="utf-8").splitlines()
    _write_vocab(minilm_copy, tokens[:-100])
    assert check_pretrained(minilm_copy).vocab_size == 30522


def test_a_repeated_vocabulary_entry_is_refused_naming_both_lines(minilm_copy):
    tokens = (minilm_copy / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert tokens[1996] == "the"
    tokens[2001] = "the"  # before: "the" silently moved from id 1996 to 2001
    path = _write_vocab(minilm_copy, tokens)
    expected = (f"{path}: line 2002 repeats the token 'the' of line 1997; each token must appear once "
                f"(a token's id is its line number)")
    assert _refused(minilm_copy) == expected
    for load in (load_vocab, lambda p: BertTokenizer.from_pretrained(p.parent)):
        with pytest.raises(ValueError) as error:
            load(path)
        assert str(error.value) == expected


@pytest.mark.parametrize("kind", ["dev zero", "not utf-8"])
def test_an_unreadable_vocabulary_is_one_line(minilm_copy, kind):
    path = minilm_copy / "vocab.txt"
    if kind == "dev zero":
        path.unlink()
        path.symlink_to("/dev/zero")
        expected = f"{path}: not a regular file"
    else:
        path.write_bytes(path.read_bytes().replace(b"\nthe\n", b"\nth\xe9\n"))
        expected = f"{path}:1997: not UTF-8 text (byte 0xe9"
    with pytest.raises(ValueError) as error:
        BertTokenizer.from_pretrained(minilm_copy)
    assert str(error.value).startswith(expected)
    assert _refused(minilm_copy).startswith(expected)


# ----------------------------------------------------------------------------- tokenizer_config.json

@pytest.mark.parametrize("key, value, message", [
    ("do_lower_case", "yes", 'do_lower_case must be true, false or null, got "yes"'),
    ("do_lower_case", 1, "do_lower_case must be true, false or null, got 1"),
    ("strip_accents", "no", 'strip_accents must be true, false or null, got "no"'),
    ("model_max_length", "512", 'model_max_length must be a whole number of at least 1, got "512"'),
    ("model_max_length", 0, "model_max_length must be a whole number of at least 1, got 0"),
    ("max_input_chars_per_word", 2.5, "max_input_chars_per_word must be a whole number of at least 1, got 2.5"),
])
def test_tokenizer_config_settings_are_checked(minilm_copy, key, value, message):
    path = minilm_copy / "tokenizer_config.json"
    values = json.loads(path.read_text())
    values[key] = value
    path.write_text(json.dumps(values))
    with pytest.raises(ValueError) as error:
        BertTokenizer.from_pretrained(minilm_copy)
    assert str(error.value) == f"{path}: {message}"


def test_tokenizer_config_sentinels_and_bad_files(minilm_copy):
    path = minilm_copy / "tokenizer_config.json"
    values = json.loads(path.read_text())
    values["model_max_length"] = int(1e30)  # transformers' "no limit"
    path.write_text(json.dumps(values))
    tokenizer = BertTokenizer.from_pretrained(minilm_copy)
    assert tokenizer.model_max_length == 512 and tokenizer.do_lower_case is True
    path.write_text("7")
    with pytest.raises(ValueError, match="the tokenizer config must be a JSON object"):
        BertTokenizer.from_pretrained(minilm_copy)
    path.unlink()
    path.symlink_to("/dev/zero")
    with pytest.raises(ValueError, match="not a regular file"):
        BertTokenizer.from_pretrained(minilm_copy)


def test_the_real_checkpoint_passes_every_check(minilm_dir):
    config = check_pretrained(minilm_dir)
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (6, 384, 30522)
    assert len(load_vocab(minilm_dir)) == 30522


def test_a_pretraining_checkpoint_into_the_masked_lm_warns_of_the_nsp_head_only(tmp_path, caplog):
    """BertForMaskedLM is built without the pooler by design: only the NSP classifier is reported."""
    torch.manual_seed(7)
    BertForPreTraining(BertConfig.preset("tiny", vocab_size=64)).save_pretrained(tmp_path / "pretrained")
    with caplog.at_level(logging.INFO, logger="bertforge"):
        model = BertForMaskedLM.from_pretrained(tmp_path / "pretrained")
    warnings = [r.getMessage() for r in caplog.records if r.name == "bertforge" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].endswith("left out): cls.seq_relationship.* (2)")
    assert sorted(model.load_report.unused) == ["bert.pooler.dense.bias", "bert.pooler.dense.weight",
                                                "cls.seq_relationship.bias", "cls.seq_relationship.weight"]
    assert model.load_report.newly_initialized == []
