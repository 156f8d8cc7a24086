"""`bertforge serve`: the HTTP server (starlette and uvicorn: the `serve` extra, imported when it starts)."""

from __future__ import annotations

import argparse
import importlib

import torch

from ..serving.limits import RequestLimits
from ..serving.server_settings import ServerSettings


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("serve", help="HTTP server: JSON API with micro-batching, metrics and a test page")
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--task", action="append", help="task(s) to serve, by name or alias (classify, tag or ner, answer "
                   "or squad, embed, fill-mask, ...), repeatable or comma-separated (default: the model's, from "
                   "config.json)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--backend", choices=("torch", "onnx"), default="torch")
    p.add_argument("--onnx-model", help="an exported .onnx for --backend onnx (default: export at start-up)")
    p.add_argument("--device", help="cpu (default), cuda, cuda:1 ...")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16", "int8"),
                   help="--backend torch: bf16 (CPUs with AVX-512 BF16/AMX, GPUs), fp16 (GPUs) or int8 (CPU) "
                        "for speed at a small cost in accuracy (default fp32, exact)")
    p.add_argument("--max-length", type=int, help="tokens per model input (default: the model's)")
    p.add_argument("--max-batch-size", type=int, default=32, help="inputs per forward pass")
    p.add_argument("--max-batch-tokens", type=int, default=ServerSettings.max_batch_tokens,
                   help="padded tokens per forward batch: a short request waits for one such batch at most")
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="how long a request waits to be batched")
    p.add_argument("--no-micro-batching", action="store_true", help="one forward pass per request")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20)
    p.add_argument("--max-texts", type=int, default=64, help="inputs per request")
    p.add_argument("--max-chars", type=int, default=10_000, help="characters per input text (413 over it)")
    p.add_argument("--body-timeout", type=float, default=10.0,
                   help="seconds to receive a request's whole body (408 and the connection closed after)")
    p.add_argument("--header-timeout", type=float, default=ServerSettings.header_timeout_s,
                   help="seconds to receive a request's headers (the connection is closed after)")
    p.add_argument("--max-connections", type=int, default=ServerSettings.max_connections,
                   help="open connections (more are answered 503 and closed)")
    p.add_argument("--max-queued-tokens", type=int, default=ServerSettings.max_queued_tokens,
                   help="model tokens of queued work past which a request is answered 429 with Retry-After "
                        "(the work queued before it, plus its own; one alone is always admitted), so that an "
                        "admitted request starts within this work plus the call running. The default (one request at the "
                        "default limits: 256 rows of 512 tokens) is ~25 s of all-MiniLM-L6-v2 on 2 idle CPU "
                        "cores (~5,600 tokens/s); scale it with the model's throughput; 0: no bound")
    p.add_argument("--max-top-k", type=int, default=RequestLimits.max_top_k, help="fill-mask top_k per request")
    p.add_argument("--max-predictions", type=int, default=RequestLimits.max_predictions,
                   help="fill-mask [MASK]s x top_k per request")
    p.add_argument("--max-rows", type=int, default=RequestLimits.max_rows,
                   help="model input rows per request (texts x windows, contexts x endings)")
    p.add_argument("--min-stride-fraction", type=float, default=RequestLimits.min_stride_fraction,
                   help="smallest tag stride / answer doc_stride, as a fraction of the model's input length")
    p.add_argument("--num-threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--graceful-timeout", type=float, default=30.0,
                   help="on SIGTERM/SIGINT: queued requests are answered 503 with Retry-After at once, the "
                        "requests running get this many seconds to finish (else 503), and the process exits "
                        "within it plus one forward batch")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=run)


def require_serve_extra() -> None:
    """starlette and uvicorn come with the `serve` extra: say how to get them, before any model is loaded."""
    for module in ("starlette", "uvicorn"):
        try:
            importlib.import_module(module)
        except ImportError:
            raise ModuleNotFoundError(f"{module} is not installed: pip install 'bertforge[serve]' "
                                      "(starlette and uvicorn)") from None


def run(args: argparse.Namespace) -> None:
    require_serve_extra()
    from ..serving.server import serve  # optional extra
    from ..serving.server_settings import ServerSettings  # optional extra

    tasks = [t for value in args.task or [] for t in value.split(",") if t]
    settings = ServerSettings(max_batch_size=args.max_batch_size, max_batch_tokens=args.max_batch_tokens,
                              max_wait_ms=args.max_wait_ms,
                              micro_batching=not args.no_micro_batching, max_body_bytes=args.max_body_bytes,
                              max_texts=args.max_texts, max_chars=args.max_chars, body_timeout_s=args.body_timeout,
                              header_timeout_s=args.header_timeout, max_connections=args.max_connections,
                              max_queued_tokens=args.max_queued_tokens or None,
                              limits=RequestLimits(max_top_k=args.max_top_k, max_predictions=args.max_predictions,
                                                   max_rows=args.max_rows,
                                                   min_stride_fraction=args.min_stride_fraction))
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    serve(args.model, tasks or None, host=args.host, port=args.port, settings=settings, backend=args.backend,
          device=args.device, max_length=args.max_length, onnx_model=args.onnx_model, log_level=args.log_level,
          graceful_timeout=args.graceful_timeout, dtype=args.dtype)
