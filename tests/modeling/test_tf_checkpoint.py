"""Reading Google's TF1 BERT checkpoints without TensorFlow, and converting them.

The fixtures in tests/fixtures/tf_* were written by TensorFlow itself (scripts/make_tf_fixture.py);
the small bundles built here by `write_bundle` cover what TF's output does not: several index
blocks, heads of fine-tuned checkpoints, unknown variables, compression.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from bertforge.modeling.tf_checkpoint import (
    _guess_do_lower_case,
    _masked_crc32c,
    convert_tf_checkpoint,
    map_tf_name,
    read_tf_checkpoint,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TINY = FIXTURES / "tf_bert_tiny"
PREFIX = TINY / "bert_model.ckpt"
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(TINY / "expected.npz") as npz:
        return {key: npz[key] for key in npz.files}


@pytest.fixture(scope="module")
def tf_variables(expected) -> dict[str, np.ndarray]:
    return {key.removeprefix("var:"): value for key, value in expected.items() if key.startswith("var:")}


@pytest.fixture(scope="module")
def model_variables(tf_variables) -> dict[str, np.ndarray]:
    """The tiny BERT's variables without the optimizer state."""
    return {name: value for name, value in tf_variables.items() if map_tf_name(name) is not None}


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    return convert_tf_checkpoint(PREFIX, tmp_path_factory.mktemp("converted") / "out")


def write_bundle(
    prefix: Path, tensors: dict[str, np.ndarray], entries_per_block: int = 1000, compression: int = 0
) -> None:
    """A single-shard float32 tensor bundle as TensorFlow writes it: prefix-compressed keys with a
    restart point every 16 entries, `entries_per_block` entries per data block."""

    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)

    def int_field(number: int, value: int) -> bytes:
        return varint(number << 3) + varint(value)

    def bytes_field(number: int, value: bytes) -> bytes:
        return varint(number << 3 | 2) + varint(len(value)) + value

    def block(items: list[tuple[bytes, bytes]]) -> bytes:
        out, restarts, previous = bytearray(), [], b""
        for i, (key, value) in enumerate(items):
            shared = 0
            if i % 16:
                while shared < min(len(key), len(previous)) and key[shared] == previous[shared]:
                    shared += 1
            else:
                restarts.append(len(out))
            out += varint(shared) + varint(len(key) - shared) + varint(len(value)) + key[shared:] + value
            previous = key
        return bytes(out) + b"".join(struct.pack("<I", r) for r in restarts) + struct.pack("<I", len(restarts))

    index_file = bytearray()

    def append_block(contents: bytes) -> bytes:
        handle = varint(len(index_file)) + varint(len(contents))
        index_file.extend(contents + bytes([compression]))
        index_file.extend(struct.pack("<I", _masked_crc32c(contents + bytes([compression]))))
        return handle

    data = bytearray()
    items = [(b"", int_field(1, 1) + bytes_field(3, int_field(1, 1)))]  # num_shards 1, version.producer 1
    for name in sorted(tensors):
        raw = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        shape = b"".join(bytes_field(2, int_field(1, dim)) for dim in tensors[name].shape)
        entry = int_field(1, 1) + bytes_field(2, shape) + int_field(4, len(data)) + int_field(5, len(raw))
        items.append((name.encode(), entry + b"\x35" + struct.pack("<I", _masked_crc32c(raw))))  # field 6, fixed32
        data += raw
    index_items = []
    for start in range(0, len(items), entries_per_block):
        chunk = items[start : start + entries_per_block]
        index_items.append((chunk[-1][0], append_block(block(chunk))))
    metaindex = append_block(block([]))
    index = append_block(block(index_items))
    footer = (metaindex + index).ljust(40, b"\0") + struct.pack("<Q", 0xDB4775248B80FB57)
    prefix.with_name(prefix.name + ".index").write_bytes(bytes(index_file) + footer)
    prefix.with_name(prefix.name + ".data-00000-of-00001").write_bytes(bytes(data))


def copy_tiny(tmp_path: Path) -> Path:
    """A writable copy of the tiny checkpoint directory; returns its prefix."""
    directory = shutil.copytree(TINY, tmp_path / "tf_bert_tiny")
    return directory / "bert_model.ckpt"


# --------------------------------------------------------------------------- reading


def test_read_returns_every_variable_bit_identical(tf_variables):
    tensors = read_tf_checkpoint(PREFIX, verify_checksums=True)
    assert sorted(tensors) == sorted(tf_variables)
    assert "bert/pooler/dense/kernel/adam_m" in tensors and "global_step" in tensors
    for name, value in tf_variables.items():
        assert tensors[name].dtype == value.dtype, name
        assert tensors[name].shape == value.shape, name
        assert tensors[name].tobytes() == value.tobytes(), name


def test_read_dtypes_across_two_shards():
    directory = FIXTURES / "tf_dtypes_sharded"
    assert len(list(directory.glob("tensors.ckpt.data-*-of-00002"))) == 2
    tensors = read_tf_checkpoint(directory / "tensors.ckpt", verify_checksums=True)
    with np.load(directory / "expected.npz") as npz:
        assert sorted(tensors) == sorted(npz.files)
        for name in npz.files:
            assert tensors[name].dtype == npz[name].dtype, name
            np.testing.assert_array_equal(tensors[name], npz[name], err_msg=name)
    assert tensors["shard1/bfloat16"].dtype == np.float32
    assert tensors["shard0/int64_scalar"].shape == () and tensors["shard0/int64_scalar"] == 123456789012


def test_read_accepts_the_index_file_or_the_directory(tf_variables):
    for path in (TINY / "bert_model.ckpt.index", TINY):
        assert sorted(read_tf_checkpoint(path)) == sorted(tf_variables)


def test_read_several_index_blocks(tmp_path, model_variables):
    write_bundle(tmp_path / "model.ckpt", model_variables, entries_per_block=5)
    tensors = read_tf_checkpoint(tmp_path / "model.ckpt", verify_checksums=True)
    assert sorted(tensors) == sorted(model_variables)
    for name, value in model_variables.items():
        np.testing.assert_array_equal(tensors[name], value, err_msg=name)


# --------------------------------------------------------------------------- name mapping


@pytest.mark.parametrize(
    ("tf_name", "hf_name"),
    [
        ("bert/embeddings/word_embeddings", "bert.embeddings.word_embeddings.weight"),
        ("bert/embeddings/LayerNorm/gamma", "bert.embeddings.LayerNorm.weight"),
        ("bert/encoder/layer_11/attention/self/value/kernel", "bert.encoder.layer.11.attention.self.value.weight"),
        (
            "bert/encoder/layer_0/attention/output/LayerNorm/beta",
            "bert.encoder.layer.0.attention.output.LayerNorm.bias",
        ),
        ("bert/encoder/layer_3/intermediate/dense/bias", "bert.encoder.layer.3.intermediate.dense.bias"),
        ("bert/encoder/layer_3/output/dense/kernel", "bert.encoder.layer.3.output.dense.weight"),
        ("bert/pooler/dense/kernel", "bert.pooler.dense.weight"),
        ("cls/predictions/transform/LayerNorm/gamma", "cls.predictions.transform.LayerNorm.weight"),
        ("cls/predictions/output_bias", "cls.predictions.bias"),
        ("cls/seq_relationship/output_weights", "cls.seq_relationship.weight"),
        ("output_weights", "classifier.weight"),
        ("cls/squad/output_bias", "qa_outputs.bias"),
    ],
)
def test_map_tf_name(tf_name, hf_name):
    assert map_tf_name(tf_name) == hf_name


@pytest.mark.parametrize(
    "tf_name",
    [
        "global_step",
        "bert/pooler/dense/kernel/adam_m",
        "output_bias/adam_v",
        "bert/pooler/dense/bias/Adam_1",
        "bert/embeddings/word_embeddings/Adam",
        "beta1_power",
    ],
)
def test_map_tf_name_skips_optimizer_state(tf_name):
    assert map_tf_name(tf_name) is None


@pytest.mark.parametrize(
    "tf_name",
    ["bert/encoder/layer_0/attention/self/query/scale", "bert/embeddings/LayerNorm/kernel", "my_head/weights"],
)
def test_map_tf_name_rejects_unknown_variables(tf_name):
    with pytest.raises(ValueError, match=tf_name):
        map_tf_name(tf_name)


def test_map_tf_name_points_out_tf2_checkpoints():
    with pytest.raises(ValueError, match="TF2 object-based checkpoint"):
        map_tf_name("model/layer/.ATTRIBUTES/VARIABLE_VALUE")


# --------------------------------------------------------------------------- conversion


def test_convert_writes_the_mapped_float32_tensors(converted, model_variables):
    tensors = load_file(converted / "model.safetensors")
    assert len(tensors) == len(model_variables) == 46
    assert not [name for name in tensors if "adam" in name.lower() or "global_step" in name]
    assert "cls.predictions.decoder.weight" not in tensors  # tied to the word embeddings
    assert all(tensor.dtype == np.float32 and tensor.flags.c_contiguous for tensor in tensors.values())
    for tf_name, value in model_variables.items():
        # Dense kernels go from TF's [in, out] to torch's [out, in]; nothing else is transposed.
        np.testing.assert_array_equal(tensors[map_tf_name(tf_name)], value.T if tf_name.endswith("/kernel") else value)
    assert tensors["bert.encoder.layer.1.intermediate.dense.weight"].shape == (37, 32)
    assert tensors["cls.seq_relationship.weight"].shape == (2, 32)
    assert tensors["cls.predictions.bias"].shape == (99,)


def test_convert_writes_config_vocab_and_tokenizer_config(converted):
    config = json.loads((converted / "config.json").read_text())
    bert_config = json.loads((TINY / "bert_config.json").read_text())
    assert config["model_type"] == "bert"
    assert config["architectures"] == ["BertForPreTraining"]
    assert config["layer_norm_eps"] == 1e-12 and config["pad_token_id"] == 0
    assert {key: config[key] for key in bert_config} == bert_config
    assert (converted / "vocab.txt").read_bytes() == (TINY / "vocab.txt").read_bytes()
    assert json.loads((converted / "tokenizer_config.json").read_text()) == {
        "do_lower_case": True,
        "tokenizer_class": "BertTokenizer",
        "model_max_length": 64,
    }
    assert not list(converted.glob(".*.tmp"))


def _inputs(expected):
    import torch

    return {
        "input_ids": torch.from_numpy(expected["input_ids"]).long(),
        "token_type_ids": torch.from_numpy(expected["token_type_ids"]).long(),
        "attention_mask": torch.from_numpy(expected["input_mask"]).long(),
    }


def _assert_matches_tf(model, expected):
    import torch

    inputs = _inputs(expected)
    with torch.no_grad():
        encoded = model.bert(**inputs)
        outputs = model(**inputs)
    np.testing.assert_allclose(encoded.last_hidden_state.numpy(), expected["sequence_output"], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(encoded.pooler_output.numpy(), expected["pooled_output"], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(outputs.prediction_logits.numpy(), expected["mlm_logits"], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(outputs.seq_relationship_logits.numpy(), expected["nsp_logits"], atol=TOLERANCE, rtol=0)


def test_transformers_reproduces_tensorflow(converted, expected):
    transformers = pytest.importorskip("transformers")
    model, info = transformers.BertForPreTraining.from_pretrained(converted, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    _assert_matches_tf(model.eval(), expected)


def test_bertforge_reproduces_tensorflow(converted, expected):
    try:
        from bertforge import BertForPreTraining
    except ImportError as error:
        pytest.skip(f"bertforge.BertForPreTraining cannot be imported yet: {error}")
    _assert_matches_tf(BertForPreTraining.from_pretrained(converted).eval(), expected)


def test_convert_classifier_checkpoint(tmp_path, model_variables, expected):
    """run_classifier.py keeps the encoder, drops cls/ and adds output_weights/output_bias."""
    rng = np.random.default_rng(0)
    tensors = {name: value for name, value in model_variables.items() if not name.startswith("cls/")}
    tensors["output_weights"] = rng.standard_normal((3, 32)).astype(np.float32)
    tensors["output_bias"] = rng.standard_normal(3).astype(np.float32)
    tensors["output_weights/adam_m"] = np.zeros((3, 32), np.float32)
    write_bundle(tmp_path / "model.ckpt-1000", tensors)
    out = convert_tf_checkpoint(
        tmp_path / "model.ckpt-1000",
        tmp_path / "out",
        config_file=str(TINY / "bert_config.json"),
        vocab_file=str(TINY / "vocab.txt"),
    )
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["id2label"] == {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}
    converted = load_file(out / "model.safetensors")
    np.testing.assert_array_equal(converted["classifier.weight"], tensors["output_weights"])  # already [out, in]
    assert not [name for name in converted if name.startswith("cls.")]

    transformers = pytest.importorskip("transformers")
    import torch

    model = transformers.BertForSequenceClassification.from_pretrained(out).eval()
    with torch.no_grad():
        logits = model(**_inputs(expected)).logits.numpy()
    tf_logits = expected["pooled_output"] @ tensors["output_weights"].T + tensors["output_bias"]
    np.testing.assert_allclose(logits, tf_logits, atol=TOLERANCE, rtol=0)


def test_convert_squad_checkpoint(tmp_path, model_variables):
    tensors = {name: value for name, value in model_variables.items() if not name.startswith("cls/")}
    tensors["cls/squad/output_weights"] = np.ones((2, 32), np.float32)
    tensors["cls/squad/output_bias"] = np.zeros(2, np.float32)
    shutil.copy(TINY / "bert_config.json", tmp_path)
    shutil.copy(TINY / "vocab.txt", tmp_path)
    write_bundle(tmp_path / "model.ckpt", tensors)
    out = convert_tf_checkpoint(tmp_path / "model.ckpt", tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForQuestionAnswering"]
    assert load_file(out / "model.safetensors")["qa_outputs.weight"].shape == (2, 32)


@pytest.mark.parametrize(
    ("model_name", "vocab", "lower"),
    [
        ("uncased_L-12_H-768_A-12", ["[CLS]", "Apple"], True),
        ("wwm_uncased_L-24_H-1024_A-16", ["[CLS]", "Apple"], True),
        ("chinese_L-12_H-768_A-12", ["[CLS]", "Apple"], True),
        ("cased_L-12_H-768_A-12", ["[CLS]", "apple"], False),
        ("multi_cased_L-12_H-768_A-12", ["[CLS]", "apple"], False),
        ("my_model", ["[CLS]", "[SEP]", "apple", "##s"], True),
        ("my_model", ["[CLS]", "apple", "##S"], False),
    ],
)
def test_guess_do_lower_case(model_name, vocab, lower):
    assert _guess_do_lower_case(model_name, vocab) is lower


# --------------------------------------------------------------------------- errors


def test_missing_index_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.ckpt.index"):
        read_tf_checkpoint(tmp_path / "nothing.ckpt")


def test_missing_data_shard_names_it(tmp_path):
    prefix = copy_tiny(tmp_path)
    prefix.with_name("bert_model.ckpt.data-00000-of-00001").unlink()
    with pytest.raises(FileNotFoundError, match="bert_model.ckpt.data-00000-of-00001"):
        read_tf_checkpoint(prefix)


def test_missing_config_names_it(tmp_path):
    prefix = copy_tiny(tmp_path)
    (prefix.parent / "bert_config.json").unlink()
    with pytest.raises(FileNotFoundError, match="bert_config.json"):
        convert_tf_checkpoint(prefix, tmp_path / "out")


def test_truncated_index(tmp_path):
    prefix = copy_tiny(tmp_path)
    index = prefix.with_name("bert_model.ckpt.index")
    index.write_bytes(index.read_bytes()[:2000])
    with pytest.raises(ValueError, match="not a valid TensorFlow checkpoint index.*truncated"):
        read_tf_checkpoint(prefix)


def test_corrupted_index_block(tmp_path):
    prefix = copy_tiny(tmp_path)
    index = prefix.with_name("bert_model.ckpt.index")
    content = bytearray(index.read_bytes())
    content[100] ^= 0x01
    index.write_bytes(bytes(content))
    with pytest.raises(ValueError, match="checksum mismatch"):
        read_tf_checkpoint(prefix)


def test_truncated_data_file(tmp_path):
    prefix = copy_tiny(tmp_path)
    data = prefix.with_name("bert_model.ckpt.data-00000-of-00001")
    data.write_bytes(data.read_bytes()[:-100])
    with pytest.raises(ValueError, match="is truncated: tensor"):
        read_tf_checkpoint(prefix)


def test_corrupted_tensor_bytes(tmp_path):
    prefix = copy_tiny(tmp_path)
    data = prefix.with_name("bert_model.ckpt.data-00000-of-00001")
    content = bytearray(data.read_bytes())
    content[1000] ^= 0x01
    data.write_bytes(bytes(content))
    read_tf_checkpoint(prefix)  # checksums of tensors are only checked on request
    with pytest.raises(ValueError, match="checksum mismatch for tensor"):
        read_tf_checkpoint(prefix, verify_checksums=True)


def test_compressed_index_is_refused(tmp_path, model_variables):
    write_bundle(tmp_path / "model.ckpt", model_variables, compression=1)
    with pytest.raises(ValueError, match=r"is compressed \(type 1, snappy\)"):
        read_tf_checkpoint(tmp_path / "model.ckpt")


def test_convert_refuses_unknown_variables(tmp_path, model_variables):
    tensors = dict(model_variables, **{"bert/encoder/layer_0/attention/self/query/lora_a": np.zeros((4, 32))})
    write_bundle(tmp_path / "model.ckpt", tensors)
    with pytest.raises(ValueError, match="unknown variable 'bert/encoder/layer_0/attention/self/query/lora_a'"):
        convert_tf_checkpoint(
            tmp_path / "model.ckpt",
            tmp_path / "out",
            config_file=str(TINY / "bert_config.json"),
            vocab_file=str(TINY / "vocab.txt"),
        )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"intermediate_size": 40},
            r"tensor 'bert/encoder/layer_0/intermediate/dense/kernel' has shape \[32, 37\], but .* implies \[32, 40\]",
        ),
        (
            {"vocab_size": 100},
            r"tensor 'bert/embeddings/word_embeddings' has shape \[99, 32\], but .* implies \[100, 32\]",
        ),
        ({"num_hidden_layers": 1}, r"'bert/encoder/layer_1/attention/output/LayerNorm/beta'.* do not fit"),
        ({"num_hidden_layers": 3}, r"the checkpoint lacks 'bert/encoder/layer_2/.* \(16 in all\)"),
    ],
)
def test_convert_checks_shapes_against_the_config(tmp_path, change, message):
    prefix = copy_tiny(tmp_path)
    config_path = prefix.parent / "bert_config.json"
    config_path.write_text(json.dumps(dict(json.loads(config_path.read_text()), **change)))
    with pytest.raises(ValueError, match=message):
        convert_tf_checkpoint(prefix, tmp_path / "out")
