"""AdamW as BERT trains with it: β = (0.9, 0.999), ε = 1e-6, decoupled weight decay 0.01.

Google's optimization.py excludes `LayerNorm` and `bias` from weight decay (exclude_from_weight_decay);
the parameters are put in two groups by name here, so the rule survives wrappers that prefix the
names (DDP's `module.`, FSDP's `_fsdp_wrapped_module.`). PyTorch's AdamW corrects the moments' bias,
as the ecosystem's BERT implementations do; Google's AdamWeightDecayOptimizer does not (the difference
fades after the first few hundred steps and is hidden by the warm-up).
"""

from __future__ import annotations

import torch
from torch import nn

BETAS = (0.9, 0.999)
EPS = 1e-6
NO_DECAY = ("LayerNorm", "layer_norm")


def decays(name: str, module: nn.Module | None = None) -> bool:
    """Whether parameter `name` gets weight decay: not LayerNorm weights (by name or type), not any bias."""
    if isinstance(module, nn.LayerNorm) or name.endswith("bias"):
        return False
    return not any(part in NO_DECAY for part in name.split("."))


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: with decay, and without (LayerNorm and biases). Frozen parameters are left out."""
    decay, no_decay, seen = [], [], set()
    for module_name, module in model.named_modules():
        for name, parameter in module.named_parameters(prefix=module_name, recurse=False):
            if parameter.requires_grad and id(parameter) not in seen:  # a tied parameter counts once
                seen.add(id(parameter))
                (decay if decays(name, module) else no_decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, lr: float, weight_decay: float = 0.01, betas=BETAS, eps: float = EPS,
                    fused: bool | None = None) -> torch.optim.AdamW:
    """AdamW over `parameter_groups`. `fused=None` picks the fused kernel where PyTorch has one for the device."""
    if fused is None:
        fused = _fused_supported(model)
    return torch.optim.AdamW(parameter_groups(model, weight_decay), lr=lr, betas=betas, eps=eps,
                             fused=fused or None, foreach=None if fused else True)


def _fused_supported(model: nn.Module) -> bool:
    try:
        parameter = next(model.parameters())
    except StopIteration:
        return False
    if parameter.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    return parameter.device.type in ("cuda", "cpu", "xpu", "mps")
