"""Table 5's last row: "LTR & No NSP + BiLSTM", a randomly initialised BiLSTM on top of the encoder.

§5.1: the left-to-right model's token representations see no right-hand context, which hurts token-
and span-level tasks (SQuAD); "to strengthen" it the paper adds a randomly initialised BiLSTM on top,
trained during fine-tuning with the encoder. Here on the token task: the encoder's final hidden states
(B, S, H) -> dropout -> one bidirectional LSTM layer (`bilstm_hidden` units per direction, run over each
row's real tokens only, so the backward direction starts at the row's last token, not at padding) ->
dropout -> a linear classifier per token (B, S, K). Kept here rather than in `modeling/` because it is
an ablation's head, not one of BERT's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..modeling import BertConfig, BertForTokenClassification
from ..modeling.heads import TaskOutput
from ..tasks.conll import IGNORE_INDEX

CONFIG_HIDDEN = "bilstm_hidden"  # config.json key: the LSTM's units per direction


class BertBiLSTMForTokenClassification(BertForTokenClassification):
    """BertForTokenClassification with a BiLSTM between the encoder and the classifier (see the module)."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        hidden = int(config.extra.get(CONFIG_HIDDEN, config.hidden_size // 2))
        self.lstm = nn.LSTM(config.hidden_size, hidden, batch_first=True, bidirectional=True)
        self.classifier = nn.Linear(2 * hidden, config.num_labels)
        self.classifier.apply(self._init_module)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                output_hidden_states=False, output_attentions=False, unpad=None) -> TaskOutput:
        """input_ids (B, S) -> TaskOutput(logits (B, S, K), loss over the labelled tokens)."""
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, output_attentions,
                        unpad=unpad)
        states = out.last_hidden_state  # (B, S, H)
        steps = states.shape[1]
        lengths = (attention_mask.sum(-1) if attention_mask is not None
                   else torch.full((states.shape[0],), steps, dtype=torch.long)).clamp(min=1)
        packed = pack_padded_sequence(self.dropout(states).float(), lengths.cpu(), batch_first=True,
                                      enforce_sorted=False)
        hidden, _ = self.lstm(packed)
        hidden, _ = pad_packed_sequence(hidden, batch_first=True, total_length=steps)  # (B, S, 2 hidden)
        logits = self.classifier(self.dropout(hidden))  # (B, S, K)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, self.num_labels).float(), labels.reshape(-1),
                                   ignore_index=IGNORE_INDEX)
        return TaskOutput(logits, loss, out.hidden_states, out.attentions)
