"""The server's settings (batching and limits) and the error a refused request raises."""

from __future__ import annotations

from dataclasses import dataclass

@dataclass
class ServerSettings:
    """Batching and limits. `micro_batching=False` runs every request as its own forward pass."""

    max_batch_size: int = 32  # inputs per forward pass
    max_wait_ms: float = 5.0  # how long the first request of a batch waits for company
    micro_batching: bool = True
    max_body_bytes: int = 1 << 20
    max_texts: int = 64  # inputs per request
    max_chars: int = 10_000  # characters per input text
    body_timeout_s: float = 10.0  # to receive a request's whole body, however it trickles in
    model: str = ""
    backend: str = "torch"
    dtype: str = "fp32"


class ApiError(Exception):
    """A request the server refuses: `status` and the one-line `reason` the client gets. `close`: end
    the connection after answering (its body was not read to the end)."""

    def __init__(self, status: int, reason: str, close: bool = False):
        super().__init__(reason)
        self.status, self.reason, self.close = status, reason, close


__all__ = ["ApiError", "ServerSettings"]
