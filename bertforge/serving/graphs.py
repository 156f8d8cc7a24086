"""The graph each pipeline runs: one `nn.Module` per task with positional tensor inputs and a tuple of
tensor outputs, so that `torch.onnx.export` sees the same function the PyTorch backend runs."""

from __future__ import annotations

import torch
from torch import nn

from ..modeling import BertForMaskedLM, BertForMultipleChoice, BertForQuestionAnswering, BertModel


class FillMaskGraph(nn.Module):
    """MLM logits only at the given positions: (B, P) positions -> (B, P, V); the vocabulary
    projection of every other token would cost (B, S, V) for nothing."""

    def __init__(self, model: BertForMaskedLM):
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask, masked_positions):
        return (self.model(input_ids, token_type_ids, attention_mask, masked_lm_positions=masked_positions).logits,)


class LogitsGraph(nn.Module):
    """A head's logits: (B, K) for sequence classification, (B, S, K) for token classification."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask):
        return (self.model(input_ids, token_type_ids, attention_mask).logits,)


class WordLogitsGraph(nn.Module):
    """Token classification at given positions only: (B, P) positions (each word's first piece) ->
    (B, P, K) logits. The encoder's last layer and the classifier run at those rows alone
    (`BertForTokenClassification`'s output_positions); a word's other pieces are never read."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask, word_positions):
        return (self.model(input_ids, token_type_ids, attention_mask, output_positions=word_positions).logits,)


class ChoiceGraph(nn.Module):
    """Multiple choice on flattened rows: (B*K, S) inputs, one per (example, ending) pair -> (B*K,)
    scores. The pipeline groups the K rows of an example back and takes the softmax over them, so the
    graph keeps the pipelines' two-dimensional inputs (and batches rows of any K together)."""

    def __init__(self, model: BertForMultipleChoice):
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask):
        # (B*K, S) -> (B*K, 1, S): each row is an example with one choice; logits (B*K, 1) -> (B*K,)
        logits = self.model(input_ids.unsqueeze(1), token_type_ids.unsqueeze(1), attention_mask.unsqueeze(1)).logits
        return (logits.squeeze(1),)


class SpanGraph(nn.Module):
    """Start and end logits of question answering, (B, S) each."""

    def __init__(self, model: BertForQuestionAnswering):
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask):
        out = self.model(input_ids, token_type_ids, attention_mask)
        return out.start_logits, out.end_logits


class HiddenStatesGraph(nn.Module):
    """Every encoder layer's output, stacked (B, L, S, H): pooling and the choice of layers happen
    after the graph, so one exported model serves every `embed` setting."""

    def __init__(self, model: BertModel):
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask):
        out = self.model(input_ids, token_type_ids, attention_mask, output_hidden_states=True)
        return (torch.stack(out.hidden_states[1:], dim=1),)


class LastHiddenStateGraph(nn.Module):
    """The last encoder layer's output alone, as (B, 1, S, H): what `embed` reads by default. Beside
    `HiddenStatesGraph` on PyTorch only, so that the default call neither re-pads every layer's packed
    output nor stacks and copies them (the exported graph stays the general one)."""

    def __init__(self, model: BertModel):
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask):
        return (self.model(input_ids, token_type_ids, attention_mask).last_hidden_state[:, None],)


__all__ = ["ChoiceGraph", "FillMaskGraph", "HiddenStatesGraph", "LastHiddenStateGraph", "LogitsGraph", "SpanGraph",
           "WordLogitsGraph"]
