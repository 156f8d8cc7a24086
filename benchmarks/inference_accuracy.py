"""What the fast inference paths cost in accuracy: a fine-tuned GLUE model's dev metrics at fp32,
bf16 and int8 (`optimize_for_inference`), on the same dev set, batches and threads; and, beside them,
the peer's at its best settings in each precision (`--dtypes` with `peer_*`).

    python benchmarks/inference_accuracy.py --model runs/sst2 --task sst2 --data-dir ../shared/data/glue
    python benchmarks/inference_accuracy.py --model runs/sst2 --task sst2 --data-dir ../shared/data/glue \
        --dtypes fp32,bf16,int8,peer_fp32,peer_bf16,peer_onnx,peer_onnx_int8
    python benchmarks/inference_accuracy.py --quick      # seconds: the test, backs no figure

`--quick`: every dtype above on a tiny random `BertForSequenceClassification` (MiniLM's vocabulary) and a toy
SST-2 dev set of 32 Shakespeare speeches, built in a temporary directory.

The peer's rows load the same checkpoint into transformers' `BertForSequenceClassification` (sdpa)
and take the same token ids: `peer_fp32`; `peer_bf16` under `torch.autocast("cpu", bfloat16)`;
`peer_onnx` and `peer_onnx_int8` run its encoder and pooler on onnxruntime (fp32, and after
`quantize_dynamic` with int8 weights, as `benchmarks/inference.py` does) with the classifier layer
after it in torch fp32. Every row is compared with bertforge's fp32 (the first dtype).

For each dtype: the task's dev metrics (fractions), the change of each from fp32 in points (×100),
how many predictions differ from fp32's, the largest logit difference from fp32, and the wall time of
the pass (unpadded, length-sorted batches of `--batch-size`). Prints ONE JSON line; progress on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _common import cpu_model, log, quick_checkpoint, quick_glue  # noqa: E402


PEER_SETTINGS = ("fp32", "bf16", "onnx", "onnx_int8")


def peer_classifier(model_dir: str, setting: str, threads: int):
    """transformers' BertForSequenceClassification of `model_dir` as a module whose call returns
    `.logits` (what `predict_features` reads), run at `setting` (one of PEER_SETTINGS)."""
    import contextlib
    from types import SimpleNamespace

    import torch
    import transformers

    if setting not in PEER_SETTINGS:
        raise SystemExit(f"unknown peer setting {setting!r}; choose from {', '.join(PEER_SETTINGS)}")
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    peer = transformers.BertForSequenceClassification.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    encoder = None
    if setting.startswith("onnx"):
        from benchmarks.inference import onnx_encoder  # the package: REPO is on sys.path

        encoder = onnx_encoder(peer.bert, threads, peer=True, int8=setting == "onnx_int8")

    class Peer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.peer = peer

        def forward(self, input_ids, token_type_ids, attention_mask):
            inputs = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}
            if encoder is not None:
                _, pooled = encoder(inputs)
                return SimpleNamespace(logits=self.peer.classifier(pooled))
            autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if setting == "bf16"
                        else contextlib.nullcontext())
            with autocast:
                return SimpleNamespace(logits=self.peer(**inputs).logits.float())

    return Peer().eval()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a fine-tuned `bertforge finetune glue` output (required unless --quick)")
    parser.add_argument("--task", help="required unless --quick")
    parser.add_argument("--data-dir", help="required unless --quick")
    parser.add_argument("--dtypes", default="fp32,bf16,int8",
                        help="comma-separated: fp32 (the reference, first), bf16, int8 (bertforge's default "
                             "engine), int8_x86, int8_onednn; the peer's peer_fp32, peer_bf16, peer_onnx, "
                             "peer_onnx_int8")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true",
                        help="every dtype on a tiny random classifier and a toy SST-2 dev set (the test)")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.quick:
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="inference-accuracy-")))
            args.model = str(quick_checkpoint(scratch / "model", "BertForSequenceClassification", num_labels=2))
            args.data_dir, args.task = str(quick_glue(scratch / "glue", "SST-2", rows=96)), "sst2"
            args.dtypes = "fp32,bf16,int8,peer_fp32,peer_bf16,peer_onnx,peer_onnx_int8"
        elif not (args.model and args.task and args.data_dir):
            parser.error("--model, --task and --data-dir are required (or --quick)")
        return run(args)


def run(args: argparse.Namespace) -> dict:
    import numpy as np
    import torch

    from bertforge.metrics.glue import glue_metrics
    from bertforge.modeling import BertForSequenceClassification, optimize_for_inference
    from bertforge.tasks.classify import logits_to_predictions, predict_features
    from bertforge.tasks.classify_features import convert_examples_to_features
    from bertforge.tasks.glue_data import get_task, read_glue_examples
    from bertforge.tokenization import BertTokenizer

    torch.set_num_threads(args.threads)
    spec = get_task(args.task)
    split = spec.dev_splits[0]
    examples = read_glue_examples(spec, args.data_dir, split)
    tokenizer = BertTokenizer.from_pretrained(args.model)
    features = convert_examples_to_features(examples, tokenizer, spec.label_list, args.max_seq_length)
    labels = [f["label"] for f in features]
    regression = spec.label_list is None
    pad_id = tokenizer.vocab.get("[PAD]", 0)

    results, reference = {}, None
    for dtype in args.dtypes.split(","):
        if dtype.startswith("peer_"):
            model = peer_classifier(args.model, dtype[len("peer_"):], args.threads)
        else:
            # "int8_onednn", "int8_x86": int8 with its weights packed for that torch quantized engine
            base, _, engine = dtype.partition("_")
            model = optimize_for_inference(BertForSequenceClassification.from_pretrained(args.model), dtype=base,
                                           quantized_engine=engine or None)
        with torch.inference_mode():
            predict_features(model, features[:args.batch_size], args.batch_size, pad_id)  # warm-up
            start = time.perf_counter()
            logits = predict_features(model, features, args.batch_size, pad_id)
            seconds = time.perf_counter() - start
        predictions = logits_to_predictions(logits, regression)
        metrics = glue_metrics(spec.split(split).metrics_task, predictions, labels)
        row = {"metrics": {k: round(v, 6) for k, v in metrics.items()}, "seconds": round(seconds, 2)}
        if reference is None:
            reference = (logits, predictions, metrics)
        else:
            row["change_points"] = {k: round(100 * (v - reference[2][k]), 3) for k, v in metrics.items()}
            row["predictions_changed"] = int(np.sum(predictions != reference[1])) if not regression else None
            row["max_abs_logit_diff"] = float(np.abs(logits - reference[0]).max())
        results[dtype] = row
        log(f"{dtype}: {row}")

    out = {"benchmark": "inference_accuracy", **({"quick": True} if args.quick else {}),
           "task": spec.name, "split": split, "examples": len(features),
           "model": str(args.model), "threads": args.threads, "batch_size": args.batch_size,
           "torch_version": torch.__version__, "cpu_model": cpu_model(),
           "results": results}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
