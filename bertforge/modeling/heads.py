"""The paper's "one additional output layer" per task shape (§3, Figure 4), and the pre-training heads.

Each head takes labels and then returns a loss; labels equal to -100 are ignored, as in PyTorch's
cross-entropy. `unpad` is passed to the encoder (`BertModel.forward`: compute only the real tokens;
None = the encoder's `unpad` attribute); logits at real positions do not change beyond rounding.
Shapes: B batch, S sequence length, H hidden, V vocabulary, P masked positions,
C choices, K labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .bert import BertModel, gather_indexes
from .config import BertConfig
from .dropout import Dropout
from .kernels import activation
from .pretrained import PreTrainedBert

IGNORE_INDEX = -100
MULTI_LABEL = "multi_label_classification"  # config.json's problem_type of a multi-label classifier


@dataclass
class PreTrainingOutput:
    prediction_logits: torch.Tensor  # (B, P, V) at masked_lm_positions, (N, V) for `labels`, else (B, S, V)
    seq_relationship_logits: torch.Tensor  # (B, 2): IsNext = 0, NotNext = 1
    loss: torch.Tensor | None = None
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class TaskOutput:
    logits: torch.Tensor
    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class QuestionAnsweringOutput:
    start_logits: torch.Tensor  # (B, S): S · T_i
    end_logits: torch.Tensor  # (B, S): E · T_i
    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class PredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.activation(self.dense(hidden_states)))


class MaskedLMHead(nn.Module):
    """Dense + GELU + LayerNorm, then the output projection tied to the word embeddings, plus a bias."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.transform = PredictionHeadTransform(config)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        """hidden_states (..., H), word_embeddings (V, H) -> logits (..., V)."""
        return F.linear(self.transform(hidden_states), word_embeddings, self.bias)


class MaskedLMHeadOnly(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.predictions = MaskedLMHead(config)


class PreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.predictions = MaskedLMHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


def _masked_lm(encoder: BertModel, head: MaskedLMHead, sequence: torch.Tensor,
               masked_lm_positions: torch.Tensor | None, masked_lm_labels: torch.Tensor | None,
               labels: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """MLM logits and loss, the vocabulary projection computed only where a prediction is asked for.

    With `masked_lm_positions` (B, P) and `masked_lm_labels` (B, P), Google's layout; with `labels`
    (B, S), -100 except at the masked tokens, the masked rows are selected; with neither, every
    position is scored (fill-mask).
    """
    word_embeddings = encoder.embeddings.word_embeddings.weight
    if masked_lm_positions is not None:
        logits = head(gather_indexes(sequence, masked_lm_positions), word_embeddings)
        targets = masked_lm_labels
    elif labels is not None:
        selected = labels != IGNORE_INDEX
        logits = head(sequence[selected], word_embeddings)
        targets = labels[selected]
    else:
        return head(sequence, word_embeddings), None
    if targets is None:
        return logits, None
    return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                                   ignore_index=IGNORE_INDEX)


class BertForPreTraining(PreTrainedBert):
    """Masked LM + next sentence prediction (§3.1). The loss is their sum."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.cls = PreTrainingHeads(config)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        masked_lm_positions: torch.Tensor | None = None,
        masked_lm_labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        unpad: bool | None = None,
    ) -> PreTrainingOutput:
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, output_attentions,
                        unpad=unpad)
        logits, mlm_loss = _masked_lm(self.bert, self.cls.predictions, out.last_hidden_state,
                                      masked_lm_positions, masked_lm_labels, labels)
        nsp_logits = self.cls.seq_relationship(out.pooler_output)
        nsp_loss = None
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_label.reshape(-1),
                                       ignore_index=IGNORE_INDEX)
        losses = [x for x in (mlm_loss, nsp_loss) if x is not None]
        return PreTrainingOutput(
            prediction_logits=logits, seq_relationship_logits=nsp_logits,
            loss=sum(losses) if losses else None, mlm_loss=mlm_loss, nsp_loss=nsp_loss,
            hidden_states=out.hidden_states, attentions=out.attentions,
        )


class BertForMaskedLM(PreTrainedBert):
    """Masked LM only (fill-mask; the no-NSP ablation). Logits over every position unless positions are given."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = MaskedLMHeadOnly(config)
        self.init_weights()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                masked_lm_positions=None, masked_lm_labels=None,
                output_hidden_states=False, output_attentions=False, unpad=None) -> TaskOutput:
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, output_attentions,
                        unpad=unpad)
        logits, loss = _masked_lm(self.bert, self.cls.predictions, out.last_hidden_state,
                                  masked_lm_positions, masked_lm_labels, labels)
        return TaskOutput(logits, loss, out.hidden_states, out.attentions)


def _over_real_tokens(logits: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """(B, S) span logits in fp32 with the padding positions at the lowest float, so that the softmax
    over a window's positions (the start and end losses) runs over its real tokens only. Without
    this a padding position would be a candidate: the padded path gives it whatever the encoder
    computes there (what Google's run_squad and transformers train with), the unpadded path a
    hidden state of zeros, i.e. a fixed logit equal to the bias; either way the loss would depend
    on how much padding a batch has, and the two paths would train differently."""
    logits = logits.float()
    if attention_mask is None:
        return logits
    return logits.masked_fill(attention_mask.reshape(logits.shape) == 0, torch.finfo(torch.float32).min)


def _classifier_dropout(config: BertConfig) -> Dropout:
    p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
    return Dropout(p)


class BertForSequenceClassification(PreTrainedBert):
    """softmax(C Wᵀ) over K labels from the pooled [CLS] vector C; K = 1 is regression with MSE; config.json's
    `problem_type="multi_label_classification"`: a sigmoid per label and binary cross-entropy (any number
    of labels per text; `labels` (B, K) of 0/1), as transformers' BertForSequenceClassification."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                output_hidden_states=False, output_attentions=False, unpad=None) -> TaskOutput:
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, output_attentions,
                        unpad=unpad, cls_only=True)  # only the pooled [CLS] vector is read
        logits = self.classifier(self.dropout(out.pooler_output))  # (B, K)
        loss = None
        if labels is not None:
            problem = self.problem_type(labels)
            if problem == "regression":
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            elif problem == MULTI_LABEL:
                loss = F.binary_cross_entropy_with_logits(logits.float(), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels.reshape(-1), ignore_index=IGNORE_INDEX)
        return TaskOutput(logits, loss, out.hidden_states, out.attentions)

    def problem_type(self, labels: torch.Tensor | None = None) -> str:
        """"regression", "single_label_classification" or "multi_label_classification": config.json's
        `problem_type` when set, else as transformers infers it: one output is regression, integer labels
        single-label (softmax + cross-entropy), float labels (B, K) multi-label (a sigmoid and binary
        cross-entropy per label, labels of 0/1)."""
        problem = self.config.extra.get("problem_type")
        if problem in ("regression", "single_label_classification", MULTI_LABEL):
            return problem
        if self.num_labels == 1:
            return "regression"
        if labels is not None and labels.is_floating_point():
            return MULTI_LABEL
        return "single_label_classification"


class BertForTokenClassification(PreTrainedBert):
    """A label per token from its final hidden vector (NER; the paper labels the first sub-token)."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config, add_pooling_layer=False)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                output_hidden_states=False, output_attentions=False, unpad=None,
                output_positions=None) -> TaskOutput:
        """logits (B, S, K); with `output_positions` (B, P) (the words' first pieces) only there, (B, P, K),
        `labels` then (B, P): the encoder's last layer and the classifier run at those rows alone, unless
        `token_logits` is overridden (a head that reads the whole sequence: its logits are gathered)."""
        per_token = type(self).token_logits is BertForTokenClassification.token_logits
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, output_attentions,
                        unpad=unpad, output_positions=output_positions if per_token else None)
        logits = self.token_logits(out.last_hidden_state, attention_mask)  # (B, S or P, K)
        if output_positions is not None and not per_token:
            logits = gather_indexes(logits, output_positions)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, self.num_labels).float(), labels.reshape(-1),
                                   ignore_index=IGNORE_INDEX)
        return TaskOutput(logits, loss, out.hidden_states, out.attentions)

    def token_logits(self, states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Final hidden states (B, S, H) -> label logits (B, S, K): dropout, then a linear layer per token.
        The hook a head between encoder and classifier overrides (e.g. the ablations' BiLSTM)."""
        return self.classifier(self.dropout(states))


class BertForQuestionAnswering(PreTrainedBert):
    """A start vector S and an end vector E; P(start = i) = softmax_i(S · T_i) over the window's real
    tokens (§4.2); the returned logits are (B, S) with padding positions left as computed."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, start_positions=None,
                end_positions=None, output_hidden_states=False, output_attentions=False,
                unpad=None) -> QuestionAnsweringOutput:
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, output_attentions,
                        unpad=unpad)
        start_logits, end_logits = self.qa_outputs(out.last_hidden_state).unbind(-1)  # (B, S) each
        loss = None
        if start_positions is not None and end_positions is not None:
            seq_length = start_logits.shape[1]
            # A gold position outside the window counts as "ignored" rather than crashing the loss.
            start = start_positions.reshape(-1).clamp(0, seq_length)
            end = end_positions.reshape(-1).clamp(0, seq_length)
            loss = (F.cross_entropy(_over_real_tokens(start_logits, attention_mask), start, ignore_index=seq_length)
                    + F.cross_entropy(_over_real_tokens(end_logits, attention_mask), end,
                                      ignore_index=seq_length)) / 2
        return QuestionAnsweringOutput(start_logits.contiguous(), end_logits.contiguous(), loss,
                                       out.hidden_states, out.attentions)


class BertForMultipleChoice(PreTrainedBert):
    """One score V · C_i per choice, softmax across the choices (SWAG, §4.4)."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.init_weights()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                output_hidden_states=False, output_attentions=False, unpad=None) -> TaskOutput:
        """input_ids, token_type_ids, attention_mask: (B, C, S) -> logits (B, C)."""
        num_choices = input_ids.shape[1]

        def flat(x):
            return None if x is None else x.reshape(-1, x.shape[-1])

        out = self.bert(flat(input_ids), flat(token_type_ids), flat(attention_mask),
                        output_hidden_states, output_attentions, unpad=unpad, cls_only=True)
        logits = self.classifier(self.dropout(out.pooler_output)).view(-1, num_choices)
        loss = None if labels is None else F.cross_entropy(logits.float(), labels.reshape(-1))
        return TaskOutput(logits, loss, out.hidden_states, out.attentions)
