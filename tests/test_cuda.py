"""The CUDA plan (`plans.VarlenPlan`: FlashAttention over variable lengths) and a training step on the GPU.

Run where there is a GPU: `pytest -m cuda` (scripts/gpu_check.sh runs them with benchmarks/gpu.py);
elsewhere every test here is skipped. Checked: `varlen_attention` against the attention equation
(outputs and gradients, bf16), the varlen plan against the padded reference plan for a whole encoder,
attention dropout inside the kernel, a training step that never waits for the device
(`torch.cuda.set_sync_debug_mode("error")`), and the first loss equal to the peer's in float32.
"""

from __future__ import annotations

import pytest
import torch

from bertforge.modeling import BertConfig, BertForPreTraining, BertForSequenceClassification, BertModel, use_unpadded
from bertforge.modeling.attention import varlen_applies, varlen_attention
from bertforge.modeling.packing import Packing, keep_host_copy
from bertforge.modeling.plans import VarlenPlan, choose_plan
from bertforge.pretraining.objectives import MaskedLMStep
from bertforge.training import Trainer, TrainingArguments

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

LENGTHS = (37, 128, 5, 64, 64, 1, 100, 77)


def mask_of(lengths=LENGTHS, seq: int | None = None) -> torch.Tensor:
    mask = torch.zeros(len(lengths), seq or max(lengths), dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    return mask


def equation(qkv: torch.Tensor, mask: torch.Tensor, heads: int, causal: bool = False) -> torch.Tensor:
    """softmax(Q Kᵀ / √D + mask) V on the padded (B, S, 3H) batch in float32 -> (B, S, H)."""
    batch, seq, hidden = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
    query, key, value = qkv.float().view(batch, seq, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4)
    scores = query @ key.transpose(-1, -2) / (hidden // heads) ** 0.5
    allowed = mask.bool()[:, None, None, :]
    if causal:
        allowed = allowed & torch.ones(seq, seq, dtype=torch.bool, device=qkv.device).tril()
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return (weights @ value).transpose(1, 2).reshape(batch, seq, hidden)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("row_bucket", [0, 16])
def test_varlen_attention_computes_the_equation_forward_and_backward(causal, row_bucket):
    heads, head_dim = 4, 64
    mask = mask_of()
    generator = torch.Generator().manual_seed(0)
    padded = torch.randn(*mask.shape, 3 * heads * head_dim, generator=generator).cuda().bfloat16()
    device_mask = keep_host_copy(mask.cuda(), mask)
    packing = Packing.from_mask(device_mask, is_causal=causal, row_bucket=row_bucket)
    packed = packing.pack(padded).detach().requires_grad_()
    assert varlen_applies(packed, heads)
    context = varlen_attention(packed, packing, heads)
    assert not context[packing.num_tokens:].any()  # filler rows
    reference_input = padded.float().requires_grad_()
    expected = equation(reference_input, mask.cuda(), heads, causal)
    real = mask.bool().cuda()
    got = packing.unpack(context.float())
    assert (got[real] - expected[real]).abs().max() <= 2e-2  # bf16 inputs, float32 sums in both
    upstream = torch.randn(expected.shape, generator=generator).cuda() * real[..., None]
    (got * upstream).sum().backward()
    (expected * upstream).sum().backward()
    want = packing.pack(reference_input.grad)[:packing.num_tokens]
    have = packed.grad.float()[:packing.num_tokens]
    assert (have - want).norm() / want.norm() <= 2e-2


def encoder_errors(model: BertModel, inputs: dict, unpad: bool, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
        hidden = model(**inputs, unpad=unpad).last_hidden_state
    hidden = hidden.float()[inputs["attention_mask"].bool()]
    hidden.square().mean().backward()
    return hidden.detach(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_the_varlen_plan_gives_the_padded_reference_outputs_and_gradients():
    """A whole encoder in bf16 autocast on the varlen plan, against the float32 padded reference: no
    further from it than twice bf16's own error on the padded plan (plus a floor), outputs and every
    parameter's gradient."""
    torch.manual_seed(0)
    config = BertConfig.preset("mini", vocab_size=1000, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertModel(config).cuda()
    mask = mask_of()
    ids = torch.randint(5, 1000, mask.shape) * mask
    inputs = {"input_ids": keep_host_copy(ids.cuda(), ids), "attention_mask": keep_host_copy(mask.cuda(), mask)}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        plan = choose_plan(model, inputs["input_ids"], inputs["attention_mask"], True, False, False, False)
    assert type(plan) is VarlenPlan
    reference_out, reference_grads = encoder_errors(model, inputs, False, None)
    padded_out, padded_grads = encoder_errors(model, inputs, False, torch.bfloat16)
    packed_out, packed_grads = encoder_errors(model, inputs, True, torch.bfloat16)
    padded_error = (padded_out - reference_out).abs().max()
    packed_error = (packed_out - reference_out).abs().max()
    assert packed_error <= 2 * padded_error + 1e-2, (packed_error, padded_error)
    relative = lambda grads: (grads - reference_grads).norm() / reference_grads.norm()  # noqa: E731
    assert relative(packed_grads) <= 2 * relative(padded_grads) + 1e-2
    # float32 on CUDA: FlashAttention does not run; the packed plan's own attention (1e-4: the GPU's
    # kernels sum in other orders than the padded plan's)
    fp32_out, _ = encoder_errors(model, inputs, True, None)
    assert (fp32_out - reference_out).abs().max() <= 1e-4


def test_attention_dropout_runs_inside_the_flash_kernel():
    torch.manual_seed(0)
    config = BertConfig.preset("mini", vocab_size=1000, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.5)
    model = BertModel(config).cuda().train()
    mask = mask_of()
    ids = torch.randint(5, 1000, mask.shape) * mask
    inputs = {"input_ids": ids.cuda(), "attention_mask": mask.cuda(), "unpad": True}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        torch.manual_seed(1)
        first = model(**inputs).last_hidden_state
        torch.manual_seed(1)
        again = model(**inputs).last_hidden_state
        torch.manual_seed(2)
        other = model(**inputs).last_hidden_state
        model.eval()
        plain = model(**inputs).last_hidden_state
    real = mask.bool().cuda()
    assert torch.equal(first[real], again[real])  # the same seed drops the same weights
    assert not torch.equal(first[real], other[real]) and not torch.equal(first[real], plain[real])
    first.float()[real].square().mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def pretraining_items(count: int, seq: int = 64, vocab: int = 1000) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    items = []
    for index in range(count):
        length = seq if index % 3 else seq // 2 + index % 7  # some short instances: padding in a batch
        ids = torch.zeros(seq, dtype=torch.long)
        ids[:length] = torch.randint(5, vocab, (length,), generator=generator)
        mask = (torch.arange(seq) < length).long()
        positions = torch.tensor([1, 3, 5, 7, 0])
        labels = torch.tensor([ids[1], ids[3], ids[5], ids[7], -100])
        items.append({"input_ids": ids, "token_type_ids": (torch.arange(seq) >= length // 2).long() * mask,
                      "attention_mask": mask, "masked_lm_positions": positions, "masked_lm_labels": labels,
                      "next_sentence_label": torch.tensor(index % 2)})
    return items


def test_a_training_step_never_waits_for_the_device(tmp_path):
    """Pre-training and fine-tuning steps in bf16 on the varlen plan, with fused AdamW and clipping,
    under `set_sync_debug_mode("error")`: any host synchronisation inside a step raises. The first step
    of each runs outside it (the optimizer's state is created then)."""
    from bertforge.pretraining.dataset import collate

    torch.manual_seed(0)
    config = BertConfig.preset("tiny", vocab_size=1000)
    items = pretraining_items(32)
    step = MaskedLMStep(nsp=True, unpad=True)
    args = TrainingArguments(str(tmp_path / "pretrain"), batch_size=8, max_steps=100, lr=1e-4, max_grad_norm=1.0,
                             precision="bf16", device="cuda", progress=False)
    trainer = Trainer(BertForPreTraining(config), args, items, collate, step, count_fn=step.counts)
    batches = [collate(items[i:i + 8]) for i in range(0, 32, 8)]
    assert any(not b["attention_mask"].bool().all() for b in batches)
    trainer.train_step([batches[0]])
    classifier = BertForSequenceClassification(BertConfig.preset("tiny", vocab_size=1000, num_labels=2))
    use_unpadded(classifier)

    def classify(model, batch):
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     labels=batch["labels"]).loss, {}

    sentences = [{"input_ids": b["input_ids"][i], "attention_mask": b["attention_mask"][i],
                  "labels": b["next_sentence_label"][i]} for b in batches for i in range(8)]
    finetune = Trainer(classifier, TrainingArguments(str(tmp_path / "finetune"), batch_size=8, max_steps=100,
                                                     precision="bf16", device="cuda", progress=False),
                       sentences, lambda xs: {k: torch.stack([x[k] for x in xs]) for k in xs[0]}, classify)
    fine_batches = [{"input_ids": b["input_ids"], "attention_mask": b["attention_mask"],
                     "labels": b["next_sentence_label"]} for b in batches]
    finetune.train_step([fine_batches[0]])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for batch, fine in zip(batches[1:], fine_batches[1:]):
            trainer.train_step([batch])
            finetune.train_step([fine])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    record = trainer._log(1.0, 1.0, 1.0)  # read at a log interval: here the device is waited for
    assert torch.isfinite(torch.tensor(record["loss"])) and trainer.step == 4 and finetune.step == 4


def test_the_first_loss_is_the_peers_in_float32_on_the_device(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = BertConfig.preset("mini", vocab_size=1000)
    ours = BertForPreTraining(config)
    ours.save_pretrained(tmp_path)
    peer = transformers.BertForPreTraining.from_pretrained(tmp_path, attn_implementation="sdpa").cuda().eval()
    ours = ours.cuda().eval()
    from bertforge.pretraining.dataset import collate

    batch = {k: v.cuda() for k, v in collate(pretraining_items(8)).items()}
    labels = torch.full_like(batch["input_ids"], -100)
    valid = batch["masked_lm_labels"] != -100
    rows = torch.arange(len(labels), device="cuda")[:, None].expand_as(valid)
    labels[rows[valid], batch["masked_lm_positions"][valid]] = batch["masked_lm_labels"][valid]
    with torch.no_grad():
        out = ours(**batch, unpad=True)
        peer_loss = peer(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                         attention_mask=batch["attention_mask"], labels=labels,
                         next_sentence_label=batch["next_sentence_label"]).loss
    assert abs(float(out.mlm_loss + out.nsp_loss) - float(peer_loss)) <= 1e-4
