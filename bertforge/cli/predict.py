"""`bertforge predict`: a fine-tuned model's predictions for a file (or one SQuAD question).

`--task` names the task, as everywhere on the command line (by its name or an alias; default: the one
the model was fine-tuned for): it picks the reader and output format, a GLUE task name its labels.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .._checks import check_output, model_positions
from ..tasks import multi_label
from ..tasks.choice import predict_choice_file
from ..tasks.classification import predict_file
from ..tasks.squad import SquadSettings, answer_questions, json_text, predict_squad_file
from ..tasks.tagging import predict_conll
from ._common import model_config, ner_summary, squad_flags, task_family


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("predict", help="predictions of a fine-tuned model for a file")
    p.add_argument("--model", required=True, help="a `bertforge finetune` output directory")
    p.add_argument("--input", help="GLUE test.tsv (or dev-shaped), or CSV/TSV/JSONL with text; SQuAD JSON; SWAG CSV")
    p.add_argument("--output", help="TSV: index, prediction (GLUE submission format); SQuAD: predictions JSON")
    p.add_argument("--task", help="the task, by name or alias: classify or a GLUE task (mrpc, ...: its labels and "
                   "submission format), multi-label, answer or squad, tag or ner, multiple-choice (default: the "
                   "model's, finetuning_task in config.json)")
    p.add_argument("--max-seq-length", type=int, help="default 128; SQuAD: the model's (384)")
    p.add_argument("--question", help="SQuAD model: answer this question (with --context), printed as JSON")
    p.add_argument("--context", help="SQuAD model: the passage holding the answer")
    p.add_argument("--doc-stride", type=int, help="SQuAD: default the model's (128); classification with "
                   "--long-input windows: tokens between window starts (default: the model's, or half a window)")
    p.add_argument("--long-input", choices=("truncate", "windows"),
                   help="classification: truncate long inputs, or classify overlapping windows and average "
                   "their logits (default: what the model was fine-tuned with)")
    p.add_argument("--max-answer-length", type=int, help="SQuAD: default the model's (30)")
    p.add_argument("--null-score-diff-threshold", type=float,
                   help="SQuAD 2.0: default the model's (0, or the value --tune-threshold chose)")
    p.add_argument("--document-context", action=argparse.BooleanOptionalAction, default=None,
                   help="NER: windows with document context (default: as the model was trained)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output (never the --input)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16", "int8"),
                   help="run the model unpadded in this precision (optimize_for_inference): fp32 exact, bf16 "
                        "(CPUs with AVX-512 BF16/AMX, GPUs) or int8 (CPU) faster at a small cost in accuracy "
                        "(default: as saved, padded batches)")
    multi_label.add_predict_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    if args.task == multi_label.TASK_NAME or (args.task is None and
                                              multi_label.is_multi_label(model_config(args.model))):
        multi_label.predict_run(args)
        return
    family = task_family(args.task, args.model)
    if family == "answer" or args.question is not None:
        run_squad(args)
        return
    if not args.input or not args.output:
        raise ValueError("--input and --output are required (or --question and --context for a SQuAD model)")
    check_output(args.output, [args.input], args.overwrite)
    if family == "tag":
        path, metrics = predict_conll(args.model, args.input, args.output, document_context=args.document_context,
                                      max_seq_length=args.max_seq_length, batch_size=args.batch_size,
                                      dtype=args.dtype)
        print(f"wrote {path}")
        if metrics is not None:  # the input had gold tags
            print(ner_summary(metrics))
        return
    if args.max_seq_length is None:  # 128, or fewer for a model with fewer positions
        args.max_seq_length = min(128, model_positions(args.model) or 128)
    if family == "multiple-choice":
        path = predict_choice_file(args.model, args.input, args.output, max_seq_length=args.max_seq_length,
                                   batch_size=args.batch_size, dtype=args.dtype)
        print(f"wrote {path}")
        return
    path = predict_file(args.model, args.input, args.output, task=args.task, max_seq_length=args.max_seq_length,
                        batch_size=args.batch_size, long_input=args.long_input, window_stride=args.doc_stride,
                        dtype=args.dtype)
    print(f"wrote {path}")


def check_squad_settings(model: str, overrides: dict) -> None:
    """The model's stored SQuAD settings with the flags given must work (before the model loads)."""
    stored = (model_config(model).get("squad") or {})
    known = set(vars(SquadSettings()))
    SquadSettings(**{**{k: v for k, v in stored.items() if k in known}, **overrides}).check(flags=True)


def run_squad(args: argparse.Namespace) -> None:
    """`bertforge predict` for a `finetune squad` model: one --question/--context, or a SQuAD JSON --input."""
    settings = squad_flags(args)
    check_squad_settings(args.model, settings)
    if args.question is not None or args.context is not None:
        if args.question is None or args.context is None:
            raise ValueError("--question and --context go together")
        for name, value in (("--question", args.question), ("--context", args.context)):
            if not value.strip():
                raise ValueError(f"{name} is empty")
        answer = answer_questions(args.model, [args.question], [args.context], batch_size=args.batch_size,
                                  dtype=args.dtype, **settings)[0]
        print(json_text(answer, indent=None))
        return
    if not args.input or not args.output:
        raise ValueError("a SQuAD model answers --question Q --context C, or a SQuAD JSON --input with --output")
    stem = Path(args.output).with_suffix("")
    check_output(args.output, [args.input], args.overwrite, [f"{stem}.nbest.json", f"{stem}.null_odds.json"])
    official = predict_squad_file(args.model, args.input, args.output, batch_size=args.batch_size, dtype=args.dtype,
                                  **settings)
    print(f"wrote {args.output}")
    if official is not None:
        print(json.dumps(official, indent=2))
