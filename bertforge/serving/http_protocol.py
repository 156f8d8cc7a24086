"""The server's HTTP/1.1 connections: uvicorn's h11 protocol with the three guards it lacks.

- **Header timeout.** uvicorn times out an idle keep-alive connection (`timeout_keep_alive`) and
  bounds a header's size (h11's 16 KiB `max_incomplete_event_size`), but a client that sends half a
  header, or nothing after connecting, is never cut off. Here the headers of a request must arrive
  whole within `header_timeout_s` of the connection (or of the previous answer on a keep-alive
  connection); otherwise the connection is closed, after a 408 when part of a header came.
  (The body has its own timeout, `body_timeout_s`, kept by the app while it reads the body.)
- **Connection cap.** Beyond `max_connections` open connections a new one is answered 503 and
  closed at once, so that slow sockets cannot use up the process's file descriptors; the held ones
  free their places when the header timeout closes them.
- **Lingering close.** A request refused before its body was read (413, 408) is answered, then the
  connection's sending side is shut and what the client still sends is read and discarded (up to
  `max_drain_bytes`, for at most `drain_timeout_s`) before the socket closes, as nginx's lingering
  close does: closing with unread data makes the kernel reset the connection, and a plain client
  (urllib, http.client: no `Expect: 100-continue`), still sending its body, would see
  ECONNRESET/EPIPE instead of the answer.

The h11 implementation is used whatever else is installed (httptools would bring other code paths
that these guards do not cover).
"""

from __future__ import annotations

import asyncio
import http
import json
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .server_settings import ServerSettings


def raw_response(status: int, reason: str) -> bytes:
    """A whole `{"error": reason}` response that closes the connection, for answers written outside
    any request (h11 only sends a response to a request it has parsed)."""
    body = json.dumps({"error": reason}).encode()
    head = (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode("ascii") + body


class _LingeringTransport:
    """The connection's transport as uvicorn sees it: `close()` asks the protocol, which lingers when
    the request's body is still arriving; everything else is the real transport's."""

    def __init__(self, transport: asyncio.Transport, protocol: "GuardedH11Protocol"):
        self._transport, self._protocol = transport, protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        self._protocol.close_connection()

    def is_closing(self) -> bool:
        return self._protocol.lingering or self._transport.is_closing()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's H11Protocol with a header timeout, a connection cap and a lingering close (see the
    module docstring). `settings` is bound by `protocol_class`."""

    settings: ServerSettings = ServerSettings()

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.raw: asyncio.Transport | None = None
        self.refused = False
        self.lingering = False
        self._drain_left = 0
        self._header_timer: asyncio.TimerHandle | None = None
        self._drain_timer: asyncio.TimerHandle | None = None

    # -- the connection cap

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.settings.max_connections:
            self.refused = True
            transport.write(raw_response(503, f"the server holds {self.settings.max_connections} connections "
                                              "(max_connections): try again shortly"))
            transport.close()
            return
        self.raw = transport
        super().connection_made(_LingeringTransport(transport, self))  # type: ignore[arg-type]
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.refused:
            return
        self._cancel_timers()
        super().connection_lost(exc)

    # -- the header timeout

    def _arm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = self.loop.call_later(self.settings.header_timeout_s, self._header_timeout)

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.raw is None or self.raw.is_closing() or self.lingering:
            return
        # Waiting for a request's headers, or still receiving the body of one already answered.
        if self.conn.their_state is not h11.IDLE and self.conn.our_state is not h11.DONE:
            return
        if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:  # part of a header came
            self.raw.write(raw_response(408, "the request headers did not arrive within "
                                             f"{self.settings.header_timeout_s:g} s"))
        self.raw.close()

    def data_received(self, data: bytes) -> None:
        if self.lingering:  # discarded: only read so that the client can finish sending and read the answer
            self._drain_left -= len(data)
            if self._drain_left < 0:
                self.raw.close()
            return
        super().data_received(data)
        if self._header_timer is not None and self.conn.their_state is not h11.IDLE:
            self._header_timer.cancel()  # the headers are in
            self._header_timer = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_timer()  # the next request's headers, on this keep-alive connection

    # -- the lingering close

    def close_connection(self) -> None:
        """Close now, or, when the client is still sending a body nobody read, shut our side and read
        (and drop) what comes for a bounded time and size, then close."""
        if self.lingering or self.raw.is_closing():
            return
        if self.conn.their_state is not h11.SEND_BODY or self.settings.max_drain_bytes <= 0 \
                or not self.raw.can_write_eof():
            self.raw.close()
            return
        self.lingering = True
        self._drain_left = self.settings.max_drain_bytes
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self._unset_keepalive_if_required()
        self.raw.write_eof()  # after the answer already written: the client reads it, then EOF
        self.flow.resume_reading()
        self._drain_timer = self.loop.call_later(self.settings.drain_timeout_s, self.raw.close)

    def shutdown(self) -> None:
        if self.lingering:
            self.raw.close()
        else:
            super().shutdown()

    def _cancel_timers(self) -> None:
        for timer in (self._header_timer, self._drain_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._drain_timer = None


def protocol_class(settings: ServerSettings) -> type[GuardedH11Protocol]:
    """GuardedH11Protocol bound to `settings`, for `uvicorn.Config(http=...)`."""
    return type("BertforgeH11Protocol", (GuardedH11Protocol,), {"settings": settings})


__all__ = ["GuardedH11Protocol", "protocol_class", "raw_response"]
