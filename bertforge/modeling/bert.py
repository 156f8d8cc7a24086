"""The BERT encoder (Devlin et al. 2019, §3): embeddings, post-LN Transformer layers, pooler.

Shapes: B = batch, S = sequence length, H = hidden size, A = attention heads, D = H / A.
Module attribute names follow the checkpoint layout the ecosystem uses
(`encoder.layer.0.attention.self.query.weight`, ...), so `state_dict()` is that layout and
checkpoints move to and from Hugging Face transformers without renaming.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import BertConfig
from .pretrained import PreTrainedBert


def activation(name: str):
    if name == "gelu":
        return F.gelu  # erf form, as Google's modeling.py
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    return F.relu


@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor  # (B, S, H)
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
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, token_type_ids: (B, S) -> (B, S, H)."""
        seq_length = input_ids.shape[1]
        max_positions = self.position_embeddings.num_embeddings
        if seq_length > max_positions:
            raise ValueError(
                f"input_ids has {seq_length} tokens but the model has only {max_positions} position "
                "embeddings: truncate the input (max_length) or use sliding windows"
            )
        embeddings = self.word_embeddings(input_ids)
        if token_type_ids is None:  # all segment A: one broadcast row instead of a gather
            embeddings = embeddings + self.token_type_embeddings.weight[0]
        else:
            embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        embeddings = embeddings + self.position_embeddings.weight[:seq_length]
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

    def forward(
        self, hidden_states: torch.Tensor, mask: torch.Tensor | None, output_attentions: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states: (B, S, H); mask: bool (B or 1, 1, S or 1, S), True = may attend.

        Returns the context (B, S, H) and, if asked, the attention probabilities (B, A, S, S).
        """
        batch, seq_length, hidden = hidden_states.shape
        # One (H, 3H) matmul instead of three (H, H) ones: fewer, larger GEMMs are faster on every
        # backend, and the parameters keep their separate checkpoint names.
        weight = torch.cat((self.query.weight, self.key.weight, self.value.weight))
        bias = torch.cat((self.query.bias, self.key.bias, self.value.bias))
        qkv = F.linear(hidden_states, weight, bias)
        qkv = qkv.view(batch, seq_length, 3, self.num_heads, hidden // self.num_heads).permute(2, 0, 3, 1, 4)
        query, key, value = qkv.unbind(0)  # each (B, A, S, D)
        dropout_p = self.dropout_p if self.training else 0.0
        if output_attentions:
            scores = query @ key.transpose(-1, -2) / math.sqrt(query.shape[-1])
            if mask is not None:
                scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            probs = scores.softmax(dim=-1)
            context = F.dropout(probs, dropout_p, self.training) @ value
        else:
            probs = None
            context = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p)
        return context.transpose(1, 2).reshape(batch, seq_length, hidden), probs


class ResidualLayerNorm(nn.Module):
    """LayerNorm(x + Dropout(Dense(h))): the "Add & Norm" that closes both sub-layers (post-LN)."""

    def __init__(self, in_features: int, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + residual)


class Attention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = MultiHeadSelfAttention(config)  # named `self` by the checkpoint layout
        self.output = ResidualLayerNorm(config.hidden_size, config)

    def forward(self, hidden_states, mask, output_attentions=False):
        context, probs = self.self(hidden_states, mask, output_attentions)
        return self.output(context, hidden_states), probs


class FeedForwardExpansion(nn.Module):
    """The first half of the position-wise feed-forward network: H -> 4H and GELU."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = activation(config.hidden_act)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(hidden_states))


class TransformerLayer(nn.Module):
    """Self-attention, Add & Norm, feed-forward (4H, GELU), Add & Norm."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = Attention(config)
        self.intermediate = FeedForwardExpansion(config)
        self.output = ResidualLayerNorm(config.intermediate_size, config)

    def forward(self, hidden_states, mask, output_attentions=False):
        attended, probs = self.attention(hidden_states, mask, output_attentions)
        return self.output(self.intermediate(attended), attended), probs


class Encoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(TransformerLayer(config) for _ in range(config.num_hidden_layers))


class Pooler(nn.Module):
    """tanh(W h_[CLS] + b): the sentence vector C used by the NSP and classification heads."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden_states[:, 0]))


def attention_mask_for(attention_mask: torch.Tensor | None, seq_length: int, is_causal: bool,
                       device: torch.device) -> torch.Tensor | None:
    """The boolean mask that scaled_dot_product_attention takes: (B, 1, 1, S), (B or 1, 1, S, S) or None.

    None when every token may see every token, so that the fused attention kernels can run.
    """
    mask = None
    if attention_mask is not None and not bool(attention_mask.all()):
        mask = attention_mask.bool()[:, None, None, :]
    if is_causal:
        causal = torch.ones(seq_length, seq_length, dtype=torch.bool, device=device).tril()[None, None]
        mask = causal if mask is None else mask & causal
    return mask


class BertModel(PreTrainedBert):
    """The bidirectional Transformer encoder, with the pooler unless `add_pooling_layer=False`."""

    base_model_prefix = ""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = Encoder(config)
        self.pooler = Pooler(config) if add_pooling_layer else None
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> EncoderOutput:
        """input_ids, token_type_ids, attention_mask (1 = real token, 0 = padding): (B, S)."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, seq_length), got shape {tuple(input_ids.shape)}")
        mask = attention_mask_for(attention_mask, input_ids.shape[1], self.config.is_causal, input_ids.device)
        hidden = self.embeddings(input_ids, token_type_ids)
        all_hidden = [hidden] if output_hidden_states else None
        all_attentions = [] if output_attentions else None
        for layer in self.encoder.layer:
            hidden, probs = layer(hidden, mask, output_attentions)
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
