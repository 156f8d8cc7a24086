"""ONNX export of a pipeline's graph, the parity check after it, and running it on onnxruntime.

The exported function is the pipeline's own graph (`Pipeline.build_graph`), so `backend="onnx"`
computes what `backend="torch"` does: fill-mask takes a fourth input `masked_positions` (B, P) and
gives (B, P, V) logits; tag a fourth input `word_positions` (B, P) and gives (B, P, K); classify
(B, K); answer start and end logits (B, S); embed every layer's hidden states (B, L, S, H). Batch and
sequence axes are dynamic. A tag model exported before its graph took `word_positions` gives (B, S, K)
and still runs: `OnnxRunner` gathers its logits at the positions (`Pipeline.rows_selected_by`).

Why the TorchScript-based exporter (`dynamo=False`) and not torch.export: the encoder decides on
the data whether a mask is needed at all (`attention_mask.all()`), which torch.export refuses as a
data-dependent branch. Tracing with a padded sample records the masked path, which is exact for
every input (an all-ones mask masks nothing). The export runs with autograd enabled so that the
encoder takes its plain path: its inference fast paths (the fused QKV weight viewed in place, buffers
reused across layers, keys cut to the batch's last real token) would be traced as constants.

Needs the `onnx` extra: `pip install 'bertforge[onnx]'` (onnx, onnxruntime).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Protocol, Sequence

import numpy as np
import torch
from torch import nn

from .._files import atomic_open
from ..modeling import BertModel
from ..modeling.modes import evaluating
from .registry import pipeline_class, pipeline_for_checkpoint, resolve_task
from .runner import Batch


class ExportablePipeline(Protocol):
    """What export and the parity check use of a `bertforge.serving.pipelines.Pipeline` (named here
    by its shape, so that this module, which the pipelines use for `backend="onnx"`, imports none)."""

    task: str
    input_names: tuple[str, ...]
    extra_input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    output_axes: dict[str, dict[int, str]]
    rows_selected_by: dict[str, str]
    max_length: int
    runner: Any

    def build_graph(self, model: nn.Module) -> nn.Module: ...

    def sample_batch(self, batch_size: int = 3, length: int = 13, seed: int = 0) -> Batch: ...

logger = logging.getLogger("bertforge")

DEFAULT_OPSET = 17  # LayerNormalization is a single op from 17 on
DEFAULT_ATOL = 1e-4
_TASK_KEY = "bertforge_task"


class OnnxParityError(RuntimeError):
    """onnxruntime's outputs differ from PyTorch's by more than the tolerance."""


@dataclass
class ExportReport:
    path: Path | None
    task: str
    max_abs_diff: float | None  # None when the check was skipped
    batches_checked: int
    opset: int


def _require(module: str):
    try:
        return __import__(module)
    except ImportError:
        raise ModuleNotFoundError(f"{module} is not installed: pip install 'bertforge[onnx]' "
                                  "(onnx and onnxruntime)") from None


@contextlib.contextmanager
def _plain_path(model: nn.Module) -> Iterator[None]:
    """Autograd on, every parameter requiring grad and the encoder padded (no unpadding: its packing
    depends on the data), restored afterwards: the encoder's plain, traceable path (see the module
    docstring)."""
    frozen = [p for p in model.parameters() if not p.requires_grad]
    unpadded = [m for m in model.modules() if isinstance(m, BertModel) and m.unpad]
    for p in frozen:
        p.requires_grad_(True)
    for encoder in unpadded:
        encoder.unpad = False
    try:
        with torch.enable_grad():
            yield
    finally:
        for p in frozen:
            p.requires_grad_(False)
        for encoder in unpadded:
            encoder.unpad = True


def _export_to(pipe: ExportablePipeline, model: nn.Module, target, opset: int) -> None:
    graph = pipe.build_graph(model).cpu()
    sample = pipe.sample_batch()
    inputs = tuple(torch.from_numpy(sample[name]) for name in pipe.input_names)
    dynamic_axes = {name: {0: "batch", 1: "sequence"} for name in pipe.input_names}
    for name in pipe.extra_input_names:  # a row-selecting input shares its output's axis name
        selected = pipe.output_axes.get(pipe.rows_selected_by.get(name, ""), {})
        dynamic_axes[name] = {0: "batch", 1: selected.get(1, "masks")}
    dynamic_axes.update(pipe.output_axes)
    with evaluating(graph), _plain_path(graph), warnings.catch_warnings():
        # Tracing warns about every Python-level branch on a tensor (all recorded as intended, see
        # the module docstring) and the exporter about its own deprecation.
        warnings.simplefilter("ignore")
        torch.onnx.export(graph, inputs, target, input_names=list(pipe.input_names),
                          output_names=list(pipe.output_names), dynamic_axes=dynamic_axes, opset_version=opset,
                          do_constant_folding=True, dynamo=False)


def _with_metadata(data: bytes, task: str) -> bytes:
    onnx = _require("onnx")
    proto = onnx.load_from_string(data)
    entry = proto.metadata_props.add()
    entry.key, entry.value = _TASK_KEY, task
    proto.producer_name = "bertforge"
    return proto.SerializeToString()


def export_onnx_bytes(pipe: ExportablePipeline, model: nn.Module, opset: int = DEFAULT_OPSET) -> bytes:
    """The ONNX model of `pipe`'s task graph around `model`, as bytes (no file written)."""
    _require("onnx")
    buffer = io.BytesIO()
    _export_to(pipe, model, buffer, opset)
    return _with_metadata(buffer.getvalue(), pipe.task)


class OnnxRunner:
    """Runs an exported pipeline graph on onnxruntime: int64 arrays in, float32 arrays out."""

    def __init__(self, model: str | os.PathLike | bytes, input_names: Sequence[str], output_names: Sequence[str],
                 device: str = "cpu", task: str | None = None, rows_selected_by: dict[str, str] | None = None):
        """`rows_selected_by`: input name -> the output whose rows (axis 1) it selects; a model without
        that input (exported before its graph took it) runs without it and its output is gathered here."""
        ort = _require("onnxruntime")
        options = ort.SessionOptions()
        # The same thread count as torch: comparable speed, and OMP_NUM_THREADS/torch.set_num_threads apply.
        options.intra_op_num_threads = torch.get_num_threads()
        providers = ["CPUExecutionProvider"]
        if str(device).startswith("cuda"):
            if "CUDAExecutionProvider" in ort.get_available_providers():
                index = str(device).partition(":")[2] or "0"
                providers.insert(0, ("CUDAExecutionProvider", {"device_id": int(index)}))
            else:
                logger.warning("onnxruntime has no CUDA provider here (install onnxruntime-gpu); running on CPU")
        source = model if isinstance(model, bytes) else str(model)
        if not isinstance(model, bytes) and not Path(model).is_file():
            raise FileNotFoundError(f"ONNX model not found: {model}")
        self.session = ort.InferenceSession(source, options, providers=providers)
        stored = self.session.get_modelmeta().custom_metadata_map.get(_TASK_KEY)
        if task is not None and stored is not None and stored != task:
            raise ValueError(f"{model if not isinstance(model, bytes) else 'the ONNX model'} was exported for "
                             f"the {stored!r} pipeline, not {task!r}")
        names = {i.name for i in self.session.get_inputs()}
        self.gathered = {name: output for name, output in (rows_selected_by or {}).items()
                         if name in input_names and name not in names}
        missing = [name for name in input_names if name not in names and name not in self.gathered]
        if missing:
            raise ValueError(f"the ONNX model lacks the input(s) {', '.join(missing)}: was it exported by bertforge "
                             "for this task?")
        self.input_names = tuple(name for name in input_names if name not in self.gathered)
        self.output_names = tuple(output_names)

    def __call__(self, batch: Batch) -> dict[str, np.ndarray]:
        feeds = {name: np.ascontiguousarray(batch[name], dtype=np.int64) for name in self.input_names}
        outputs = self.session.run(list(self.output_names), feeds)
        result = {name: np.asarray(value, dtype=np.float32) for name, value in zip(self.output_names, outputs)}
        for name, output in self.gathered.items():  # (B, S, ...) at the (B, P) rows -> (B, P, ...)
            rows = batch[name].reshape(*batch[name].shape, *([1] * (result[output].ndim - 2)))
            result[output] = np.take_along_axis(result[output], rows, axis=1)
        return result


def onnx_runner(model: str | os.PathLike | bytes, pipe: ExportablePipeline, device: str = "cpu") -> OnnxRunner:
    return OnnxRunner(model, pipe.input_names, pipe.output_names, device, task=pipe.task,
                      rows_selected_by=pipe.rows_selected_by)


def parity(pipe: ExportablePipeline, reference, candidate, batches: Sequence[Batch] | None = None) -> tuple[float, int]:
    """The largest |reference - candidate| over every output of the given batches (default: three
    random batches of different shapes, with padding), and how many batches were compared. Outputs
    with a sequence axis are compared at real tokens only: what a padding position holds differs
    between the padded (exported) and the unpadded (PyTorch default) encoder, and no pipeline reads it."""
    if batches is None:
        batches = [pipe.sample_batch(3, 13, seed=1), pipe.sample_batch(5, 40, seed=2),
                   pipe.sample_batch(1, min(pipe.max_length, 128), seed=3)]
    worst = 0.0
    for batch in batches:
        expected, actual = reference(batch), candidate(batch)
        for name in pipe.output_names:
            if expected[name].shape != actual[name].shape:
                raise OnnxParityError(f"{name}: shape {actual[name].shape} from onnxruntime, "
                                      f"{expected[name].shape} from PyTorch")
            difference = np.abs(expected[name] - actual[name])
            axis = next((a for a, label in pipe.output_axes.get(name, {}).items() if label == "sequence"), None)
            if axis is not None:  # (B, ..., S, ...): keep the real positions of each row
                real = batch["attention_mask"].astype(bool)
                difference = np.moveaxis(difference, axis, 1)[real]
            worst = max(worst, float(difference.max(initial=0.0)))
    return worst, len(batches)


def check_parity(pipe: ExportablePipeline, data: bytes, atol: float = DEFAULT_ATOL, what: str = "the model") -> tuple[float, int]:
    """Compare `pipe`'s PyTorch runner with onnxruntime on `data`; OnnxParityError past `atol`."""
    worst, count = parity(pipe, pipe.runner, onnx_runner(data, pipe))
    if not worst <= atol:  # also catches NaN
        raise OnnxParityError(f"ONNX export of {what} ({pipe.task}) differs from PyTorch by {worst:.3g} > {atol:g}")
    return worst, count


def export_onnx(model_dir: str | os.PathLike, output: str | os.PathLike | None, task: str | None = None,
                opset: int = DEFAULT_OPSET, check: bool = True, atol: float = DEFAULT_ATOL) -> ExportReport:
    """Export the `task` pipeline of a checkpoint to `output` and check it against PyTorch.

    task: any name of the task registry (default: the checkpoint's pipeline, `pipeline_for_checkpoint`).
    The check runs both backends on random padded batches of three shapes (so the dynamic axes are
    exercised) and raises OnnxParityError, writing no file, when the largest difference exceeds `atol`.
    """
    task = resolve_task(task or pipeline_for_checkpoint(model_dir))
    cls = pipeline_class(task)
    pipe = cls(model_dir, backend="torch", device="cpu")
    model = pipe.runner.graph.model
    data = export_onnx_bytes(pipe, model, opset)
    worst, count = None, 0
    if check:
        worst, count = check_parity(pipe, data, atol, str(model_dir))
    path = None
    if output is not None:
        path = Path(output)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(path, "wb", prefix=f".{path.name}.") as out:  # never a half-written .onnx file
            out.write(data)
    return ExportReport(path, task, worst, count, opset)


__all__ = ["DEFAULT_ATOL", "DEFAULT_OPSET", "ExportReport", "OnnxParityError", "OnnxRunner", "export_onnx",
           "export_onnx_bytes", "check_parity", "onnx_runner", "parity"]
