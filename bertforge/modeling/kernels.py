"""The CPU inference kernels of the encoder's dense layers: reused scratch buffers, in-place updates
where no autograd graph or hook can see them, and the opt-in oneDNN linear.

None of this changes what the layers compute (the paper's layers in bert.py read as if these were
`F.linear` and fresh tensors); it changes where results are written and which kernel runs, so that an
inference forward pass on CPU allocates little and touches fresh pages rarely.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Linear", "Workspace", "inplace_activation", "linear", "may_overwrite_output", "onednn_linear_op", "project",
           "share_storage", "stacked_parameter"]

_ONEDNN_LINEAR: list = []  # [op or None], decided on first use


def onednn_linear_op():
    """torch's oneDNN float32 linear kernel (the one Inductor uses on CPU) if opted in, else None.

    Opt in with the environment variable BERTFORGE_ONEDNN_LINEAR=1 (read on first use). For BERT's
    shapes on a CPU it is faster than the BLAS call behind `F.linear`, which is most of a forward
    pass (BENCHMARKS.md), but it rounds differently: hidden states drift from the BLAS results (and from
    Hugging Face transformers) by up to ~1e-5 in the middle layers of all-MiniLM-L6-v2, so it is not
    the default. None also where this build of torch lacks the op or a probe disagrees with F.linear.
    """
    if not _ONEDNN_LINEAR:
        op = None
        if os.environ.get("BERTFORGE_ONEDNN_LINEAR", "0") == "1":
            try:
                if torch.backends.mkldnn.is_available():
                    candidate = torch.ops.mkldnn._linear_pointwise
                    generator = torch.Generator().manual_seed(0)
                    x = torch.randn(2, 3, 16, generator=generator)
                    weight, bias = torch.randn(8, 16, generator=generator), torch.randn(8, generator=generator)
                    with torch.no_grad():
                        ok = torch.allclose(candidate(x, weight, bias, "none", [None], ""), F.linear(x, weight, bias),
                                            rtol=1e-4, atol=1e-5)
                        ok = ok and torch.allclose(candidate(x, weight, None, "none", [None], ""),
                                                   F.linear(x, weight), rtol=1e-4, atol=1e-5)
                    op = candidate if ok else None
            except Exception:  # not built with oneDNN, or the private op changed: use F.linear
                op = None
        _ONEDNN_LINEAR.append(op)
    return _ONEDNN_LINEAR[0]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear`; through oneDNN if opted in (`onednn_linear_op`), without autograd, on CPU float32."""
    if (
        not torch.is_grad_enabled() and not _autocasting()
        and x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
        and x.layout == torch.strided and x.is_contiguous() and weight.is_contiguous()
        and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()))
        and torch.backends.mkldnn.enabled
    ):
        op = onednn_linear_op()
        if op is not None:
            return op(x, weight, bias, "none", [None], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear whose forward is `linear` (oneDNN in inference on CPU, if opted in)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return linear(input, self.weight, self.bias)


class Workspace:
    """Scratch tensors for one inference forward pass on CPU, reused by every layer.

    Each layer's projections (QKV, the 4H expansion, the two H-wide outputs) are consumed within the
    layer, so one buffer of each shape serves all layers: a fresh allocation per layer costs a page
    fault per 4 KiB on first touch, a visible share of a CPU forward pass. Buffers never
    escape the forward pass (LayerNorm writes the layer outputs to new tensors), and a workspace
    belongs to a single call, so concurrent calls do not share one.
    """

    def __init__(self) -> None:
        self._tensors: dict[str, torch.Tensor] = {}

    def get(self, key: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        tensor = self._tensors.get(key)
        if tensor is None or tensor.shape != shape or tensor.dtype != like.dtype or tensor.device != like.device:
            tensor = self._tensors[key] = torch.empty(shape, dtype=like.dtype, device=like.device)
        return tensor


def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            workspace: Workspace | None = None, key: str = "") -> torch.Tensor:
    """`linear(x, weight, bias)`, written into `workspace`'s buffer `key` when there is one.

    The same BLAS call as `F.linear` (addmm on the flattened input), so the same bits.
    """
    if (
        workspace is None or bias is None or x.dim() < 2 or not x.is_contiguous()
        or not (x.dtype == weight.dtype == bias.dtype) or onednn_linear_op() is not None
    ):
        return linear(x, weight, bias)
    out = workspace.get(key, (*x.shape[:-1], weight.shape[0]), x)
    torch.addmm(bias, x.reshape(-1, x.shape[-1]), weight.t(), out=out.view(-1, weight.shape[0]))
    return out


def _autocasting() -> bool:
    """Whether autocast is on for any device (its dtype changes would make in-place ops differ)."""
    is_any = getattr(torch._C, "_is_any_autocast_enabled", None)
    if is_any is not None:
        return bool(is_any())
    return torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled()


def may_overwrite_output(*modules: nn.Module) -> bool:
    """Whether the output of `modules` may be updated in place: no autograd graph is being recorded
    (inference: `torch.no_grad()`/`inference_mode()`) and no forward hook can have kept a reference.

    Reusing the freshly allocated output of a Linear for the residual add and the activation saves
    one large allocation each (and its page faults on first touch).
    """
    if torch.is_grad_enabled() or nn.modules.module._global_forward_hooks or _autocasting():
        return False
    return not any(module._forward_hooks for module in modules)


def inplace_activation(name: str):
    """`activation(name)` overwriting its input (the same values, bit for bit), or None."""
    gelu_ = getattr(torch._C._nn, "gelu_", None)
    if name == "relu":
        return F.relu_
    if gelu_ is None:
        return None
    if name == "gelu":
        return gelu_
    return lambda x: gelu_(x, approximate="tanh")


def share_storage(linears: Sequence[nn.Linear]) -> None:
    """Lay the weights (and biases) of `linears` (the query, key and value projections) side by side in
    one tensor each.

    The parameters stay separate (same objects, names and checkpoint keys); only their memory is
    adjacent, so that without autograd `stacked_parameter` reads the stacked weight in place instead of
    concatenating it in every forward pass. In-place updates (loading, optimizers, init) keep the layout;
    anything that re-allocates a parameter (`.to(dtype)`, `param.data = ...`) just makes
    `stacked_parameter` fall back to concatenating.
    """
    with torch.no_grad():
        for name in ("weight", "bias"):
            params = [getattr(linear, name) for linear in linears]
            fused = torch.cat([param.detach() for param in params])
            for param, part in zip(params, fused.split([p.shape[0] for p in params])):
                param.data = part


def stacked_parameter(linears: Sequence[nn.Linear], name: str) -> torch.Tensor:
    """The weights (or biases, `name`) of `linears` stacked in their order, e.g. Q, K, V: (3H, H) or (3H,).
    A view of the shared storage (`share_storage`) without autograd when the layout allows, else a copy."""
    params = [getattr(linear, name) for linear in linears]
    if torch.is_grad_enabled() and any(param.requires_grad for param in params):
        return torch.cat(params)  # autograd reaches each parameter
    first = params[0]
    size = first.numel() * first.element_size()
    storage = first.untyped_storage().data_ptr()
    adjacent = all(
        param.is_contiguous() and param.shape == first.shape and param.dtype == first.dtype
        and param.device == first.device and param.untyped_storage().data_ptr() == storage
        and param.data_ptr() == first.data_ptr() + i * size
        for i, param in enumerate(params)
    )
    if not adjacent:
        return torch.cat(params)
    return first.detach().as_strided((len(params) * first.shape[0], *first.shape[1:]), first.stride())
