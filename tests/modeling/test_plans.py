"""Each execution plan (`bertforge.modeling.plans`) against the reference plan: the padded layout with
every product a module call, as autograd runs it.

A plan is a layout (padded, packed) and a set of product kernels (`Reference`, `InPlace`, `CpuInference`).
Here each combination runs the same model on the same batch and must give the reference's outputs:
float32 to 1e-5 (bit for bit on the padded layout with the BLAS, where only buffers and in-place
writes differ), gradients to 1e-5; the attention functions of attention.py against the equation written
out in float64; bf16 and int8 within the budgets test_inference_paths measured on all-MiniLM-L6-v2.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import bertforge.modeling.attention as attention_module
import bertforge.modeling.kernels as kernels_module
import bertforge.modeling.plans as plans_module
from bertforge.modeling import BertConfig, BertForSequenceClassification, BertModel, optimize_for_inference
from bertforge.modeling.attention import (_padded_attention, attend, first_token_attention, packed_attention,
                                          padded_attention, varlen_applies)
from bertforge.modeling.packing import HOST_COPY, Packing, bucket_size, host_copy, keep_host_copy
from bertforge.modeling.plans import (REFERENCE, REFERENCE_PRODUCTS, CpuInference, FirstTokens, InPlace, PackedPlan,
                                      PaddedPlan, Reference, RowsAt, VarlenPlan, choose_plan)

TOL = 1e-5


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def grad_close(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """Within TOL, relative to the gradient's size where that is above 1 (float32 sums over the batch)."""
    return max_diff(got, expected) <= TOL * max(1.0, expected.abs().max().item())


def batch(lengths=(24, 19, 9, 14, 9, 1), seed=0, vocab_size=1000) -> dict[str, torch.Tensor]:
    """[CLS] first, two segments, right padding to the longest row; two rows of one length (a group)."""
    generator = torch.Generator().manual_seed(seed)
    seq = max(lengths)
    input_ids = torch.randint(5, vocab_size, (len(lengths), seq), generator=generator)
    token_type_ids = torch.zeros_like(input_ids)
    attention_mask = torch.zeros_like(input_ids)
    for row, length in enumerate(lengths):
        input_ids[row, 0] = 2
        input_ids[row, length:] = 0
        token_type_ids[row, length // 2:length] = 1
        attention_mask[row, :length] = 1
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}


def model(**overrides) -> BertModel:
    torch.manual_seed(0)
    config = BertConfig.preset("mini", vocab_size=1000, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                               **overrides)
    return BertModel(config).eval()


@pytest.fixture
def blas_linear(monkeypatch):
    """Inference products through the BLAS, as autograd's: the plans may then agree bit for bit."""
    monkeypatch.setattr(kernels_module, "_ONEDNN_LINEAR", [None])


def plan_of(encoder: BertModel, inputs: dict, **kwargs):
    return choose_plan(encoder, inputs["input_ids"], inputs["attention_mask"], kwargs.get("unpad"),
                       kwargs.get("output_hidden_states", False), kwargs.get("output_attentions", False),
                       kwargs.get("cls_only", False))


def test_the_plan_is_chosen_from_the_call_and_the_edge():
    encoder, inputs = model(), batch()
    kinds = lambda plan: (type(plan).__name__, type(plan.linear.__self__).__name__)  # noqa: E731
    assert kinds(plan_of(encoder, inputs)) == ("PaddedPlan", "Reference")  # autograd on
    assert kinds(plan_of(encoder, inputs, unpad=True)) == ("PackedPlan", "Reference")
    with torch.no_grad():
        assert kinds(plan_of(encoder, inputs)) == ("PaddedPlan", "CpuInference")
        assert kinds(plan_of(encoder, inputs, unpad=True)) == ("PackedPlan", "CpuInference")
        assert kinds(plan_of(encoder, inputs, unpad=True, output_attentions=True)) == ("PaddedPlan", "CpuInference")
        first = plan_of(encoder, inputs, cls_only=True)  # CPU inference: [CLS] as rows of forward_rows
        assert first.cls_only and first.first_token_as_rows
        handle = encoder.encoder.layer[0].intermediate.register_forward_hook(lambda *args: None)
        try:  # a hook could keep a reused buffer: in place only where no hook sees it
            assert kinds(plan_of(encoder, inputs, unpad=True)) == ("PackedPlan", "InPlace")
            first = plan_of(encoder, inputs, unpad=True, cls_only=True)
            assert first.cls_only and not first.first_token_as_rows
        finally:
            handle.remove()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert kinds(plan_of(encoder, inputs)) == ("PaddedPlan", "Reference")
    full = {**inputs, "attention_mask": torch.ones_like(inputs["attention_mask"])}
    assert kinds(plan_of(encoder, full, unpad=True)) == ("PaddedPlan", "Reference")  # nothing to remove
    encoder.unpad, encoder.unpad_row_bucket = True, 16
    with torch.no_grad():  # with row buckets, inference packs a batch without padding too
        plan = plan_of(encoder, full)
        assert isinstance(plan, PackedPlan) and plan.packing.num_tokens == full["input_ids"].numel()
    assert isinstance(REFERENCE, PaddedPlan) and isinstance(REFERENCE.linear.__self__, Reference)


def run(encoder: BertModel, inputs: dict, products: type, unpad: bool, cls_only: bool = False):
    """`encoder(**inputs)` on the layout `unpad` picks, with `products` forced: InPlace stands in for the
    CPU inference products by saying the fast path may not run."""
    if products is InPlace:
        encoder._inference_fast_path = lambda input_ids: False
    try:
        with torch.no_grad():
            out = encoder(**inputs, unpad=unpad, cls_only=cls_only)
            plan = plan_of(encoder, inputs, unpad=unpad)
        assert type(plan.linear.__self__) is products
        return out
    finally:
        encoder.__dict__.pop("_inference_fast_path", None)


@pytest.mark.parametrize("products", [InPlace, CpuInference])
@pytest.mark.parametrize("unpad, row_bucket", [(False, 0), (True, 0), (True, 16)])
def test_every_inference_plan_gives_the_reference_outputs(products, unpad, row_bucket):
    encoder, inputs = model(), batch()
    real = inputs["attention_mask"].bool()
    reference = encoder(**inputs)  # autograd on: the reference plan
    encoder.unpad_row_bucket = row_bucket
    out = run(encoder, inputs, products, unpad)
    assert max_diff(out.last_hidden_state[real], reference.last_hidden_state[real]) <= TOL
    assert max_diff(out.pooler_output, reference.pooler_output) <= TOL
    # [CLS] only: the last layer at one row per example (InPlace: FirstTokens; CpuInference: RowsAt at position 0)
    first = run(encoder, inputs, products, unpad, cls_only=True)
    assert first.last_hidden_state.shape[1] == 1
    assert max_diff(first.last_hidden_state[:, 0], reference.last_hidden_state[:, 0]) <= TOL
    assert max_diff(first.pooler_output, reference.pooler_output) <= TOL


@pytest.mark.parametrize("products", [InPlace, CpuInference])
def test_padded_inference_plans_are_the_reference_bit_for_bit(blas_linear, products):
    """Through the BLAS, the inference products only write elsewhere (in place, reused buffers)."""
    encoder, inputs = model(), batch()
    reference = encoder(**inputs, output_hidden_states=True)
    out = run(encoder, inputs, products, unpad=False)
    assert torch.equal(out.last_hidden_state, reference.last_hidden_state.detach())
    assert torch.equal(out.pooler_output, reference.pooler_output.detach())


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("row_bucket", [0, 16])
def test_the_packed_reference_plan_gives_the_padded_gradients(is_causal, row_bucket):
    """Training's plans: the packed layout (length groups, or one padded batch for sentence lengths) and
    the [CLS]-only last layer, against the padded reference: outputs and every parameter's gradient
    (to 1e-5 relative where a gradient is above 1 in size)."""
    encoder, inputs = model(is_causal=is_causal), batch(lengths=(24, 19, 9, 14, 9, 3, 17, 24))
    encoder.train()
    encoder.unpad_row_bucket = row_bucket
    real = inputs["attention_mask"].bool()
    weights = torch.randn(*real.shape, encoder.config.hidden_size, generator=torch.Generator().manual_seed(1))

    def step(unpad: bool, cls_only: bool = False):
        encoder.zero_grad()
        out = encoder(**inputs, unpad=unpad, cls_only=cls_only)
        rows = out.last_hidden_state.shape[1]
        loss = (out.last_hidden_state * weights[:, :rows] * real[:, :rows, None]).sum() + out.pooler_output.sum()
        loss.backward()
        return out, {name: p.grad.clone() for name, p in encoder.named_parameters() if p.grad is not None}

    reference, reference_grads = step(unpad=False)
    runs = [(step(unpad=True), real)]
    if not is_causal:  # a causal model's first token sees only itself: no [CLS]-only layer
        first_real = real[:, :1]
        reference_first, reference_first_grads = step(unpad=False, cls_only=True)
        assert max_diff(reference_first.last_hidden_state[:, 0], reference.last_hidden_state[:, 0]) <= TOL
        runs.append((step(unpad=True, cls_only=True), first_real))
        for name, grad in reference_first_grads.items():
            assert grad_close(runs[-1][0][1][name], grad), name
    (packed, packed_grads), _ = runs[0]
    assert max_diff(packed.last_hidden_state[real], reference.last_hidden_state[real]) <= TOL
    assert packed_grads.keys() == reference_grads.keys()
    for name, grad in reference_grads.items():
        assert grad_close(packed_grads[name], grad), name


def word_positions(inputs: dict, seed: int = 3) -> torch.Tensor:
    """(B, P) real positions of each row, a random subset (as a tagger's first word pieces), padded with 0."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for length in inputs["attention_mask"].sum(1).tolist():
        chosen = torch.randperm(length, generator=generator)[:max(1, (2 * length) // 3)].sort().values
        rows.append(chosen)
    positions = torch.zeros(len(rows), max(len(r) for r in rows), dtype=torch.long)
    for row, chosen in enumerate(rows):
        positions[row, :len(chosen)] = chosen
    return positions


@pytest.mark.parametrize("products", [Reference, InPlace, CpuInference])
@pytest.mark.parametrize("unpad, row_bucket", [(False, 0), (True, 0), (True, 16)])
def test_output_positions_run_the_last_layer_at_those_rows_only(products, unpad, row_bucket, monkeypatch):
    """`output_positions`: the full call's rows at those positions, on every plan, with the last layer's
    output projection and feed-forward run at those rows alone (counted by the rows its expansion sees)."""
    encoder, inputs = model(), batch()
    positions = word_positions(inputs)
    reference = encoder(**inputs).last_hidden_state.detach()
    expected = reference.gather(1, positions[..., None].expand(-1, -1, reference.shape[-1]))
    encoder.unpad_row_bucket = row_bucket
    seen = []
    last = encoder.encoder.layer[-1].intermediate
    forward = type(last).forward
    monkeypatch.setattr(type(last), "forward", lambda self, x, plan=REFERENCE: (
        seen.append(x.reshape(-1, x.shape[-1]).shape[0]) if self is last else None, forward(self, x, plan))[1])
    if products is Reference:
        out = encoder(**inputs, unpad=unpad, output_positions=positions)
    else:
        if products is InPlace:
            monkeypatch.setattr(encoder, "_inference_fast_path", lambda input_ids: False)
        with torch.no_grad():
            out = encoder(**inputs, unpad=unpad, output_positions=positions)
    assert out.last_hidden_state.shape == expected.shape and out.pooler_output is None
    assert max_diff(out.last_hidden_state.detach(), expected) <= TOL
    distinct = len({(row, position) for row, chosen in enumerate(positions.tolist()) for position in chosen})
    bucketed = distinct if products is Reference else bucket_size(distinct, row_bucket)  # inference buckets
    assert seen == [bucketed] and distinct < positions.numel()  # each row once
    with torch.no_grad():  # asking for the hidden states runs the full last layer, gathered
        full = encoder(**inputs, unpad=unpad, output_positions=positions, output_hidden_states=True)
    assert max_diff(full.last_hidden_state, expected) <= TOL and seen[-1] > seen[0]
    with pytest.raises(ValueError, match="cls_only and output_positions"):
        encoder(**inputs, cls_only=True, output_positions=positions)
    with pytest.raises(ValueError, match=r"output_positions must be \(batch, P\).*got shape \(3, 2\)"):
        encoder(**inputs, output_positions=positions[:3, :2])


def test_the_plan_decides_how_the_last_layer_runs():
    """`choose_plan` alone decides the last layer: in full (output_positions then gathered), at [CLS] with
    one query per example (`FirstTokens`) or, on CPU inference, as row 0 of each example (`RowsAt`), or
    at the output positions, each distinct row once and bucketed in inference."""
    encoder, inputs = model(), batch()
    positions = word_positions(inputs)
    batch_size, seq_length = inputs["input_ids"].shape

    def last(unpad=False, output_hidden_states=False, cls_only=False, output_positions=None):
        return choose_plan(encoder, inputs["input_ids"], inputs["attention_mask"], unpad, output_hidden_states,
                           False, cls_only, output_positions)

    assert last().last_rows is None and last().positions is None
    assert isinstance(last(cls_only=True).last_rows, FirstTokens)  # autograd: Reference's products
    assert last(cls_only=True, output_hidden_states=True).last_rows is None
    at_rows = last(unpad=True, output_positions=positions)
    distinct = len({(row, position) for row, chosen in enumerate(positions.tolist()) for position in chosen})
    assert isinstance(at_rows.last_rows, RowsAt) and at_rows.last_rows.rows.shape == (distinct,)
    full = last(output_positions=positions, output_hidden_states=True)
    assert full.last_rows is None and full.positions is positions
    with torch.no_grad():  # CPU inference: [CLS] as row 0 of each example, their count bucketed
        first = last(cls_only=True).last_rows
        assert isinstance(first, RowsAt) and first.rows.tolist() == [row * seq_length for row in range(batch_size)]
        encoder.unpad_row_bucket = 16
        assert last(unpad=True, cls_only=True).last_rows.rows.shape == (bucket_size(batch_size, 16),)
    with pytest.raises(ValueError, match="cls_only and output_positions"):
        last(cls_only=True, output_positions=positions)


def test_output_positions_give_the_full_calls_gradients():
    """Training at some rows only (the loss reads those): every parameter's gradient equals that of the
    full call's loss over the same rows (to 1e-5 relative), padded and packed."""
    encoder, inputs = model(), batch(lengths=(24, 19, 9, 14, 9, 3, 17, 24))
    encoder.train()
    positions = word_positions(inputs, seed=5)
    weights = torch.randn(*positions.shape, encoder.config.hidden_size, generator=torch.Generator().manual_seed(1))

    def grads(**kwargs):
        encoder.zero_grad()
        out = encoder(**inputs, **kwargs).last_hidden_state
        if "output_positions" not in kwargs:
            out = out.gather(1, positions[..., None].expand(-1, -1, out.shape[-1]))
        (out * weights).sum().backward()
        return {name: p.grad.clone() for name, p in encoder.named_parameters() if p.grad is not None}

    reference = grads(unpad=False)
    for unpad in (False, True):
        got = grads(unpad=unpad, output_positions=positions)
        assert got.keys() == reference.keys()
        for name, grad in reference.items():
            assert grad_close(got[name], grad), (unpad, name)


# -- attention.py against the equation ---------------------------------------------------------------

def equation(query, key, value, allowed):
    """softmax(Q Kᵀ / √D, -inf where not allowed) V, written out (float64)."""
    scores = query @ key.transpose(-1, -2) / query.shape[-1] ** 0.5
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ value


def padded_case(lengths=(5, 12, 5, 7, 12, 3), heads=4, head_dim=8, is_causal=False, dtype=torch.float64):
    generator = torch.Generator().manual_seed(sum(lengths))
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    qkv = torch.randn(len(lengths), max(lengths), 3 * heads * head_dim, generator=generator, dtype=dtype)
    query, key, value = qkv.view(*mask.shape, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
    allowed = mask.bool()[:, None, None, :]
    if is_causal:
        allowed = allowed & torch.ones(mask.shape[1], mask.shape[1], dtype=torch.bool).tril()
    expected = equation(query, key, value, allowed).transpose(1, 2).reshape(*mask.shape, heads * head_dim)
    return qkv, mask, expected


@pytest.mark.parametrize("is_causal", [False, True])
def test_padded_and_packed_attention_compute_the_equation(is_causal):
    qkv, mask, expected = padded_case(is_causal=is_causal)
    real = mask.bool()
    allowed = real[:, None, None, :]
    if is_causal:
        allowed = allowed & torch.ones(mask.shape[1], mask.shape[1], dtype=torch.bool).tril()
    context, probs = padded_attention(qkv, allowed, num_heads=4, output_attentions=True)
    assert max_diff(context[real], expected[real]) <= 1e-12 and probs.shape == (6, 4, 12, 12)
    assert max_diff(padded_attention(qkv, allowed, num_heads=4)[0][real], expected[real]) <= 1e-12
    for row_bucket in (0, 16):
        packing = Packing.from_mask(mask, is_causal=is_causal, row_bucket=row_bucket)
        packed_qkv = packing.pack(qkv)
        for grad in (False, True):  # inference: one call per length; autograd: split and cat
            with torch.set_grad_enabled(grad):
                context = packed_attention(packed_qkv.clone().requires_grad_(grad), packing, num_heads=4)
            assert max_diff(packing.unpack(context)[real], expected[real]) <= 1e-12
            assert not context[packing.num_tokens:].any()  # filler rows
        context = _padded_attention(packed_qkv.clone().requires_grad_(), packing, num_heads=4, dropout_p=0.0)
        assert max_diff(packing.unpack(context)[real], expected[real]) <= 1e-12


def test_cumulative_lengths_bound_each_example_and_the_varlen_plan_falls_back_off_cuda():
    """`VarlenPlan` (CUDA's packed layout) hands FlashAttention each example's row bounds in the packed
    order (`Packing.cu_seqlens`); where FlashAttention cannot run (float32, the CPU) its attention is
    `PackedPlan`'s, bit for bit. (FlashAttention itself: tests/test_cuda.py.)"""
    qkv, mask, _ = padded_case(dtype=torch.float32)  # lengths 5, 12, 5, 7, 12, 3
    packing = Packing.from_mask(mask, row_bucket=16)
    bounds = packing.cu_seqlens()
    assert bounds.dtype == torch.int32 and bounds.tolist() == [0, 3, 8, 13, 20, 32, 44]
    assert packing.max_length == 12 and packing.num_tokens == 44 and packing.extra_rows == 4
    example = packing.index[:packing.num_tokens] // mask.shape[1]
    for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):  # one whole example between bounds
        assert example[start:end].unique().numel() == 1 and end - start == int(mask[example[start]].sum())
    packed = packing.pack(qkv)
    assert not varlen_applies(packed, num_heads=4) and not varlen_applies(packed.bfloat16(), num_heads=4)
    with torch.no_grad():
        got, probs = VarlenPlan(REFERENCE_PRODUCTS, packing).attention(packed, None, 4, 0.0, False)
        assert probs is None and torch.equal(got, packed_attention(packed, packing, num_heads=4))


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("row_bucket", [0, 16])
def test_the_varlen_plan_lays_out_the_rows_as_flash_attention_reads_them(monkeypatch, is_causal, row_bucket):
    """What `varlen_attention` hands FlashAttention and takes back: (T, A, D) views of the packed qkv, each
    example's bounds and the longest length, the context reshaped and the filler rows zeroed. Checked on
    the CPU with the equation in the kernel's place (`varlen_attn`'s arguments, one `attend` per
    example between its bounds): a whole encoder on `VarlenPlan`, training, gives the padded reference's
    outputs and gradients to 1e-5, the [CLS]-only last layer too. The kernel itself: tests/test_cuda.py."""
    seen = []

    def kernel(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, **kwargs):
        causal = kwargs["window_size"] == (-1, 0) if "window_size" in kwargs else kwargs["is_causal"]
        bounds = cu_seq_q.tolist()
        seen.append((query.shape[0], bounds[-1], max_q, max(b - a for a, b in zip(bounds, bounds[1:]))))
        assert torch.equal(cu_seq_q, cu_seq_k) and max_q == max_k and causal == is_causal
        pieces = [attend(*(t[a:b].transpose(0, 1) for t in (query, key, value)), is_causal=causal)[0]
                  for a, b in zip(bounds[:-1], bounds[1:])]
        return torch.cat([piece.transpose(0, 1) for piece in pieces])

    monkeypatch.setattr(attention_module, "varlen_attn", kernel)
    monkeypatch.setattr(plans_module, "varlen_applies", lambda qkv, num_heads: True)
    monkeypatch.setattr(plans_module, "PackedPlan", VarlenPlan)  # what choose_plan picks on CUDA
    encoder, inputs = model(is_causal=is_causal), batch(lengths=(24, 19, 9, 14, 9, 3, 17, 24))
    encoder.train()
    encoder.unpad_row_bucket = row_bucket
    real = inputs["attention_mask"].bool()
    weights = torch.randn(*real.shape, encoder.config.hidden_size, generator=torch.Generator().manual_seed(1))

    def step(unpad: bool, cls_only: bool = False):
        encoder.zero_grad()
        out = encoder(**inputs, unpad=unpad, cls_only=cls_only)
        rows = out.last_hidden_state.shape[1]
        loss = (out.last_hidden_state * weights[:, :rows] * real[:, :rows, None]).sum() + out.pooler_output.sum()
        loss.backward()
        return out, {name: p.grad.clone() for name, p in encoder.named_parameters() if p.grad is not None}

    for cls_only in ([False] if is_causal else [False, True]):
        reference, reference_grads = step(unpad=False, cls_only=cls_only)
        seen.clear()
        packed, packed_grads = step(unpad=True, cls_only=cls_only)
        layers = encoder.config.num_hidden_layers - cls_only  # a [CLS]-only last layer has its own attention
        assert seen == [(int(real.sum()), int(real.sum()), 24, 24)] * layers
        rows = real[:, :packed.last_hidden_state.shape[1]]
        assert max_diff(packed.last_hidden_state[rows], reference.last_hidden_state[rows]) <= TOL
        assert max_diff(packed.pooler_output, reference.pooler_output) <= TOL
        assert packed_grads.keys() == reference_grads.keys()
        for name, grad in reference_grads.items():
            assert grad_close(packed_grads[name], grad), name


def test_a_device_batch_is_packed_from_its_host_copy_without_reading_the_device():
    """On a device, the plan reads the mask on the host copy the Trainer keeps (`keep_host_copy`): here
    the device is `meta`, whose tensors hold no values, so any read of the device mask would fail."""
    encoder, inputs = model(), batch()
    mask = inputs["attention_mask"]
    assert host_copy(mask) is mask and keep_host_copy(mask, mask) is mask and not hasattr(mask, HOST_COPY)
    on_meta = {key: keep_host_copy(value.to("meta"), value) for key, value in inputs.items()}
    assert host_copy(on_meta["attention_mask"]) is mask
    plan = plan_of(encoder.to("meta"), on_meta, unpad=True, cls_only=True)
    expected = Packing.from_mask(mask)
    assert type(plan) is PackedPlan and plan.packing.groups == expected.groups and plan.cls_only
    assert plan.packing.index.device.type == "meta" and plan.packing.cu_seqlens().device.type == "meta"
    bare = inputs["attention_mask"].to("meta")  # no host copy: the mask must be read, and cannot be
    with pytest.raises((NotImplementedError, RuntimeError)):
        plan_of(encoder, {**on_meta, "attention_mask": bare}, unpad=True)


def test_short_float32_groups_and_bf16_buckets_stay_with_the_equation():
    """Inference's two kernel choices inside `packed_attention`: short float32 groups as plain matmuls,
    bf16 with row buckets at bucketed lengths (masked), against the float64 equation."""
    qkv, mask, expected = padded_case(dtype=torch.float32)
    real = mask.bool()
    packing = Packing.from_mask(mask, row_bucket=16)
    with torch.no_grad():
        float32 = packed_attention(packing.pack(qkv), packing, num_heads=4)
        bf16 = packed_attention(packing.pack(qkv).bfloat16(), packing, num_heads=4)
    assert max_diff(packing.unpack(float32)[real], expected[real]) <= 1e-6
    assert max_diff(packing.unpack(bf16)[real], expected[real]) <= 0.05  # bf16: 8 significant bits


def test_first_token_attention_is_row_zero_of_the_full_attention():
    qkv, mask, expected = padded_case()
    real = mask.bool()
    hidden = qkv.shape[-1] // 3
    query = qkv[:, 0, :hidden]
    padded = first_token_attention(query, qkv[..., hidden:], None, num_heads=4, mask=real[:, None, None, :])
    assert max_diff(padded, expected[:, 0]) <= 1e-12
    packing = Packing.from_mask(mask, row_bucket=16)
    packed_qkv = packing.pack(qkv)
    packed = first_token_attention(packed_qkv[packing.first_rows(), :hidden], packed_qkv[:, hidden:], packing,
                                   num_heads=4)
    assert max_diff(packing.batch_order(packed), expected[:, 0]) <= 1e-12


def test_attend_drops_with_the_cpu_mask_and_returns_probabilities_on_request():
    torch.manual_seed(3)
    query, key, value = (torch.randn(2, 3, 5, 8) for _ in range(3))
    allowed = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)[:, None, None, :]
    context, probs = attend(query, key, value, allowed, probabilities=True)
    assert max_diff(context, equation(query.double(), key.double(), value.double(), allowed)) <= 1e-6
    assert torch.all(probs.masked_select(~allowed) == 0) and torch.allclose(probs.sum(-1), torch.ones(()))
    fused, none = attend(query, key, value, allowed)
    assert none is None and max_diff(fused, context) <= 1e-6
    dropped, _ = attend(query, key, value, allowed, dropout_p=0.5)  # numpy's mask: the math form
    assert max_diff(dropped, context) > 0.01


# -- low precision: within test_inference_paths' budgets ---------------------------------------------

@pytest.fixture(scope="module")
def minilm(minilm_dir):
    return BertModel.from_pretrained(minilm_dir).eval()


def sentence_vectors(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask[..., None].float()
    return (hidden.float() * mask).sum(1) / mask.sum(1)


@pytest.fixture(scope="module")
def sentences(minilm_dir):
    from bertforge.tokenization import BertTokenizer
    texts = ["a gripping, funny and wholly original film.", "it is not a bad movie, just a forgettable one",
             "the plot makes no sense at all and the actors seem to know it", "superb.",
             "an unflinching look at grief, told with patience and a wicked sense of humour"] * 4
    return BertTokenizer.from_pretrained(minilm_dir).encode_batch(texts, padding="longest", return_tensors="pt")


@pytest.mark.parametrize("dtype, budget", [("bf16", 0.999), ("int8", 0.9)])
@torch.inference_mode()
def test_low_precision_plans_stay_within_budget(minilm_dir, minilm, sentences, dtype, budget):
    """bf16: sentence cosine ≥ 0.999 to float32 (test_bf16_runs_and_stays_close); int8: ≥ 0.9, the
    budget with 7-bit activations (test_int8_runs_and_stays_close), on every layout."""
    if dtype == "bf16" and not (kernels_module.onednn_linear_op() is not None and kernels_module._onednn_bf16()):
        pytest.skip("no bfloat16 oneDNN kernels on this CPU")
    mask = sentences["attention_mask"].bool()
    reference = sentence_vectors(minilm(**sentences).last_hidden_state, mask)
    model = optimize_for_inference(BertModel.from_pretrained(minilm_dir), dtype=dtype)
    for unpad in (True, False):
        out = model(**sentences, unpad=unpad).last_hidden_state
        cosine = F.cosine_similarity(sentence_vectors(out, mask), reference)
        assert cosine.min() >= budget, (unpad, cosine.min())
    classifier = optimize_for_inference(BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2),
                                        dtype=dtype)
    first = classifier.bert(**sentences, cls_only=True).last_hidden_state[:, 0]  # [CLS]-only last layer
    full = classifier.bert(**sentences).last_hidden_state[:, 0]
    assert F.cosine_similarity(first.float(), full.float()).min() >= budget


def test_compile_per_token_parts_keeps_types_and_checkpoint_keys():
    from bertforge.modeling import compile_per_token_parts
    from bertforge.modeling.bert import FeedForwardExpansion, ResidualLayerNorm

    model = BertForSequenceClassification(BertConfig.preset("tiny", num_labels=2))
    keys = list(model.state_dict())
    layers = model.config.num_hidden_layers
    assert compile_per_token_parts(model) == 3 * layers  # one expansion and two Add & Norms per layer
    assert list(model.state_dict()) == keys  # checkpoints unchanged: no `_orig_mod.` prefix
    parts = [m for m in model.modules() if isinstance(m, (FeedForwardExpansion, ResidualLayerNorm))]
    assert len(parts) == 3 * layers and all(m._compiled_call_impl is not None for m in parts)


def test_compile_is_refused_on_cpu_in_one_line(tmp_path):
    from bertforge.training import TrainingArguments

    with pytest.raises(ValueError, match=r"^compile \(--compile\) needs a CUDA device, not cpu: "):
        TrainingArguments(str(tmp_path), compile=True, device="cpu")
    assert TrainingArguments(str(tmp_path), compile=False, device="cpu").compile is False
