"""The server's settings (batching, limits and connection guards) and the error a refused request raises."""

from __future__ import annotations

from dataclasses import dataclass, field

from .admission import DEFAULT_MAX_QUEUED_TOKENS
from .limits import RequestLimits


@dataclass
class ServerSettings:
    """Batching, limits and connection guards. `micro_batching=False` runs every request as its own
    forward pass. `limits`: what one request may cost (`bertforge.serving.limits`), the same limits
    the pipelines' API applies."""

    max_batch_size: int = 32  # inputs per forward pass
    max_batch_tokens: int = 4096  # padded tokens per forward batch: a cheaper request waits for one at most
    max_wait_ms: float = 5.0  # how long the first request of a batch waits for company
    micro_batching: bool = True
    max_body_bytes: int = 1 << 20
    max_texts: int = 64  # inputs per request
    max_chars: int = 10_000  # characters per input text
    body_timeout_s: float = 10.0  # to receive a request's whole body, however it trickles in
    header_timeout_s: float = 10.0  # to receive a request's headers, from the connection or the previous answer
    max_connections: int = 500  # open connections; more are answered 503 and closed
    # Model tokens of queued work past which a request is answered 429 with Retry-After (`admission`);
    # None: no bound.
    max_queued_tokens: int | None = DEFAULT_MAX_QUEUED_TOKENS
    max_drain_bytes: int = 16 << 20  # of a refused body, read and dropped so that the client reads the answer
    drain_timeout_s: float = 5.0  # how long that reading may take
    limits: RequestLimits = field(default_factory=RequestLimits)
    model: str = ""
    backend: str = "torch"
    dtype: str = "fp32"

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "drain_timeout_s", "max_connections", "max_batch_tokens"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        if self.max_queued_tokens is not None and not self.max_queued_tokens > 0:
            raise ValueError(f"max_queued_tokens must be positive, got {self.max_queued_tokens!r}")
        if self.max_drain_bytes < 0:
            raise ValueError(f"max_drain_bytes must be at least 0, got {self.max_drain_bytes!r}")


class ApiError(Exception):
    """A request the server refuses: `status` and the one-line `reason` the client gets. `close`: end
    the connection after answering (its body was not read to the end). `headers`: extra response headers."""

    def __init__(self, status: int, reason: str, close: bool = False, headers: dict[str, str] | None = None):
        super().__init__(reason)
        self.status, self.reason, self.close, self.headers = status, reason, close, headers or {}


__all__ = ["ApiError", "ServerSettings"]
