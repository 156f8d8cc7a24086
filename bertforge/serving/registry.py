"""Which pipeline class serves each task: the serving side of `bertforge.tasks.registry`.

The task registry (`bertforge.tasks.registry`) declares every task family, its aliases and the name
of its pipeline (`TaskFamily.pipeline`: a family names its pipeline, it never imports serving); this
module binds those names to the `Pipeline` classes (`register_pipeline`) and resolves a task name or
a checkpoint to one through the family's entry (a multi-label family, say, served by "classify"). It
imports no pipeline itself, so that the ONNX exporter can look pipelines up without importing the
module that uses it (the classes register when `bertforge.serving.pipelines` is imported, which
importing `bertforge.serving` always does).
"""

from __future__ import annotations

from typing import Callable, TypeVar

from ..tasks.registry import pipeline_for_checkpoint, resolve, task_for_checkpoint

PIPELINES: dict[str, type] = {}
_ALIASES: dict[str, str] = {}  # extra aliases given to register_pipeline beyond the task registry's

P = TypeVar("P", bound=type)


def register_pipeline(name: str, *aliases: str) -> Callable[[P], P]:
    """Class decorator: make a Pipeline subclass available as `pipeline(name, ...)` (and on the server
    as `POST /v1/<name>`). The task registry's aliases of `name` resolve to it too; `aliases` adds more
    (for a pipeline of your own that has no task family)."""

    def decorate(cls: P) -> P:
        cls.task = name
        PIPELINES[name] = cls
        for alias in aliases:
            _ALIASES[alias] = name
        return cls

    return decorate


def resolve_task(task: str) -> str:
    """The registered pipeline name of `task`: a pipeline's own name, else the `pipeline` of the family the
    task registry resolves `task` to (its canonical name, an alias such as "ner", "squad", "fill_mask",
    a GLUE task ...), else an alias given to `register_pipeline`."""
    name = task if task in PIPELINES else None
    if name is None:
        try:
            name = resolve(task).pipeline
        except ValueError:
            name = _ALIASES.get(task, task)
    if name not in PIPELINES:
        raise ValueError(f"unknown pipeline {task!r}; choose one of {', '.join(sorted(PIPELINES))}")
    return name


__all__ = ["PIPELINES", "pipeline_for_checkpoint", "register_pipeline", "resolve_task", "task_for_checkpoint"]
