"""The packed layout of the unpadded path, and its row buckets.

`Packing`: the real tokens of a padded (B, S) batch packed into one (T, ...) sequence for the
embeddings and every dense layer (T = the real tokens; often half of B·S on real text, and the dense
layers are most of the work), grouped by length for attention (`attention.packed_attention`).

Row buckets (`bucket_size`): on CPU, lengths are rounded up to a few sizes, with filler rows or masked
positions that change no output. Why, once for every bucket in bertforge: oneDNN, which runs the
matmuls (every dtype), the fused GELU and the bf16 attention blocks on CPU, builds and keeps a kernel,
with heap memory of its own, for every tensor shape it meets, and the allocator keeps blocks of every
size it has served. A workload whose every batch brings a new shape (a server, a pass over a file,
training on unpadded batches) would keep building kernels and growing its memory; with shapes from a
few sizes it stops once it has seen them. Buckets are off by default (exact packing); the plans turn
them on for CPU: `optimize_for_inference` for inference, the Trainer (`BertModel.prepare_cpu_training`)
for training.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["DEFAULT_ROW_BUCKET", "HOST_COPY", "PADDED_LENGTH_STEP", "Packing", "bucket_size", "host_copy",
           "keep_host_copy"]

# The attribute under which a device tensor may carry the host tensor it was copied from (`keep_host_copy`).
HOST_COPY = "host_copy"


def keep_host_copy(device_tensor: torch.Tensor, host: torch.Tensor) -> torch.Tensor:
    """Let `device_tensor` (a copy of `host` on an accelerator) carry `host`, so that what the packed
    layout needs to know on the host (the examples' lengths, the real tokens' places) is read there
    rather than from the device: reading it back would wait for the device in the middle of a step.
    The Trainer does this for every batch it moves to a device. Returns `device_tensor`."""
    if device_tensor.device.type != "cpu" and device_tensor is not host:
        setattr(device_tensor, HOST_COPY, host)
    return device_tensor


def host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` itself on the CPU; on a device, the host tensor it was copied from (`keep_host_copy`),
    or else a copy to the host (which waits for the device)."""
    if tensor.device.type == "cpu":
        return tensor
    host = getattr(tensor, HOST_COPY, None)
    return host if host is not None else tensor.cpu()

# The smallest bucket step of the packed length on CPU (`optimize_for_inference`, `prepare_cpu_training`).
DEFAULT_ROW_BUCKET = 16


def bucket_size(n: int, step: int) -> int:
    """`n` rounded up to a multiple of max(step, 2^⌊log2 n⌋ / 8): at most `step - 1` more for small n,
    at most 1/8 more for large n, and about 8 sizes per doubling of n. `step` 0 (or n 0): n itself.
    Why buckets: the module's docstring."""
    if not step or n <= 0:
        return n
    return n + -n % max(step, (1 << (n.bit_length() - 1)) // 8)


@dataclass
class Packing:
    """Where the real tokens of a padded (B, S) batch lie in the packed (T, ...) layout of the
    unpadded path, T = the number of real tokens.

    Examples are packed in order of length (stable), so that examples of equal length are adjacent:
    each group of `count` examples of `length` tokens is the contiguous rows `start` to
    `start + count * length` of the packed sequence and runs through one attention call as a
    (count, A, length, D) batch, without padding and without copying it out.

    `row_bucket` > 0 appends `extra_rows` filler rows after the real tokens to round the packed
    length up to a bucket (`bucket_size`). The filler rows belong to no group (attend to nothing, are
    attended by nothing), their attention context is zero, and `unpack` drops them. `length_bucket`
    (set to row_bucket): in bf16/fp16 inference the attention of each example also runs at a bucketed
    length, and the padded attention of training and of the [CLS] query at a rounded-up length
    (`_padded_slots`).
    """

    batch: int
    seq_length: int
    index: torch.Tensor  # (T + extra_rows,) int64: b * S + s, each packed row's place in the padded (B·S) layout
    positions: torch.Tensor  # (T + extra_rows,) int64: s, its position id (its column, as in the padded path)
    groups: tuple[tuple[int, int, int], ...]  # (start, count, length) per run of equal-length examples
    is_causal: bool = False
    extra_rows: int = 0  # filler rows after the T real ones (see `row_bucket`)
    length_bucket: int = 0  # in low-precision inference, attention lengths are rounded up too (see `bucket_size`)
    padded_slots: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, compare=False, repr=False)
    padded_bias: tuple[tuple, torch.Tensor] | None = field(default=None, compare=False, repr=False)
    _first_rows: torch.Tensor | None = field(default=None, compare=False, repr=False)
    _cu_seqlens: torch.Tensor | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor, is_causal: bool = False, row_bucket: int = 0) -> Packing:
        """attention_mask: (B, S), 1 = real token, 0 = padding (anywhere in the row, not only at the end).
        row_bucket: 0 packs exactly the real tokens; > 0 rounds their number up (see the class)."""
        if not isinstance(row_bucket, int) or isinstance(row_bucket, bool) or row_bucket < 0:
            raise ValueError(f"row_bucket must be an int >= 0, got {row_bucket!r}")
        device = attention_mask.device
        mask = host_copy(attention_mask).bool()  # on a device: built on the host, moved without waiting
        batch, seq_length = mask.shape
        lengths = mask.sum(1)
        order = torch.argsort(lengths, stable=True)
        rows, columns = mask[order].nonzero(as_tuple=True)  # row-major: tokens keep their order
        index = order[rows] * seq_length + columns
        groups, start = [], 0
        sorted_lengths = lengths[order].tolist()
        for length in sorted(set(sorted_lengths)):
            count = sorted_lengths.count(length)
            if length:  # an all-padding row has no tokens to attend
                groups.append((start, count, length))
            start += count * length
        extra = bucket_size(start, row_bucket) - start
        if extra:  # filler rows repeat the first real token: real ids and positions, never read back
            index = torch.cat([index, index[:1].expand(extra)])
            columns = torch.cat([columns, columns[:1].expand(extra)])
        if device.type != "cpu":
            index, columns = index.to(device, non_blocking=True), columns.to(device, non_blocking=True)
        return cls(batch, seq_length, index, columns, tuple(groups), is_causal, extra, row_bucket)

    @property
    def num_tokens(self) -> int:
        """T, the real tokens (the packed rows are T + extra_rows)."""
        return self.index.shape[0] - self.extra_rows

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(B, S, ...) -> (T + extra_rows, ...): the real tokens, then any filler rows."""
        return x.reshape(self.batch * self.seq_length, *x.shape[2:])[self.index]

    def first_rows(self) -> torch.Tensor:
        """(N,) int64: the packed row of each example's first real token, the examples in packed order
        (by length); N = the examples with a real token."""
        if self._first_rows is None:  # read by the last layer (its first tokens) and for the output order
            firsts = [start + i * length for start, count, length in self.groups for i in range(count)]
            self._first_rows = torch.tensor(firsts).to(self.index.device, non_blocking=True)
        return self._first_rows

    def rows_of(self, positions: torch.Tensor) -> torch.Tensor:
        """positions (B, P) of the padded batch -> (B·P,) int64: the packed row of each (example, position),
        examples in batch order. A padding position has no row: its entry is a real row, unspecified."""
        tokens = self.num_tokens
        row_of = torch.zeros(self.batch * self.seq_length, dtype=torch.long, device=self.index.device)
        row_of[self.index[:tokens]] = torch.arange(tokens, device=self.index.device)
        starts = torch.arange(self.batch, device=positions.device)[:, None] * self.seq_length
        return row_of[(positions + starts).reshape(-1)]

    @property
    def max_length(self) -> int:
        """The longest example's real tokens (0 for a batch of padding only)."""
        return max((length for _, _, length in self.groups), default=0)

    def cu_seqlens(self) -> torch.Tensor:
        """(N + 1,) int32 on the packing's device: where each example's rows start in the packed layout,
        examples in packed order, then T (FlashAttention's cumulative sequence lengths; filler rows
        belong to no example). Built on the host from `groups` and moved without waiting."""
        if self._cu_seqlens is None:
            bounds = [0] + [start + (i + 1) * length for start, count, length in self.groups for i in range(count)]
            self._cu_seqlens = torch.tensor(bounds, dtype=torch.int32).to(self.index.device, non_blocking=True)
        return self._cu_seqlens

    def batch_order(self, packed: torch.Tensor) -> torch.Tensor:
        """(N, ...) rows in packed example order (as `first_rows`) -> (B, ...) in batch order; every
        example must have a real token at position 0 (`first_rows` is then each example's column 0)."""
        examples = self.index[self.first_rows()] // self.seq_length  # (N,) the example of each packed row
        if examples.shape[0] != self.batch:
            raise ValueError(f"batch_order needs a real first token in each of the {self.batch} examples, "
                             f"found {examples.shape[0]}")
        return packed[torch.argsort(examples)]

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """(T + extra_rows, H) -> (B, S, H), zeros at the padding positions (what the padded path
        leaves there is arbitrary: no caller may read it)."""
        out = x.new_zeros(self.batch * self.seq_length, x.shape[-1])
        tokens = self.num_tokens
        return out.index_copy_(0, self.index[:tokens], x[:tokens]).view(self.batch, self.seq_length, x.shape[-1])


# With row buckets on (`Packing.length_bucket` > 0), the padded layout's length L is the longest example's
# rounded up to a multiple of this (`bucket_size`: 8 up to 127 tokens, 16 up to 255, ...).
PADDED_LENGTH_STEP = 8


def _padded_slots(packing: Packing) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each real packed row sits in the padded (N, L) layout: (real_tokens,) int64 slots
    n·L + position, and the (N, 1, 1, L) key mask (True = a real token). Built once per batch and
    kept on the Packing, which every layer shares.

    L is the longest example's length, rounded up (`PADDED_LENGTH_STEP`) when the packing has row
    buckets (fine-tuning on sentence batches meets nearly every length up to max_seq_length, and each
    would be a new attention shape mid-step). The extra key positions are masked (weight exactly 0) and
    the extra query rows dropped, so the outputs do not change."""
    if packing.padded_slots is None:
        lengths = torch.tensor([length for _, n, length in packing.groups for _ in range(n)])
        count, longest = len(lengths), int(lengths.max())
        if packing.length_bucket:
            longest = bucket_size(longest, PADDED_LENGTH_STEP)
        slots = torch.arange(longest).expand(count, longest)
        real = slots < lengths[:, None]  # (N, L); row-major order is the packed order of the real rows
        slots = (torch.arange(count)[:, None] * longest + slots)[real]
        device = packing.index.device
        packing.padded_slots = (slots.to(device, non_blocking=True),
                                real[:, None, None, :].to(device, non_blocking=True))
    return packing.padded_slots


def _padded_bias(packing: Packing, num_heads: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive attention mask of the padded (N, L) layout, 0 where a query may see a key and -inf
    where not: (N·A, 1, L), or (N·A, L, L) for a causal model. Built once per batch and dtype and kept
    on the Packing, which every layer shares."""
    key = (num_heads, dtype)
    if packing.padded_bias is None or packing.padded_bias[0] != key:
        _, key_mask = _padded_slots(packing)  # (N, 1, 1, L)
        count, longest = key_mask.shape[0], key_mask.shape[-1]
        allowed = key_mask[:, 0]  # (N, 1, L)
        if packing.is_causal:
            allowed = allowed & torch.ones(longest, longest, dtype=torch.bool, device=allowed.device).tril_()
        bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))
        bias = bias[:, None].expand(count, num_heads, *allowed.shape[1:]).reshape(count * num_heads,
                                                                                  *allowed.shape[1:])
        packing.padded_bias = (key, bias)
    return packing.padded_bias[1]
