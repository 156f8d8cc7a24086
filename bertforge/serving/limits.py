"""What one pipeline call (one server request) may cost: the options that multiply work, bounded.

They are the server's: `bertforge serve` gives the pipelines it serves its per-request limits
(`Pipeline.with_limits`), so that `POST /v1/<pipeline>` refuses a costly request with a
`PipelineInputError`'s message (answered with 422). A library pipeline has none by default (a batch
job's call runs whatever its size, in batches); a caller who wants the server's refusals passes
`limits=RequestLimits(...)`, and gets the same messages. Every check runs before the forward pass:

- fill-mask `top_k`: at most `max_top_k` and the vocabulary size; the predictions of a call, the
  [MASK]s of its texts times `top_k`, at most `max_predictions` (this bounds the response size).
- tag `stride` and answer `doc_stride`: at least `min_stride_fraction` of the model's input length
  (`max_length`), so that a text yields a bounded number of windows.
- model rows of a call where inputs multiply into rows (texts x windows for tag and answer,
  contexts x endings for multiple choice): at most `max_rows`, counted before any row is built.
  (Elsewhere a text is one row: the server bounds them with `max_texts`.)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestLimits:
    """The per-call cost limits (see the module docstring); `bertforge serve` sets them from its flags."""

    max_top_k: int = 50  # fill-mask candidates per [MASK]
    max_predictions: int = 2048  # fill-mask: [MASK]s x top_k over a call's texts
    min_stride_fraction: float = 0.25  # tag stride / answer doc_stride, as a fraction of max_length
    max_rows: int = 256  # model input rows per call

    def __post_init__(self) -> None:
        for name in ("max_top_k", "max_predictions", "max_rows"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not 0 <= self.min_stride_fraction <= 1:
            raise ValueError(f"min_stride_fraction must lie in [0, 1], got {self.min_stride_fraction!r}")

    def min_stride(self, max_length: int) -> int:
        """The smallest stride (tag) or doc_stride (answer) allowed for inputs of `max_length` tokens."""
        return max(1, int(max_length * self.min_stride_fraction))


__all__ = ["RequestLimits"]
