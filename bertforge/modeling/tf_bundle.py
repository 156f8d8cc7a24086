"""Google's TF1 tensor bundles read without TensorFlow: `read_tf_checkpoint` (tf_checkpoint.py converts them).

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
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["read_tf_checkpoint"]

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

    Pure Python: fine for index blocks, too slow to run over a whole data file by default.
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
    verify_checksums: also check each tensor's CRC-32C (pure Python, so slow on large checkpoints).
    Raises FileNotFoundError for a missing index or data file, ValueError for a corrupted one.
    """
    bundle = _Bundle(ckpt_prefix)
    return {name: bundle.read(name, verify_checksums) for name in sorted(bundle.entries)}
