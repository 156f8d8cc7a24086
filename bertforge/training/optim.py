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


class AdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's update, op for op, done in place and in cache-sized chunks.

    On CPUs PyTorch's fused AdamW kernel runs about one element at a time and its for-each and
    per-tensor forms allocate parameter-sized temporaries; these vectorised in-place passes over
    chunks of each tensor (the denominator written into one small reused buffer) avoid both (see
    BENCHMARKS.md, "Pre-training step"). The state (`step`, `exp_avg`,
    `exp_avg_sq`) is torch.optim.AdamW's, so checkpoints move between the two.
    """

    CHUNK = 1 << 18  # elements: the chunks of parameter, gradient and moments stay in cache

    def __init__(self, params, lr: float = 1e-3, betas=BETAS, eps: float = EPS, weight_decay: float = 0.01):
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"invalid AdamW settings: lr={lr}, betas={betas}, eps={eps}, weight_decay={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        buffers: dict[tuple, torch.Tensor] = {}
        for group in self.param_groups:
            lr, (beta1, beta2), eps, weight_decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for parameter in group["params"]:
                grad = parameter.grad
                if grad is None:
                    continue
                if grad.is_sparse:
                    raise RuntimeError("AdamW does not support sparse gradients")
                state = self.state[parameter]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
                state["step"] += 1
                step = state["step"].item()
                tensors = (parameter, grad, state["exp_avg"], state["exp_avg_sq"])
                flat = all(t.is_contiguous() for t in tensors)
                if flat:
                    key = (parameter.device, parameter.dtype)
                    if key not in buffers:
                        buffers[key] = torch.empty(self.CHUNK, dtype=parameter.dtype, device=parameter.device)
                    views = [t.view(-1) for t in tensors]
                    chunks = [[v[start: start + self.CHUNK] for v in views]
                              for start in range(0, parameter.numel(), self.CHUNK)]
                else:
                    chunks = [tensors]
                step_size, correction = lr / (1 - beta1 ** step), (1 - beta2 ** step) ** 0.5
                for p, g, exp_avg, exp_avg_sq in chunks:
                    p.mul_(1 - lr * weight_decay)
                    exp_avg.lerp_(g, 1 - beta1)
                    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                    denom = buffers[key][: p.numel()] if flat else torch.empty_like(p)
                    torch.sqrt(exp_avg_sq, out=denom)
                    denom.div_(correction).add_(eps)
                    p.addcdiv_(exp_avg, denom, value=-step_size)
        return loss


def build_optimizer(model: nn.Module, lr: float, weight_decay: float = 0.01, betas=BETAS,
                    eps: float = EPS) -> torch.optim.Optimizer:
    """AdamW over `parameter_groups`: the in-place `AdamW` above on CPUs, PyTorch's fused kernel on GPUs."""
    groups = parameter_groups(model, weight_decay)
    devices = {p.device.type for group in groups for p in group["params"]}
    if devices <= {"cpu"}:
        return AdamW(groups, lr=lr, betas=betas, eps=eps)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=True)
