"""Load test of `bertforge serve` on loopback: throughput and latency with and without micro-batching,
memory over the run, and bad requests.

    python benchmarks/serve_load.py --model runs/sst2/final            # 60 s per mode
    python benchmarks/serve_load.py --model DIR --duration 5           # a smoke run

For each mode (micro-batching on, then off) it starts the server as a child process
(`python -m bertforge serve --task classify`), sends SST-2 dev sentences to `/v1/classify` from
`--clients` concurrent keep-alive connections, one sentence per request, for `--duration` seconds,
and records throughput, p50/p99 latency, errors and the server's resident memory after warm-up, every
5 s during the load and at the end. After the batched run it sends `--bad-requests` requests of each
bad kind (oversize body, too many texts, too long a text, bad JSON, wrong types, empty text), checks
each gets its 4xx and that a good request still succeeds after each kind, then stops the server with SIGTERM (graceful: in-flight
requests finish; uvicorn then re-raises the signal, so the exit status reads -15).
Prints one JSON line. Only loopback is used; every loop is bounded in time or count.
"""

from __future__ import annotations

import argparse
import csv
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO / ".." / "shared" / "data" / "glue" / "SST-2" / "dev.tsv"
HOST = "127.0.0.1"


def read_sentences(path: Path) -> list[str]:
    with open(path, encoding="utf-8", newline="") as handle:
        rows = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [row["sentence"] for row in rows if row.get("sentence", "").strip()]


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def post(connection: http.client.HTTPConnection, path: str, body: bytes) -> tuple[int, bytes]:
    connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, response.read()


class Server:
    def __init__(self, args, batching: bool):
        self.port = free_port()
        command = [sys.executable, "-m", "bertforge", "serve", "--model", str(args.model), "--task", "classify",
                   "--host", HOST, "--port", str(self.port), "--max-batch-size", str(args.max_batch_size),
                   "--max-wait-ms", str(args.max_wait_ms), "--log-level", "warning"]
        if not batching:
            command.append("--no-micro-batching")
        if args.num_threads:
            command += ["--num-threads", str(args.num_threads)]
        if args.dtype:
            command += ["--dtype", args.dtype]
        self.process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + args.startup_timeout
        while True:
            if self.process.poll() is not None:
                raise SystemExit(f"the server exited with {self.process.returncode}: {self.process.stderr.read()}")
            try:
                connection = http.client.HTTPConnection(HOST, self.port, timeout=5)
                connection.request("GET", "/health")
                if connection.getresponse().status == 200:
                    connection.close()
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.process.kill()
                raise SystemExit("the server did not become healthy in time")
            time.sleep(0.2)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return -9


def load(port: int, sentences: list[str], clients: int, duration: float) -> dict:
    """`clients` threads, each with its own keep-alive connection, one sentence per request."""
    latencies: list[float] = []
    errors = {"count": 0, "examples": []}
    lock = threading.Lock()
    stop_at = time.monotonic() + duration

    def client(index: int) -> None:
        connection = http.client.HTTPConnection(HOST, port, timeout=60)
        position = index
        mine: list[float] = []
        while time.monotonic() < stop_at:
            body = json.dumps({"texts": [sentences[position % len(sentences)]]}).encode()
            position += clients
            start = time.perf_counter()
            try:
                status, payload = post(connection, "/v1/classify", body)
                ok = status == 200
            except (OSError, http.client.HTTPException) as error:
                status, payload, ok = None, str(error).encode(), False
                connection.close()
                connection = http.client.HTTPConnection(HOST, port, timeout=60)
            elapsed = time.perf_counter() - start
            if ok:
                mine.append(elapsed)
            else:
                with lock:
                    errors["count"] += 1
                    if len(errors["examples"]) < 3:
                        errors["examples"].append(f"{status}: {payload[:200].decode(errors='replace')}")
        connection.close()
        with lock:
            latencies.extend(mine)

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(duration + 120)
    wall = time.perf_counter() - started
    latencies.sort()

    def percentile(q: float) -> float | None:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 2) if latencies else None

    return {"requests": len(latencies), "seconds": round(wall, 2),
            "throughput_rps": round(len(latencies) / wall, 2), "p50_ms": percentile(0.50), "p99_ms": percentile(0.99),
            "mean_ms": round(statistics.fmean(latencies) * 1000, 2) if latencies else None,
            "errors": errors["count"], "error_examples": errors["examples"]}


RSS_EVERY_S = 5.0


class RssSampler:
    """The server's resident memory every `every` seconds while the load runs, in a thread.

    A leak grows without end; a server that is merely warming up (the allocator reaching the sizes of
    full micro-batches) grows early and then stays. So the summary compares the second half of the
    run with its end: `rss_growth_second_half_mb` near zero is "flat"."""

    def __init__(self, pid: int, every: float):
        self.pid, self.every = pid, every
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            rss = rss_bytes(self.pid)
            if rss:
                self.samples.append(round(rss / 2**20, 1))

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(self.every + 5)

    def summary(self) -> dict:
        if len(self.samples) < 2:
            return {"rss_mb_every_5s": self.samples}
        half = self.samples[len(self.samples) // 2]
        return {"rss_mb_every_5s": self.samples,
                "rss_growth_second_half_mb": round(self.samples[-1] - half, 1)}


def bad_requests(port: int, count: int, max_body_bytes: int) -> dict:
    """`count` requests of each bad kind; each must get its status, and a good request must pass after."""
    kinds = {
        "oversize_body": (413, json.dumps({"texts": ["x" * (max_body_bytes + 10)]}).encode()),
        "too_many_texts": (413, json.dumps({"texts": ["a good film"] * 65}).encode()),
        "text_too_long": (413, json.dumps({"texts": ["word " * 2001]}).encode()),
        "bad_json": (400, b'{"texts": ["unterminated'),
        "wrong_types": (422, json.dumps({"texts": [1, {"a": 2}]}).encode()),
        "empty_text": (422, json.dumps({"texts": ["   "]}).encode()),
    }
    report = {}
    good = json.dumps({"texts": ["a gripping, beautifully made film"]}).encode()
    for name, (expected, body) in kinds.items():
        connection = http.client.HTTPConnection(HOST, port, timeout=60)
        statuses: dict[str, int] = {}
        for _ in range(count):
            try:
                status, _ = post(connection, "/v1/classify", body)
            except (OSError, http.client.HTTPException):
                status = "connection_error"
                connection.close()
                connection = http.client.HTTPConnection(HOST, port, timeout=60)
            statuses[str(status)] = statuses.get(str(status), 0) + 1
        connection.close()
        connection = http.client.HTTPConnection(HOST, port, timeout=60)
        still_serving = post(connection, "/v1/classify", good)[0] == 200
        connection.close()
        report[name] = {"expected": expected, "statuses": statuses,
                        "ok": statuses == {str(expected): count} and still_serving, "still_serving": still_serving}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a sequence-classification checkpoint (e.g. fine-tuned SST-2)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="SST-2 dev.tsv")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load per mode")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--bad-requests", type=int, default=100, help="requests of each bad kind")
    parser.add_argument("--modes", default="batched,unbatched", help="comma-separated: batched, unbatched")
    parser.add_argument("--num-threads", type=int, help="torch threads in the server")
    parser.add_argument("--dtype", choices=("fp32", "bf16", "int8"), help="the server's --dtype (default: its own, fp32)")
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    args = parser.parse_args()

    sentences = read_sentences(args.data)
    result: dict = {"benchmark": "serve_load", "model": str(args.model), "dtype": args.dtype or "fp32", "data": str(args.data),
                    "sentences": len(sentences), "clients": args.clients, "duration_s": args.duration,
                    "max_batch_size": args.max_batch_size, "max_wait_ms": args.max_wait_ms,
                    "torch_threads_env": os.environ.get("OMP_NUM_THREADS")}
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        server = Server(args, batching=mode == "batched")
        run: dict = {}
        try:
            warm = http.client.HTTPConnection(HOST, server.port, timeout=60)
            post(warm, "/v1/classify", json.dumps({"texts": sentences[:8]}).encode())
            warm.close()
            rss_start = rss_bytes(server.process.pid)
            with RssSampler(server.process.pid, RSS_EVERY_S) as sampler:
                run.update(load(server.port, sentences, args.clients, args.duration))
            run["rss_start_mb"] = round(rss_start / 2**20, 1) if rss_start else None
            rss_end = rss_bytes(server.process.pid)
            run["rss_end_mb"] = round(rss_end / 2**20, 1) if rss_end else None
            run.update(sampler.summary())
            if mode == "batched" and args.bad_requests:
                result["bad_requests"] = bad_requests(server.port, args.bad_requests, 1 << 20)
                rss_after = rss_bytes(server.process.pid)
                run["rss_after_bad_requests_mb"] = round(rss_after / 2**20, 1) if rss_after else None
        finally:
            run["exit_code_after_sigterm"] = server.stop()
        result[mode] = run
    if "batched" in result and "unbatched" in result and result["unbatched"]["throughput_rps"]:
        result["batching_speedup"] = round(result["batched"]["throughput_rps"] / result["unbatched"]["throughput_rps"], 2)
    # uvicorn re-raises SIGTERM after its graceful shutdown, so a clean exit reads -15 (or 0).
    clean_exits = (0, -signal.SIGTERM)
    result["ok"] = (all(result[m]["errors"] == 0 and result[m]["exit_code_after_sigterm"] in clean_exits
                        for m in ("batched", "unbatched") if m in result)
                    and all(kind["ok"] for kind in result.get("bad_requests", {}).values()))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
