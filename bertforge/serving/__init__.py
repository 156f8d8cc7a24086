"""Inference: task pipelines (PyTorch or onnxruntime), ONNX export, and the HTTP server.

The server (`bertforge.serving.server`) and ONNX (`bertforge.serving.onnx`) need optional extras,
`serve` and `onnx`, and are imported only when used.
"""

from .pipelines import (
    PIPELINES,
    AnswerPipeline,
    ClassifyPipeline,
    EmbedPipeline,
    FillMaskPipeline,
    MultipleChoicePipeline,
    Pipeline,
    PipelineInputError,
    TagPipeline,
    pipeline,
    register_pipeline,
    task_for_checkpoint,
)

__all__ = [
    "PIPELINES", "Pipeline", "PipelineInputError", "FillMaskPipeline", "ClassifyPipeline", "EmbedPipeline",
    "TagPipeline", "AnswerPipeline", "MultipleChoicePipeline", "pipeline", "register_pipeline", "task_for_checkpoint",
]
