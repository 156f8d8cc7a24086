"""AdamW as BERT trains with it: β = (0.9, 0.999), ε = 1e-6, decoupled weight decay 0.01.

Google's optimization.py excludes `LayerNorm` and `bias` from weight decay (exclude_from_weight_decay);
the parameters are put in two groups by name here, so the rule survives wrappers that prefix the
names (DDP's `module.`, FSDP's `_fsdp_wrapped_module.`). PyTorch's AdamW corrects the moments' bias,
as the ecosystem's BERT implementations do; Google's AdamWeightDecayOptimizer does not (the difference
fades after the first few hundred steps and is hidden by the warm-up).

The update is PyTorch's fused AdamW kernel on every device: on CPU one vectorised pass per tensor over
parameter, gradient and both moments (the for-each form makes several), and what the peer's `Trainer`
runs by default (`adamw_torch_fused`).
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


def build_optimizer(model: nn.Module, lr: float, weight_decay: float = 0.01, betas=BETAS,
                    eps: float = EPS) -> torch.optim.Optimizer:
    """`torch.optim.AdamW` (fused) over `parameter_groups`."""
    groups = parameter_groups(model, weight_decay)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=True)
