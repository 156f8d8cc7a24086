"""The PyTorch runner of a pipeline graph: int64 numpy batches in, float32 numpy outputs out.

A *runner* is any callable from a padded batch (`Batch`: name -> (B, S) int64 array) to the graph's
named outputs; `TorchRunner` runs the graph on PyTorch, `bertforge.serving.onnx.OnnxRunner` the same
graph exported to ONNX, and tests pass their own.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

Batch = dict[str, np.ndarray]
Runner = Callable[[Batch], dict[str, np.ndarray]]


class TorchRunner:
    """Runs a pipeline graph on PyTorch: int64 numpy arrays in, float32 numpy arrays out."""

    def __init__(self, graph: nn.Module, input_names: Sequence[str], output_names: Sequence[str],
                 device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.graph = graph.to(self.device).eval()
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)

    def __call__(self, batch: Batch) -> dict[str, np.ndarray]:
        with torch.inference_mode():
            inputs = [torch.from_numpy(batch[name]).to(self.device) for name in self.input_names]
            outputs = self.graph(*inputs)
        return {name: out.float().cpu().numpy() for name, out in zip(self.output_names, outputs)}


__all__ = ["Batch", "Runner", "TorchRunner"]
