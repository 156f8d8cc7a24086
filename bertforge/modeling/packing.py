"""The unpadded (packed) path of the encoder: the real tokens of a padded (B, S) batch packed into one
(T, ...) sequence for the embeddings and every dense layer, attention run within each example, and the
packed length rounded up to a few sizes (row buckets) so that CPU kernels meet few shapes.

`BertModel` (bert.py) switches to this path with `unpad`; `MultiHeadSelfAttention` calls
`packed_attention` when given a `Packing`. Row buckets are off by default; `optimize_for_inference`
turns them on for inference and the Trainer, through `BertModel.prepare_cpu_training`, for training
on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .dropout import dropout, matmul_attention, scaled_dot_product_attention
from .kernels import Workspace

__all__ = ["DEFAULT_ROW_BUCKET", "PADDED_LENGTH_STEP", "Packing", "bucket_size", "first_token_attention",
           "packed_attention"]

# The smallest bucket step of the unpadded path's packed length (see `optimize_for_inference`).
DEFAULT_ROW_BUCKET = 16


def bucket_size(n: int, step: int) -> int:
    """`n` rounded up to a multiple of max(step, 2^⌊log2 n⌋ / 8): at most `step - 1` more for small n,
    at most 1/8 more for large n, and about 8 sizes per doubling of n. `step` 0 (or n 0): n itself.

    Why: oneDNN, which runs matmuls, GELU and attention blocks on CPU, builds and keeps a kernel per
    tensor shape, and the allocator keeps blocks of every size it has served, so a workload whose every
    batch brings a new shape (a server, a pass over a file) grows its memory batch after batch. With
    shapes from a few sizes it stops growing once it has seen them.
    """
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
    length up to a bucket: a multiple of max(row_bucket, 2^⌊log2 T⌋ / 8), so at most 1/8 more rows
    (row_bucket at most for short batches) and about 8 distinct lengths per doubling of T. The
    filler rows belong to no group (attend to nothing, are attended by nothing), their attention
    context is zero, and `unpack` drops them. Why: oneDNN (the bf16 and int8 matmuls, and the float32
    GELU) builds and caches a kernel per matrix shape, and the allocator keeps blocks of every size it
    has served, so a server whose every batch has a new T keeps building kernels and growing its
    memory (`bucket_size`). `length_bucket` (set to row_bucket): in bf16/fp16 inference the attention
    of each example also runs at a bucketed length (`packed_attention`), and the padded attention of
    training and of the [CLS] query at a rounded-up length (`_padded_slots`).
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

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor, is_causal: bool = False, row_bucket: int = 0) -> Packing:
        """attention_mask: (B, S), 1 = real token, 0 = padding (anywhere in the row, not only at the end).
        row_bucket: 0 packs exactly the real tokens; > 0 rounds their number up (see the class)."""
        if not isinstance(row_bucket, int) or isinstance(row_bucket, bool) or row_bucket < 0:
            raise ValueError(f"row_bucket must be an int >= 0, got {row_bucket!r}")
        mask = attention_mask.bool()
        batch, seq_length = mask.shape
        lengths = mask.sum(1)
        order = torch.argsort(lengths, stable=True)
        rows, columns = mask[order].nonzero(as_tuple=True)  # row-major: tokens keep their order
        index = order[rows] * seq_length + columns
        groups, start = [], 0
        sorted_lengths = lengths[order].tolist()  # a host sync on GPU, once per forward pass
        for length in sorted(set(sorted_lengths)):
            count = sorted_lengths.count(length)
            if length:  # an all-padding row has no tokens to attend
                groups.append((start, count, length))
            start += count * length
        extra = bucket_size(start, row_bucket) - start
        if extra:  # filler rows repeat the first real token: real ids and positions, never read back
            index = torch.cat([index, index[:1].expand(extra)])
            columns = torch.cat([columns, columns[:1].expand(extra)])
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
            self._first_rows = torch.tensor(firsts, device=self.index.device)
        return self._first_rows

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


def packed_attention(qkv: torch.Tensor, packing: Packing, num_heads: int, dropout_p: float = 0.0,
                     workspace: Workspace | None = None) -> torch.Tensor:
    """qkv (T, 3H) -> context (T, H): attention within each example of the packed batch.

    One scaled_dot_product_attention call per run of equal-length examples, on views of the packed
    QKV rows: no padding, no mask, so no attention work is spent on padding (faster on CPU than one
    call per example or scattering into a padded, masked batch; nested (jagged) tensors have no CPU
    kernel for it). Filler rows (`Packing.extra_rows`) get a zero context.
    """
    tokens, hidden = qkv.shape[0], qkv.shape[1] // 3
    heads = num_heads
    if qkv.requires_grad and torch.is_grad_enabled():
        return _packed_attention_for_autograd(qkv, packing, num_heads, dropout_p)
    if workspace is not None:
        context = workspace.get("context", (tokens, hidden), qkv)
    else:
        context = qkv.new_empty(tokens, hidden)
    if packing.length_bucket and qkv.dtype in (torch.bfloat16, torch.float16) and not torch.is_grad_enabled():
        _attend_in_length_buckets(qkv, context, packing, num_heads)
        if packing.extra_rows:
            context[tokens - packing.extra_rows:].zero_()
        return context
    for start, count, length in packing.groups:
        rows = slice(start, start + count * length)
        out = _group_attention(qkv[rows], count, length, heads, dropout_p, packing.is_causal)
        context[rows].view(count, length, heads, hidden // heads).copy_(out)
    if packing.extra_rows:
        context[tokens - packing.extra_rows:].zero_()
    return context


def _group_attention(rows: torch.Tensor, count: int, length: int, num_heads: int, dropout_p: float,
                     is_causal: bool) -> torch.Tensor:
    """One group of `count` examples of `length` tokens: its qkv rows (count·length, 3H) -> context
    (count, length, A, D), a view of the attention output (not contiguous)."""
    hidden = rows.shape[1] // 3
    query, key, value = rows.view(count, length, 3, num_heads, hidden // num_heads).permute(2, 0, 3, 1, 4)
    if _short_float32_inference(query, length, dropout_p, is_causal):
        out = matmul_attention(query, key, value)
    else:
        out = scaled_dot_product_attention(query, key, value, dropout_p=dropout_p, is_causal=is_causal)
    return out.transpose(1, 2)


# Float32 inference attention on CPU runs as two matmuls and a softmax for groups up to this length
# whose Q·Kᵀ work, N·L²·D multiply-adds per head, is at most MATH_ATTENTION_MAX_WORK.
MATH_ATTENTION_MAX_LENGTH = 128
MATH_ATTENTION_MAX_WORK = 1 << 22


def _short_float32_inference(query: torch.Tensor, length: int, dropout_p: float, is_causal: bool) -> bool:
    """Whether a group's attention (query (N, A, L, D)) runs as softmax(Q Kᵀ / √D) V in plain matmuls
    rather than torch's fused CPU kernel: float32 on CPU, no autograd, no dropout or causal mask, L up to
    MATH_ATTENTION_MAX_LENGTH and N·L²·D up to MATH_ATTENTION_MAX_WORK. Why: the fused kernel works in
    blocks sized for long sequences and pays a fixed cost per call; for the few sentences of one length
    that a packed batch's group holds, the matmuls are faster, and for many it is (BENCHMARKS.md, "CPU
    kernels for inference")."""
    count, head_size = query.shape[0], query.shape[-1]
    return (length <= MATH_ATTENTION_MAX_LENGTH and count * length * length * head_size <= MATH_ATTENTION_MAX_WORK
            and query.dtype == torch.float32 and query.device.type == "cpu"
            and not dropout_p and not is_causal and not torch.is_grad_enabled())


def pads_attention(packing: Packing, hidden: int) -> bool:
    """Whether training runs the attention of all the packed examples as one padded, masked batch
    (`_padded_attention`) instead of one call per length (`packed_attention`'s groups).

    Why: with gradients, each group costs some 25 small ops forward and backward, and a shuffled batch
    of 32 sentences has about 20 lengths, so per-length calls cost more than the padding saves. One call
    is taken when the attention work it adds on padding, 4·H·(N·L² − Σ n²) FLOPs for N examples of
    lengths n up to L, is at most an eighth of the dense layers' 24·T·H² on the T real tokens, as it is
    for sentence-length batches (the dense layers, not attention, dominate there); long examples of
    mixed lengths (packed pre-training rows, SQuAD windows) keep the per-length calls.
    """
    if len(packing.groups) < 2:
        return False
    count = sum(n for _, n, _ in packing.groups)
    longest = max(length for _, _, length in packing.groups)
    squares = sum(n * length * length for _, n, length in packing.groups)
    return 4 * (count * longest * longest - squares) <= 3 * packing.num_tokens * hidden


# With row buckets on (`Packing.length_bucket` > 0), the padded layout's length L is the longest example's
# rounded up to a multiple of this (`bucket_size`: 8 up to 127 tokens, 16 up to 255, ...).
PADDED_LENGTH_STEP = 8


def _padded_slots(packing: Packing) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each real packed row sits in the padded (N, L) layout: (real_tokens,) int64 slots
    n·L + position, and the (N, 1, 1, L) key mask (True = a real token). Built once per batch and
    kept on the Packing, which every layer shares.

    L is the longest example's length, rounded up (`PADDED_LENGTH_STEP`) when the packing has row
    buckets. Why: oneDNN builds and caches a matmul kernel, with heap memory of its own, for every
    attention shape it meets, in the middle of a training step among the step's tensors; fine-tuning on
    sentence batches meets nearly every length up to max_seq_length, and those kernels would fragment the
    heap and keep it growing (BENCHMARKS.md, "Training memory"). The extra key positions are masked (weight
    exactly 0) and the extra query rows dropped, so the outputs do not change."""
    if packing.padded_slots is None:
        lengths = torch.tensor([length for _, n, length in packing.groups for _ in range(n)])
        count, longest = len(lengths), int(lengths.max())
        if packing.length_bucket:
            longest = bucket_size(longest, PADDED_LENGTH_STEP)
        slots = torch.arange(longest).expand(count, longest)
        real = slots < lengths[:, None]  # (N, L); row-major order is the packed order of the real rows
        slots = (torch.arange(count)[:, None] * longest + slots)[real]
        device = packing.index.device
        packing.padded_slots = (slots.to(device), real[:, None, None, :].to(device))
    return packing.padded_slots


def first_token_attention(query: torch.Tensor, key_value: torch.Tensor, packing: Packing, num_heads: int,
                          dropout_p: float = 0.0) -> torch.Tensor:
    """query (N, H) of each example's first token (`Packing.first_rows`, packed example order) and key_value
    (T, 2H) of every row -> context (N, H): the keys and values of every real token, padded into one
    (N, A, L, D) batch as `_padded_attention` does, and one query per example. What the pooler reads of
    the last layer (`TransformerLayer.forward_first`). Not for causal attention."""
    if packing.is_causal:
        raise ValueError("first_token_attention: a causal model's first token sees only itself")
    tokens, hidden = key_value.shape[0], key_value.shape[1] // 2
    head_dim = hidden // num_heads
    slots, key_mask = _padded_slots(packing)
    count, longest = key_mask.shape[0], key_mask.shape[-1]
    padded = key_value.new_zeros(count * longest, 2 * hidden).index_copy(
        0, slots, key_value[:tokens - packing.extra_rows])
    key, value = padded.view(count, longest, 2, num_heads, head_dim).permute(2, 0, 3, 1, 4)
    query = query.view(count, 1, num_heads, head_dim).transpose(1, 2)
    out = scaled_dot_product_attention(query, key, value, attn_mask=key_mask, dropout_p=dropout_p)  # (N, A, 1, D)
    return out.transpose(1, 2).reshape(count, hidden)


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


def _padded_attention(qkv: torch.Tensor, packing: Packing, num_heads: int, dropout_p: float) -> torch.Tensor:
    """qkv (T, 3H) -> context (T, H) through one (N·A, L, D) batch of attention matmuls: the real rows
    copied into a zero-padded (N·L, 3H) batch (`index_copy`, whose backward is one gather), its heads laid
    out side by side in one copy, padding keys masked by an additive -inf (`_padded_bias`, in the same
    batched matmul as the scaling: `baddbmm`), the padding queries' outputs dropped (`index_select`).
    Filler rows (`Packing.extra_rows`) get a zero context. The fewest ops per layer for autograd to
    record and replay: this runs once per layer per training step."""
    tokens, hidden = qkv.shape[0], qkv.shape[1] // 3
    head_dim = hidden // num_heads
    real_tokens = tokens - packing.extra_rows
    slots, key_mask = _padded_slots(packing)
    count, longest = key_mask.shape[0], key_mask.shape[-1]
    padded = qkv.new_zeros(count * longest, 3 * hidden).index_copy(0, slots, qkv[:real_tokens])
    query, key, value = padded.view(count, longest, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4).reshape(
        3, count * num_heads, longest, head_dim).unbind(0)  # each (N·A, L, D), contiguous
    bias = _padded_bias(packing, num_heads, query.dtype)
    scores = torch.baddbmm(bias, query, key.transpose(1, 2), alpha=head_dim ** -0.5)  # (N·A, L, L)
    probabilities = scores.softmax(dim=-1)
    if dropout_p:
        probabilities = dropout(probabilities, dropout_p)
    out = torch.bmm(probabilities, value)  # (N·A, L, D)
    context = out.view(count, num_heads, longest, head_dim).transpose(1, 2).reshape(
        count * longest, hidden).index_select(0, slots)
    if packing.extra_rows:
        context = torch.cat([context, qkv.new_zeros(packing.extra_rows, hidden)])
    return context


def _packed_attention_for_autograd(qkv: torch.Tensor, packing: Packing, num_heads: int,
                                   dropout_p: float) -> torch.Tensor:
    """`packed_attention` when gradients flow: qkv (T, 3H) -> context (T, H). Sentence-length batches
    run as one padded call (`pads_attention`); otherwise the groups are taken with one `split` and
    their contexts joined with one `cat`. Why: the backward of a slice is a zero-filled (T, 3H) gradient
    per group, and that of a copy into a slice of `context` clones the whole (T, H) gradient per group.
    The backward of split is one cat and vice versa."""
    tokens, hidden = qkv.shape[0], qkv.shape[1] // 3
    if pads_attention(packing, hidden):
        return _padded_attention(qkv, packing, num_heads, dropout_p)
    sizes = [count * length for _, count, length in packing.groups]
    filler = tokens - sum(sizes)  # the extra_rows
    pieces = qkv.split(sizes + [filler] if filler else sizes)
    contexts = []
    for piece, (_, count, length) in zip(pieces, packing.groups):
        out = _group_attention(piece, count, length, num_heads, dropout_p, packing.is_causal)
        contexts.append(out.reshape(count * length, hidden))
    if filler:
        contexts.append(qkv.new_zeros(filler, hidden))
    return torch.cat(contexts) if contexts else qkv.new_zeros(tokens, hidden)


def _attend_in_length_buckets(qkv: torch.Tensor, context: torch.Tensor, packing: Packing, num_heads: int) -> None:
    """Attention of the packed batch with every example's length rounded up to a bucket
    (`bucket_size(length, packing.length_bucket)`): qkv (T, 3H) -> context (T, H), in place.

    The examples of one bucket are copied into a zero-padded (N, L_bucket, 3H) batch and run
    through one scaled_dot_product_attention call whose mask hides the padding keys (they get
    weight exactly 0); the padding queries' outputs are dropped. Why: in bf16 on CPU the fused
    attention kernel keeps state per sequence length (its blocks run on oneDNN micro-kernels):
    a server that meets every length up to max_length kept growing its memory without buckets,
    and stopped with them. Inference only (no dropout).
    """
    hidden = context.shape[-1]
    heads, head_dim = num_heads, hidden // num_heads
    buckets: dict[int, list[tuple[int, int, int]]] = {}
    for group in packing.groups:
        buckets.setdefault(bucket_size(group[2], packing.length_bucket), []).append(group)
    for padded_length, groups in buckets.items():
        count = sum(n for _, n, _ in groups)
        padded = qkv.new_zeros(count, padded_length, 3 * hidden)
        lengths = torch.empty(count, dtype=torch.long)
        row = 0
        for start, n, length in groups:
            padded[row:row + n, :length] = qkv[start:start + n * length].view(n, length, 3 * hidden)
            lengths[row:row + n] = length
            row += n
        # (N, 1, 1, L_bucket): True for the example's real keys
        mask = (torch.arange(padded_length) < lengths[:, None]).to(qkv.device)[:, None, None, :]
        if packing.is_causal:
            mask = mask & torch.ones(padded_length, padded_length, dtype=torch.bool, device=qkv.device).tril()
        query, key, value = padded.view(count, padded_length, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask).transpose(1, 2)
        row = 0
        for start, n, length in groups:
            context[start:start + n * length].view(n, length, heads, head_dim).copy_(out[row:row + n, :length])
            row += n
