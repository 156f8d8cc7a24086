"""How one forward pass of the encoder runs: its execution plan, chosen once per call, at the edge.

The paper's layers (bert.py) compute the same thing on every plan. They call their plan, by name, for
what differs between the ways to run them:

- the dense products: `linear(module, x, key)`, `linear_activation(module, x, hidden_act)`,
  `project_qkv(attention, x)`, and `add(x, other, *sources)` (the residual and embedding sums);
- attention: `attention(qkv, mask, num_heads, dropout_p, output_attentions)`;
- the layout in and out: `embedding_inputs(...)`, `unpack(hidden)`, `gather(sequence)` (the call's
  output_positions of a full last layer);
- the last layer: in full, or at some of its rows only (`last_rows`, a `LastRows`: [CLS] with its
  query there alone, `FirstTokens`; or given rows after full attention, `RowsAt`, from `rows_at`), which
  `split_last(layers)` and `last_layer(layer, hidden)` run through `TransformerLayer.forward_rows`.

Dropout is the layers' own `Dropout` modules (dropout.py: a cheaper mask on CPU, `F.dropout` elsewhere).

A plan is a layout and a set of product kernels:

- layouts: `PaddedPlan`, (B, S, H) with a key mask: the reference, what ONNX export traces, and the
  layout of output_attentions; `PackedPlan`, the (T, H) real tokens (`packing.Packing`), attention in
  `attention.packed_attention`, the packed length bucketed on CPU; `VarlenPlan`, the packed layout on
  CUDA, attention in one FlashAttention call over the batch's cumulative sequence lengths
  (`attention.varlen_attention`) instead of one call per length.
- products: `Reference`, every product a module call and every sum a fresh tensor (autograd, autocast,
  forward hooks see what they expect); `InPlace`, inference: sums and the activation written in place
  and oneDNN's GELU fused into its matmul, except where a hook could see it; `CpuInference`, inference
  on CPU with the encoder's own, unhooked modules: projections into a reused `kernels.Workspace` and
  oneDNN's packed weights (`kernels.PackedWeight`, set by `optimize_for_inference`).

`choose_plan` is the one place that decides, from the call (unpad, output_attentions, output_hidden_states,
cls_only, output_positions), the autograd, autocast and hook state, the device, and what the edge set on
the model: `unpad` (`use_unpadded`, `optimize_for_inference`, the finetune CLI), `unpad_row_bucket`
(`optimize_for_inference`, the Trainer through `BertModel.prepare_cpu_training`) and the packed weights.
That includes how the last layer runs: in full, at [CLS] only, or at given rows (bucketed in inference).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import (attention_mask_for, first_token_attention, packed_attention, padded_attention,
                        varlen_applies, varlen_attention)
from .kernels import (Workspace, activation, fused_linear_activation, inplace_activation, linear,
                      may_overwrite_output, project, stacked_parameter)
from .packing import Packing, bucket_size, host_copy

__all__ = ["CpuInference", "FirstTokens", "InPlace", "LastRows", "PackedPlan", "PaddedPlan", "Plan", "REFERENCE",
           "Reference", "RowsAt", "VarlenPlan", "choose_plan", "gather_indexes"]


class Reference:
    """Products for autograd, autocast and hooks: each dense product a module call (`kernels.linear` for
    the stacked Q, K, V weights), each sum a fresh tensor."""

    workspace: Workspace | None = None
    # Whether a [CLS]-only last layer runs at the [CLS] rows as `RowsAt` (full attention, the rest at those
    # rows) rather than `FirstTokens` (one query per example): `CpuInference`'s kernels take rows only.
    first_token_as_rows = False

    def linear(self, module: nn.Module, x: torch.Tensor, key: str) -> torch.Tensor:
        """module(x); `key` names the product's reused buffer on `CpuInference`."""
        return module(x)

    def linear_activation(self, module: nn.Module, x: torch.Tensor, hidden_act: str) -> torch.Tensor:
        return activation(hidden_act)(module(x))

    def add(self, x: torch.Tensor, other: torch.Tensor, *sources: nn.Module) -> torch.Tensor:
        """x + other; `sources`: the modules that returned x (whose hooks may hold it)."""
        return x + other

    def project_qkv(self, attention: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., 3H): the query, key and value projections side by side, one (H, 3H) matmul
        (fewer, larger GEMMs are faster on every backend); `attention.qkv` where int8 set one."""
        if attention.qkv is not None:
            return attention.qkv(x)
        return linear(x, attention._fused("weight"), attention._fused("bias"), attention.packed_qkv)


class InPlace(Reference):
    """Inference (no autograd, autocast or global hook): sums and the activation overwrite a freshly
    computed tensor, saving an allocation each (and its page faults), and the GELU runs inside oneDNN's
    matmul (`kernels.fused_linear_activation`; None where that does not apply), except where a forward
    hook on the module that returned the tensor could have kept it. The same values as `Reference`."""

    def linear_activation(self, module: nn.Module, x: torch.Tensor, hidden_act: str) -> torch.Tensor:
        if isinstance(module, nn.Linear) and not module._forward_hooks:
            fused = fused_linear_activation(x, module.weight, module.bias, hidden_act,
                                            getattr(module, "packed_weight", None))
            if fused is not None:
                return fused
        out = module(x)
        in_place = inplace_activation(hidden_act)
        if in_place is None or module._forward_hooks:
            return activation(hidden_act)(out)
        return in_place(out)  # (.., 4H): the largest tensor of the layer

    def add(self, x: torch.Tensor, other: torch.Tensor, *sources: nn.Module) -> torch.Tensor:
        if x.dtype != other.dtype:
            return x + other
        for source in sources:
            if source._forward_hooks:
                return x + other
        return x.add_(other)  # the same order, the same rounding


class CpuInference(InPlace):
    """`InPlace` on CPU with the encoder's own modules and no hook in it: each product through oneDNN
    with the weight packed once (`kernels.project`), or with the BLAS into one reused buffer per product
    (`Workspace`: the layers consume each within the layer). One per forward pass, never shared."""

    first_token_as_rows = True

    def __init__(self) -> None:
        self.workspace = Workspace()

    def linear(self, module: nn.Module, x: torch.Tensor, key: str) -> torch.Tensor:
        return project(x, module.weight, module.bias, self.workspace, key, getattr(module, "packed_weight", None))

    def linear_activation(self, module: nn.Module, x: torch.Tensor, hidden_act: str) -> torch.Tensor:
        packed = getattr(module, "packed_weight", None)
        fused = fused_linear_activation(x, module.weight, module.bias, hidden_act, packed)
        if fused is not None:
            return fused
        in_place = inplace_activation(hidden_act)
        if in_place is None:
            return activation(hidden_act)(module(x))
        return in_place(project(x, module.weight, module.bias, self.workspace, "intermediate", packed))

    def project_qkv(self, attention: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return project(x, attention._fused("weight"), attention._fused("bias"), self.workspace, "qkv",
                       attention.packed_qkv)


REFERENCE_PRODUCTS, IN_PLACE = Reference(), InPlace()


class Plan:
    """A layout with its products' methods bound once per forward pass. `mask`: what the layers pass to
    attention; `cls_only`: the last layer runs at each example's first token only; `last_rows`: where
    the last layer runs (None: in full); `positions`: the output_positions gathered from a full last layer."""

    mask: torch.Tensor | None = None
    packing: Packing | None = None
    last_rows: LastRows | None = None
    positions: torch.Tensor | None = None

    def __init__(self, products: Reference, cls_only: bool = False) -> None:
        self.linear, self.linear_activation = products.linear, products.linear_activation
        self.add, self.project_qkv, self.workspace = products.add, products.project_qkv, products.workspace
        self.cls_only = cls_only
        self.first_token_as_rows = products.first_token_as_rows  # see Reference

    def split_last(self, layers: nn.ModuleList) -> tuple[list[nn.Module], nn.Module | None]:
        """The layers to run in full, and the last one where it runs at `last_rows` only (else None)."""
        layers = list(layers)
        return (layers, None) if self.last_rows is None else (layers[:-1], layers[-1])

    def last_layer(self, layer: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """The last layer at `last_rows` only (`TransformerLayer.forward_rows`) -> (B, P, H): (B, 1, H) for [CLS]."""
        return self.last_rows.output(self, layer.forward_rows(hidden, self.mask, self.last_rows, self))

    def gather(self, sequence: torch.Tensor) -> torch.Tensor:
        """A full last layer's (B, S, H) -> the rows the call asked for: (B, P, H) at `positions`, if any."""
        return sequence if self.positions is None else gather_indexes(sequence, self.positions)

    def rows_at(self, positions: torch.Tensor, seq_length: int, row_bucket: int) -> RowsAt:
        """The last layer at positions (B, P) of the padded batch: each distinct row of the layout once (a
        batch's positions are padded to its longest row, so repeat) and, in inference, their count
        bucketed as the packed length is (`packing.bucket_size`, step `row_bucket`): few kernel shapes."""
        rows, where = torch.unique(self._flat_rows(positions, seq_length), return_inverse=True)
        count = rows.shape[0]
        filler = 0 if torch.is_grad_enabled() else bucket_size(count, row_bucket) - count
        if filler:
            rows = torch.cat([rows, rows[:1].expand(filler)])
        return RowsAt(rows, where, tuple(positions.shape))


class PaddedPlan(Plan):
    """The (B, S, H) batch, padding included, with `mask` from `attention.attention_mask_for`."""

    def __init__(self, products: Reference, mask: torch.Tensor | None = None, cls_only: bool = False) -> None:
        super().__init__(products, cls_only)
        self.mask = mask

    def embedding_inputs(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> tuple:
        return input_ids, token_type_ids, None

    def attention(self, qkv: torch.Tensor, mask: torch.Tensor | None, num_heads: int, dropout_p: float,
                  output_attentions: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        return padded_attention(qkv, mask, num_heads, dropout_p, output_attentions)

    def first_rows(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden[:, 0]

    def unpack(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    def first_token_output(self, rows: torch.Tensor) -> torch.Tensor:
        return rows[:, None]

    def _flat_rows(self, positions: torch.Tensor, seq_length: int) -> torch.Tensor:
        """positions (B, P) -> (B·P,) rows of hidden (B, S, H) flattened to (B·S, H)."""
        starts = torch.arange(positions.shape[0], device=positions.device)[:, None] * seq_length
        return (positions + starts).reshape(-1)


class PackedPlan(Plan):
    """The real tokens only, (T, H) (`Packing`); attention within each example; no mask, no probabilities."""

    def __init__(self, products: Reference, packing: Packing, cls_only: bool = False) -> None:
        super().__init__(products, cls_only)
        self.packing = packing

    def embedding_inputs(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> tuple:
        packing = self.packing
        return (packing.pack(input_ids), None if token_type_ids is None else packing.pack(token_type_ids),
                packing.positions)

    def attention(self, qkv: torch.Tensor, mask: torch.Tensor | None, num_heads: int, dropout_p: float,
                  output_attentions: bool) -> tuple[torch.Tensor, None]:
        return packed_attention(qkv, self.packing, num_heads, dropout_p, self.workspace), None

    def first_rows(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden[self.packing.first_rows()]  # in packed example order

    def unpack(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.packing.unpack(hidden)

    def first_token_output(self, rows: torch.Tensor) -> torch.Tensor:
        return self.packing.batch_order(rows)[:, None]

    def _flat_rows(self, positions: torch.Tensor, seq_length: int) -> torch.Tensor:
        """positions (B, P) of the padded batch -> (B·P,) rows of the packed hidden (T, H)."""
        return self.packing.rows_of(positions)


class VarlenPlan(PackedPlan):
    """The packed layout on CUDA: attention over the whole batch in one FlashAttention call
    (`attention.varlen_attention`), each example bounded by its cumulative sequence length, wherever
    FlashAttention runs (bf16/fp16: autocast or a cast model, `attention.varlen_applies`); float32
    falls back to `PackedPlan`'s attention. Every index it needs is built on the host (`Packing`), so a
    step on it never waits for the device."""

    def attention(self, qkv: torch.Tensor, mask: torch.Tensor | None, num_heads: int, dropout_p: float,
                  output_attentions: bool) -> tuple[torch.Tensor, None]:
        if varlen_applies(qkv, num_heads):
            return varlen_attention(qkv, self.packing, num_heads, dropout_p), None
        return super().attention(qkv, mask, num_heads, dropout_p, output_attentions)


class LastRows:
    """Which rows of the last layer run, and how their attention is computed (`choose_plan` picks one:
    `Plan.last_rows`). `take`: those rows of a (B, S, H) or packed (T, H) tensor -> (N, H); `context`:
    the attention's context at them, keys and values from every token; `output`: the layer's (N, H)
    rows as the call's (B, P, H). Each takes the plan (none keeps one: its buffers are freed with it)."""

    def take(self, plan: Plan, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def context(self, plan: Plan, attention: nn.Module, hidden: torch.Tensor, rows: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def output(self, plan: Plan, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class FirstTokens(LastRows):
    """Each example's first token ([CLS]), its query projected and attending there alone: one query per
    example (`attention.first_token_attention`). The [CLS]-only last layer of `Reference` and `InPlace`."""

    def take(self, plan: Plan, hidden: torch.Tensor) -> torch.Tensor:
        return plan.first_rows(hidden)

    def context(self, plan: Plan, attention: nn.Module, hidden: torch.Tensor, rows: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        """Keys and values projected for every token, the query for the first tokens `rows` (N, H) only
        (for int8's one quantized (3H, H) module, every row's)."""
        width = hidden.shape[-1]
        if attention.qkv is not None:
            qkv = attention.qkv(hidden)
            query, key_value = plan.first_rows(qkv)[:, :width], qkv[..., width:]
        else:
            pair = (attention.key, attention.value)
            query = F.linear(rows, attention.query.weight, attention.query.bias)
            key_value = F.linear(hidden, stacked_parameter(pair, "weight"), stacked_parameter(pair, "bias"))
        dropout_p = attention.dropout_p if attention.training else 0.0
        return first_token_attention(query, key_value, plan.packing, attention.num_heads, dropout_p, mask)

    def output(self, plan: Plan, rows: torch.Tensor) -> torch.Tensor:
        return plan.first_token_output(rows)


class RowsAt(LastRows):
    """Rows (N,) of the layout flattened to (B·S or T, H) (`Plan.rows_at`), every query attending and the
    context then taken at them: output_positions on every plan, and [CLS] (position 0) on `CpuInference`,
    whose kernels take rows only. `where` (B·P,) puts the N rows back as (B, P, H), `shape` = (B, P)."""

    def __init__(self, rows: torch.Tensor, where: torch.Tensor, shape: tuple[int, int]) -> None:
        self.rows, self.where, self.shape = rows, where, shape

    def take(self, plan: Plan, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.reshape(-1, hidden.shape[-1])[self.rows]

    def context(self, plan: Plan, attention: nn.Module, hidden: torch.Tensor, rows: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        return self.take(plan, attention(hidden, mask, False, plan)[0])

    def output(self, plan: Plan, rows: torch.Tensor) -> torch.Tensor:
        return rows[self.where].view(*self.shape, rows.shape[-1])


FIRST_TOKENS = FirstTokens()


def gather_indexes(sequence: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """sequence (B, S, H), positions (B, P) -> (B, P, H), as Google's `gather_indexes`."""
    return sequence.gather(1, positions.unsqueeze(-1).expand(-1, -1, sequence.shape[-1]))


# What a layer called on its own runs: padded, every product a module call.
REFERENCE = PaddedPlan(REFERENCE_PRODUCTS)


def choose_plan(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                unpad: bool | None, output_hidden_states: bool, output_attentions: bool, cls_only: bool,
                output_positions: torch.Tensor | None = None) -> Plan:
    """The plan of one `BertModel.forward` call (its docstring says what each argument asks for).

    Packed when `unpad` (default: the model's attribute) and the batch has padding, or, in inference
    with row buckets, always (a batch without padding then lands on a bucket too); padded with
    output_attentions, without a mask, or when nothing is padding. The products: `CpuInference` where
    `model._inference_fast_path`, `InPlace` in other inference, else `Reference`. Keys past the last
    real one are cut on the CPU inference path (finding it costs no device sync there). On CUDA the
    packed layout is `VarlenPlan`; the mask is read on the host (`packing.host_copy`).

    The last layer (`Plan.last_rows`) runs at some rows only where the call reads only those (cls_only,
    output_positions), asks for no hidden states or attentions, and the model's last layer allows it
    (`model._last_layer_at_rows_ok`); else in full, output_positions then gathered (`Plan.gather`).
    [CLS]-only: `FirstTokens`, or on `CpuInference` position 0 as `RowsAt` (`Reference.first_token_as_rows`);
    on the packed layout only when every example's position 0 is real. output_positions: `RowsAt`.
    """
    if output_positions is not None:
        if cls_only:
            raise ValueError("cls_only and output_positions ask for different rows of the last layer: give one")
        if output_positions.dim() != 2 or output_positions.shape[0] != input_ids.shape[0]:
            raise ValueError(f"output_positions must be (batch, P) with batch {input_ids.shape[0]} as input_ids, "
                             f"got shape {tuple(output_positions.shape)}")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, seq_length), got shape {tuple(input_ids.shape)}")
    if unpad is None:
        unpad = model.unpad
    if not isinstance(unpad, bool):
        raise TypeError(f"unpad must be True, False or None (the model's default), got {unpad!r}")
    fast = model._inference_fast_path(input_ids)
    products = CpuInference() if fast else IN_PLACE if may_overwrite_output() else REFERENCE_PRODUCTS
    at_rows = ((cls_only or output_positions is not None) and not (output_hidden_states or output_attentions)
               and model._last_layer_at_rows_ok())
    plan = _layout(model, input_ids, attention_mask, unpad, output_attentions, products, fast, cls_only and at_rows)
    if plan.cls_only and plan.first_token_as_rows:  # [CLS] as row 0 of each example (Reference says why)
        output_positions = input_ids.new_zeros(input_ids.shape[0], 1)
    if at_rows and output_positions is not None:
        plan.last_rows = plan.rows_at(output_positions, input_ids.shape[1], model.unpad_row_bucket)
    elif plan.cls_only:
        plan.last_rows = FIRST_TOKENS
    else:
        plan.positions = output_positions
    return plan


def _layout(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, unpad: bool,
            output_attentions: bool, products: Reference, fast: bool, cls_only: bool) -> Plan:
    """`choose_plan`'s layout: packed, varlen or padded, with its mask or `Packing` (choose_plan says when)."""
    pack_always = bool(model.unpad_row_bucket) and not torch.is_grad_enabled()
    if unpad and not output_attentions and (attention_mask is not None or pack_always):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids "
                             f"{tuple(input_ids.shape)}")
        host_mask = host_copy(attention_mask)  # what a device batch carries on the host: no wait for the device
        if pack_always or not bool(host_mask.bool().all()):
            model.embeddings.check_length(input_ids.shape[1])
            packing = Packing.from_mask(attention_mask, model.config.is_causal, model.unpad_row_bucket)
            layout = VarlenPlan if input_ids.device.type == "cuda" else PackedPlan
            return layout(products, packing, cls_only and bool(host_mask[:, 0].all()))
    mask = attention_mask_for(attention_mask, input_ids.shape[1], model.config.is_causal, input_ids.device,
                              trim_keys=fast and not output_attentions)
    return PaddedPlan(products, mask, cls_only)
