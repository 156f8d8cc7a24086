"""The CPU dropout mask (`bertforge.modeling.dropout`): its rate, independence, expectation,
gradient, reproducibility, and attention that equals torch's when nothing is dropped."""
import pytest
import torch
import torch.nn.functional as F

from bertforge.modeling.attention import scaled_dot_product_attention
from bertforge.modeling.dropout import Dropout, drop_mask, dropout, kept_scale


def test_mask_rate_and_independence():
    torch.manual_seed(0)
    drop = drop_mask((4_000_000,), 0.1)
    rate = drop.float().mean().item()
    assert abs(rate - 6554 / 65536) < 0.001  # binomial std ≈ 1.5e-4
    # Neighbours share a 64-bit draw (four elements per draw): their drops must still be independent.
    for offset in (1, 2, 3, 4):
        both = (drop[:-offset] & drop[offset:]).float().mean().item()
        assert abs(both - rate * rate) < 0.001, offset


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_expectation_and_gradient(p):
    torch.manual_seed(1)
    x = torch.full((1_000_000,), 2.0, requires_grad=True)
    y = dropout(x, p)
    kept = torch.tensor(2.0).mul(kept_scale(p)).item()  # in float32, as the op computes it
    assert set(torch.unique(y).tolist()) <= {0.0, kept}
    assert abs(y.mean().item() - 2.0) < 0.02  # E[y] = x exactly; sampling error only
    y.sum().backward()
    assert torch.equal(x.grad, (y != 0).float().mul(kept_scale(p)))


def test_reproducible_from_the_seed_and_off_in_eval():
    module = Dropout(0.1)
    x = torch.randn(64, 384)
    torch.manual_seed(3)
    first = module(x)
    torch.manual_seed(3)
    assert torch.equal(module(x), first)
    assert not torch.equal(module(x), first)
    module.eval()
    assert torch.equal(module(x), x)
    assert torch.equal(dropout(x, 0.1, training=False), x)


def test_extreme_rates_are_torchs():
    x = torch.randn(10, 10)
    assert torch.equal(dropout(x, 0.0), x)
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_equals_torchs_when_nothing_drops(causal):
    torch.manual_seed(4)
    query, key, value = (torch.randn(2, 3, 7, 8) for _ in range(3))
    mask = None if causal else torch.rand(2, 1, 1, 7) > 0.3
    if mask is not None:
        mask[..., 0] = True
    # A rate below 2^-17 rounds to zero drops: the computation is then torch's math attention.
    ours = scaled_dot_product_attention(query, key, value, mask, dropout_p=1e-9, is_causal=causal)
    torchs = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=causal)
    torch.testing.assert_close(ours, torchs, rtol=0, atol=1e-6)


def test_attention_drops_probabilities():
    torch.manual_seed(5)
    query = torch.zeros(1, 1, 4, 8)  # uniform attention: each probability 1/64
    key, value = torch.randn(1, 1, 64, 8), torch.ones(1, 1, 64, 1)
    out = scaled_dot_product_attention(query, key, value, dropout_p=0.5)
    # Each output = (kept keys) / 64 * 2: a multiple of 1/32, not the undropped 1.0 everywhere.
    assert torch.allclose(out * 32, (out * 32).round(), atol=1e-4)
    assert not torch.allclose(out, torch.ones_like(out))
