"""Which pipeline class serves each task: read from the task family, resolved here.

The task registry (`bertforge.tasks.registry`) declares every task family, its aliases, the name of
its pipeline (`TaskFamily.pipeline`: the server's `POST /v1/<name>`, ONNX metadata) and its class as an
import path (`TaskFamily.pipeline_class`, "module:Class": a family never imports serving). This module
imports that class when a task or a checkpoint is resolved to it (a multi-label family, say, served by
the classify pipeline); it keeps no table of its own. `PIPELINES` is a read-only view of the families'
pipelines by name.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator, Mapping
from typing import Callable, TypeVar

from ..tasks.registry import TASKS, TaskFamily, pipeline_for_checkpoint, resolve, task_for_checkpoint

P = TypeVar("P", bound=type)


def register_pipeline(name: str) -> Callable[[P], P]:
    """Class decorator: the pipeline's name (`cls.task`: `pipeline(name, ...)`, `POST /v1/<name>`, ONNX
    metadata). The class is served for a family whose `pipeline_class` names it (`register_family` for a
    pipeline of your own)."""

    def decorate(cls: P) -> P:
        cls.task = name
        return cls

    return decorate


def _families() -> dict[str, TaskFamily]:
    """Pipeline name -> the family that declares its class (`pipeline_class`), the first in registration
    order. A family that names another's pipeline (multi-label: "classify") is served by that class."""
    owners: dict[str, TaskFamily] = {}
    for family in TASKS.values():
        if family.pipeline_class:
            owners.setdefault(family.pipeline, family)
    return owners


def family_pipeline(family: TaskFamily) -> type:
    """The `Pipeline` class a family declares (`pipeline_class`, imported). ValueError when it has none."""
    if not family.pipeline_class:
        raise ValueError(f"the {family.name} family has no pipeline")
    module, _, name = family.pipeline_class.partition(":")
    return getattr(importlib.import_module(module), name)


def _companions() -> dict[str, type]:
    """Pipeline name -> class of the pipelines served beside a family's (`Pipeline.companions`: embed's
    `similarity`), which no family names itself."""
    found: dict[str, type] = {}
    for family in _families().values():
        for companion in getattr(family_pipeline(family), "companions", ()):
            found.setdefault(companion.task, companion)
    return found


def resolve_task(task: str) -> str:
    """The pipeline name of `task`: the `pipeline` of the family the task registry resolves `task` to (its
    canonical name, an alias such as "ner", "squad", "fill_mask", a GLUE task ...), or a companion
    pipeline's own name ("similarity")."""
    try:
        name = resolve(task).pipeline
    except ValueError:
        name = task if task in _companions() else None
    if name not in _families() and name not in _companions():
        raise ValueError(f"unknown pipeline {task!r}; choose one of {', '.join(sorted(PIPELINES))}")
    return name


def pipeline_class(task: str) -> type:
    """The `Pipeline` class that serves `task` (any name `resolve_task` takes)."""
    name = resolve_task(task)
    families = _families()
    return family_pipeline(families[name]) if name in families else _companions()[name]


def served_for_checkpoint(directory: str | os.PathLike) -> list[str]:
    """The pipelines `bertforge serve` runs for a checkpoint by default: its family's (`pipeline_for_checkpoint`)
    and that pipeline's companions (embed: similarity)."""
    name = pipeline_for_checkpoint(directory)
    return [name, *(companion.task for companion in getattr(pipeline_class(name), "companions", ()))]


class _Pipelines(Mapping):
    """Every pipeline by name, read from the families (`pipeline_class`, imported on access)."""

    def __getitem__(self, name: str) -> type:
        families = _families()
        if name in families:
            return family_pipeline(families[name])
        companions = _companions()
        if name not in companions:
            raise KeyError(name)
        return companions[name]

    def __iter__(self) -> Iterator[str]:
        return iter({**_families(), **_companions()})

    def __len__(self) -> int:
        return len({**_families(), **_companions()})


PIPELINES: Mapping[str, type] = _Pipelines()

__all__ = ["PIPELINES", "family_pipeline", "pipeline_class", "pipeline_for_checkpoint", "register_pipeline",
           "resolve_task", "served_for_checkpoint", "task_for_checkpoint"]
