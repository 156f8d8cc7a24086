"""bertforge: BERT end to end — WordPiece, the encoder and its heads, pre-training, fine-tuning, inference."""

from .modeling import (
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from .serving import pipeline
from .tokenization import BertTokenizer

__version__ = "0.1.0"

__all__ = [
    "BertConfig", "BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
    "BertForTokenClassification", "BertForQuestionAnswering", "BertForMultipleChoice", "BertTokenizer", "pipeline",
]
