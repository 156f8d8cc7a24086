"""Inference pipelines: text in, task results out, on PyTorch or onnxruntime.

    >>> from bertforge import pipeline
    >>> fill = pipeline("fill-mask", model="path/to/checkpoint")
    >>> fill(["Paris is the [MASK] of France."], top_k=3)

One module per concern: `base` (the `Pipeline` class: tokenize, batch, run, postprocess, and the
server's request schema), one module per pipeline, named after its family (`fill_mask`, `classify`,
`embed`, `tag`, `answer`, `multiple_choice`; `choice` is the last one's old name, an alias), the graphs
they run (`bertforge.serving.graphs`), the PyTorch runner (`bertforge.serving.runner`), entity grouping
(`bertforge.serving.entities`) and the lookup of a task's class (`bertforge.serving.registry`: the task
family's `pipeline_class`, from `bertforge.tasks.registry`).
Every name this module had when it was one file stays importable from here.

The graph a pipeline runs (`Pipeline.build_graph`) is one `nn.Module` per task with plain tensors in
and a tuple of tensors out; `bertforge.serving.onnx` exports exactly that module, so the two
backends compute the same function. A new pipeline names itself with `register_pipeline` and is served
for the task family whose `pipeline_class` points at it.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ...tasks.windows import max_context_window
from ..entities import group_entities
from ..graphs import ChoiceGraph, FillMaskGraph, HiddenStatesGraph, LogitsGraph, SpanGraph, WordLogitsGraph
from ..registry import (PIPELINES, pipeline_class, pipeline_for_checkpoint, register_pipeline, resolve_task,
                        task_for_checkpoint)
from ..runner import Batch, Runner, TorchRunner
from .answer import AnswerPipeline
from .base import BASE_INPUTS, MASK_TOKEN, Feature, Pipeline, PipelineInputError, check_texts, windows
from .multiple_choice import MultipleChoicePipeline, predict_multiple_choice
from .classify import ClassifyPipeline
from .embed import EmbedPipeline, SimilarityPipeline
from .fill_mask import FillMaskPipeline
from .tag import TagPipeline


def pipeline(task: str | None = None, model: str | os.PathLike | None = None, *, backend: str = "torch",
             device: str | torch.device | None = None, max_length: int | None = None,
             onnx_model: str | os.PathLike | bytes | None = None, **kwargs: Any) -> Pipeline:
    """A ready pipeline: `pipeline("classify", model="runs/sst2/final")`.

    task: fill-mask, classify, embed (and its companion similarity), tag, answer or multiple-choice, or any alias of the task registry
    (`bertforge.tasks.registry`: "ner", "squad", "question-answering" ...); default: the checkpoint's
    pipeline (`pipeline_for_checkpoint`: its family's). backend: "torch" or "onnx". See `Pipeline` for the
    other arguments.
    """
    if model is None:
        raise ValueError("pipeline() needs model=<checkpoint directory>")
    if task is None:
        task = pipeline_for_checkpoint(model)
    cls = pipeline_class(task)
    return cls(model, backend=backend, device=device, max_length=max_length, onnx_model=onnx_model, **kwargs)


__all__ = [
    "PIPELINES", "Pipeline", "PipelineInputError", "FillMaskPipeline", "ClassifyPipeline", "EmbedPipeline",
    "SimilarityPipeline",
    "TagPipeline", "AnswerPipeline", "MultipleChoicePipeline", "TorchRunner", "Feature", "pipeline",
    "pipeline_class", "predict_multiple_choice", "register_pipeline", "resolve_task", "pipeline_for_checkpoint",
    "task_for_checkpoint", "group_entities",
    "windows", "max_context_window", "BASE_INPUTS", "MASK_TOKEN", "Batch", "Runner", "check_texts",
    "ChoiceGraph", "FillMaskGraph", "HiddenStatesGraph", "LogitsGraph", "SpanGraph", "WordLogitsGraph",
]
