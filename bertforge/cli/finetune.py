"""`bertforge finetune TASK`: fine-tune on GLUE, your own classification data (single- or multi-label),
SWAG-style multiple choice, SQuAD or CoNLL NER. The shared flags are FinetuneArguments fields
(bertforge.training.settings); each task's recipe changes only their defaults (learning rate, epochs, batch size)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..tasks import multi_label
from ..tasks.choice import multiple_choice_task, predict_choice_file
from ..tasks.classification import classify_task, predict_file
from ..tasks.feature_based import feature_ner_task
from ..tasks.glue import get_task, glue_task, glue_task_dir
from ..tasks.squad import SquadSettings, squad_task
from ..tasks.tagging import ner_task, predict_conll
from ..training import finetune as engine  # engine.finetune_grid: looked up per run, so a test can stand in for it
from ..training.finetune import FinetuneArguments
from ._common import ner_summary, report_finetune, squad_flags
from .flags import add_settings_flags, settings_from_args

# The FinetuneArguments fields every task takes as flags, in --help's order (after --lr, --lr-grid, --seeds).
SHARED_FLAGS = ("epochs", "batch_size", "grad_accum", "max_steps", "warmup_ratio", "weight_decay", "max_grad_norm",
                "precision", "seed", "eval_every", "eval_batch_size", "log_every", "save_every", "resume",
                "max_minutes", "group_by_length", "unpad", "num_threads", "device", "progress")

# SQuAD defaults per version: Google's run_squad.py / the paper's v1.1 recipe (3 epochs, batch 32, lr 5e-5) and
# the paper's v2.0 recipe (§4.3: 2 epochs, batch 48, lr 5e-5).
SQUAD_DEFAULTS = {"1.1": {"epochs": 3.0, "batch_size": 32}, "2.0": {"epochs": 2.0, "batch_size": 48}}


def _lr_list(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--lr-grid takes comma-separated numbers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"--lr-grid needs positive learning rates, got {text!r}")
    return values


def _add_finetune_flags(p: argparse.ArgumentParser, *, lr: float | None = 2e-5,
                        batch_size: int | None = 32, max_seq_length: int = 128) -> None:
    """The flags every `finetune` task shares; a None default means "the task's recipe decides" (per
    version, approach, ...). --epochs defaults to None whatever the recipe, so that `_arguments` can tell a
    given --epochs from the recipe's (the recipe's epochs: `_arguments`' `epochs`)."""
    recipe = {"lr": lr, "epochs": None, "batch_size": batch_size}
    p.add_argument("--model", required=True, help="pre-trained checkpoint directory (config.json, weights, vocab.txt) "
                   "or Hub id (org/name[@revision])")
    add_settings_flags(p, FinetuneArguments, ("output_dir",))
    p.add_argument("--max-seq-length", type=int, default=max_seq_length)
    add_settings_flags(p, FinetuneArguments, ("lr",), recipe)
    p.add_argument("--lr-grid", type=_lr_list, metavar="LR,LR,...",
                   help="try each learning rate (the paper: 5e-5,4e-5,3e-5,2e-5), keep the best on dev; runs go "
                   "to OUT/lr{LR}-seed{SEED}/ (even for one rate), the best model and summary.json to OUT")
    p.add_argument("--seeds", type=int, default=1, help="repeat with N seeds (--seed, --seed+1, ...): "
                   "mean, std, min, max of every metric in OUT/summary.json; with --resume, finished runs are "
                   "read back")
    add_settings_flags(p, FinetuneArguments, SHARED_FLAGS, recipe)


def _add_long_input_flags(p: argparse.ArgumentParser) -> None:
    """Classification's handling of inputs longer than --max-seq-length."""
    p.add_argument("--long-input", choices=("truncate", "windows"), default="truncate",
                   help="truncate: cut a long input to --max-seq-length (Google's run_classifier); windows: "
                   "cut it into overlapping windows, train on each with the example's label, predict the mean "
                   "of the windows' logits")
    p.add_argument("--doc-stride", type=int, help="--long-input windows: tokens between window starts "
                   "(default: half a window)")


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("finetune", help="fine-tune on a task (GLUE, your own classification data, ...)")
    tasks = p.add_subparsers(dest="task_family", required=True, metavar="TASK")
    p = tasks.add_parser("glue", help="a GLUE task (paper defaults: batch 32, 3 epochs, lr 2e-5)")
    p.add_argument("--task", required=True, help="the task, a GLUE task: cola, sst2, mrpc, stsb, qqp, mnli, qnli, "
                   "rte or wnli (recorded as the model's finetuning_task)")
    p.add_argument("--data-dir", required=True, help="the GLUE root (holding MRPC/, ...) or the task's directory")
    p.add_argument("--max-train-examples", type=int, help="train on the first N examples only")
    p.add_argument("--no-test-predictions", action="store_true", help="skip the submission file for test.tsv")
    _add_long_input_flags(p)
    _add_finetune_flags(p)
    p.set_defaults(func=run_glue)
    p = tasks.add_parser("classify", help="your own CSV/TSV/JSONL: columns text, [text_pair], label")
    p.add_argument("--train-file", required=True)
    p.add_argument("--dev-file", required=True)
    p.add_argument("--test-file", help="predicted with the best model into OUT/test_predictions.tsv")
    p.add_argument("--regression", action="store_true", help="numeric labels: one output, MSE loss")
    _add_long_input_flags(p)
    _add_finetune_flags(p)
    p.set_defaults(func=run_classify)
    p = tasks.add_parser("multi-label", help="any number of labels per text: GoEmotions TSV with --labels, or "
                         "CSV/JSONL with a labels list; defaults: batch 32, 3 epochs, lr 5e-5")
    multi_label.add_multi_label_flags(p)
    _add_finetune_flags(p, lr=multi_label.RECIPE["lr"], batch_size=multi_label.RECIPE["batch_size"],
                        max_seq_length=multi_label.RECIPE["max_seq_length"])
    p.set_defaults(func=run_multi_label)
    p = tasks.add_parser("multiple-choice", help="SWAG-layout CSV (sent1, sent2, ending0..3, label); "
                         "paper defaults: batch 16, 3 epochs, lr 2e-5")
    p.add_argument("--train-file", required=True, help="SWAG CSV: [index], video-id, fold-ind, startphrase, sent1, "
                   "sent2, gold-source, ending0..ending3, label")
    p.add_argument("--dev-file", required=True, help="SWAG CSV with labels (SWAG's val.csv)")
    p.add_argument("--test-file", help="SWAG CSV, labels optional: predicted into OUT/test_predictions.tsv")
    p.add_argument("--max-train-examples", type=int, help="train on the first N examples only")
    _add_finetune_flags(p, lr=2e-5, batch_size=16, max_seq_length=128)
    p.set_defaults(func=run_multiple_choice)
    p = tasks.add_parser("squad", help="SQuAD v1.1 / v2.0 JSON (Google's defaults: seq 384, stride 128, lr 5e-5; "
                         "v1.1: 3 epochs, batch 32; v2.0: 2 epochs, batch 48 as the paper)")
    p.add_argument("--train-file", required=True, help="official-format JSON (data/paragraphs/qas/answers)")
    p.add_argument("--dev-file", required=True, help="official-format JSON with answers")
    p.add_argument("--version", choices=("1.1", "2.0"), default="1.1",
                   help="2.0: unanswerable questions (is_impossible), no-answer at [CLS]")
    p.add_argument("--doc-stride", type=int, default=128, help="tokens between the starts of passage windows")
    p.add_argument("--max-query-length", type=int, default=64, help="question tokens kept")
    p.add_argument("--n-best-size", type=int, default=20, help="candidates per window and n-best list length")
    p.add_argument("--max-answer-length", type=int, default=30, help="longest answer span, in tokens")
    p.add_argument("--null-score-diff-threshold", type=float, default=0.0,
                   help="v2.0: answer nothing when null score - best span score exceeds this (the paper's tau)")
    p.add_argument("--tune-threshold", action="store_true",
                   help="v2.0: choose the threshold that maximises dev F1 at each evaluation (saved with the model)")
    p.add_argument("--max-train-examples", type=int, help="train on the first N questions only")
    _add_finetune_flags(p, lr=5e-5, batch_size=None, max_seq_length=384)
    p.set_defaults(func=run_squad, check=check_squad)

    p = tasks.add_parser("ner", help="CoNLL-2003-style NER (word ... TAG columns); defaults: batch 16, "
                         "3 epochs, lr 5e-5 (--feature-based: 4 epochs, lr 1e-3)")
    p.add_argument("--train-file", required=True, help="CoNLL columns (word first, IOB1/IOB2 tag last), blank line "
                   "between sentences, -DOCSTART- between documents; the label list is taken from it")
    p.add_argument("--dev-file", required=True, help="the same format, labelled: entity F1 picks the best epoch")
    p.add_argument("--test-file", help="CoNLL file tagged by the best model into OUT/test_predictions.txt "
                   "(scored when it has gold tags)")
    p.add_argument("--document-context", action="store_true", help="fill each window with the neighbouring "
                   "sentences of the same document and predict only the centre sentence (the paper's setup)")
    p.add_argument("--max-train-examples", type=int, help="train on the first N sentences only")
    p.add_argument("--feature-based", action="store_true", help="the paper's feature-based approach (Table 7): "
                   "frozen encoder, its hidden states cached once, a BiLSTM tagger trained on them")
    p.add_argument("--features", default="concat-last-4", choices=("embeddings", "last", "second-to-last",
                   "sum-last-4", "concat-last-4", "sum-all"), help="--feature-based: which hidden states "
                   "(default concat-last-4, the paper's best)")
    p.add_argument("--lstm-hidden", type=int, default=768, help="--feature-based: BiLSTM hidden size per direction")
    p.add_argument("--lstm-layers", type=int, default=2, help="--feature-based: BiLSTM layers")
    p.add_argument("--lstm-dropout", type=float, default=0.1, help="--feature-based: dropout on the BiLSTM's "
                   "input, between its layers and before the classifier")
    # lr and epochs default per approach (see run_ner); None here means "that default".
    _add_finetune_flags(p, lr=None, batch_size=16, max_seq_length=128)
    p.set_defaults(func=run_ner)


def _arguments(args: argparse.Namespace, epochs: float = 3.0) -> FinetuneArguments:
    """FinetuneArguments from the flags `_add_finetune_flags` defines; `epochs`: the task's recipe, when
    --epochs is not given. --max-steps wins over the epochs (the engine's rule); given with --epochs too,
    that is said on stderr."""
    if args.max_steps is not None and args.epochs is not None:
        print(f"bertforge finetune: note: --max-steps {args.max_steps} wins over --epochs {args.epochs:g}: "
              f"training runs {args.max_steps} steps", file=sys.stderr)
    return settings_from_args(FinetuneArguments, args, epochs=args.epochs if args.epochs is not None else epochs)


def _grid(args: argparse.Namespace) -> tuple[list[float] | None, list[int] | None]:
    """`finetune_grid`'s learning rates and seeds: None for each one the command did not ask to vary."""
    seeds = list(range(args.seed, args.seed + args.seeds)) if args.seeds > 1 else None
    return args.lr_grid or None, seeds


def run_glue(args: argparse.Namespace) -> None:
    spec = get_task(args.task)
    task = glue_task(spec, args.data_dir, args.model, max_seq_length=args.max_seq_length,
                     eval_batch_size=args.eval_batch_size, max_train_examples=args.max_train_examples,
                     long_input=args.long_input, window_stride=args.doc_stride)
    results = engine.finetune_grid(task, _arguments(args), *_grid(args))
    report_finetune(results, args.output_dir)
    for split in spec.test_splits:  # the GLUE server's files, from the best model
        test = glue_task_dir(spec, args.data_dir) / spec.split(split).file
        if test.is_file() and not args.no_test_predictions:
            path = predict_file(args.output_dir, test, Path(args.output_dir) / spec.split(split).submission,
                                task=spec.name, max_seq_length=args.max_seq_length, long_input=args.long_input,
                                window_stride=args.doc_stride)
            print(f"test predictions: {path}")


def run_classify(args: argparse.Namespace) -> None:
    task = classify_task(args.model, args.train_file, args.dev_file, regression=args.regression,
                         max_seq_length=args.max_seq_length, eval_batch_size=args.eval_batch_size,
                         long_input=args.long_input, window_stride=args.doc_stride)
    results = engine.finetune_grid(task, _arguments(args), *_grid(args))
    report_finetune(results, args.output_dir)
    if args.test_file:
        path = predict_file(args.output_dir, args.test_file, Path(args.output_dir) / "test_predictions.tsv",
                            task="classify", max_seq_length=args.max_seq_length, long_input=args.long_input,
                            window_stride=args.doc_stride)
        print(f"test predictions: {path}")


def run_multi_label(args: argparse.Namespace) -> None:
    task = multi_label.multi_label_from_args(args)
    results = engine.finetune_grid(task, _arguments(args, multi_label.RECIPE["epochs"]), *_grid(args))
    report_finetune(results, args.output_dir)
    multi_label.after_finetune(args)


def run_multiple_choice(args: argparse.Namespace) -> None:
    task = multiple_choice_task(args.model, args.train_file, args.dev_file, max_seq_length=args.max_seq_length,
                                eval_batch_size=args.eval_batch_size, max_train_examples=args.max_train_examples)
    results = engine.finetune_grid(task, _arguments(args), *_grid(args))
    report_finetune(results, args.output_dir)
    if args.test_file:
        path = predict_choice_file(args.output_dir, args.test_file, Path(args.output_dir) / "test_predictions.tsv",
                                   max_seq_length=args.max_seq_length, batch_size=args.eval_batch_size)
        print(f"test predictions: {path}")


def check_squad(args: argparse.Namespace) -> None:
    """The window settings must work together (before a model is fetched or loads)."""
    SquadSettings(**{k: v for k, v in squad_flags(args).items() if k != "null_score_diff_threshold"}).check(flags=True)


def run_squad(args: argparse.Namespace) -> None:
    recipe = SQUAD_DEFAULTS[args.version]
    if args.batch_size is None:
        args.batch_size = recipe["batch_size"]
    if args.tune_threshold and args.version != "2.0":
        raise ValueError("--tune-threshold chooses the no-answer threshold of SQuAD 2.0: add --version 2.0")
    task = squad_task(args.model, args.train_file, args.dev_file, version=args.version,
                      settings=SquadSettings(**squad_flags(args)), tune_threshold=args.tune_threshold,
                      eval_batch_size=args.eval_batch_size, max_train_examples=args.max_train_examples)
    results = engine.finetune_grid(task, _arguments(args, recipe["epochs"]), *_grid(args))
    report_finetune(results, args.output_dir)
    print(f"predictions.json, nbest_predictions.json{', null_odds.json' if args.version == '2.0' else ''} and the "
          f"official script's results (percent) in {args.output_dir}/squad_eval.json")


def run_ner(args: argparse.Namespace) -> None:
    if args.feature_based:
        # A randomly initialised BiLSTM learns at the usual LSTM rates, not at BERT's fine-tuning rates.
        args.lr = args.lr or 1e-3
        epochs = 4.0
        task = feature_ner_task(args.model, args.train_file, args.dev_file, features=args.features,
                                lstm_hidden=args.lstm_hidden, lstm_layers=args.lstm_layers, dropout=args.lstm_dropout,
                                document_context=args.document_context, max_seq_length=args.max_seq_length,
                                eval_batch_size=args.eval_batch_size, max_train_examples=args.max_train_examples,
                                device=args.device, progress=args.progress)
    else:
        args.lr = args.lr or 5e-5
        epochs = 3.0
        task = ner_task(args.model, args.train_file, args.dev_file, document_context=args.document_context,
                        max_seq_length=args.max_seq_length, eval_batch_size=args.eval_batch_size,
                        max_train_examples=args.max_train_examples)
    results = engine.finetune_grid(task, _arguments(args, epochs), *_grid(args))
    report_finetune(results, args.output_dir)
    if args.test_file:
        path, metrics = predict_conll(args.output_dir, args.test_file, Path(args.output_dir) / "test_predictions.txt",
                                      batch_size=args.eval_batch_size)
        print(f"test predictions: {path}" + (f"; {ner_summary(metrics)}" if metrics else ""))
