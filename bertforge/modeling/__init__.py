"""The BERT encoder, its heads, and checkpoint I/O.

bert.py (the paper's layers and `BertModel`), plans.py (how a forward pass runs: its execution plan,
chosen once per call), attention.py (every attention computation), packing.py (the unpadded layout and
row buckets), kernels.py (the dense products' CPU kernels), dropout.py (the CPU dropout mask), heads.py
(pre-training and task heads), config.py, pretrained.py (checkpoint I/O), hub.py (models by Hub id),
inference.py (bf16, int8, unpadded inference), modes.py (evaluation mode for a block), tf_checkpoint.py
+ tf_bundle.py (Google's TF checkpoints).
"""

from .bert import BertModel, EncoderOutput, compile_per_token_parts, use_unpadded
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
from .inference import (Int8Linear, load_for_inference, optimize_for_inference, quantize_int8,
                        require_trained_head)
from .pretrained import LoadReport, PreTrainedBert

__all__ = [
    "PRESETS", "BertConfig", "BertModel", "EncoderOutput", "BertForPreTraining", "BertForMaskedLM",
    "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering",
    "BertForMultipleChoice", "PreTrainingOutput", "TaskOutput", "QuestionAnsweringOutput",
    "LoadReport", "PreTrainedBert", "optimize_for_inference", "load_for_inference", "require_trained_head",
    "quantize_int8", "Int8Linear", "use_unpadded", "compile_per_token_parts",
]
