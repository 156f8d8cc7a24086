"""The BERT encoder (Devlin et al. 2019, §3): embeddings, post-LN Transformer layers, pooler.

Shapes: B = batch, S = sequence length, H = hidden size, A = attention heads, D = H / A.
Module attribute names follow the checkpoint layout the ecosystem uses
(`encoder.layer.0.attention.self.query.weight`, ...), so `state_dict()` is that layout and
checkpoints move to and from Hugging Face transformers without renaming.

Unpadded execution (`model(..., unpad=True)` per call, or the model's `unpad` attribute): the real
tokens of a padded batch are packed into one (T, H) sequence, T = the number of real tokens, for
the embeddings and every dense layer, attention runs per example (`Packing`), and the result is
scattered back to (B, S, H) at the end. T is often half of B·S on real text, and the dense layers
are most of the work.

This file holds the paper's layers, top to bottom, each with its padded and packed forward. The
machinery of the fast paths lives beside it: packing.py (the unpadded path: `Packing`, row buckets,
packed attention) and kernels.py (CPU inference: reused buffers, in-place updates, the oneDNN linear,
the fused QKV storage); dropout.py the CPU dropout mask. It is a little over 400 lines because the layers and `BertModel.forward`'s
choice between the paths read best in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import BertConfig
from .dropout import Dropout, dropout, scaled_dot_product_attention
from .kernels import (_ONEDNN_LINEAR, Linear, PackedWeight, Workspace, _autocasting,  # noqa: F401
                      fused_linear_activation, inplace_activation, linear, may_overwrite_output, onednn_linear_op,
                      project, share_storage, stacked_parameter)
from .packing import (DEFAULT_ROW_BUCKET, Packing, bucket_size, first_token_attention,  # noqa: F401 (re-exported)
                      packed_attention)
from .pretrained import PreTrainedBert


def activation(name: str):
    if name == "gelu":
        return F.gelu  # erf form, as Google's modeling.py
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    return F.relu


@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor  # (B, S, H); (B, 1, H), the [CLS] rows, when called with cls_only
    pooler_output: torch.Tensor | None = None  # (B, H): tanh(W · h_[CLS] + b)
    hidden_states: tuple[torch.Tensor, ...] | None = None  # embeddings, then each layer: (B, S, H)
    attentions: tuple[torch.Tensor, ...] | None = None  # each layer: (B, A, S, S)


class BertEmbeddings(nn.Module):
    """Token + segment + learned position embeddings, then LayerNorm and dropout (Figure 2)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def check_length(self, seq_length: int) -> None:
        max_positions = self.position_embeddings.num_embeddings
        if seq_length > max_positions:
            raise ValueError(
                f"input_ids has {seq_length} tokens but the model has only {max_positions} position "
                "embeddings: truncate the input (max_length) or use sliding windows"
            )

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, token_type_ids: (B, S) -> (B, S, H); positions 0 .. S-1.

        With `position_ids` (the packed tokens of the unpadded path): input_ids, token_type_ids and
        position_ids (T,) -> (T, H), the same values as those tokens' rows of the padded call.
        """
        if position_ids is None:
            seq_length = input_ids.shape[1]
            self.check_length(seq_length)
            positions = self.position_embeddings.weight[:seq_length]
        else:
            positions = self.position_embeddings(position_ids)
        embeddings = self.word_embeddings(input_ids)
        if token_type_ids is None:  # all segment A: one broadcast row instead of a gather
            token_types = self.token_type_embeddings.weight[0]
        else:
            token_types = self.token_type_embeddings(token_type_ids)
        if may_overwrite_output(self.word_embeddings) and embeddings.dtype == token_types.dtype == positions.dtype:
            embeddings.add_(token_types).add_(positions)  # same order, same rounding
        else:
            embeddings = embeddings + token_types + positions
        return self.dropout(self.LayerNorm(embeddings))


class MultiHeadSelfAttention(nn.Module):
    """softmax(Q Kᵀ / √D + mask) V for A heads at once (Vaswani et al. 2017, §3.2.2)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.dropout_p = config.attention_probs_dropout_prob
        # A module computing all three projections at once, (..., H) -> (..., 3H), that replaces
        # query/key/value when set: int8 quantization (`optimize_for_inference`) quantizes the
        # fused (3H, H) weight as one matrix. None: the three Linears, fused through `_fused`.
        self.qkv: nn.Module | None = None
        # oneDNN's packed copy of the stacked (3H, H) weight for CPU inference (`kernels.PackedWeight`),
        # set by `optimize_for_inference`.
        self.packed_qkv: PackedWeight | None = None
        self._share_qkv_storage()

    def _share_qkv_storage(self) -> None:
        """Lay the query, key and value weights (and biases) side by side in memory (`kernels.share_storage`):
        without autograd `_fused` then reads the (3H, H) weight in place instead of concatenating it."""
        share_storage((self.query, self.key, self.value))

    def _fused(self, name: str) -> torch.Tensor:
        """The (3H, H) weight or (3H,) bias of the Q, K, V projections, stacked in that order."""
        return stacked_parameter((self.query, self.key, self.value), name)

    def project_qkv(self, hidden_states: torch.Tensor, workspace: Workspace | None = None) -> torch.Tensor:
        """(..., H) -> (..., 3H): the query, key and value projections side by side."""
        if self.qkv is not None:
            return self.qkv(hidden_states)
        # One (H, 3H) matmul instead of three (H, H) ones: fewer, larger GEMMs are faster on every
        # backend, and the parameters keep their separate checkpoint names.
        return project(hidden_states, self._fused("weight"), self._fused("bias"), workspace, "qkv", self.packed_qkv)

    def forward(
        self, hidden_states: torch.Tensor, mask: torch.Tensor | None, output_attentions: bool = False,
        workspace: Workspace | None = None, packing: Packing | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states: (B, S, H); mask: bool (B or 1, 1, S or 1, K), True = may attend. K < S
        (without output_attentions) says that keys from K on are masked for every query.

        Returns the context (B, S, H) and, if asked, the attention probabilities (B, A, S, S).
        With `packing` (the unpadded path): hidden_states (T, H) -> context (T, H); `mask` is not
        used (each example attends to its own tokens) and there are no probabilities.
        """
        if packing is not None:
            return self._forward_packed(hidden_states, packing, workspace), None
        batch, seq_length, hidden = hidden_states.shape
        qkv = self.project_qkv(hidden_states, workspace)
        qkv = qkv.view(batch, seq_length, 3, self.num_heads, hidden // self.num_heads).permute(2, 0, 3, 1, 4)
        query, key, value = qkv.unbind(0)  # each (B, A, S, D)
        dropout_p = self.dropout_p if self.training else 0.0
        if output_attentions:
            # × D^-½ rather than ÷ √D: the same rounding as scaled_dot_product_attention's default
            # scale and the ecosystem's eager attention (÷ √D differs by up to ~2e-5 in the probabilities).
            scores = (query @ key.transpose(-1, -2)) * query.shape[-1] ** -0.5
            if mask is not None:
                scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            probs = scores.softmax(dim=-1)
            context = dropout(probs, dropout_p, self.training) @ value
        else:
            probs = None
            keys = seq_length if mask is None else mask.shape[-1]
            if keys < seq_length:  # the mask covers only the keys any query may see (attention_mask_for)
                key, value = key[:, :, :keys], value[:, :, :keys]
            context = scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p)
        return context.transpose(1, 2).reshape(batch, seq_length, hidden), probs

    def first_token_context(self, hidden_states: torch.Tensor, first: torch.Tensor, mask: torch.Tensor | None,
                            packing: Packing | None = None) -> torch.Tensor:
        """The context at each example's first token only, attending to all its keys: hidden_states
        (B, S, H) and their first tokens `first` (B, H), mask (B or 1, 1, 1, S) or None -> (B, H); with
        `packing`, (T, H) and (N, H) -> (N, H) in packed example order (`first_token_attention`). Keys and
        values are projected for every token, the query for the first tokens only."""
        dropout_p = self.dropout_p if self.training else 0.0
        hidden = hidden_states.shape[-1]
        if self.qkv is not None:  # a module that projects all three at once (int8): every row's query too
            qkv = self.project_qkv(hidden_states)
            query = (qkv[:, 0] if packing is None else qkv[packing.first_rows()])[:, :hidden]
            key_value = qkv[..., hidden:]
        else:
            pair = (self.key, self.value)
            query = F.linear(first, self.query.weight, self.query.bias)
            key_value = F.linear(hidden_states, stacked_parameter(pair, "weight"), stacked_parameter(pair, "bias"))
        if packing is not None:
            return first_token_attention(query, key_value, packing, self.num_heads, dropout_p)
        batch, seq_length, _ = hidden_states.shape
        key, value = key_value.view(batch, seq_length, 2, self.num_heads, hidden // self.num_heads).permute(
            2, 0, 3, 1, 4).unbind(0)  # each (B, A, S, D)
        query = query.view(batch, self.num_heads, 1, hidden // self.num_heads)
        context = scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p)
        return context.reshape(batch, hidden)

    def _forward_packed(self, hidden_states: torch.Tensor, packing: Packing,
                        workspace: Workspace | None) -> torch.Tensor:
        """(T, H) -> (T, H): attention within each example of the packed batch (`packed_attention`)."""
        qkv = self.project_qkv(hidden_states, workspace)  # (T, 3H)
        return packed_attention(qkv, packing, self.num_heads, self.dropout_p if self.training else 0.0, workspace)


class ResidualLayerNorm(nn.Module):
    """LayerNorm(x + Dropout(Dense(h))): the "Add & Norm" that closes both sub-layers (post-LN)."""

    def __init__(self, in_features: int, config: BertConfig):
        super().__init__()
        self.dense = Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor,
                workspace: Workspace | None = None) -> torch.Tensor:
        if workspace is not None:
            hidden_states = project(hidden_states, self.dense.weight, self.dense.bias, workspace, "hidden",
                                    getattr(self.dense, "packed_weight", None))
            return self.LayerNorm(self.dropout(hidden_states).add_(residual))
        hidden_states = self.dropout(self.dense(hidden_states))
        if may_overwrite_output(self.dense, self.dropout) and hidden_states.dtype == residual.dtype:
            return self.LayerNorm(hidden_states.add_(residual))
        return self.LayerNorm(hidden_states + residual)


class Attention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = MultiHeadSelfAttention(config)  # named `self` by the checkpoint layout
        self.output = ResidualLayerNorm(config.hidden_size, config)

    def forward(self, hidden_states, mask, output_attentions=False, workspace=None, packing=None):
        # `packing` is passed on only when set, so that a replaced attention module (a subclass
        # or a wrapper from another library) that knows nothing of it keeps working on the padded path.
        extra = {} if packing is None else {"packing": packing}
        context, probs = self.self(hidden_states, mask, output_attentions, workspace=workspace, **extra)
        return self.output(context, hidden_states, workspace=workspace), probs


class FeedForwardExpansion(nn.Module):
    """The first half of the position-wise feed-forward network: H -> 4H and GELU."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = Linear(config.hidden_size, config.intermediate_size)
        self.activation = activation(config.hidden_act)
        self.activation_ = inplace_activation(config.hidden_act)
        self.hidden_act = config.hidden_act

    def forward(self, hidden_states: torch.Tensor, workspace: Workspace | None = None) -> torch.Tensor:
        if isinstance(self.dense, nn.Linear) and may_overwrite_output(self.dense):
            # float32/bfloat16 inference on CPU: the activation fused into the matmul (None elsewhere)
            fused = fused_linear_activation(hidden_states, self.dense.weight, self.dense.bias, self.hidden_act,
                                            getattr(self.dense, "packed_weight", None))
            if fused is not None:
                return fused
        if workspace is not None and self.activation_ is not None:
            hidden_states = project(hidden_states, self.dense.weight, self.dense.bias, workspace, "intermediate",
                                    getattr(self.dense, "packed_weight", None))
            return self.activation_(hidden_states)
        hidden_states = self.dense(hidden_states)
        if self.activation_ is not None and may_overwrite_output(self.dense):
            return self.activation_(hidden_states)  # (B, S, 4H): the largest tensor of the layer
        return self.activation(hidden_states)


class TransformerLayer(nn.Module):
    """Self-attention, Add & Norm, feed-forward (4H, GELU), Add & Norm."""

    # Sharded training (FSDP) wraps each module whose class sets this as one unit, gathered only for its
    # own forward and backward; the Trainer reads it and knows no model class.
    fsdp_unit = True

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = Attention(config)
        self.intermediate = FeedForwardExpansion(config)
        self.output = ResidualLayerNorm(config.intermediate_size, config)

    def forward(self, hidden_states, mask, output_attentions=False, workspace=None, packing=None):
        """hidden_states (B, S, H) -> (B, S, H); with `packing` (unpadded), (T, H) -> (T, H)."""
        extra = {} if packing is None else {"packing": packing}
        attended, probs = self.attention(hidden_states, mask, output_attentions, workspace=workspace, **extra)
        expanded = self.intermediate(attended, workspace=workspace)
        return self.output(expanded, attended, workspace=workspace), probs

    def forward_first(self, hidden_states: torch.Tensor, mask: torch.Tensor | None,
                      packing: Packing | None = None) -> torch.Tensor:
        """The layer's output at each example's first token ([CLS]) only, all that the pooler reads of the
        last layer: hidden_states (B, S, H) -> (B, H); with `packing`, (T, H) -> (N, H) in packed example
        order. Keys and values still come from every token; the query, output projection, feed-forward
        and norms run on one row per example instead of all of them (`BertModel.forward`'s `cls_only`)."""
        first = hidden_states[:, 0] if packing is None else hidden_states[packing.first_rows()]
        context = self.attention.self.first_token_context(hidden_states, first, mask, packing)
        attended = self.attention.output(context, first)
        return self.output(self.intermediate(attended), attended)


class Encoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(TransformerLayer(config) for _ in range(config.num_hidden_layers))


class Pooler(nn.Module):
    """tanh(W h_[CLS] + b): the sentence vector C used by the NSP and classification heads."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(B, S, H) -> (B, H). The [CLS] rows are copied out first: as a view their row stride is S·H,
        and oneDNN (bf16 on CPU) builds a new matmul kernel for every stride, so for every S."""
        return torch.tanh(self.dense(hidden_states[:, 0].contiguous()))


KEY_BLOCK = 32  # keys are cut to a multiple of this: whole SIMD vectors, so the same sums


def attention_mask_for(attention_mask: torch.Tensor | None, seq_length: int, is_causal: bool,
                       device: torch.device, trim_keys: bool = False) -> torch.Tensor | None:
    """The boolean mask that scaled_dot_product_attention takes: (B, 1, 1, S), (B or 1, 1, S, S) or None.

    None when every token may see every token, so that the fused attention kernels can run.

    With `trim_keys`, the mask's last dimension stops after the last key that any query may see
    (rounded up to a multiple of KEY_BLOCK): trailing padding common to the whole batch, as
    `padding="max_length"` leaves it, then costs no attention. Queries are not cut, so every
    position still gets its output, and the dropped keys had weight exactly 0.
    """
    mask = None
    if attention_mask is not None and not bool(attention_mask.all()):
        mask = attention_mask.bool()[:, None, None, :]
    if is_causal:
        causal = torch.ones(seq_length, seq_length, dtype=torch.bool, device=device).tril()[None, None]
        mask = causal if mask is None else mask & causal
    if trim_keys and mask is not None:
        seen = mask.reshape(-1, mask.shape[-1]).any(0).nonzero()
        if len(seen):
            keys = -(-(int(seen[-1]) + 1) // KEY_BLOCK) * KEY_BLOCK
            if keys < mask.shape[-1]:
                mask = mask[..., :keys]
    return mask


_WORKSPACE_MODULES = (Encoder, nn.ModuleList, TransformerLayer, Attention, MultiHeadSelfAttention,
                      ResidualLayerNorm, FeedForwardExpansion, nn.Linear, Linear, nn.LayerNorm, Dropout)


class BertModel(PreTrainedBert):
    """The bidirectional Transformer encoder, with the pooler unless `add_pooling_layer=False`."""

    base_model_prefix = ""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = Encoder(config)
        self.pooler = Pooler(config) if add_pooling_layer else None
        # The default of `forward`'s `unpad`: set it (or `optimize_for_inference(model, unpad=True)`)
        # to run a head class's encoder unpadded without changing its calls.
        self.unpad = False
        # The unpadded path's packed length is rounded up to a bucket (`Packing`, row_bucket): 0 (off)
        # here; `optimize_for_inference` turns it on for inference.
        self.unpad_row_bucket = 0
        self.init_weights()

    def prepare_cpu_training(self) -> None:
        """Round the unpadded path's packed length up to a few sizes (`Packing`'s row_bucket) for training
        on CPU; the Trainer calls this on every submodule that has it, when its device is the CPU.

        On CPU the matmuls of training run in oneDNN (fp32 too, not only under autocast), which builds and
        caches a kernel for each matrix shape, and unpadded batches have a new number of real tokens
        nearly every step: without buckets memory keeps growing and steps slow down (BENCHMARKS.md,
        pre-training memory). The filler rows attend to nothing and are dropped, so losses and gradients
        are those of the exact packing. A bucket step already set is kept.
        """
        if self.unpad_row_bucket == 0:
            self.unpad_row_bucket = DEFAULT_ROW_BUCKET

    def _inference_fast_path(self, input_ids: torch.Tensor) -> bool:
        """Inference on CPU with the encoder as built: no autograd or autocast, no hook anywhere that
        could keep a reference to a reused buffer (as a module's input or output), and no submodule
        replaced by another kind (which might not take a workspace or a key-trimmed mask)."""
        hooks = nn.modules.module
        if (torch.is_grad_enabled() or input_ids.device.type != "cpu" or _autocasting()
                or hooks._global_forward_hooks or hooks._global_forward_pre_hooks):
            return False
        return all(type(module) in _WORKSPACE_MODULES and not module._forward_hooks
                   and not module._forward_pre_hooks for module in self.encoder.modules())

    def _first_only_ok(self) -> bool:
        """Whether the last layer may run at [CLS] only (`forward`'s cls_only): a non-causal encoder whose
        last layer is this module's own TransformerLayer, without hooks that would miss the call."""
        if self.config.is_causal or not len(self.encoder.layer):
            return False
        layer = self.encoder.layer[-1]
        hooks = nn.modules.module
        if hooks._global_forward_hooks or hooks._global_forward_pre_hooks:
            return False
        return (type(layer) is TransformerLayer and type(layer.attention) is Attention
                and isinstance(layer.attention.self, MultiHeadSelfAttention)
                and not any(module._forward_hooks or module._forward_pre_hooks for module in layer.modules()))

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        unpad: bool | None = None,
        cls_only: bool = False,
    ) -> EncoderOutput:
        """input_ids, token_type_ids, attention_mask (1 = real token, 0 = padding): (B, S).

        `unpad` (default: the `unpad` attribute, False unless set): compute only the real tokens
        (see `Packing`) when the batch has padding. The outputs at real positions, and the pooled
        vector where position 0 is real, equal the padded path's to float rounding (≤ 1e-5 in
        fp32); padding positions hold zeros. With output_attentions, or without an attention mask
        or padding, the padded path runs (there is nothing to remove, or the (B, A, S, S)
        probabilities are asked for), except that in inference (no autograd) with row buckets
        (`unpad_row_bucket` > 0) a batch without padding is packed too, so that its shapes are
        bucketed like every other batch's.

        `cls_only`: the caller reads only position 0 ([CLS]) of the last layer (the pooler, a sentence
        classifier): the last layer then runs its query, output projection, feed-forward and norms on
        that row alone (`TransformerLayer.forward_first`; keys and values still come from every token),
        and last_hidden_state is (B, 1, H), equal to the full call's [CLS] row to float rounding. For a
        6-layer encoder that is about a seventh of the dense work. It is ignored (the full last layer runs)
        with output_hidden_states or output_attentions, for a causal model, on the CPU inference fast
        path (whose kernels are laid out per full batch), when the last layer is not this module's own
        or has hooks, and on the unpadded path when some example's position 0 is padding.
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, seq_length), got shape {tuple(input_ids.shape)}")
        if unpad is None:
            unpad = self.unpad
        if not isinstance(unpad, bool):
            raise TypeError(f"unpad must be True, False or None (the model's default), got {unpad!r}")
        fast = self._inference_fast_path(input_ids)
        cls_only = cls_only and not (output_hidden_states or output_attentions or fast) and self._first_only_ok()
        # In inference with row buckets a batch without padding is packed too, so that its B·S rows
        # land on a bucket as well (the padded path would show the kernels a new (B, S) nearly every call).
        pack_always = bool(self.unpad_row_bucket) and not torch.is_grad_enabled()
        if unpad and not output_attentions and (attention_mask is not None or pack_always):
            if attention_mask is None:
                attention_mask = torch.ones_like(input_ids)
            if attention_mask.shape != input_ids.shape:
                raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids "
                                 f"{tuple(input_ids.shape)}")
            if pack_always or not bool(attention_mask.bool().all()):
                return self._forward_unpadded(input_ids, token_type_ids, attention_mask, output_hidden_states,
                                              Workspace() if fast else None, cls_only)
        # Keys are cut only where no (B, A, S, S) probabilities are asked for (and, being on CPU,
        # finding the last real key costs no device sync).
        mask = attention_mask_for(attention_mask, input_ids.shape[1], self.config.is_causal, input_ids.device,
                                  trim_keys=fast and not output_attentions)
        hidden = self.embeddings(input_ids, token_type_ids)
        all_hidden = [hidden] if output_hidden_states else None
        all_attentions = [] if output_attentions else None
        workspace = Workspace() if fast else None
        last = len(self.encoder.layer) - 1
        for index, layer in enumerate(self.encoder.layer):
            if cls_only and index == last:
                hidden = layer.forward_first(hidden, mask)[:, None]  # (B, 1, H)
                break
            if workspace is None:
                hidden, probs = layer(hidden, mask, output_attentions)
            else:
                hidden, probs = layer(hidden, mask, output_attentions, workspace=workspace)
            if output_hidden_states:
                all_hidden.append(hidden)
            if output_attentions:
                all_attentions.append(probs)
        return EncoderOutput(
            last_hidden_state=hidden,
            pooler_output=self.pooler(hidden) if self.pooler is not None else None,
            hidden_states=tuple(all_hidden) if output_hidden_states else None,
            attentions=tuple(all_attentions) if output_attentions else None,
        )

    def _forward_unpadded(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                          attention_mask: torch.Tensor, output_hidden_states: bool,
                          workspace: Workspace | None, cls_only: bool = False) -> EncoderOutput:
        """The unpadded path: pack (B, S) -> (T,), run every layer on (T, H), scatter back to (B, S, H);
        with `cls_only` (and a real token at every example's position 0) the last layer -> (B, 1, H)."""
        self.embeddings.check_length(input_ids.shape[1])
        packing = Packing.from_mask(attention_mask, self.config.is_causal, self.unpad_row_bucket)
        hidden = self.embeddings(packing.pack(input_ids),
                                 None if token_type_ids is None else packing.pack(token_type_ids),
                                 position_ids=packing.positions)
        all_hidden = [packing.unpack(hidden)] if output_hidden_states else None
        first_only = cls_only and bool(attention_mask[:, 0].all())
        last = len(self.encoder.layer) - 1
        for index, layer in enumerate(self.encoder.layer):
            if first_only and index == last:
                sequence = packing.batch_order(layer.forward_first(hidden, None, packing))[:, None]  # (B, 1, H)
                return EncoderOutput(last_hidden_state=sequence,
                                     pooler_output=self.pooler(sequence) if self.pooler is not None else None)
            hidden, _ = layer(hidden, None, False, workspace=workspace, packing=packing)
            if output_hidden_states:
                all_hidden.append(packing.unpack(hidden))
        sequence = all_hidden[-1] if output_hidden_states else packing.unpack(hidden)
        return EncoderOutput(
            last_hidden_state=sequence,
            pooler_output=self.pooler(sequence) if self.pooler is not None else None,
            hidden_states=tuple(all_hidden) if output_hidden_states else None,
        )


def use_unpadded(model: nn.Module, unpad: bool = True) -> None:
    """Make every BERT encoder inside `model` run unpadded by default (`BertModel.unpad`): the same results
    to rounding, with no compute spent on padding whatever the batch composition."""
    for module in model.modules():
        if isinstance(module, BertModel):
            module.unpad = unpad
