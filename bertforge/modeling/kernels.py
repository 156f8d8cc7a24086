"""The CPU inference kernels of the encoder's dense layers: reused scratch buffers, in-place updates
where no autograd graph or hook can see them, and oneDNN's linear kernel with the activation fused and
the weights packed once in its layout.

None of this changes what the layers compute: the paper's layers in bert.py call their plan
(plans.py) for each dense product, and the inference plans call these; they change where results are
written and which kernel runs, so that an inference forward pass on CPU allocates little and touches
fresh pages rarely.
"""

from __future__ import annotations

import functools
import os
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Linear", "PackedWeight", "Workspace", "activation", "fused_linear_activation", "inplace_activation",
           "linear", "may_overwrite_output", "onednn_linear_op", "project", "share_storage", "stacked_parameter"]

_ONEDNN_LINEAR: list = []  # [op or None], decided on first use
ONEDNN_SWITCH = "BERTFORGE_ONEDNN_LINEAR"  # "0": inference matmuls through F.linear (the BLAS) instead
# oneDNN's post-op (attr, algorithm) for each `hidden_act` it can fuse into a linear layer
_FUSED_ACTIVATIONS = {"gelu": ("gelu", "none"), "gelu_new": ("gelu", "tanh"), "gelu_pytorch_tanh": ("gelu", "tanh"),
                      "relu": ("relu", "")}
_PROBE_TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def onednn_linear_op():
    """torch's oneDNN linear kernel (`torch.ops.mkldnn._linear_pointwise`, the one Inductor uses on
    CPU), or None where it is switched off, missing, or disagrees with `F.linear` on a probe.

    Why: for BERT's shapes on a CPU it is faster than the BLAS (MKL) call behind `F.linear`, most of all
    on CPUs MKL does not tune for, and it applies GELU to each tile while it is in cache instead of in
    a second pass over the (T, 4H) expansion (docs/results/inference/README.md, "CPU kernels for inference"). It sums in
    another order, so float32 hidden states differ from the BLAS results in the last bits (within the
    1e-5 budget against the peer that the parity tests hold). bfloat16 inference takes it too where
    oneDNN has bfloat16 kernels (`_onednn_bf16`). The environment variable BERTFORGE_ONEDNN_LINEAR=0
    (read on first use) keeps inference on `F.linear`.
    """
    if not _ONEDNN_LINEAR:
        op = None
        if os.environ.get(ONEDNN_SWITCH, "1") != "0":
            try:
                if torch.backends.mkldnn.is_available():
                    op = torch.ops.mkldnn._linear_pointwise
                    generator = torch.Generator().manual_seed(0)
                    x = torch.randn(2, 3, 16, generator=generator)
                    weight, bias = torch.randn(8, 16, generator=generator), torch.randn(8, generator=generator)
                    with torch.no_grad():
                        expected = F.linear(x, weight, bias)
                        ok = (torch.allclose(op(x, weight, bias, "none", [None], ""), expected, **_PROBE_TOLERANCE)
                              and torch.allclose(op(x, weight, None, "none", [None], ""), F.linear(x, weight),
                                                 **_PROBE_TOLERANCE)
                              and torch.allclose(op(x, weight, bias, "gelu", [None], "none"), F.gelu(expected),
                                                 **_PROBE_TOLERANCE)
                              and torch.allclose(op(x, weight, bias, "gelu", [None], "tanh"),
                                                 F.gelu(expected, approximate="tanh"), **_PROBE_TOLERANCE)
                              and torch.allclose(op(x, weight, bias, "relu", [None], ""), F.relu(expected),
                                                 **_PROBE_TOLERANCE))
                    op = op if ok else None
            except Exception:  # not built with oneDNN, or the private op changed: use F.linear
                op = None
        _ONEDNN_LINEAR.append(op)
    return _ONEDNN_LINEAR[0]


def _onednn_eligible(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Inference (no autograd, no autocast) on CPU float32 or bfloat16 contiguous tensors of one dtype,
    oneDNN on (bfloat16 only where oneDNN has bfloat16 kernels for this CPU)."""
    return (
        not torch.is_grad_enabled() and not _autocasting()
        and x.device.type == "cpu" and x.dtype == weight.dtype and x.dtype in _ONEDNN_DTYPES
        and x.layout == torch.strided and x.is_contiguous() and weight.is_contiguous()
        and (bias is None or (bias.dtype == x.dtype and bias.is_contiguous()))
        and torch.backends.mkldnn.enabled
        and (x.dtype == torch.float32 or _onednn_bf16())
    )


_ONEDNN_DTYPES = (torch.float32, torch.bfloat16)


@functools.cache
def _onednn_bf16() -> bool:
    """Whether oneDNN has bfloat16 kernels for this CPU and its linear kernel agrees in bfloat16 with
    `F.linear` in float32 on a probe (within bfloat16's rounding). Whether oneDNN runs at all is
    `onednn_linear_op`'s to say."""
    try:
        if not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return False
        op = torch.ops.mkldnn._linear_pointwise
        generator = torch.Generator().manual_seed(0)
        x, weight, bias = (torch.randn(*shape, generator=generator) for shape in ((5, 16), (8, 16), (8,)))
        with torch.no_grad():
            got = op(x.bfloat16(), weight.bfloat16(), bias.bfloat16(), "none", [None], "").float()
            return bool(torch.allclose(got, F.linear(x, weight, bias), rtol=0.05, atol=0.1))
    except Exception:  # the private ops changed: stay on F.linear
        return False


class PackedWeight:
    """A linear layer's (out, in) weight in oneDNN's blocked layout, for CPU inference
    (`optimize_for_inference` sets one on each dense layer of the encoder).

    Why: oneDNN's kernels read a weight in a blocked layout; given a plain one they work from it on
    every call, slower than from a copy packed once (docs/results/inference/README.md, "CPU kernels for inference"). It is
    made from the weight at first use and again whenever a parameter it comes from has moved or been
    changed in place (loading a state_dict, `.to()`), so it never serves stale weights. The cost is a
    second copy of the dense layers' weights in memory. `params`: the parameters the weight is read from
    (the query, key and value weights for the stacked QKV projection).
    """

    def __init__(self, *params: torch.Tensor) -> None:
        self.params = params
        self._cached: tuple | None = None  # (key, packed tensor), replaced as one

    def of(self, weight: torch.Tensor) -> torch.Tensor:
        """The packed form of `weight` (out, in), the current value of `params` (stacked); `weight` itself
        when a parameter is an inference tensor (made under `torch.inference_mode()`), whose in-place
        changes no version counter records."""
        try:
            key = (weight.dtype, tuple(weight.shape), tuple((p.data_ptr(), p._version) for p in self.params))
        except RuntimeError:  # an inference tensor has no version counter
            return weight
        cached = self._cached
        if cached is None or cached[0] != key:
            cached = self._cached = (key, torch.ops.mkldnn._reorder_linear_weight(weight))
        return cached[1]

    def __getstate__(self) -> dict:  # oneDNN's opaque tensors cannot be copied or pickled: made again on use
        return {"params": self.params, "_cached": None}


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           packed: PackedWeight | None = None) -> torch.Tensor:
    """`F.linear`; through oneDNN (`onednn_linear_op`) in float32 or bfloat16 inference on CPU, with
    `packed`'s copy of `weight` when given."""
    if _onednn_eligible(x, weight, bias):
        op = onednn_linear_op()
        if op is not None:
            return op(x, weight if packed is None else packed.of(weight), bias, "none", [None], "")
    return F.linear(x, weight, bias)


def fused_linear_activation(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                            name: str, packed: PackedWeight | None = None) -> torch.Tensor | None:
    """activation(linear(x, weight, bias)) in one oneDNN call, the activation applied to each output
    tile as it is computed, or None where that does not apply (training, another dtype or device,
    oneDNN off, an activation it has no post-op for). name: a config's `hidden_act` ("gelu" is erf's).
    x (..., in) -> (..., out). In bfloat16 the activation reads the float32 sums, rounded once after it."""
    fused = _FUSED_ACTIVATIONS.get(name)
    if fused is None or not _onednn_eligible(x, weight, bias):
        return None
    op = onednn_linear_op()
    if op is None:
        return None
    return op(x, weight if packed is None else packed.of(weight), bias, fused[0], [None], fused[1])


class Linear(nn.Linear):
    """nn.Linear whose forward is `linear` (oneDNN in float32/bfloat16 inference on CPU), with the packed
    weight `packed_weight` when one is set."""

    packed_weight: PackedWeight | None = None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return linear(input, self.weight, self.bias, self.packed_weight)


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
            workspace: Workspace | None = None, key: str = "", packed: PackedWeight | None = None) -> torch.Tensor:
    """`linear(x, weight, bias)`, written into `workspace`'s buffer `key` when there is one.

    The same BLAS call as `F.linear` (addmm on the flattened input), so the same bits.
    """
    if (
        workspace is None or bias is None or x.dim() < 2 or not x.is_contiguous()
        or not (x.dtype == weight.dtype == bias.dtype) or onednn_linear_op() is not None
    ):
        return linear(x, weight, bias, packed)
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


@functools.cache
def activation(name: str):
    """The feed-forward activation a config's `hidden_act` names: GELU's erf form (as Google's modeling.py),
    its tanh form, or ReLU."""
    if name == "gelu":
        return F.gelu
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    return F.relu


@functools.cache
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


class _Stacked(torch.autograd.Function):
    """The stacked view of parameters laid side by side (`share_storage`) as a function of them: the
    forward copies nothing, the backward hands each parameter its rows of the stacked gradient."""

    @staticmethod
    def forward(ctx, stacked: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        ctx.sizes = [param.shape[0] for param in params]
        return stacked.view_as(stacked)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return (None, *grad.split(ctx.sizes))


def stacked_parameter(linears: Sequence[nn.Linear], name: str) -> torch.Tensor:
    """The weights (or biases, `name`) of `linears` stacked in their order, e.g. Q, K, V: (3H, H) or (3H,).
    A view of the shared storage (`share_storage`) when the layout allows (with autograd, through `_Stacked`),
    else a copy (`torch.cat`)."""
    params = [getattr(linear, name) for linear in linears]
    tracked = torch.is_grad_enabled() and any(param.requires_grad for param in params)
    if tracked and (torch.onnx.is_in_onnx_export() or torch.jit.is_tracing() or torch.compiler.is_compiling()):
        return torch.cat(params)  # an exported graph would bake the view's offsets in as constant indices
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
    stacked = first.detach().as_strided((len(params) * first.shape[0], *first.shape[1:]), first.stride())
    if tracked:
        return _Stacked.apply(stacked, *params)  # autograd reaches each parameter
    return stacked
