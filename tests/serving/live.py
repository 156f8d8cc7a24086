"""A real uvicorn server on a free loopback port, in a thread (tests only), configured as `bertforge
serve` configures it (`uvicorn_server`: the guarded h11 protocol with the app's settings, the
batcher drained on shutdown)."""

from __future__ import annotations

import socket
import threading
import time


class LiveServer:
    def __init__(self, app, graceful_timeout: float = 10.0):
        from bertforge.serving.server import uvicorn_server

        with socket.socket() as probe:  # a free port; the tiny race with another process is acceptable here
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.app = app
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn_server(app, "127.0.0.1", self.port, graceful_timeout=graceful_timeout,
                                     log_level="warning")
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    def __enter__(self) -> "LiveServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
