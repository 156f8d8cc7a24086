"""Every way bertforge computes softmax(Q Kᵀ / √D + mask) V (Vaswani et al. 2017, §3.2.2), in one place.

`attend` is the equation itself, on (..., L, D) tensors: torch's fused `scaled_dot_product_attention`,
or the same sums as two matmuls and a softmax where that is faster (CPU dropout, short float32 groups)
or where the probabilities are asked for. The others lay a plan's tokens out for it (`plans.py` picks
one per forward pass):

- `padded_attention`: the reference plan's (B, S, H) batch with its key mask; the (B, A, S, S)
  probabilities with output_attentions.
- `packed_attention`: the packed plan's (T, H) rows (`packing.Packing`): one call per run of
  equal-length examples; in low-precision inference the lengths rounded up to a bucket; in training
  on sentence-length batches one padded batch (`_padded_attention`, the only other place the equation
  is written, as batched matmuls with an additive mask, for autograd).
- `varlen_attention`: the packed plan's (T, H) rows on CUDA in bf16/fp16 (`plans.VarlenPlan`): one
  FlashAttention call over the whole batch, each example's keys found by its cumulative sequence
  length (`Packing.cu_seqlens`): no loop over lengths, no padding, no mask.
- `first_token_attention`: the [CLS] query of each example against all its keys (the last layer of
  a sentence classifier), padded or packed.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

try:  # torch >= 2.9; its causal flag became `window_size` later (2.13 has the latter)
    from torch.nn.attention.varlen import varlen_attn
    _VARLEN_WINDOW = "window_size" in inspect.signature(varlen_attn).parameters
except ImportError:
    varlen_attn, _VARLEN_WINDOW = None, False

from .dropout import dropout
from .kernels import Workspace
from .packing import Packing, _padded_bias, _padded_slots, bucket_size, host_copy

__all__ = ["KEY_BLOCK", "attend", "attention_mask_for", "first_token_attention", "packed_attention",
           "padded_attention", "pads_attention", "scaled_dot_product_attention", "varlen_applies",
           "varlen_attention"]

KEY_BLOCK = 32  # keys are cut to a multiple of this: whole SIMD vectors, so the same sums

# Float32 inference attention on CPU runs as two matmuls and a softmax for groups up to this length
# whose Q·Kᵀ work, N·L²·D multiply-adds per head, is at most MATH_ATTENTION_MAX_WORK.
MATH_ATTENTION_MAX_LENGTH = 128
MATH_ATTENTION_MAX_WORK = 1 << 22


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None,
           dropout_p: float = 0.0, is_causal: bool = False, matmul: bool = False,
           probabilities: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """query (..., L, D), key/value (..., K, D), mask bool broadcast to (..., L, K), True = may attend
    -> (context (..., L, D), the probabilities (..., L, K) if asked for, else None).

    torch's fused kernel, except as two matmuls and a softmax (the same sums) when `matmul`, when the
    probabilities are asked for, or with dropout on CPU: there torch falls back to its unfused "math"
    attention anyway, and this one drops with `dropout`'s cheaper mask. Scaled by × D^-½ rather than
    ÷ √D: the rounding of the fused kernel's default scale and of the ecosystem's eager attention.
    With the probabilities, masked scores are the dtype's lowest value (as the ecosystem's eager
    attention: a query that sees no key gets uniform weights), else -inf.
    """
    if not (matmul or probabilities or (0.0 < dropout_p < 1.0 and query.device.type == "cpu")):
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p,
                                              is_causal=is_causal), None
    scores = torch.matmul(query, key.transpose(-1, -2)).mul_(query.shape[-1] ** -0.5)  # (..., L, K)
    if is_causal:
        length, keys = scores.shape[-2:]
        future = torch.ones(length, keys, dtype=torch.bool, device=scores.device).triu_(1)
        scores = scores.masked_fill(future, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min if probabilities else float("-inf"))
    weights = scores.softmax(dim=-1)
    return torch.matmul(dropout(weights, dropout_p) if dropout_p else weights, value), weights


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False) -> torch.Tensor:
    """`F.scaled_dot_product_attention`'s signature and result, with `dropout`'s mask on CPU (`attend`)."""
    return attend(query, key, value, attn_mask, dropout_p, is_causal)[0]


def attention_mask_for(attention_mask: torch.Tensor | None, seq_length: int, is_causal: bool,
                       device: torch.device, trim_keys: bool = False) -> torch.Tensor | None:
    """The boolean mask of the padded batch: (B, 1, 1, S), (B or 1, 1, S, S) or None.

    None when every token may see every token, so that the fused attention kernels can run.

    With `trim_keys`, the mask's last dimension stops after the last key that any query may see
    (rounded up to a multiple of KEY_BLOCK): trailing padding common to the whole batch, as
    `padding="max_length"` leaves it, then costs no attention. Queries are not cut, so every
    position still gets its output, and the dropped keys had weight exactly 0.
    """
    mask = None
    if attention_mask is not None and not bool(host_copy(attention_mask).all()):  # read on the host
        mask = attention_mask.bool()[:, None, None, :]
    if is_causal:
        causal = torch.ones(seq_length, seq_length, dtype=torch.bool, device=device).tril()[None, None]
        mask = causal if mask is None else mask & causal
    if trim_keys and mask is not None:
        seen = mask.reshape(-1, mask.shape[-1]).any(0).nonzero()
        if len(seen):
            keys = -(-(int(seen[-1]) + 1) // KEY_BLOCK) * KEY_BLOCK
            if keys < mask.shape[-1]:
                mask = mask[..., :keys]
    return mask


def padded_attention(qkv: torch.Tensor, mask: torch.Tensor | None, num_heads: int, dropout_p: float = 0.0,
                     output_attentions: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """qkv (B, S, 3H), mask (B or 1, 1, S or 1, K) from `attention_mask_for` -> context (B, S, H) and,
    with output_attentions, the probabilities (B, A, S, S). K < S (a trimmed mask) says that keys from
    K on are masked for every query: they are cut."""
    batch, seq_length, hidden = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
    query, key, value = qkv.view(batch, seq_length, 3, num_heads, hidden // num_heads).permute(2, 0, 3, 1, 4)
    keys = seq_length if mask is None else mask.shape[-1]
    if keys < seq_length:
        key, value = key[:, :, :keys], value[:, :, :keys]
    context, probs = attend(query, key, value, mask, dropout_p, probabilities=output_attentions)
    return context.transpose(1, 2).reshape(batch, seq_length, hidden), probs


def packed_attention(qkv: torch.Tensor, packing: Packing, num_heads: int, dropout_p: float = 0.0,
                     workspace: Workspace | None = None) -> torch.Tensor:
    """qkv (T, 3H) -> context (T, H): attention within each example of the packed batch; filler rows
    (`Packing.extra_rows`) get a zero context.

    One `attend` call per run of equal-length examples (`Packing.groups`), on views of the packed rows:
    no padding, no mask (nested tensors have no CPU kernel for it). With gradients the groups are taken
    with one `split` and joined with one `cat` (the backward of a slice is a zero-filled (T, 3H)
    gradient per group, that of a copy into a slice a clone of the (T, H) one), or, for sentence-length
    batches, run as one padded batch (`pads_attention`). In bf16/fp16 inference with row buckets the
    examples run at their length rounded up to a bucket, masked: torch's fused attention keeps state
    per sequence length there (`packing.bucket_size`).
    """
    tokens, hidden = qkv.shape[0], qkv.shape[1] // 3
    head_dim = hidden // num_heads
    groups, filler = packing.groups, packing.extra_rows
    if qkv.requires_grad and torch.is_grad_enabled():
        if pads_attention(packing, hidden):
            return _padded_attention(qkv, packing, num_heads, dropout_p)
        pieces = qkv.split([count * length for _, count, length in groups] + ([filler] if filler else []))
        contexts = []
        for piece, (_, count, length) in zip(pieces, groups):
            query, key, value = piece.view(count, length, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4)
            out = attend(query, key, value, None, dropout_p, packing.is_causal)[0]
            contexts.append(out.transpose(1, 2).reshape(count * length, hidden))
        if filler:
            contexts.append(qkv.new_zeros(filler, hidden))
        return torch.cat(contexts) if contexts else qkv.new_zeros(tokens, hidden)
    context = qkv.new_empty(tokens, hidden) if workspace is None else workspace.get("context", (tokens, hidden), qkv)
    if packing.length_bucket and qkv.dtype in (torch.bfloat16, torch.float16) and not torch.is_grad_enabled():
        _attend_in_length_buckets(qkv, context, packing, num_heads)
    else:
        for start, count, length in groups:
            rows = slice(start, start + count * length)
            query, key, value = qkv[rows].view(count, length, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4)
            short = _short_float32_inference(query, length, dropout_p, packing.is_causal)
            out = attend(query, key, value, None, dropout_p, packing.is_causal, matmul=short)[0]
            context[rows].view(count, length, num_heads, head_dim).copy_(out.transpose(1, 2))
    if filler:
        context[tokens - filler:].zero_()
    return context


def varlen_applies(qkv: torch.Tensor, num_heads: int) -> bool:
    """Whether `varlen_attention` can run on qkv (T, 3H): torch has `varlen_attn` (2.9 on), and
    FlashAttention's conditions hold: a CUDA tensor in bf16 or fp16 (autocast's output) with a head size
    a multiple of 8 up to 256. Elsewhere (float32 on CUDA, as the correctness checks run it) the packed
    plan's `packed_attention` runs."""
    head_dim = qkv.shape[-1] // (3 * num_heads)
    return (varlen_attn is not None and qkv.device.type == "cuda" and qkv.dtype in (torch.bfloat16, torch.float16)
            and head_dim % 8 == 0 and head_dim <= 256)


def varlen_attention(qkv: torch.Tensor, packing: Packing, num_heads: int, dropout_p: float = 0.0) -> torch.Tensor:
    """qkv (T, 3H) -> context (T, H) on CUDA: attention within each example of the packed batch in one
    FlashAttention call over variable lengths (`varlen_attn`, forward and backward), the examples'
    bounds given by `packing.cu_seqlens()` (built on the host: no wait for the device). Filler rows get
    a zero context. The queries, keys and values are strided views of qkv: no copy.

    `varlen_attn` runs without dropout; with attention dropout (training), the same FlashAttention
    kernel is called through its ATen op, which drops inside the kernel and has its own backward."""
    tokens, hidden = qkv.shape[0], qkv.shape[1] // 3
    real = packing.num_tokens
    query, key, value = qkv[:real].view(real, 3, num_heads, hidden // num_heads).unbind(1)  # each (T, A, D)
    bounds, longest = packing.cu_seqlens(), packing.max_length
    if dropout_p:
        out = torch.ops.aten._flash_attention_forward(query, key, value, bounds, bounds, longest, longest, dropout_p,
                                                      packing.is_causal, False)[0]
    elif _VARLEN_WINDOW:
        out = varlen_attn(query, key, value, bounds, bounds, longest, longest,
                          window_size=(-1, 0) if packing.is_causal else (-1, -1))
    else:
        out = varlen_attn(query, key, value, bounds, bounds, longest, longest, is_causal=packing.is_causal)
    context = out.reshape(real, hidden)
    if tokens > real:
        context = torch.cat([context, context.new_zeros(tokens - real, hidden)])
    return context


def _attend_in_length_buckets(qkv: torch.Tensor, context: torch.Tensor, packing: Packing, num_heads: int) -> None:
    """`packed_attention` in bf16/fp16 inference with row buckets: every example's length rounded up to a
    bucket (`bucket_size(length, packing.length_bucket)`), qkv (T, 3H) -> context (T, H) in place. The
    examples of one bucket are copied into a zero-padded (N, L_bucket, 3H) batch and run through one
    `attend` call whose mask hides the padding keys (weight exactly 0); the padding queries' outputs are
    dropped. No dropout (inference only)."""
    hidden = context.shape[-1]
    head_dim = hidden // num_heads
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
        query, key, value = padded.view(count, padded_length, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4)
        out = attend(query, key, value, mask)[0].transpose(1, 2)
        row = 0
        for start, n, length in groups:
            context[start:start + n * length].view(n, length, num_heads, head_dim).copy_(out[row:row + n, :length])
            row += n


def _short_float32_inference(query: torch.Tensor, length: int, dropout_p: float, is_causal: bool) -> bool:
    """Whether a group's attention (query (N, A, L, D)) runs as two matmuls and a softmax rather than
    torch's fused CPU kernel: float32 on CPU, no autograd, no dropout or causal mask, L up to
    MATH_ATTENTION_MAX_LENGTH and N·L²·D up to MATH_ATTENTION_MAX_WORK. Why: the fused kernel works in
    blocks sized for long sequences and pays a fixed cost per call; for the few sentences of one length
    that a packed batch's group holds, the matmuls are faster."""
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


def _padded_attention(qkv: torch.Tensor, packing: Packing, num_heads: int, dropout_p: float) -> torch.Tensor:
    """qkv (T, 3H) -> context (T, H) through one (N·A, L, D) batch of attention matmuls: the real rows
    copied into a zero-padded (N·L, 3H) batch (`index_copy`, whose backward is one gather), its heads laid
    out side by side in one copy, padding keys masked by an additive -inf (`packing._padded_bias`, in the
    same batched matmul as the scaling: `baddbmm`), the padding queries' outputs dropped (`index_select`).
    Filler rows get a zero context. The fewest ops per layer for autograd to record and replay: this
    runs once per layer per training step."""
    tokens, hidden = qkv.shape[0], qkv.shape[1] // 3
    head_dim = hidden // num_heads
    slots, key_mask = _padded_slots(packing)
    count, longest = key_mask.shape[0], key_mask.shape[-1]
    padded = qkv.new_zeros(count * longest, 3 * hidden).index_copy(0, slots, qkv[:tokens - packing.extra_rows])
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


def first_token_attention(query: torch.Tensor, key_value: torch.Tensor, packing: Packing | None, num_heads: int,
                          dropout_p: float = 0.0, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The context at each example's first token, attending to all its keys: query (N, H) of the first
    tokens and key_value (..., 2H) of every token -> (N, H). Padded (`packing` None): key_value
    (B, S, 2H), `mask` (B or 1, 1, 1, S) or None. Packed: key_value (T, 2H), the queries in packed
    example order (`Packing.first_rows`), the keys and values padded into one (N, A, L, D) batch as
    `_padded_attention` does. What the pooler reads of the last layer. Not for causal attention."""
    hidden = key_value.shape[-1] // 2
    head_dim = hidden // num_heads
    if packing is None:
        batch, seq_length = key_value.shape[:2]
        key, value = key_value.view(batch, seq_length, 2, num_heads, head_dim).permute(2, 0, 3, 1, 4)
        query = query.view(batch, num_heads, 1, head_dim)
        return attend(query, key, value, mask, dropout_p)[0].reshape(batch, hidden)
    if packing.is_causal:
        raise ValueError("first_token_attention: a causal model's first token sees only itself")
    slots, key_mask = _padded_slots(packing)
    count, longest = key_mask.shape[0], key_mask.shape[-1]
    padded = key_value.new_zeros(count * longest, 2 * hidden).index_copy(
        0, slots, key_value[:key_value.shape[0] - packing.extra_rows])
    key, value = padded.view(count, longest, 2, num_heads, head_dim).permute(2, 0, 3, 1, 4)
    query = query.view(count, 1, num_heads, head_dim).transpose(1, 2)
    out = attend(query, key, value, key_mask, dropout_p)[0]  # (N, A, 1, D)
    return out.transpose(1, 2).reshape(count, hidden)
