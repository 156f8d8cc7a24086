"""bertforge's inference options against its exact path: unpadded execution, bf16, int8, compile.

Unpadded (`unpad=True`): the real tokens of a padded batch are computed as one packed sequence and
scattered back. Its outputs must equal the padded path's to 1e-5 (absolute, fp32) at real
positions, on the real all-MiniLM-L6-v2 checkpoint and real GLUE sentences in file order (mixed
lengths in every batch), for BertModel and every head. bf16 and int8 are approximations: they are
checked to run through the same calls and to stay close, with the tolerances stated at each test
(measured on all-MiniLM-L6-v2, SST-2 dev sentences).
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F

from bertforge.modeling import (
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    Int8Linear,
    optimize_for_inference,
)
from bertforge.modeling import inference as inference_module
from bertforge.modeling import kernels
from bertforge.modeling.bert import Packing
from bertforge.modeling.inference import _prepack_weights, cpu_has_vnni, default_quantized_engine

TOL = 1e-5
BATCH = 32
MAX_LENGTH = 128


def read_tsv(path) -> list[list[str]]:
    """GLUE's TSVs: tab-separated, one header line, no quoting."""
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    return [line.split("\t") for line in lines[1:] if line.strip()]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.float() - b.float()).abs().max().item() if a.numel() else 0.0


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    return BertModel.from_pretrained(minilm_dir).eval()


@pytest.fixture(scope="module")
def real_batches(glue_dir, minilm_tokenizer) -> list[dict[str, torch.Tensor]]:
    """Batches of 32 in file order: SST-2 dev sentences, MRPC dev pairs, RTE dev pairs (long: some
    are truncated to 128 tokens). Each batch is padded to its longest row."""
    sst2 = [row[0] for row in read_tsv(glue_dir / "SST-2" / "dev.tsv")[:2 * BATCH]]
    mrpc = [(row[3], row[4]) for row in read_tsv(glue_dir / "MRPC" / "dev.tsv")[:2 * BATCH]]
    rte = [(row[1], row[2]) for row in read_tsv(glue_dir / "RTE" / "dev.tsv")[:BATCH]]
    batches = []
    for start in range(0, len(sst2), BATCH):
        batches.append(minilm_tokenizer.encode_batch(sst2[start:start + BATCH], max_length=MAX_LENGTH,
                                                     padding="longest", return_tensors="pt"))
    for pairs in (mrpc, rte):
        for start in range(0, len(pairs), BATCH):
            chunk = pairs[start:start + BATCH]
            batches.append(minilm_tokenizer.encode_batch([a for a, _ in chunk], [b for _, b in chunk],
                                                         max_length=MAX_LENGTH, padding="longest",
                                                         return_tensors="pt"))
    return batches


def sentence_vectors(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the real tokens (the sentence embedding all-MiniLM-L6-v2 is trained for): (B, H)."""
    mask = mask[..., None].float()
    return (hidden.float() * mask).sum(1) / mask.sum(1)


# ------------------------------------------------------------------------------------ unpadded


@torch.inference_mode()
def test_unpadded_matches_padded_on_real_batches(minilm, real_batches):
    worst = {"last": 0.0, "pooled": 0.0, "layers": 0.0}
    padded_rows = 0
    for batch in real_batches:
        mask = batch["attention_mask"].bool()
        lengths = mask.sum(1)
        assert lengths.min() < lengths.max()  # every batch mixes lengths
        padded_rows += int((~mask).sum())
        padded = minilm(**batch, output_hidden_states=True)
        unpadded = minilm(**batch, output_hidden_states=True, unpad=True)
        worst["last"] = max(worst["last"], max_diff(unpadded.last_hidden_state[mask], padded.last_hidden_state[mask]))
        worst["pooled"] = max(worst["pooled"], max_diff(unpadded.pooler_output, padded.pooler_output))
        assert len(unpadded.hidden_states) == len(padded.hidden_states)
        for a, b in zip(unpadded.hidden_states, padded.hidden_states):
            worst["layers"] = max(worst["layers"], max_diff(a[mask], b[mask]))
            assert not a[~mask].any()  # padding positions hold zeros
        assert torch.equal(unpadded.hidden_states[0][mask], padded.hidden_states[0][mask])  # embeddings: same ops
        assert unpadded.hidden_states[-1] is unpadded.last_hidden_state
    assert padded_rows > 0
    assert max(worst.values()) <= TOL, worst


@torch.inference_mode()
def test_model_attribute_switches_the_default(minilm_dir, real_batches):
    model = BertModel.from_pretrained(minilm_dir).eval()
    batch = real_batches[0]
    padded = model(**batch).last_hidden_state
    model.unpad = True
    unpadded = model(**batch).last_hidden_state
    assert not unpadded[~batch["attention_mask"].bool()].any()  # the unpadded path ran (zeros at padding)
    assert torch.equal(model(**batch, unpad=False).last_hidden_state, padded)  # the argument wins


MINILM_HEADS = ((BertForSequenceClassification, {"num_labels": 3}), (BertForTokenClassification, {"num_labels": 5}),
                (BertForQuestionAnswering, {}), (BertForMaskedLM, {}))
TINY_HEADS = ((BertForPreTraining, {}), (BertForMultipleChoice, {}))  # the same encoder calls; ~1.5 s less each


def _head_logits(model, batch, **kwargs) -> dict[str, torch.Tensor]:
    out = model(**batch, **kwargs)
    if hasattr(out, "start_logits"):
        return {"start_logits": out.start_logits, "end_logits": out.end_logits}
    if hasattr(out, "seq_relationship_logits"):
        return {"prediction_logits": out.prediction_logits, "seq_relationship_logits": out.seq_relationship_logits}
    return {"logits": out.logits}


def assert_heads_agree(model, inputs: dict, mask: torch.Tensor, check_attribute: bool = False) -> None:
    """The head's logits, unpadded (argument; attribute) against padded, at real positions."""
    padded = _head_logits(model, inputs)
    runs = [_head_logits(model, inputs, unpad=True)]
    if check_attribute:
        runs.append(_head_logits(optimize_for_inference(model, unpad=True), inputs))
        assert model.bert.unpad
    for unpadded in runs:
        for key, value in padded.items():
            token_level = value.dim() >= 2 and value.shape[:2] == mask.shape
            real = (lambda x: x[mask]) if token_level else (lambda x: x)
            # relative to the logits' size: float32 rounding scales with it (the MLM head's are large)
            scale = max(1.0, real(value).abs().max().item())
            assert max_diff(real(unpadded[key]), real(value)) <= TOL * scale, (type(model).__name__, key, scale)


@pytest.mark.parametrize("cls, overrides", MINILM_HEADS, ids=[cls.__name__ for cls, _ in MINILM_HEADS])
@torch.inference_mode()
def test_minilm_heads_unpadded_match_padded(minilm_dir, real_batches, cls, overrides):
    """The MiniLM encoder under each head (head weights newly initialised, seeded), 8 MRPC pairs."""
    torch.manual_seed(5)
    model = cls.from_pretrained(minilm_dir, **overrides).eval()
    batch = {key: value[:8] for key, value in real_batches[2].items()}
    mask = batch["attention_mask"].bool()
    assert mask.sum(1).min() < mask.shape[1]
    assert_heads_agree(model, batch, mask, check_attribute=cls is BertForSequenceClassification)


@pytest.mark.parametrize("cls, overrides", TINY_HEADS, ids=[cls.__name__ for cls, _ in TINY_HEADS])
@torch.inference_mode()
def test_tiny_heads_unpadded_match_padded(cls, overrides):
    torch.manual_seed(5)
    model = cls(BertConfig.preset("tiny", **overrides)).eval()
    generator = torch.Generator().manual_seed(2)
    lengths = torch.tensor([11, 4, 16, 9, 7, 16, 3, 12])
    mask = (torch.arange(16)[None] < lengths[:, None]).long()
    inputs = {"input_ids": torch.randint(1000, 30000, (8, 16), generator=generator) * mask,
              "token_type_ids": (torch.arange(16)[None] >= lengths[:, None] // 2).long() * mask,
              "attention_mask": mask}
    if cls is BertForMultipleChoice:  # (2 examples, 4 choices, S)
        inputs = {key: value.view(2, 4, -1) for key, value in inputs.items()}
    assert_heads_agree(model, inputs, mask.bool())


def test_unpadded_handles_left_padding_empty_rows_and_no_padding():
    torch.manual_seed(0)
    model = BertModel(BertConfig.preset("tiny")).eval()
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(1000, 30000, (4, 10), generator=generator)
    mask = torch.ones(4, 10, dtype=torch.long)
    mask[0, 7:] = 0  # right padding
    mask[1, :3] = 0  # left padding: position ids stay the columns, as in the padded path
    mask[2, :] = 0  # no real token at all
    with torch.inference_mode():
        padded = model(input_ids, attention_mask=mask).last_hidden_state
        unpadded = model(input_ids, attention_mask=mask, unpad=True).last_hidden_state
        real = mask.bool()
        assert max_diff(unpadded[real], padded[real]) <= TOL
        assert not unpadded[2].any()
        full = torch.ones_like(mask)  # nothing to remove: the padded path runs, same bits
        assert torch.equal(model(input_ids, attention_mask=full, unpad=True).last_hidden_state,
                           model(input_ids, attention_mask=full).last_hidden_state)
        # Probabilities (B, A, S, S) are asked for: the padded path runs.
        out = model(input_ids, attention_mask=mask, unpad=True, output_attentions=True)
        assert len(out.attentions) == model.config.num_hidden_layers
        expected = model(input_ids, attention_mask=mask, output_attentions=True)
        assert torch.equal(out.last_hidden_state, expected.last_hidden_state)


def test_packing_groups_equal_lengths_in_contiguous_rows():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
    packing = Packing.from_mask(mask)
    assert packing.num_tokens == 12
    assert packing.groups == ((0, 1, 2), (2, 2, 3), (8, 1, 4))  # (start, count, length)
    assert packing.index.tolist() == [4, 5, 0, 1, 2, 8, 9, 10, 12, 13, 14, 15]
    assert packing.positions.tolist() == [0, 1, 0, 1, 2, 0, 1, 2, 0, 1, 2, 3]
    values = torch.arange(16.0).view(4, 4, 1)
    assert torch.equal(packing.unpack(packing.pack(values)), values * mask[..., None])


def test_packing_rounds_rows_up_to_a_bucket():
    mask = torch.zeros(8, 40, dtype=torch.long)
    for row, length in enumerate([40, 3, 17, 17, 9, 40, 1, 25]):
        mask[row, :length] = 1  # T = 152 real tokens
    exact = Packing.from_mask(mask)
    bucketed = Packing.from_mask(mask, row_bucket=16)
    assert exact.extra_rows == 0 and bucketed.num_tokens == exact.num_tokens == 152
    assert bucketed.extra_rows == 8  # 160 = a multiple of max(16, 128 // 8)
    assert bucketed.groups == exact.groups and bucketed.positions.shape == (160,)
    values = torch.randn(8, 40, 1)
    packed = bucketed.pack(values)
    assert packed.shape == (160, 1)
    assert torch.equal(bucketed.unpack(packed), exact.unpack(exact.pack(values)))
    # Few distinct lengths: every T up to 4096 lands on one of ~60, with at most 1/8 more rows.
    sizes = set()
    for tokens in range(1, 4097):
        rows = tokens + Packing.from_mask(torch.ones(1, tokens), row_bucket=16).extra_rows
        assert tokens <= rows <= max(tokens + 15, tokens * 9 / 8)
        sizes.add(rows)
    assert len(sizes) <= 70
    with pytest.raises(ValueError, match="row_bucket"):
        Packing.from_mask(mask, row_bucket=-1)


@torch.inference_mode()
def test_bucketed_rows_leave_outputs_unchanged(minilm, real_batches):
    """The filler rows attend to nothing and are dropped: the same outputs as the exact packing
    (to 1e-6 in fp32; the rows' GEMM results do not depend on how many rows there are)."""
    try:
        for batch in real_batches[:6]:
            mask = batch["attention_mask"].bool()
            minilm.unpad_row_bucket = 0
            exact = minilm(**batch, unpad=True)
            minilm.unpad_row_bucket = 16
            bucketed = minilm(**batch, unpad=True)
            assert max_diff(bucketed.last_hidden_state[mask], exact.last_hidden_state[mask]) <= 1e-6
            assert max_diff(bucketed.pooler_output, exact.pooler_output) <= 1e-6
            assert not bucketed.last_hidden_state[~mask].any()
    finally:
        minilm.unpad_row_bucket = 0


@torch.inference_mode()
def test_bucketed_inference_packs_batches_without_padding(minilm, monkeypatch):
    """With row buckets, a batch with no padding is packed as well (so its B·S rows are bucketed
    too): the padded path's outputs to 1e-5. Without buckets, or with autograd, it runs padded."""
    packings = []
    original = Packing.from_mask.__func__
    monkeypatch.setattr(Packing, "from_mask",
                        classmethod(lambda cls, *a, **k: packings.append(original(cls, *a, **k)) or packings[-1]))
    input_ids = torch.randint(1000, 30000, (3, 21), generator=torch.Generator().manual_seed(0))
    padded = minilm(input_ids)
    try:
        minilm.unpad_row_bucket = 16
        for mask in (None, torch.ones_like(input_ids)):
            packed = minilm(input_ids, attention_mask=mask, unpad=True)
            assert max_diff(packed.last_hidden_state, padded.last_hidden_state) <= TOL
            assert max_diff(packed.pooler_output, padded.pooler_output) <= TOL
        assert [p.num_tokens + p.extra_rows for p in packings] == [64, 64]  # 63 rows -> 64
        minilm.unpad_row_bucket = 0
        minilm(input_ids, attention_mask=torch.ones_like(input_ids), unpad=True)
        assert len(packings) == 2
    finally:
        minilm.unpad_row_bucket = 0


def test_unpadded_causal_and_autograd_match_padded():
    """A causal config attends within each example up to the query; gradients flow the same way."""
    torch.manual_seed(0)
    config = BertConfig.preset("tiny", is_causal=True, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertModel(config)
    input_ids = torch.randint(1000, 30000, (3, 9))
    mask = torch.tensor([[1] * 9, [1] * 5 + [0] * 4, [1] * 7 + [0] * 2])
    real = mask.bool()
    grads = []
    for unpad in (False, True):
        model.zero_grad()
        out = model(input_ids, attention_mask=mask, unpad=unpad)
        (out.last_hidden_state[real].pow(2).mean() + out.pooler_output.sum()).backward()
        grads.append({name: param.grad.clone() for name, param in model.named_parameters()})
        if unpad:
            assert max_diff(out.last_hidden_state[real], padded_out[real]) <= TOL
        padded_out = out.last_hidden_state.detach()
    for name in grads[0]:
        assert max_diff(grads[1][name], grads[0][name]) <= TOL, name


def test_stacked_parameters_in_place_give_each_parameter_its_gradient(monkeypatch):
    """With autograd, the stacked Q, K, V weight is read in place of their shared storage (no copy) and
    each parameter gets its own rows of the gradient: the same outputs and gradients as concatenating,
    fp32 and under bf16 autocast; while exporting or tracing it is a concatenation."""
    torch.manual_seed(0)
    linears = [torch.nn.Linear(16, 16) for _ in range(3)]
    kernels.share_storage(linears)
    x = torch.randn(5, 16)
    assert kernels.stacked_parameter(linears, "weight").data_ptr() == linears[0].weight.data_ptr()
    for autocast in (False, True):
        runs = []
        for stack in (lambda name: kernels.stacked_parameter(linears, name),
                      lambda name: torch.cat([getattr(linear, name) for linear in linears])):
            for linear in linears:
                linear.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = F.linear(x, stack("weight"), stack("bias"))
            (out.float() * torch.arange(out.shape[-1])).sum().backward()  # a different gradient per row
            runs.append((out, [(linear.weight.grad.clone(), linear.bias.grad.clone()) for linear in linears]))
        (out, grads), (expected_out, expected_grads) = runs
        assert torch.equal(out, expected_out)
        for (weight, bias), (expected_weight, expected_bias) in zip(grads, expected_grads):
            assert torch.equal(weight, expected_weight) and torch.equal(bias, expected_bias)
    monkeypatch.setattr(torch.onnx, "is_in_onnx_export", lambda: True)
    assert kernels.stacked_parameter(linears, "weight").data_ptr() != linears[0].weight.data_ptr()


def test_cls_only_last_layer_matches_the_full_layer(minilm_dir, real_batches):
    """`cls_only` (what the classification heads ask for) runs the last layer at [CLS] only: the pooled
    vector, the [CLS] row and every parameter's gradient equal the full layer's, padded and unpadded,
    on real batches, and in CPU inference; the full layer runs when more is asked for or position 0 is
    padding."""
    model = BertModel.from_pretrained(minilm_dir).eval()  # no dropout; gradients on: not the inference path
    hidden = model.config.hidden_size
    for batch in (real_batches[0], real_batches[2]):  # SST-2 sentences, MRPC pairs
        for unpad in (False, True):
            runs = []
            for cls_only in (False, True):
                model.zero_grad()
                out = model(**batch, unpad=unpad, cls_only=cls_only)
                out.pooler_output.pow(2).sum().backward()
                runs.append((out, {name: param.grad.clone() for name, param in model.named_parameters()}))
            (full, full_grads), (first, first_grads) = runs
            assert first.last_hidden_state.shape == (batch["input_ids"].shape[0], 1, hidden)
            assert max_diff(first.last_hidden_state[:, 0], full.last_hidden_state[:, 0]) <= TOL
            assert max_diff(first.pooler_output, full.pooler_output) <= TOL
            for name, grad in full_grads.items():  # relative to the gradient's scale (up to ~2 here)
                assert max_diff(first_grads[name], grad) <= TOL * max(1.0, grad.abs().max().item()), name
    batch = real_batches[0]
    shape = tuple(batch["input_ids"].shape)
    assert model(**batch, cls_only=True, output_hidden_states=True).last_hidden_state.shape[:2] == shape
    left = {key: value.flip(1) for key, value in batch.items()}  # padding first: position 0 is padding
    assert model(**left, unpad=True, cls_only=True).last_hidden_state.shape[:2] == shape
    seen = []
    handle = model.encoder.layer[-1].register_forward_hook(lambda module, args, output: seen.append(output))
    try:
        assert model(**batch, cls_only=True).last_hidden_state.shape[:2] == shape and seen
    finally:
        handle.remove()
    with torch.inference_mode():  # the CPU inference path: [CLS] as one row per example (forward_rows)
        for unpad in (False, True):
            full, first = model(**batch, unpad=unpad), model(**batch, unpad=unpad, cls_only=True)
            assert first.last_hidden_state.shape == (shape[0], 1, hidden)
            assert max_diff(first.last_hidden_state[:, 0], full.last_hidden_state[:, 0]) <= TOL
            assert max_diff(first.pooler_output, full.pooler_output) <= TOL


def test_span_loss_is_the_same_on_both_paths_and_with_more_padding():
    """SQuAD's start/end softmax runs over a window's real tokens: the loss and its gradients are the
    same on the padded and unpadded paths and when the batch is padded further. (When padding was a
    candidate, the unpadded path gave it a fixed logit, the bias, and trained worse: issue 28.)"""
    torch.manual_seed(0)
    config = BertConfig.preset("tiny", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForQuestionAnswering(config)
    lengths = torch.tensor([12, 5, 9])
    mask = (torch.arange(12)[None] < lengths[:, None]).long()
    inputs = {"input_ids": torch.randint(1000, 30000, (3, 12)) * mask, "attention_mask": mask,
              "token_type_ids": (torch.arange(12)[None] >= 3).long() * mask,
              "start_positions": torch.tensor([4, 1, 3]), "end_positions": torch.tensor([6, 4, 8])}
    wider = {key: torch.nn.functional.pad(value, (0, 20)) if value.dim() == 2 else value
             for key, value in inputs.items()}
    runs = []
    for batch, unpad in ((inputs, False), (inputs, True), (wider, False), (wider, True)):
        model.zero_grad()
        loss = model(**batch, unpad=unpad).loss
        loss.backward()
        runs.append((loss.item(), {name: param.grad.clone() for name, param in model.named_parameters()}))
    for loss, grads in runs[1:]:
        assert abs(loss - runs[0][0]) <= TOL
        for name, grad in grads.items():
            assert max_diff(grad, runs[0][1][name]) <= TOL, name


def test_packed_attention_with_gradients_equals_the_inference_path():
    """Training takes the groups with split/cat (no per-group full-size gradients); the context is the
    inference path's, filler rows zero, and the gradient reaches every real row."""
    from bertforge.modeling.attention import packed_attention
    from bertforge.modeling.packing import Packing
    torch.manual_seed(0)
    mask = torch.zeros(6, 10, dtype=torch.long)
    for row, length in enumerate((3, 10, 3, 7, 0, 5)):
        mask[row, :length] = 1
    packing = Packing.from_mask(mask, row_bucket=16)
    assert packing.extra_rows and len(packing.groups) == 4
    qkv = torch.randn(packing.num_tokens + packing.extra_rows, 3 * 8, requires_grad=True)
    with torch.no_grad():
        expected = packed_attention(qkv, packing, num_heads=2)
    context = packed_attention(qkv, packing, num_heads=2)
    # inference runs short groups as plain matmuls, training through torch's attention: the same sums
    # up to float32 rounding
    assert context.grad_fn is not None and max_diff(context, expected) <= 1e-6
    assert not context[packing.num_tokens:].any()
    context.pow(2).sum().backward()
    assert qkv.grad[:packing.num_tokens].abs().sum(1).gt(0).all() and not qkv.grad[packing.num_tokens:].any()


@pytest.mark.parametrize("is_causal", [False, True])
def test_padded_attention_in_training_equals_per_length_calls(is_causal):
    """Sentence-length batches train with one padded, masked attention call (`pads_attention`): the
    same context and gradients as one call per length (float64, to rounding), filler rows zero."""
    from bertforge.modeling import attention as packing_module
    from bertforge.modeling.attention import packed_attention, pads_attention
    from bertforge.modeling.packing import Packing
    torch.manual_seed(0)
    lengths = (3, 12, 3, 7, 0, 5, 9, 12)
    mask = torch.zeros(len(lengths), 12, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    packing = Packing.from_mask(mask, is_causal=is_causal, row_bucket=16)
    assert packing.extra_rows and len(packing.groups) == 5 and pads_attention(packing, hidden=64)
    qkv = torch.randn(packing.num_tokens + packing.extra_rows, 3 * 64, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(qkv.shape[0], 64, dtype=torch.float64)
    results = []
    for padded in (True, False):
        original = packing_module.pads_attention
        packing_module.pads_attention = lambda *_: padded
        try:
            context = packed_attention(qkv, packing, num_heads=4)
        finally:
            packing_module.pads_attention = original
        (context * weights).sum().backward()
        results.append((context.detach(), qkv.grad.clone()))
        qkv.grad = None
    (padded_context, padded_grad), (grouped_context, grouped_grad) = results
    assert max_diff(padded_context, grouped_context) <= 1e-12 and max_diff(padded_grad, grouped_grad) <= 1e-12
    assert not padded_context[packing.num_tokens:].any() and not padded_grad[packing.num_tokens:].any()


def test_padded_attention_length_rounds_up_with_row_buckets():
    """With row buckets the padded layout's length is the longest example's rounded up to a multiple of
    PADDED_LENGTH_STEP (fewer attention shapes for oneDNN to build kernels for); context, gradients and
    the [CLS] query's context equal those at the exact length (float64, to rounding)."""
    import dataclasses

    from bertforge.modeling.attention import _padded_attention, first_token_attention
    from bertforge.modeling.packing import PADDED_LENGTH_STEP, Packing, _padded_slots
    torch.manual_seed(0)
    lengths = (21, 9, 17, 21, 5)
    mask = torch.zeros(len(lengths), 21, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    bucketed = Packing.from_mask(mask, row_bucket=16)
    exact = dataclasses.replace(bucketed, length_bucket=0, padded_slots=None, padded_bias=None)
    assert _padded_slots(exact)[1].shape[-1] == 21
    assert _padded_slots(bucketed)[1].shape[-1] == 24 == -(-21 // PADDED_LENGTH_STEP) * PADDED_LENGTH_STEP
    qkv = torch.randn(bucketed.num_tokens + bucketed.extra_rows, 3 * 32, dtype=torch.float64)
    weights = torch.randn(qkv.shape[0], 32, dtype=torch.float64)
    query = torch.randn(len(lengths), 32, dtype=torch.float64)
    results = []
    for packing in (exact, bucketed):
        leaf = qkv.clone().requires_grad_()
        context = _padded_attention(leaf, packing, num_heads=4, dropout_p=0.0)
        (context * weights).sum().backward()
        first = first_token_attention(query, qkv[:, 32:], packing, num_heads=4)
        results.append((context.detach(), leaf.grad, first))
    for got, expected in zip(*results):
        assert max_diff(got, expected) <= 1e-12


def test_long_mixed_lengths_keep_per_length_attention():
    """Padding a 512-token example's batch-mates to 512 would cost more attention than it saves."""
    from bertforge.modeling.attention import pads_attention
    from bertforge.modeling.packing import Packing
    mask = torch.zeros(4, 512, dtype=torch.long)
    for row, length in enumerate((512, 20, 30, 40)):
        mask[row, :length] = 1
    assert not pads_attention(Packing.from_mask(mask), hidden=128)
    assert pads_attention(Packing.from_mask(mask[:, :40]), hidden=128)
    assert not pads_attention(Packing.from_mask(mask[:1]), hidden=128)  # one length: one call anyway


# ----------------------------------------------------------------------------------- bf16, int8


@torch.inference_mode()
def test_bf16_runs_and_stays_close(minilm_dir, minilm, real_batches):
    """bf16 (8-bit mantissa): measured max abs diff ~0.05 on hidden states of size up to ~10, and
    mean-pooled sentence vectors at cosine ≥ 0.9999 to fp32. Checked: ≤ 0.15 and ≥ 0.999."""
    model = optimize_for_inference(BertModel.from_pretrained(minilm_dir), dtype="bf16")
    attention = model.encoder.layer[0].attention.self
    assert attention._fused("weight").data_ptr() == attention.query.weight.data_ptr()  # still fused in place
    for batch in real_batches[:2] + real_batches[-1:]:
        mask = batch["attention_mask"].bool()
        out = model(**batch)
        reference = minilm(**batch)
        assert out.last_hidden_state.dtype == torch.bfloat16
        assert max_diff(out.last_hidden_state[mask], reference.last_hidden_state[mask]) <= 0.15
        cosine = F.cosine_similarity(sentence_vectors(out.last_hidden_state, mask),
                                     sentence_vectors(reference.last_hidden_state, mask))
        assert cosine.min() >= 0.999, cosine.min()


# packed and plain weights run one kernel; the allowance is a last-bit difference should oneDNN pick
# another kernel for the other layout (bf16: one unit in the last place at |h| < 16)
PACKED_TOL = {"fp32": 1e-6, "bf16": 0.0625}


def _packing_available(dtype: str) -> bool:
    return kernels.onednn_linear_op() is not None and (dtype == "fp32" or kernels._onednn_bf16())


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_packed_weights_compute_the_plain_weights_and_follow_reloads(minilm_dir, real_batches, dtype):
    """On CPU, optimize_for_inference gives every dense layer of the encoder oneDNN's packed copy of its
    weight: the same products as the plain weight (within PACKED_TOL: one kernel, one summation order),
    made again when the weights change in place (a state_dict loaded later runs, not a stale copy),
    dropped by copies and pickles, and never made from inference tensors (whose changes no version
    counter sees) or for int8."""
    if not _packing_available(dtype):
        pytest.skip(f"oneDNN's {dtype} linear is not available here")
    model = optimize_for_inference(BertModel.from_pretrained(minilm_dir), dtype=dtype)
    layer = model.encoder.layer[0]
    packs = [layer.attention.self.packed_qkv] + [module.dense.packed_weight for module in
                                                 (layer.attention.output, layer.intermediate, layer.output)]
    assert all(isinstance(pack, kernels.PackedWeight) for pack in packs)
    tol = PACKED_TOL[dtype]
    with torch.inference_mode():
        packed = [model(**batch).last_hidden_state for batch in real_batches[:2] + real_batches[-1:]]
        assert all(pack._cached is not None for pack in packs)  # the packed copies ran
        _prepack_weights(model, False)
        plain = [model(**batch).last_hidden_state for batch in real_batches[:2] + real_batches[-1:]]
        for a, b in zip(packed, plain):
            assert max_diff(a, b) <= tol

    # new weights loaded in place: the packed copies follow
    state = {name: value * 0.5 if value.is_floating_point() else value
             for name, value in BertModel.from_pretrained(minilm_dir).state_dict().items()}
    expected_model = optimize_for_inference(BertModel.from_pretrained(minilm_dir), dtype=dtype)
    expected_model.load_state_dict(state)
    _prepack_weights(expected_model, False)
    _prepack_weights(model, True)
    batch = real_batches[0]
    with torch.inference_mode():
        model(**batch)
        model.load_state_dict(state)
        assert max_diff(model(**batch).last_hidden_state, expected_model(**batch).last_hidden_state) <= tol

    clone = copy.deepcopy(model)
    restored = pickle.loads(pickle.dumps(model))
    assert clone.encoder.layer[0].attention.self.packed_qkv._cached is None
    with torch.inference_mode():
        expected = model(**batch).last_hidden_state
        for other in (clone, restored):
            assert max_diff(other(**batch).last_hidden_state, expected) <= tol

    reference = optimize_for_inference(BertModel.from_pretrained(minilm_dir), dtype=dtype)
    _prepack_weights(reference, False)
    with torch.inference_mode():  # parameters made here are inference tensors: the plain weights serve
        frozen = optimize_for_inference(BertModel.from_pretrained(minilm_dir), dtype=dtype)
        assert frozen.encoder.layer[0].attention.self.query.weight.is_inference()
        assert max_diff(frozen(**batch).last_hidden_state, reference(**batch).last_hidden_state) <= tol
        assert frozen.encoder.layer[0].attention.self.packed_qkv._cached is None

    int8 = optimize_for_inference(BertModel.from_pretrained(minilm_dir), dtype="int8")
    assert int8.encoder.layer[0].attention.self.packed_qkv is None
    assert not any(getattr(m, "packed_weight", None) for m in int8.encoder.modules())


ENGINES = [None] + [e for e in ("x86", "onednn") if e in torch.backends.quantized.supported_engines]


@pytest.mark.parametrize("vendor, flags, onednn", [
    ("GenuineIntel", {"avx512_vnni", "amx_int8"}, True), ("AuthenticAMD", {"avx512_vnni"}, True),
    ("GenuineIntel", {"avx512_vnni"}, False), ("AuthenticAMD", {"avx2"}, False), ("", set(), False)])
def test_default_quantized_engine_is_onednn_where_measured_faster(monkeypatch, vendor, flags, onednn):
    """oneDNN's int8 kernels by default on AMX CPUs and AMD CPUs with AVX-512 VNNI; torch's engine elsewhere."""
    if "onednn" not in torch.backends.quantized.supported_engines:
        pytest.skip("this torch has no oneDNN quantized engine")
    monkeypatch.setattr(inference_module, "_INFO", (vendor, frozenset(flags)))
    expected = "onednn" if onednn else torch.backends.quantized.engine
    assert default_quantized_engine() == expected


@pytest.mark.parametrize("engine", ENGINES)
@torch.inference_mode()
def test_int8_runs_and_stays_close(minilm_dir, minilm, real_batches, engine):
    """int8 weights (per channel) and activations (per tensor, per call). Measured on SST-2 with 8-bit
    activations (VNNI CPUs): max abs diff ~0.5, sentence cosine ≥ 0.985; with 7 bits (no VNNI): ~1.0,
    ≥ 0.94. Checked: cosine ≥ 0.97 (0.9 with 7 bits), and every Linear of the encoder quantized, with
    torch's default quantized engine and with oneDNN's (the global engine left as it was)."""
    global_engine = torch.backends.quantized.engine
    model = optimize_for_inference(BertModel.from_pretrained(minilm_dir), dtype="int8", quantized_engine=engine)
    assert torch.backends.quantized.engine == global_engine
    layer = model.encoder.layer[0]
    assert layer.attention.self.qkv.engine == (engine or default_quantized_engine())
    assert isinstance(layer.attention.self.qkv, Int8Linear) and layer.attention.self.query is None
    assert all(isinstance(module.dense, Int8Linear)
               for module in (layer.attention.output, layer.intermediate, layer.output, model.pooler))
    assert not any(type(module) is torch.nn.Linear for module in model.encoder.modules())
    threshold = 0.97 if cpu_has_vnni() else 0.9
    for batch in real_batches[:2] + real_batches[-1:]:
        mask = batch["attention_mask"].bool()
        reference = sentence_vectors(minilm(**batch).last_hidden_state, mask)
        for unpad in (True, False):  # both paths run through the quantized layers
            out = model(**batch, unpad=unpad)
            assert out.last_hidden_state.dtype == torch.float32
            cosine = F.cosine_similarity(sentence_vectors(out.last_hidden_state, mask), reference)
            assert cosine.min() >= threshold, (unpad, cosine.min())
    with pytest.raises(TypeError, match="float32"):
        layer.intermediate.dense(torch.zeros(2, 384, dtype=torch.bfloat16))


@torch.inference_mode()
def test_int8_classifier_head(minilm_dir, real_batches):
    """A head class: only the encoder's layers are quantized; the classifier stays float32."""
    torch.manual_seed(5)
    reference = BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2).eval()
    torch.manual_seed(5)
    model = optimize_for_inference(BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2),
                                   dtype="int8")
    assert type(model.classifier) is torch.nn.Linear
    batch = real_batches[0]
    logits, expected = model(**batch).logits, reference(**batch).logits
    assert logits.shape == expected.shape and logits.dtype == torch.float32
    assert max_diff(logits, expected) <= 0.1  # logits of a fresh head are ~0.1 in size: a loose check


# ------------------------------------------------------------------------------------ arguments


def test_bad_arguments_say_what_is_wrong():
    torch.manual_seed(0)
    model = BertModel(BertConfig.preset("tiny"))
    ids = torch.randint(1000, 30000, (2, 5))
    with pytest.raises(ValueError, match="dtype must be one of"):
        optimize_for_inference(model, dtype="fp64")
    with pytest.raises(ValueError, match="dtype must be one of"):
        optimize_for_inference(model, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="unpad must be"):
        optimize_for_inference(model, unpad="yes")
    with pytest.raises(TypeError, match="compile must be"):
        optimize_for_inference(model, compile=1)
    with pytest.raises(ValueError, match="row_bucket must be"):
        optimize_for_inference(model, row_bucket=2.5)
    assert optimize_for_inference(model).unpad_row_bucket == 16  # CPU: bucketed by default, every dtype
    assert optimize_for_inference(model, row_bucket=32).unpad_row_bucket == 32
    # oneDNN runs int8 (and bf16) matmuls on CPU: buckets by default there.
    assert optimize_for_inference(BertModel(BertConfig.preset("tiny")), dtype="int8").unpad_row_bucket == 16
    with pytest.raises(TypeError, match="unpad must be"):
        model(ids, unpad=1)
    with pytest.raises(ValueError, match="attention_mask has shape"):
        model(ids, attention_mask=torch.ones(2, 4, dtype=torch.long), unpad=True)
    with pytest.raises(TypeError, match="BertModel or a head class"):
        optimize_for_inference(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="for GPUs"):
        optimize_for_inference(model, dtype="fp16")
    with pytest.raises(ValueError, match="not supported with dtype='int8'"):
        optimize_for_inference(model, dtype="int8", compile=True)
    with pytest.raises(ValueError, match="applies to dtype='int8' only"):
        optimize_for_inference(model, dtype="fp32", quantized_engine="onednn")
    with pytest.raises(ValueError, match="quantized engine 'tpu' is not available"):
        optimize_for_inference(model, dtype="int8", quantized_engine="tpu")
    optimize_for_inference(model, dtype="int8")
    optimize_for_inference(model, dtype="int8")  # again: nothing left to do
    with pytest.raises(ValueError, match="already int8"):
        optimize_for_inference(model, dtype="bf16")
    with pytest.raises(ValueError, match="input_ids has 600 tokens"):
        model(torch.ones(1, 600, dtype=torch.long), attention_mask=torch.ones(1, 600), unpad=True)


def test_compile_option_wraps_the_per_token_modules():
    """compile=True only wraps modules (compilation happens on the first call, which is not timed
    here: it takes tens of seconds on a small CPU)."""
    torch.manual_seed(0)
    model = optimize_for_inference(BertModel(BertConfig.preset("tiny")), compile=True)
    layer = model.encoder.layer[0]
    assert all(hasattr(module, "_orig_mod") for module in (layer.intermediate, layer.output, layer.attention.output))
    assert not model._inference_fast_path(torch.zeros(1, 1, dtype=torch.long))  # no eager workspace under compile


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@torch.inference_mode()
def test_half_precision_on_gpu(minilm_dir, minilm, real_batches, dtype):
    model = optimize_for_inference(BertModel.from_pretrained(minilm_dir).cuda(), dtype=dtype)
    for batch in real_batches[:2]:
        mask = batch["attention_mask"].bool()
        out = model(**{key: value.cuda() for key, value in batch.items()}).last_hidden_state.cpu()
        cosine = F.cosine_similarity(sentence_vectors(out, mask),
                                     sentence_vectors(minilm(**batch).last_hidden_state, mask))
        assert cosine.min() >= 0.999
