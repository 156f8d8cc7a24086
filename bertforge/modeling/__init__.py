"""The BERT encoder, its heads, and checkpoint I/O."""

from .bert import BertModel, EncoderOutput
from .config import PRESETS, BertConfig
from .heads import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    PreTrainingOutput,
    QuestionAnsweringOutput,
    TaskOutput,
)
from .pretrained import LoadReport, PreTrainedBert

__all__ = [
    "PRESETS", "BertConfig", "BertModel", "EncoderOutput", "BertForPreTraining", "BertForMaskedLM",
    "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering",
    "BertForMultipleChoice", "PreTrainingOutput", "TaskOutput", "QuestionAnsweringOutput",
    "LoadReport", "PreTrainedBert",
]
