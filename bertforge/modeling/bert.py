"""The BERT encoder (Devlin et al. 2019, §3): embeddings, post-LN Transformer layers, pooler.

Shapes: B = batch, S = sequence length, H = hidden size, A = attention heads, D = H / A; T = the real
tokens of a padded batch on the packed (unpadded) layout, whose (T, H) rows the layers take as they
take (B, S, H).
Module attribute names follow the checkpoint layout the ecosystem uses
(`encoder.layer.0.attention.self.query.weight`, ...), so `state_dict()` is that layout and
checkpoints move to and from Hugging Face transformers without renaming.

This file holds the paper's layers, top to bottom, as the paper describes them. How a forward pass
runs (padded or packed, which kernels, which buffers) is its execution plan, chosen once per call by
`plans.choose_plan` from what the edge set (`optimize_for_inference`, `use_unpadded`, the Trainer, the
device); the layers call it by name for the dense products (`plan.linear`, ...), the sums and
attention (`plan.attention`, in attention.py), and `BertModel.forward` asks it how the last layer runs
(in full, or at [CLS] or the output positions only: `Plan.last_rows`). Called on their own, layers run
`plans.REFERENCE`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .attention import KEY_BLOCK, attention_mask_for  # noqa: F401 (re-exported)
from .config import BertConfig
from .dropout import Dropout
from .kernels import Linear, _autocasting, share_storage, stacked_parameter
from .kernels import onednn_linear_op  # noqa: F401 (re-exported)
from .packing import DEFAULT_ROW_BUCKET, Packing, bucket_size  # noqa: F401 (re-exported)
from .plans import REFERENCE, LastRows, Plan, choose_plan
from .plans import gather_indexes  # noqa: F401 (re-exported)
from .pretrained import PreTrainedBert


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
                position_ids: torch.Tensor | None = None, plan: Plan = REFERENCE) -> torch.Tensor:
        """input_ids, token_type_ids: (B, S) -> (B, S, H); positions 0 .. S-1 unless `position_ids`
        (the packed layout's tokens: (T,) -> (T, H), the values of those tokens' rows in (B, S, H))."""
        if position_ids is None:
            self.check_length(input_ids.shape[1])
            positions = self.position_embeddings.weight[:input_ids.shape[1]]
        else:
            positions = self.position_embeddings(position_ids)
        if token_type_ids is None:  # all segment A: one broadcast row instead of a gather
            token_types = self.token_type_embeddings.weight[0]
        else:
            token_types = self.token_type_embeddings(token_type_ids)
        embeddings = plan.add(self.word_embeddings(input_ids), token_types, self.word_embeddings)
        return self.dropout(self.LayerNorm(plan.add(embeddings, positions, self.word_embeddings)))


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
        # fused (3H, H) weight as one matrix. None: the three Linears, stacked (`_fused`).
        self.qkv: nn.Module | None = None
        # oneDNN's packed copy of the stacked (3H, H) weight for CPU inference (`kernels.PackedWeight`),
        # set by `optimize_for_inference`.
        self.packed_qkv = None
        self._share_qkv_storage()

    def _share_qkv_storage(self) -> None:
        """Lay the query, key and value weights (and biases) side by side in memory (`kernels.share_storage`):
        without autograd `_fused` then reads the (3H, H) weight in place instead of concatenating it."""
        share_storage((self.query, self.key, self.value))

    def _fused(self, name: str) -> torch.Tensor:
        """The (3H, H) weight or (3H,) bias of the Q, K, V projections, stacked in that order."""
        return stacked_parameter((self.query, self.key, self.value), name)

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor | None, output_attentions: bool = False,
                plan: Plan = REFERENCE) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states (B, S, H), mask bool (B or 1, 1, S or 1, K), True = may attend -> the context
        (B, S, H) and, if asked, the attention probabilities (B, A, S, S). K < S (without
        output_attentions) says that keys from K on are masked for every query."""
        dropout_p = self.dropout_p if self.training else 0.0
        qkv = plan.project_qkv(self, hidden_states)  # (B, S, 3H): Q, K, V side by side
        return plan.attention(qkv, mask, self.num_heads, dropout_p, output_attentions)


class ResidualLayerNorm(nn.Module):
    """LayerNorm(x + Dropout(Dense(h))): the "Add & Norm" that closes both sub-layers (post-LN)."""

    def __init__(self, in_features: int, config: BertConfig):
        super().__init__()
        self.dense = Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor, plan: Plan = REFERENCE) -> torch.Tensor:
        hidden_states = self.dropout(plan.linear(self.dense, hidden_states, "hidden"))
        return self.LayerNorm(plan.add(hidden_states, residual, self.dense, self.dropout))


class Attention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = MultiHeadSelfAttention(config)  # named `self` by the checkpoint layout
        self.output = ResidualLayerNorm(config.hidden_size, config)

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor | None, output_attentions: bool = False,
                plan: Plan = REFERENCE) -> tuple[torch.Tensor, torch.Tensor | None]:
        context, probs = self.self(hidden_states, mask, output_attentions, plan)
        return self.output(context, hidden_states, plan), probs


class FeedForwardExpansion(nn.Module):
    """The first half of the position-wise feed-forward network: H -> 4H and GELU."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = Linear(config.hidden_size, config.intermediate_size)
        self.hidden_act = config.hidden_act  # "gelu" is erf's, as Google's modeling.py (`kernels.activation`)

    def forward(self, hidden_states: torch.Tensor, plan: Plan = REFERENCE) -> torch.Tensor:
        return plan.linear_activation(self.dense, hidden_states, self.hidden_act)


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

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor | None, output_attentions: bool = False,
                plan: Plan = REFERENCE) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states (B, S, H) -> (B, S, H), and the attention probabilities if asked."""
        attended, probs = self.attention(hidden_states, mask, output_attentions, plan)
        return self.output(self.intermediate(attended, plan), attended, plan), probs

    def forward_rows(self, hidden_states: torch.Tensor, mask: torch.Tensor | None, rows: LastRows,
                     plan: Plan = REFERENCE) -> torch.Tensor:
        """The layer's output at some of its tokens only, those `rows` picks (`plans.choose_plan`: each
        example's [CLS], or the output positions): hidden_states (B, S, H) or the packed (T, H) -> (N, H).
        Keys and values come from every token, the query where `rows` says; the attention's output
        projection, the feed-forward and both norms, three quarters of the layer's work, run at the N
        rows alone (`BertModel.forward`'s cls_only and output_positions)."""
        own = rows.take(plan, hidden_states)
        context = rows.context(plan, self.attention.self, hidden_states, own, mask)
        attended = self.attention.output(context, own, plan)
        return self.output(self.intermediate(attended, plan), attended, plan)


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


# The module types the CPU inference plan knows how to run (`_inference_fast_path`).
_PLAN_MODULES = (Encoder, nn.ModuleList, TransformerLayer, Attention, MultiHeadSelfAttention,
                 ResidualLayerNorm, FeedForwardExpansion, nn.Linear, Linear, nn.LayerNorm, Dropout)


class BertModel(PreTrainedBert):
    """The bidirectional Transformer encoder, with the pooler unless `add_pooling_layer=False`."""

    base_model_prefix = ""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = Encoder(config)
        self.pooler = Pooler(config) if add_pooling_layer else None
        # The default of `forward`'s `unpad`: set it (`use_unpadded`, `optimize_for_inference`) to run a
        # head class's encoder on the packed layout without changing its calls.
        self.unpad = False
        # The packed length's bucket step (`packing.bucket_size`): 0 (exact) here; the CPU plans set it.
        self.unpad_row_bucket = 0
        self.init_weights()

    def prepare_cpu_training(self) -> None:
        """Bucket the packed length (`packing.bucket_size`, which says why) for training on CPU: the Trainer
        calls this on every submodule that has it, when its device is the CPU. The filler rows attend to
        nothing and are dropped: the losses and gradients are those of the exact packing. A bucket step
        already set is kept."""
        if self.unpad_row_bucket == 0:
            self.unpad_row_bucket = DEFAULT_ROW_BUCKET

    def _inference_fast_path(self, input_ids: torch.Tensor) -> bool:
        """Whether the CPU inference plan may run (`plans.CpuInference`): no autograd or autocast, the
        encoder as built, and no hook anywhere that could keep a reference to a reused buffer."""
        hooks = nn.modules.module
        if (torch.is_grad_enabled() or input_ids.device.type != "cpu" or _autocasting()
                or hooks._global_forward_hooks or hooks._global_forward_pre_hooks):
            return False
        return all(type(module) in _PLAN_MODULES and not module._forward_hooks
                   and not module._forward_pre_hooks for module in self.encoder.modules())

    def _last_layer_at_rows_ok(self) -> bool:
        """Whether the last layer may run at some of its tokens only (`forward`'s cls_only and
        output_positions; `plans.choose_plan` asks): a non-causal encoder whose last layer is this
        module's own TransformerLayer, without hooks that would miss the call."""
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
        output_positions: torch.Tensor | None = None,
    ) -> EncoderOutput:
        """input_ids, token_type_ids, attention_mask (1 = real token, 0 = padding): (B, S).

        `unpad` (default: the `unpad` attribute, False unless set): compute only the real tokens
        (`Packing`) when the batch has padding. The outputs at real positions, and the pooled vector
        where position 0 is real, equal the padded path's to float rounding (≤ 1e-5 in fp32); padding
        positions hold zeros. With output_attentions, or without an attention mask or padding, the
        padded path runs, except that in inference with row buckets (`unpad_row_bucket` > 0) a batch
        without padding is packed too, so that its shapes are bucketed like every other batch's.

        `cls_only`: the caller reads only position 0 ([CLS]) of the last layer (the pooler, a sentence
        classifier): the last layer then runs its output projection, feed-forward and norms on that row
        alone (`TransformerLayer.forward_rows`; keys and values still come from every token, the query
        from [CLS] alone or from every token as the plan's kernels need: `plans.FirstTokens`,
        `plans.RowsAt`), and last_hidden_state is (B, 1, H), equal to the full call's [CLS] row to float
        rounding. It is ignored where the plan cannot honour it (`plans.choose_plan`): the full last layer runs.

        `output_positions` (B, P) int64: the caller reads only these positions of the last layer (a token
        classifier's first word pieces): last_hidden_state is (B, P, H), the full call's rows at those
        positions (`gather_indexes`) to float rounding, and there is no pooled output. The last layer
        runs its output projection, feed-forward and norms at those rows alone
        (`TransformerLayer.forward_rows`), except with output_hidden_states or output_attentions or where
        the last layer cannot (`_last_layer_at_rows_ok`): the full layer then runs and its rows are
        gathered. A padding position's row is unspecified. Not with cls_only (ValueError).
        """
        plan = choose_plan(self, input_ids, attention_mask, unpad, output_hidden_states, output_attentions, cls_only,
                           output_positions)
        hidden = self.embeddings(*plan.embedding_inputs(input_ids, token_type_ids), plan=plan)
        all_hidden = [plan.unpack(hidden)] if output_hidden_states else None
        all_attentions = []  # each layer's probabilities: None unless output_attentions
        layers, last = plan.split_last(self.encoder.layer)  # last: to run at the plan's rows only, below
        for layer in layers:
            hidden, probs = layer(hidden, plan.mask, output_attentions, plan)
            all_attentions.append(probs)
            if output_hidden_states:
                all_hidden.append(plan.unpack(hidden))
        if last is None:  # every layer in full: the rows the call asked for (all, or output_positions')
            sequence = plan.gather(all_hidden[-1] if output_hidden_states else plan.unpack(hidden))
        else:  # (B, P, H) at the output positions; (B, 1, H) for cls_only
            sequence = plan.last_layer(last, hidden)
        return EncoderOutput(
            last_hidden_state=sequence,
            pooler_output=self.pooler(sequence) if self.pooler is not None and output_positions is None else None,
            hidden_states=tuple(all_hidden) if output_hidden_states else None,
            attentions=tuple(all_attentions) if output_attentions else None,
        )


def compile_per_token_parts(model: nn.Module) -> int:
    """`torch.compile` (dynamic shapes) the per-token parts of every layer inside `model`, in place: the
    feed-forward expansion (dense + GELU) and both Add & Norms (dense + dropout + residual + LayerNorm),
    forward and backward. Attention and the plan's packing stay eager. Inductor fuses each part's
    elementwise work into a few kernels: fewer launches and memory passes on a GPU (BENCHMARKS.md, "GPU").
    For CUDA: on CPU the cheaper dropout mask (dropout.py) breaks the graph and Inductor's fused linear
    kernels fail on the packed layers' changing shapes (training's `compile` setting refuses it there). The modules
    keep their type and `state_dict` keys (`nn.Module.compile`): checkpoints are unchanged. The first
    steps (and each new dynamic shape kind) compile. Returns how many modules were compiled."""
    parts = [module for module in model.modules() if isinstance(module, (FeedForwardExpansion, ResidualLayerNorm))]
    for module in parts:
        module.compile(dynamic=True)
    return len(parts)


def use_unpadded(model: nn.Module, unpad: bool = True) -> None:
    """Make every BERT encoder inside `model` run unpadded by default (`BertModel.unpad`): the same results
    to rounding, with no compute spent on padding whatever the batch composition."""
    for module in model.modules():
        if isinstance(module, BertModel):
            module.unpad = unpad
