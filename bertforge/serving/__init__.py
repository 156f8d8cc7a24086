"""Inference: task pipelines (PyTorch or onnxruntime), ONNX export, and the HTTP server.

The server (`bertforge.serving.server`) needs the `serve` extra and is imported only when used;
ONNX export and the onnxruntime backend (`bertforge.serving.onnx`) import the `onnx` extra's
packages only when called. Which pipeline serves which task comes from the task registry
(`bertforge.tasks.registry`: each family's `pipeline_class`, imported by `bertforge.serving.registry`).
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
