"""The server's metrics: Prometheus counters and histograms, and the middleware that records requests.

Served as Prometheus text at `GET /metrics` by `bertforge.serving.server`.
"""

from __future__ import annotations

import bisect
import collections
import os
import time
from typing import Sequence

from .registry import PIPELINES

# ---------------------------------------------------------------------------- metrics


class Histogram:
    def __init__(self, buckets: Sequence[float]):
        self.buckets = list(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last: above every bucket (+Inf only)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def render(self, name: str, labels: str = "") -> list[str]:
        lines, cumulative = [], 0
        prefix = labels + "," if labels else ""
        for bound, count in zip(self.buckets, self.counts):
            cumulative += count
            lines.append(f'{name}_bucket{{{prefix}le="{bound:g}"}} {cumulative}')
        lines.append(f'{name}_bucket{{{prefix}le="+Inf"}} {self.count}')
        suffix = f"{{{labels}}}" if labels else ""
        lines += [f"{name}_sum{suffix} {self.sum:.6f}", f"{name}_count{suffix} {self.count}"]
        return lines


LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def resident_memory_bytes() -> int | None:
    """This process's resident set size, from /proc (Linux); None elsewhere."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class Metrics:
    """Counters and histograms, updated on the event loop only (so without locks)."""

    def __init__(self) -> None:
        self.requests: collections.Counter[tuple[str, int]] = collections.Counter()
        self.latency: dict[str, Histogram] = {}
        self.batch_size = Histogram(BATCH_BUCKETS)
        self.forward_seconds = Histogram(LATENCY_BUCKETS)
        self.in_flight = 0

    def record_request(self, route: str, status: int, seconds: float) -> None:
        self.requests[(route, status)] += 1
        self.latency.setdefault(route, Histogram(LATENCY_BUCKETS)).observe(seconds)

    def render(self) -> str:
        lines = ["# HELP bertforge_requests_total HTTP requests by route and status code.",
                 "# TYPE bertforge_requests_total counter"]
        for (route, status), count in sorted(self.requests.items()):
            lines.append(f'bertforge_requests_total{{route="{route}",code="{status}"}} {count}')
        lines += ["# HELP bertforge_request_duration_seconds Time from request to response.",
                  "# TYPE bertforge_request_duration_seconds histogram"]
        for route, histogram in sorted(self.latency.items()):
            lines += histogram.render("bertforge_request_duration_seconds", f'route="{route}"')
        lines += ["# HELP bertforge_batch_size Inputs per forward pass (after micro-batching).",
                  "# TYPE bertforge_batch_size histogram", *self.batch_size.render("bertforge_batch_size"),
                  "# HELP bertforge_forward_duration_seconds Time of one pipeline call on the model thread.",
                  "# TYPE bertforge_forward_duration_seconds histogram",
                  *self.forward_seconds.render("bertforge_forward_duration_seconds"),
                  "# HELP bertforge_requests_in_flight Requests being handled now.",
                  "# TYPE bertforge_requests_in_flight gauge", f"bertforge_requests_in_flight {self.in_flight}"]
        rss = resident_memory_bytes()
        if rss is not None:
            lines += ["# HELP process_resident_memory_bytes Resident memory size in bytes.",
                      "# TYPE process_resident_memory_bytes gauge", f"process_resident_memory_bytes {rss}"]
        return "\n".join(lines) + "\n"


class MetricsMiddleware:
    """Counts every HTTP response by route (the pipeline name for /v1/..., else a known path or
    "other": unknown paths must not create unbounded label values) and status code."""

    KNOWN = {"/", "/health", "/metrics"}

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if path.startswith("/v1/"):
            name = path[len("/v1/"):]
            route = name if name in PIPELINES else "unknown_pipeline"
        else:
            route = path if path in self.KNOWN else "other"
        status = 500
        start = time.perf_counter()

        async def send_wrapper(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.in_flight += 1
        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.metrics.in_flight -= 1
            self.metrics.record_request(route, status, time.perf_counter() - start)


__all__ = ["BATCH_BUCKETS", "LATENCY_BUCKETS", "Histogram", "Metrics", "MetricsMiddleware", "resident_memory_bytes"]
