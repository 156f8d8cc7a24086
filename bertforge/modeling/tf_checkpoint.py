"""Convert Google's original TensorFlow BERT checkpoints to a Hugging Face-layout directory, without TensorFlow.

Google's checkpoints (`bert_model.ckpt.index` + `bert_model.ckpt.data-00000-of-00001`, from
run_pretraining.py, run_classifier.py or run_squad.py) are TF1 *tensor bundles*, read here directly:

* `<prefix>.index` is a LevelDB-style SSTable. It ends with a 48-byte footer (the BlockHandles of the
  metaindex and index blocks, varint-encoded and zero-padded to 40 bytes, then the 8-byte magic
  number). The index block maps separator keys to the BlockHandles of data blocks; every block is
  followed by a 5-byte trailer (compression type byte, masked CRC-32C of block + type byte). A block
  is a run of prefix-compressed entries (varint shared, varint non_shared, varint value_length,
  key delta, value) followed by its restart points (fixed32 offsets of entries whose key is stored
  whole) and their count (fixed32).
* Its keys are tensor names; the value of the empty key is a `BundleHeaderProto` (num_shards,
  endianness), every other value a `BundleEntryProto` (dtype, shape, shard_id, offset, size, crc32c).
* `<prefix>.data-0000K-of-0000N` holds the raw little-endian bytes of the tensors of shard K.

The variables map onto the `BertForPreTraining` state-dict layout (`bert.encoder.layer.0...`) that
bertforge and Hugging Face transformers share; dense kernels are stored [in, out] by TF and
transposed to torch's [out, in].
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tqdm.auto import tqdm

from .._files import atomic_path, write_text_atomic

__all__ = ["convert_tf_checkpoint", "map_tf_name", "read_tf_checkpoint"]


# --------------------------------------------------------------------------- tensor-bundle reader

_TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_SIZE = 48  # metaindex + index BlockHandles padded to 40 bytes, then the fixed64 magic
_BLOCK_TRAILER_SIZE = 5  # compression type byte + fixed32 masked CRC-32C

# TF DataType enum -> little-endian numpy dtype of the stored bytes.
_DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<f4"),  # DT_FLOAT
    3: np.dtype("<i4"),  # DT_INT32
    9: np.dtype("<i8"),  # DT_INT64
    14: np.dtype("<u2"),  # DT_BFLOAT16: numpy has no bfloat16, widened to float32 on read
    19: np.dtype("<f2"),  # DT_HALF
}
_DT_BFLOAT16 = 14
_DTYPE_NAMES = {2: "DT_DOUBLE", 4: "DT_UINT8", 5: "DT_INT16", 6: "DT_INT8", 7: "DT_STRING", 10: "DT_BOOL"}


class _FormatError(ValueError):
    """A structural problem in an index file; re-raised with the file's path."""


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli polynomial, reflected
        table.append(crc)
    return table


_CRC32C_TABLE = _crc32c_table()


def _masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """LevelDB's masked CRC-32C (the mask keeps CRCs of data that embeds CRCs well distributed).

    Pure Python, about 7 MB/s: fine for index blocks, too slow to run over a whole data file by default.
    """
    crc = 0xFFFFFFFF
    table = _CRC32C_TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Decode a base-128 varint at buf[pos]: (value, position after it)."""
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise _FormatError("a varint runs past the end of its buffer")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise _FormatError("a varint is longer than 10 bytes")


def _proto_fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of a serialized protobuf message: an int for varint/fixed fields,
    the raw bytes for length-delimited ones."""
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        field, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            value, pos = _varint(buf, pos)
        elif wire_type == 2:
            length, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + length], pos + length
        elif wire_type in (1, 5):
            width = 8 if wire_type == 1 else 4
            value, pos = int.from_bytes(buf[pos : pos + width], "little"), pos + width
        else:
            raise _FormatError(f"unsupported protobuf wire type {wire_type}")
        if pos > len(buf):
            raise _FormatError("a protobuf field runs past the end of its message")
        yield field, value


@dataclass(frozen=True)
class _Entry:
    """One tensor of the bundle (a BundleEntryProto)."""

    dtype: int
    shape: tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c: int


def _parse_entry(name: str, buf: bytes) -> _Entry:
    """Decode a BundleEntryProto: dtype = 1, shape = 2, shard_id = 3, offset = 4, size = 5,
    crc32c = 6, slices = 7 (set only for partitioned variables)."""
    ints = {1: 0, 3: 0, 4: 0, 5: 0, 6: 0}
    shape: list[int] = []
    for number, value in _proto_fields(buf):
        if number == 7:
            raise ValueError(f"tensor {name!r} is a partitioned variable (slices), which is not supported")
        if (number == 2) != isinstance(value, bytes):
            raise _FormatError(f"the entry of {name!r} has a field {number} of the wrong wire type")
        if number == 2:  # TensorShapeProto { repeated Dim dim = 2 }, Dim { int64 size = 1 }
            for shape_field, dim in _proto_fields(value):
                if shape_field == 2:
                    size = dict(_proto_fields(dim)).get(1, 0)
                    shape.append(size - (1 << 64) if size >= 1 << 63 else size)  # int64 as two's complement
        elif number in ints:
            ints[number] = value
    return _Entry(dtype=ints[1], shape=tuple(shape), shard_id=ints[3], offset=ints[4], size=ints[5], crc32c=ints[6])


def _block_handle(buf: bytes, pos: int) -> tuple[tuple[int, int], int]:
    """A BlockHandle (varint64 offset, varint64 size) at buf[pos]: ((offset, size), position after it)."""
    offset, pos = _varint(buf, pos)
    size, pos = _varint(buf, pos)
    return (offset, size), pos


def _read_block(data: bytes, handle: tuple[int, int]) -> bytes:
    """The contents of the block at handle, its trailer checked."""
    offset, size = handle
    end = offset + size
    if end + _BLOCK_TRAILER_SIZE > len(data):
        raise _FormatError(f"the block at offset {offset} ({size} bytes) runs past the end of the file")
    stored_crc = int.from_bytes(data[end + 1 : end + _BLOCK_TRAILER_SIZE], "little")
    if _masked_crc32c(memoryview(data)[offset : end + 1]) != stored_crc:  # the CRC covers the type byte
        raise _FormatError(f"checksum mismatch in the block at offset {offset}")
    compression = data[end]
    if compression != 0:
        kind = {1: "snappy", 2: "zlib"}.get(compression, "unknown")
        raise _FormatError(
            f"the block at offset {offset} is compressed (type {compression}, {kind}); only uncompressed "
            "tables, which is how TensorFlow writes checkpoint indexes, are supported"
        )
    return data[offset:end]


def _block_entries(block: bytes) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) of every entry of a block, prefix compression undone."""
    if len(block) < 4:
        raise _FormatError("a block is shorter than its restart count")
    num_restarts = int.from_bytes(block[-4:], "little")
    entries_end = len(block) - 4 - 4 * num_restarts
    if entries_end < 0:
        raise _FormatError(f"a block of {len(block)} bytes cannot hold {num_restarts} restart points")
    restarts = {
        int.from_bytes(block[entries_end + 4 * i : entries_end + 4 * i + 4], "little") for i in range(num_restarts)
    }
    key, pos = b"", 0
    while pos < entries_end:
        start = pos
        shared, pos = _varint(block, pos)
        non_shared, pos = _varint(block, pos)
        value_length, pos = _varint(block, pos)
        # A restart point stores its key whole, so that a reader may start decoding there.
        if shared > len(key) or (start in restarts and shared):
            raise _FormatError(f"bad key prefix length {shared} at block offset {start}")
        if pos + non_shared + value_length > entries_end:
            raise _FormatError(f"the entry at block offset {start} runs into the restart points")
        key = key[:shared] + block[pos : pos + non_shared]
        pos += non_shared
        yield key, block[pos : pos + value_length]
        pos += value_length


def _read_index(index_path: Path) -> tuple[int, dict[str, _Entry]]:
    """(number of data shards, tensor name -> entry) of a tensor-bundle index file."""
    data = index_path.read_bytes()
    try:
        if len(data) < _FOOTER_SIZE:
            raise _FormatError(f"{len(data)} bytes is shorter than the {_FOOTER_SIZE}-byte footer (truncated file?)")
        footer = data[-_FOOTER_SIZE:]
        if int.from_bytes(footer[-8:], "little") != _TABLE_MAGIC:
            raise _FormatError("the footer's magic number is wrong (truncated file, or not an SSTable)")
        _, pos = _block_handle(footer, 0)  # the metaindex block: empty in tensor bundles
        index_handle, _ = _block_handle(footer, pos)
        num_shards, entries = 1, {}
        for _, handle in _block_entries(_read_block(data, index_handle)):
            for key, value in _block_entries(_read_block(data, _block_handle(handle, 0)[0])):
                if key == b"":  # BundleHeaderProto: num_shards = 1, endianness = 2 (0 = little)
                    header = dict(_proto_fields(value))
                    num_shards = header.get(1, 1)
                    if header.get(2, 0) != 0:
                        raise _FormatError("the checkpoint was written big-endian; only little-endian is supported")
                    continue
                name = key.decode("utf-8")
                entries[name] = _parse_entry(name, value)
    except _FormatError as error:
        raise ValueError(f"{index_path}: not a valid TensorFlow checkpoint index: {error}") from None
    return num_shards, entries


def _resolve_prefix(ckpt_prefix: str | os.PathLike) -> Path:
    """The checkpoint prefix, from the prefix itself, its .index file, or a directory holding one checkpoint."""
    path = Path(ckpt_prefix)
    if path.is_dir():
        indexes = sorted(path.glob("*.index"))
        if len(indexes) != 1:
            found = ", ".join(p.name for p in indexes) or "none"
            raise FileNotFoundError(f"expected exactly one *.index checkpoint file in {path}, found {found}")
        path = indexes[0]
    if path.name.endswith(".index"):
        path = path.with_name(path.name[: -len(".index")])
    if not path.with_name(path.name + ".index").is_file():
        raise FileNotFoundError(f"TensorFlow checkpoint index not found: {path.with_name(path.name + '.index')}")
    return path


class _Bundle:
    """A tensor bundle's index, read eagerly, and its tensors, read on demand."""

    def __init__(self, ckpt_prefix: str | os.PathLike):
        self.prefix = _resolve_prefix(ckpt_prefix)
        num_shards, self.entries = _read_index(self.prefix.with_name(self.prefix.name + ".index"))
        self.shards = [
            self.prefix.with_name(f"{self.prefix.name}.data-{k:05d}-of-{num_shards:05d}") for k in range(num_shards)
        ]
        for shard in self.shards:
            if not shard.is_file():
                raise FileNotFoundError(f"TensorFlow checkpoint data file not found: {shard}")

    def read(self, name: str, verify_checksum: bool = False) -> np.ndarray:
        """The tensor `name`, in its stored shape; bfloat16 widened to float32."""
        entry = self.entries[name]
        dtype = _DTYPES.get(entry.dtype)
        if dtype is None:
            raise ValueError(
                f"tensor {name!r} has dtype {_DTYPE_NAMES.get(entry.dtype, entry.dtype)}, which is not supported "
                "(DT_FLOAT, DT_HALF, DT_BFLOAT16, DT_INT32 and DT_INT64 are)"
            )
        if not 0 <= entry.shard_id < len(self.shards):
            raise ValueError(f"tensor {name!r} is in shard {entry.shard_id}, but the checkpoint has {len(self.shards)}")
        if math.prod(entry.shape) * dtype.itemsize != entry.size:
            raise ValueError(
                f"tensor {name!r}: {entry.size} bytes cannot hold a {dtype} tensor of shape {list(entry.shape)}"
            )
        shard = self.shards[entry.shard_id]
        raw = bytearray(entry.size)  # writable, so the returned array is too
        with open(shard, "rb") as file:
            file.seek(entry.offset)
            if file.readinto(raw) != entry.size:
                raise ValueError(
                    f"{shard} is truncated: tensor {name!r} needs bytes {entry.offset}..{entry.offset + entry.size}"
                )
        if verify_checksum and _masked_crc32c(raw) != entry.crc32c:
            raise ValueError(f"{shard}: checksum mismatch for tensor {name!r} (corrupted download?)")
        array = np.frombuffer(raw, dtype).reshape(entry.shape)
        if entry.dtype == _DT_BFLOAT16:  # bfloat16 is the top half of a float32
            array = (array.astype(np.uint32) << 16).view(np.float32)
        return array


def read_tf_checkpoint(ckpt_prefix: str | os.PathLike, verify_checksums: bool = False) -> dict[str, np.ndarray]:
    """Every tensor of a TF1 checkpoint, optimizer slots included, by TF variable name.

    ckpt_prefix: `.../bert_model.ckpt` (the path without `.index`), its `.index` file, or a
    directory holding one checkpoint. Tensors keep their TF shape (dense kernels are [in, out]) and
    dtype (float32, float16, int32, int64), except bfloat16, returned as float32.
    verify_checksums: also check each tensor's CRC-32C; pure Python, about 7 MB/s.
    Raises FileNotFoundError for a missing index or data file, ValueError for a corrupted one.
    """
    bundle = _Bundle(ckpt_prefix)
    return {name: bundle.read(name, verify_checksums) for name in sorted(bundle.entries)}


# --------------------------------------------------------------------------- name mapping

# Optimizer state and bookkeeping: AdamWeightDecayOptimizer's `<var>/adam_m|adam_v` (Google's
# optimization.py), tf.train.AdamOptimizer's `<var>/Adam`, `<var>/Adam_1`, `beta1_power`,
# `beta2_power`, and the global step.
_OPTIMIZER_STATE = re.compile(r"(^|/)(global_step|beta[12]_power)$|/(adam_m|adam_v|Adam(_\d+)?)$")

_LINEAR_SCOPES = (
    r"bert/encoder/layer_\d+/(?:attention/self/(?:query|key|value)|attention/output/dense|intermediate/dense|output/dense)"
    r"|bert/pooler/dense|cls/predictions/transform/dense"
)
_NORM_SCOPES = (
    r"bert/embeddings/LayerNorm|bert/encoder/layer_\d+/(?:attention/output|output)/LayerNorm"
    r"|cls/predictions/transform/LayerNorm"
)
_MODULE_VARIABLE = re.compile(
    rf"^(?:(?P<linear>{_LINEAR_SCOPES})/(?P<linear_leaf>kernel|bias)|(?P<norm>{_NORM_SCOPES})/(?P<norm_leaf>gamma|beta))$"
)
_LEAF_NAMES = {"kernel": "weight", "bias": "bias", "gamma": "weight", "beta": "bias"}

# Variables that are not `<module>/<leaf>`, with the head each belongs to.
_NAMED_VARIABLES: dict[str, tuple[str, str]] = {
    "bert/embeddings/word_embeddings": ("bert.embeddings.word_embeddings.weight", "encoder"),
    "bert/embeddings/token_type_embeddings": ("bert.embeddings.token_type_embeddings.weight", "encoder"),
    "bert/embeddings/position_embeddings": ("bert.embeddings.position_embeddings.weight", "encoder"),
    # The MLM decoder weight is tied to the word embeddings: only its bias is stored.
    "cls/predictions/output_bias": ("cls.predictions.bias", "mlm"),
    # Already [out, in]: created with tf.get_variable, not tf.layers.dense.
    "cls/seq_relationship/output_weights": ("cls.seq_relationship.weight", "nsp"),
    "cls/seq_relationship/output_bias": ("cls.seq_relationship.bias", "nsp"),
    # run_classifier.py's create_model, outside any scope.
    "output_weights": ("classifier.weight", "classifier"),
    "output_bias": ("classifier.bias", "classifier"),
    # run_squad.py's create_model.
    "cls/squad/output_weights": ("qa_outputs.weight", "squad"),
    "cls/squad/output_bias": ("qa_outputs.bias", "squad"),
}


def _head_of(tf_name: str) -> str:
    """Which part of the model a mapped variable belongs to: encoder, mlm, nsp, classifier or squad."""
    if tf_name in _NAMED_VARIABLES:
        return _NAMED_VARIABLES[tf_name][1]
    return "mlm" if tf_name.startswith("cls/predictions/") else "encoder"


def map_tf_name(name: str) -> str | None:
    """The Hugging Face / bertforge state-dict name of a Google TF BERT variable.

    None for optimizer state and bookkeeping (adam_m, adam_v, Adam, Adam_1, beta1_power,
    beta2_power, global_step), which a conversion skips. Raises ValueError for any other variable,
    so that no user weight is dropped silently. A variable whose name ends in `/kernel` must be
    transposed from TF's [in, out] to torch's [out, in]; no other one.
    """
    if _OPTIMIZER_STATE.search(name):
        return None
    if name in _NAMED_VARIABLES:
        return _NAMED_VARIABLES[name][0]
    match = _MODULE_VARIABLE.match(name)
    if match is None:
        hint = ""
        if "/.ATTRIBUTES/" in name or name == "_CHECKPOINTABLE_OBJECT_GRAPH":
            hint = (
                " (this looks like a TF2 object-based checkpoint, e.g. from the TF Model Garden; only "
                "the TF1 checkpoints of Google's original BERT code are supported)"
            )
        raise ValueError(f"unknown variable {name!r} in the TensorFlow checkpoint{hint}")
    scope = match["linear"] or match["norm"]
    leaf = match["linear_leaf"] or match["norm_leaf"]
    return re.sub(r"layer_(\d+)", r"layer.\1", scope).replace("/", ".") + "." + _LEAF_NAMES[leaf]


# --------------------------------------------------------------------------- conversion

_CONFIG_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
)

# The transformers class for the heads a checkpoint has: the first whose heads are all there.
_ARCHITECTURES = (
    ({"classifier"}, "BertForSequenceClassification"),
    ({"squad"}, "BertForQuestionAnswering"),
    ({"mlm", "nsp"}, "BertForPreTraining"),
    ({"mlm"}, "BertForMaskedLM"),
    ({"nsp"}, "BertForNextSentencePrediction"),
    (set(), "BertModel"),
)

# From Google's tokenization.validate_case_matches_checkpoint: released models whose names say
# nothing about case but that were trained lower-cased.
_LOWER_CASED_MODELS = ("multilingual_L-12_H-768_A-12", "chinese_L-12_H-768_A-12")


def _expected_shapes(config: dict, heads: set[str], num_labels: int) -> dict[str, tuple[int, ...]]:
    """TF name -> TF shape of every variable a model with `heads` has under bert_config.json."""
    H, FFN, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "bert/embeddings/word_embeddings": (V, H),
        "bert/embeddings/token_type_embeddings": (config["type_vocab_size"], H),
        "bert/embeddings/position_embeddings": (config["max_position_embeddings"], H),
    }

    def dense(scope: str, n_in: int, n_out: int) -> None:
        shapes[f"{scope}/kernel"], shapes[f"{scope}/bias"] = (n_in, n_out), (n_out,)

    def layer_norm(scope: str) -> None:
        shapes[f"{scope}/gamma"], shapes[f"{scope}/beta"] = (H,), (H,)

    layer_norm("bert/embeddings/LayerNorm")
    for n in range(config["num_hidden_layers"]):
        layer = f"bert/encoder/layer_{n}"
        for projection in ("query", "key", "value"):
            dense(f"{layer}/attention/self/{projection}", H, H)
        dense(f"{layer}/attention/output/dense", H, H)
        layer_norm(f"{layer}/attention/output/LayerNorm")
        dense(f"{layer}/intermediate/dense", H, FFN)
        dense(f"{layer}/output/dense", FFN, H)
        layer_norm(f"{layer}/output/LayerNorm")
    dense("bert/pooler/dense", H, H)
    if "mlm" in heads:
        dense("cls/predictions/transform/dense", H, H)
        layer_norm("cls/predictions/transform/LayerNorm")
        shapes["cls/predictions/output_bias"] = (V,)
    if "nsp" in heads:
        shapes["cls/seq_relationship/output_weights"], shapes["cls/seq_relationship/output_bias"] = (2, H), (2,)
    if "classifier" in heads:
        shapes["output_weights"], shapes["output_bias"] = (num_labels, H), (num_labels,)
    if "squad" in heads:
        shapes["cls/squad/output_weights"], shapes["cls/squad/output_bias"] = (2, H), (2,)
    return shapes


def _read_config(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"BERT config file not found: {path}")
    config = json.loads(path.read_text(encoding="utf-8"))
    missing = [key for key in _CONFIG_KEYS if key not in config]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}: not a bert_config.json?")
    return config


def _read_vocab(path: Path) -> list[str]:
    if not path.is_file():
        raise FileNotFoundError(f"vocabulary file not found: {path}")
    # Split on "\n" only, as Google's load_vocab reads lines: str.splitlines() would also split
    # inside tokens holding \x1c, \x85, \u2028 ...
    text = path.read_text(encoding="utf-8")
    return [line.strip() for line in text.removesuffix("\n").split("\n")]


def _guess_do_lower_case(model_name: str, vocab: list[str]) -> bool:
    """Whether the model was trained on lower-cased text, as Google's validate_case_matches_checkpoint
    tells from the directory name (uncased_L-12_H-768_A-12, cased_L-12_H-768_A-12, ...); for any
    other name, from the vocabulary: lower-cased if no token but the [CLS]-like specials has an
    upper-case letter."""
    if "uncased_" in model_name or model_name in _LOWER_CASED_MODELS:
        return True
    if "cased_" in model_name:
        return False
    return not any(
        char.isupper() for token in vocab if not (token.startswith("[") and token.endswith("]")) for char in token
    )


def _some(names: list[str], shown: int = 5) -> str:
    """The first few of a long list of variable names, for an error message."""
    return ", ".join(map(repr, names[:shown])) + (f" ... ({len(names)} in all)" if len(names) > shown else "")


def _write_json(path: Path, content: dict) -> None:
    write_text_atomic(path, json.dumps(content, indent=2) + "\n")


def convert_tf_checkpoint(
    ckpt_prefix: str | os.PathLike,
    output_dir: str | os.PathLike,
    config_file: str | None = None,
    vocab_file: str | None = None,
) -> Path:
    """Convert one of Google's TF1 BERT checkpoints to a directory that bertforge and transformers load.

    ckpt_prefix: `.../bert_model.ckpt` (the path without `.index`), its `.index` file, or a
    directory holding one checkpoint. config_file, vocab_file: default to `bert_config.json` and
    `vocab.txt` beside the checkpoint.

    Writes to output_dir (created if missing) `config.json` (Hugging Face's BERT config, with
    `architectures` from the heads found: BertForPreTraining for run_pretraining.py checkpoints,
    BertForSequenceClassification for run_classifier.py's, BertForQuestionAnswering for
    run_squad.py's), `model.safetensors` (float32, kernels transposed to [out, in], no optimizer
    state, no MLM decoder weight as it is tied to the word embeddings), `vocab.txt` and
    `tokenizer_config.json`. Returns output_dir.

    Raises FileNotFoundError naming a missing file, ValueError for a corrupted checkpoint, an
    unknown variable, a missing one, or a shape that disagrees with the config.
    """
    bundle = _Bundle(ckpt_prefix)
    config_path = Path(config_file) if config_file else bundle.prefix.parent / "bert_config.json"
    vocab_path = Path(vocab_file) if vocab_file else bundle.prefix.parent / "vocab.txt"
    config = _read_config(config_path)
    vocab = _read_vocab(vocab_path)
    if len(vocab) > config["vocab_size"]:
        raise ValueError(
            f"{vocab_path} has {len(vocab)} tokens but {config_path} says vocab_size={config['vocab_size']}"
        )

    names = {tf_name: hf_name for tf_name in bundle.entries if (hf_name := map_tf_name(tf_name)) is not None}
    heads = {_head_of(tf_name) for tf_name in names}
    classifier = bundle.entries.get("output_weights")
    num_labels = classifier.shape[0] if classifier is not None and classifier.shape else 0
    expected = _expected_shapes(config, heads, num_labels)
    unexpected = sorted(set(names) - set(expected))
    if unexpected:
        layers = config["num_hidden_layers"]
        raise ValueError(f"variables {_some(unexpected)} do not fit {config_path} (num_hidden_layers={layers})")
    missing = sorted(set(expected) - set(names))
    if missing:
        raise ValueError(f"the checkpoint lacks {_some(missing)}")
    for tf_name, shape in expected.items():
        found = bundle.entries[tf_name].shape
        if found != shape:
            raise ValueError(f"tensor {tf_name!r} has shape {list(found)}, but {config_path} implies {list(shape)}")

    tensors = {}
    for tf_name in tqdm(sorted(names), desc="Converting", unit="tensor", disable=len(names) < 100, leave=False):
        array = bundle.read(tf_name)
        tensors[names[tf_name]] = np.ascontiguousarray(
            array.T if tf_name.endswith("/kernel") else array, dtype=np.float32
        )

    architecture = next(arch for needs, arch in _ARCHITECTURES if needs <= heads)
    hf_config = {
        "architectures": [architecture],
        "model_type": "bert",
        **config,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
    }
    if "classifier" in heads:
        hf_config["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_labels)}
        hf_config["label2id"] = {f"LABEL_{i}": i for i in range(num_labels)}
    tokenizer_config = {
        "do_lower_case": _guess_do_lower_case(bundle.prefix.parent.name, vocab),
        "tokenizer_class": "BertTokenizer",
        "model_max_length": config["max_position_embeddings"],
    }

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "model.safetensors", prefix=".model.") as temporary:
        save_file(tensors, temporary, metadata={"format": "pt"})
    _write_json(out / "config.json", hf_config)
    with atomic_path(out / "vocab.txt") as temporary:
        shutil.copyfile(vocab_path, temporary)
    _write_json(out / "tokenizer_config.json", tokenizer_config)
    return out
