"""The heads the ablations need beyond BERT's own: the LTR model's sentence vector, and Table 5's BiLSTM.

* `pool_last_token(model)`: a causal (left-to-right) encoder's [CLS], at position 0, has read only itself,
  so the usual pooler (tanh(W h_[CLS] + b)) would classify from nothing. As OpenAI GPT does, the LTR
  model's sentence-level tasks read the LAST real token instead (the closing [SEP]: the only position
  that has read the whole input), through the same pooler weights.
* Table 5's last row, "LTR & No NSP + BiLSTM". §5.1: the left-to-right model's token representations see
  no right-hand context, which hurts token- and span-level tasks (SQuAD); to strengthen it the paper adds
  a randomly initialised BiLSTM on top, trained during fine-tuning with the encoder (it helps SQuAD and
  hurts GLUE). One bidirectional LSTM layer (`bilstm_hidden` units per direction) runs over each row's
  real tokens only (packed: the backward direction starts at the row's last token, not at padding):
  - `BertBiLSTMForTokenClassification` (the token task): final hidden states (B, S, H) -> dropout ->
    BiLSTM -> dropout -> a linear classifier per token (B, S, K);
  - `pool_bilstm(model, hidden)` (the sentence-level tasks): the pooler becomes BiLSTM -> [the forward
    direction's state at the last real token; the backward one's at [CLS]] (B, 2 hidden) -> a new
    dense layer to H -> tanh, feeding the task's classifier as the pooler did.

Kept here rather than in `modeling/` because they are an ablation's heads, not BERT's (and `modeling/`'s
pooler stays the peer's, which its parity tests check for causal encoders too).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..modeling import BertConfig, BertForTokenClassification
from ..modeling.bert import Pooler

CONFIG_HIDDEN = "bilstm_hidden"  # config.json key: the LSTM's units per direction


class BertBiLSTMForTokenClassification(BertForTokenClassification):
    """BertForTokenClassification with a BiLSTM between the encoder and the classifier (see the module)."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        hidden = int(config.extra.get(CONFIG_HIDDEN, config.hidden_size // 2))
        self.lstm = nn.LSTM(config.hidden_size, hidden, batch_first=True, bidirectional=True)
        self.classifier = nn.Linear(2 * hidden, config.num_labels)
        self.classifier.apply(self._init_module)

    def token_logits(self, states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Final hidden states (B, S, H) -> dropout -> BiLSTM over each row's real tokens -> dropout -> (B, S, K)."""
        steps = states.shape[1]
        lengths = (attention_mask.sum(-1) if attention_mask is not None
                   else torch.full((states.shape[0],), steps, dtype=torch.long)).clamp(min=1)
        packed = pack_padded_sequence(self.dropout(states).float(), lengths.cpu(), batch_first=True,
                                      enforce_sorted=False)
        hidden, _ = self.lstm(packed)
        hidden, _ = pad_packed_sequence(hidden, batch_first=True, total_length=steps)  # (B, S, 2 hidden)
        return self.classifier(self.dropout(hidden))


class LastTokenPooler(Pooler):
    """tanh(W h_last + b): the pooler read at each row's last real token (rows padded on the right).
    `mask` (B, S), the batch's attention mask, is set by the encoder's forward pre-hook (`pool_last_token`)."""

    mask: torch.Tensor | None = None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(B, S, H) -> (B, H)."""
        batch, steps = hidden_states.shape[:2]
        if self.mask is None or self.mask.shape != (batch, steps):
            last = torch.full((batch,), steps - 1, dtype=torch.long, device=hidden_states.device)
        else:
            last = self.mask.to(hidden_states.device).long().sum(-1).clamp(min=1) - 1
        rows = hidden_states[torch.arange(batch, device=hidden_states.device), last]
        return torch.tanh(self.dense(rows))


class BiLSTMPooler(nn.Module):
    """(B, S, H) -> BiLSTM over the real tokens -> [forward final state; backward final state] -> dense -> tanh
    -> (B, H). `mask` is set as for LastTokenPooler."""

    mask: torch.Tensor | None = None

    def __init__(self, hidden_size: int, lstm_hidden: int):
        super().__init__()
        self.lstm = nn.LSTM(hidden_size, lstm_hidden, batch_first=True, bidirectional=True)
        self.dense = nn.Linear(2 * lstm_hidden, hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(B, S, H) -> (B, H)."""
        batch, steps = hidden_states.shape[:2]
        if self.mask is None or self.mask.shape != (batch, steps):
            lengths = torch.full((batch,), steps, dtype=torch.long)
        else:
            lengths = self.mask.long().sum(-1).clamp(min=1)
        packed = pack_padded_sequence(hidden_states.float(), lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, (final, _) = self.lstm(packed)  # (2, B, hidden): forward at the last real token, backward at [CLS]
        return torch.tanh(self.dense(torch.cat([final[0], final[1]], dim=-1)))


def _replace_pooler(model: nn.Module, pooler: nn.Module) -> nn.Module:
    """Put `pooler` in `model.bert` and hand it each batch's attention mask (a forward pre-hook)."""
    bert = model.bert
    bert.pooler = pooler

    def capture(module, args, kwargs):  # BertModel(input_ids, token_type_ids, attention_mask, ...)
        pooler.mask = kwargs.get("attention_mask", args[2] if len(args) > 2 else None)

    bert.register_forward_pre_hook(capture, with_kwargs=True)
    return model


def pool_last_token(model: nn.Module) -> nn.Module:
    """Make `model.bert`'s pooler read each row's last real token (see the module docstring); returns `model`.
    The pooler keeps its weights and parameter names, so the model saves and loads as before."""
    pooler = LastTokenPooler(model.bert.config)
    pooler.load_state_dict(model.bert.pooler.state_dict())
    return _replace_pooler(model, pooler)


def pool_bilstm(model: nn.Module, lstm_hidden: int) -> nn.Module:
    """Replace `model.bert`'s pooler by a randomly initialised BiLSTMPooler (seeded by the caller); returns `model`."""
    return _replace_pooler(model, BiLSTMPooler(model.bert.config.hidden_size, lstm_hidden))
