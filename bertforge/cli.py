"""The `bertforge` command: parses flags and calls the library. Each sub-command is one stage."""

from __future__ import annotations

import argparse
import glob
import logging
import sys
from pathlib import Path

from ._checks import check_flags, check_positions


def _expand(patterns: list[str]) -> list[str]:
    files: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern, recursive=True))
        if not matches:
            raise FileNotFoundError(f"no file matches {pattern}")
        files.extend(m for m in matches if Path(m).is_file())
    return files


def _layers(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--layers takes comma-separated integers, got {text!r}") from None


def cmd_vocab(args: argparse.Namespace) -> None:
    from .tokenization import train_vocab

    files = _expand(args.input)
    if args.extend:
        cmd_vocab_extend(args, files)
        return
    vocab = train_vocab(files, vocab_size=args.vocab_size, lowercase=not args.cased,
                        min_frequency=args.min_frequency, output=args.output)
    print(f"wrote {args.output}: {len(vocab)} tokens ({'cased' if args.cased else 'uncased'}) "
          f"from {len(files)} file(s)")


def cmd_vocab_extend(args: argparse.Namespace, files: list[str]) -> None:
    """`vocab --extend`: the domain's words in the [unusedN] slots of an existing vocabulary."""
    from .pretraining.text import read_documents
    from .tokenization.extend import extend_vocab, report_path

    if args.cased:
        raise ValueError("--cased: with --extend, case and accents follow the model's tokenizer settings")
    # The text prepare-pretraining reads (WikiExtractor markup and repeated titles dropped).
    texts = (sentence for file in files for document in read_documents(file) for sentence in document)
    report = extend_vocab(args.extend, texts, args.output, max_new=args.max_new, min_pieces=args.min_pieces,
                          min_count=args.min_count, inputs=files)
    before, after = report["before"], report["after"]
    print(f"wrote {args.output}: {report['new_words']} new words in [unusedN] slots ({report['unused_slots_left']} "
          f"left); {report['new_word_occurrences']:,} of {report['words']:,} word occurrences "
          f"({100 * report['new_word_share']:.2f}%) become single tokens; tokens per word "
          f"{before['tokens_per_word']:.4f} -> {after['tokens_per_word']:.4f}; report {report_path(args.output)}")


def cmd_extract_features(args: argparse.Namespace) -> None:
    from ._checks import model_positions
    from .tasks.features import extract_features

    if args.max_seq_length is None:  # 128, or fewer for a model with fewer positions
        args.max_seq_length = min(128, model_positions(args.model) or 128)
    count = extract_features(args.model, args.input_file, args.output_file, args.layers,
                             args.max_seq_length, args.batch_size)
    print(f"wrote {args.output_file}: features of layers {args.layers} for {count} example(s)")


def cmd_convert_tf(args: argparse.Namespace) -> None:
    from .modeling.tf_checkpoint import convert_tf_checkpoint

    out = convert_tf_checkpoint(args.checkpoint, args.output_dir, config_file=args.config, vocab_file=args.vocab)
    print(f"converted {args.checkpoint} -> {out} (config.json, model.safetensors, vocab.txt, tokenizer_config.json)")


def cmd_quickstart(args: argparse.Namespace) -> None:
    from .quickstart import run_quickstart

    run_quickstart(args.output_dir)


def cmd_prepare_pretraining(args: argparse.Namespace) -> None:
    from .pretraining import prepare_pretraining

    index = prepare_pretraining(
        _expand(args.input), args.vocab, args.output_dir, max_seq_length=args.max_seq_length,
        max_predictions_per_seq=args.max_predictions_per_seq, masked_lm_prob=args.masked_lm_prob,
        short_seq_prob=args.short_seq_prob, dupe_factor=args.dupe_factor, whole_word_mask=args.whole_word_mask,
        masking=args.masking, do_lower_case=args.do_lower_case, seed=args.seed, workers=args.workers,
        input_format=args.input_format, shard_size=args.shard_size, buffer_documents=args.buffer_documents,
        buffer_tokens=args.buffer_tokens, progress=not args.quiet, strict=args.strict)
    stats = index["stats"]
    print(f"wrote {args.output_dir}: {index['num_instances']} instances in {len(index['shards'])} shard(s) from "
          f"{index['num_documents']} document(s) ({args.masking} masking, {stats['is_next']} IsNext, "
          f"{stats['tokens']} tokens)")
    if index["replaced_bytes"]:
        first = next(iter(index["replaced_bytes"]))
        print(f"warning: replaced {stats['replaced_bytes']} byte(s) that are not UTF-8 with U+FFFD in "
              f"{len(index['replaced_bytes'])} file(s) (first: {first}); --strict refuses such input", file=sys.stderr)


def cmd_pretrain(args: argparse.Namespace) -> None:
    import os

    from .pretraining.trainer import arguments_from, run_pretraining
    from .training import NonFiniteLossError

    try:
        final = run_pretraining(arguments_from(args))
    except NonFiniteLossError as error:  # diverged: say where to resume from, no traceback
        raise SystemExit(f"bertforge pretrain: error: {error}") from None
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"pre-trained {args.init_from or args.config or 'base'}: log {Path(args.output_dir) / 'log.jsonl'}, "
              f"checkpoints {Path(args.output_dir) / 'checkpoints'}, model {final}")


def cmd_plot(args: argparse.Namespace) -> None:
    from .training.plot import plot_log

    written = plot_log(args.run, args.output_dir)
    print("wrote " + ", ".join(str(p) for p in written))


def cmd_export_onnx(args: argparse.Namespace) -> None:
    from .serving.onnx import OnnxParityError, export_onnx

    try:
        report = export_onnx(args.model, args.output, task=args.task, opset=args.opset, check=not args.no_check,
                             atol=args.atol)
    except OnnxParityError as error:  # the export is wrong: say by how much, write nothing
        raise SystemExit(f"bertforge export-onnx: error: {error}") from None
    check = ("check skipped" if report.max_abs_diff is None else
             f"max |torch - onnxruntime| = {report.max_abs_diff:.3g} over {report.batches_checked} batches "
             f"(tolerance {args.atol:g})")
    print(f"wrote {report.path}: {report.task} pipeline, opset {report.opset}, dynamic batch and sequence; {check}")


def _require_serve_extra() -> None:
    """starlette and uvicorn come with the `serve` extra: say how to get them, before any model is loaded."""
    import importlib

    for module in ("starlette", "uvicorn"):
        try:
            importlib.import_module(module)
        except ImportError:
            raise ModuleNotFoundError(f"{module} is not installed: pip install 'bertforge[serve]' "
                                      "(starlette and uvicorn)") from None


def cmd_serve(args: argparse.Namespace) -> None:
    _require_serve_extra()
    from .serving.server import ServerSettings, serve

    tasks = [t for value in args.task or [] for t in value.split(",") if t]
    settings = ServerSettings(max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms,
                              micro_batching=not args.no_micro_batching, max_body_bytes=args.max_body_bytes,
                              max_texts=args.max_texts, max_chars=args.max_chars, body_timeout_s=args.body_timeout)
    if args.num_threads:
        import torch

        torch.set_num_threads(args.num_threads)
    serve(args.model, tasks or None, host=args.host, port=args.port, settings=settings, backend=args.backend,
          device=args.device, max_length=args.max_length, onnx_model=args.onnx_model, log_level=args.log_level,
          graceful_timeout=args.graceful_timeout, dtype=args.dtype)


def _finetune_arguments(args: argparse.Namespace):
    """FinetuneArguments from the flags `_add_finetune_flags` defines."""
    import dataclasses

    from .training.finetune import FinetuneArguments

    names = {f.name for f in dataclasses.fields(FinetuneArguments)}
    return FinetuneArguments(**{k: v for k, v in vars(args).items() if k in names and v is not None})


def _grid(args: argparse.Namespace) -> tuple[list[float] | None, list[int] | None]:
    """`finetune_grid`'s learning rates and seeds: None for each one the command did not ask to vary."""
    seeds = list(range(args.seed, args.seed + args.seeds)) if args.seeds > 1 else None
    return args.lr_grid or None, seeds


def _report_finetune(results: dict, output_dir: str) -> None:
    if "runs" in results:  # a grid or several seeds
        main = results["main_metric"]
        stats = results["metrics"][main]
        print(f"{results['task']}: best lr {results['best_lr']:g}; {main} over {stats['n']} seed(s): "
              f"mean {stats['mean']:.4f} ± {stats['std']:.4f} (min {stats['min']:.4f}, max {stats['max']:.4f}); "
              f"{output_dir}/summary.json, best model in {output_dir}")
    else:
        metrics = ", ".join(f"{k} {v:.4f}" for k, v in results["metrics"].items())
        print(f"{results['task']}: best at epoch {results['epoch']:g} (step {results['step']}): {metrics}; "
              f"model and eval_results.json in {output_dir}")


def cmd_finetune_glue(args: argparse.Namespace) -> None:
    from .tasks.classification import predict_file
    from .tasks.glue import get_task, glue_task, glue_task_dir
    from .training.finetune import finetune_grid

    spec = get_task(args.task)
    task = glue_task(spec, args.data_dir, args.model, max_seq_length=args.max_seq_length,
                     eval_batch_size=args.eval_batch_size, max_train_examples=args.max_train_examples,
                     long_input=args.long_input, window_stride=args.doc_stride)
    results = finetune_grid(task, _finetune_arguments(args), *_grid(args))
    _report_finetune(results, args.output_dir)
    for split in spec.test_splits:  # the GLUE server's files, from the best model
        test = glue_task_dir(spec, args.data_dir) / spec.split(split).file
        if test.is_file() and not args.no_test_predictions:
            path = predict_file(args.output_dir, test, Path(args.output_dir) / spec.split(split).submission,
                                task=spec.name, max_seq_length=args.max_seq_length, long_input=args.long_input,
                                window_stride=args.doc_stride)
            print(f"test predictions: {path}")


def cmd_finetune_classify(args: argparse.Namespace) -> None:
    from .tasks.classification import classify_task, predict_file
    from .training.finetune import finetune_grid

    task = classify_task(args.model, args.train_file, args.dev_file, regression=args.regression,
                         max_seq_length=args.max_seq_length, eval_batch_size=args.eval_batch_size,
                         long_input=args.long_input, window_stride=args.doc_stride)
    results = finetune_grid(task, _finetune_arguments(args), *_grid(args))
    _report_finetune(results, args.output_dir)
    if args.test_file:
        path = predict_file(args.output_dir, args.test_file, Path(args.output_dir) / "test_predictions.tsv",
                            task="classify", max_seq_length=args.max_seq_length, long_input=args.long_input,
                            window_stride=args.doc_stride)
        print(f"test predictions: {path}")


def cmd_finetune_multiple_choice(args: argparse.Namespace) -> None:
    from .tasks.choice import multiple_choice_task, predict_choice_file
    from .training.finetune import finetune_grid

    task = multiple_choice_task(args.model, args.train_file, args.dev_file, max_seq_length=args.max_seq_length,
                                eval_batch_size=args.eval_batch_size, max_train_examples=args.max_train_examples)
    results = finetune_grid(task, _finetune_arguments(args), *_grid(args))
    _report_finetune(results, args.output_dir)
    if args.test_file:
        path = predict_choice_file(args.output_dir, args.test_file, Path(args.output_dir) / "test_predictions.tsv",
                                   max_seq_length=args.max_seq_length, batch_size=args.eval_batch_size)
        print(f"test predictions: {path}")


# SQuAD defaults per version: Google's run_squad.py / the paper's v1.1 recipe (3 epochs, batch 32, lr 5e-5) and
# the paper's v2.0 recipe (§4.3: 2 epochs, batch 48, lr 5e-5).
SQUAD_DEFAULTS = {"1.1": {"epochs": 3.0, "batch_size": 32}, "2.0": {"epochs": 2.0, "batch_size": 48}}


def _squad_settings(args: argparse.Namespace) -> dict:
    """The SquadSettings fields given on the command line."""
    names = ("max_seq_length", "doc_stride", "max_query_length", "n_best_size", "max_answer_length",
             "null_score_diff_threshold")
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def cmd_finetune_squad(args: argparse.Namespace) -> None:
    from .tasks.squad import SquadSettings, squad_task
    from .training.finetune import finetune_grid

    for name, value in SQUAD_DEFAULTS[args.version].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.tune_threshold and args.version != "2.0":
        raise ValueError("--tune-threshold chooses the no-answer threshold of SQuAD 2.0: add --version 2.0")
    task = squad_task(args.model, args.train_file, args.dev_file, version=args.version,
                      settings=SquadSettings(**_squad_settings(args)), tune_threshold=args.tune_threshold,
                      eval_batch_size=args.eval_batch_size, max_train_examples=args.max_train_examples)
    results = finetune_grid(task, _finetune_arguments(args), *_grid(args))
    _report_finetune(results, args.output_dir)
    print(f"predictions.json, nbest_predictions.json{', null_odds.json' if args.version == '2.0' else ''} and the "
          f"official script's results (percent) in {args.output_dir}/squad_eval.json")


def _check_squad_settings(model: str, overrides: dict) -> None:
    """The model's stored SQuAD settings with the flags given must work (before the model loads)."""
    from .tasks.squad import SquadSettings

    stored = (_model_config(model).get("squad") or {})
    known = set(vars(SquadSettings()))
    SquadSettings(**{**{k: v for k, v in stored.items() if k in known}, **overrides}).check(flags=True)


def cmd_predict_squad(args: argparse.Namespace) -> None:
    """`bertforge predict` for a `finetune squad` model: one --question/--context, or a SQuAD JSON --input."""
    import json

    from ._checks import check_output
    from .tasks.squad import answer_questions, json_text, predict_squad_file

    settings = _squad_settings(args)
    _check_squad_settings(args.model, settings)
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


def _ner_summary(metrics: dict) -> str:
    types = sorted(k[3:] for k in metrics if k.startswith("f1_"))
    per_type = ", ".join(f"{t} {metrics['f1_' + t]:.4f}" for t in types)
    return (f"entity F1 {metrics['f1']:.4f} (precision {metrics['precision']:.4f}, recall {metrics['recall']:.4f}); "
            f"per type F1: {per_type}")


def cmd_finetune_ner(args: argparse.Namespace) -> None:
    from .tasks.tagging import predict_conll
    from .training.finetune import finetune_grid

    if args.feature_based:
        from .tasks.feature_based import feature_ner_task

        # A randomly initialised BiLSTM learns at the usual LSTM rates, not at BERT's fine-tuning rates.
        args.lr = args.lr or 1e-3
        args.epochs = args.epochs or 4.0
        task = feature_ner_task(args.model, args.train_file, args.dev_file, features=args.features,
                                lstm_hidden=args.lstm_hidden, lstm_layers=args.lstm_layers, dropout=args.lstm_dropout,
                                document_context=args.document_context, max_seq_length=args.max_seq_length,
                                eval_batch_size=args.eval_batch_size, max_train_examples=args.max_train_examples,
                                device=args.device, progress=args.progress)
    else:
        from .tasks.tagging import ner_task

        args.lr = args.lr or 5e-5
        args.epochs = args.epochs or 3.0
        task = ner_task(args.model, args.train_file, args.dev_file, document_context=args.document_context,
                        max_seq_length=args.max_seq_length, eval_batch_size=args.eval_batch_size,
                        max_train_examples=args.max_train_examples)
    results = finetune_grid(task, _finetune_arguments(args), *_grid(args))
    _report_finetune(results, args.output_dir)
    if args.test_file:
        path, metrics = predict_conll(args.output_dir, args.test_file, Path(args.output_dir) / "test_predictions.txt",
                                      batch_size=args.eval_batch_size)
        print(f"test predictions: {path}" + (f"; {_ner_summary(metrics)}" if metrics else ""))


def _model_config(model_dir: str) -> dict:
    """A model directory's config.json ({} when absent or unreadable)."""
    import json

    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _model_task(model_dir: str) -> str | None:
    """The `finetuning_task` in a model directory's config.json (None when absent or unreadable)."""
    return _model_config(model_dir).get("finetuning_task")


def cmd_predict(args: argparse.Namespace) -> None:
    from ._checks import check_output, model_positions
    from .tasks.classification import predict_file

    if (args.task or _model_task(args.model)) in ("squad", "squad_v2") or args.question is not None:
        cmd_predict_squad(args)
        return
    if not args.input or not args.output:
        raise ValueError("--input and --output are required (or --question and --context for a SQuAD model)")
    check_output(args.output, [args.input], args.overwrite)
    if (args.task or _model_task(args.model)) == "ner":
        from .tasks.tagging import predict_conll

        path, metrics = predict_conll(args.model, args.input, args.output, document_context=args.document_context,
                                      max_seq_length=args.max_seq_length, batch_size=args.batch_size,
                                      dtype=args.dtype)
        print(f"wrote {path}")
        if metrics is not None:  # the input had gold tags
            print(_ner_summary(metrics))
        return
    if args.max_seq_length is None:  # 128, or fewer for a model with fewer positions
        args.max_seq_length = min(128, model_positions(args.model) or 128)
    if (args.task or _model_task(args.model)) == "multiple-choice":
        from .tasks.choice import predict_choice_file

        path = predict_choice_file(args.model, args.input, args.output, max_seq_length=args.max_seq_length,
                                   batch_size=args.batch_size, dtype=args.dtype)
        print(f"wrote {path}")
        return
    path = predict_file(args.model, args.input, args.output, task=args.task, max_seq_length=args.max_seq_length,
                        batch_size=args.batch_size, long_input=args.long_input, window_stride=args.doc_stride,
                        dtype=args.dtype)
    print(f"wrote {path}")


def _lr_list(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--lr-grid takes comma-separated numbers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"--lr-grid needs positive learning rates, got {text!r}")
    return values


def _add_finetune_flags(p: argparse.ArgumentParser, *, lr: float = 2e-5, epochs: float = 3.0, batch_size: int = 32,
                        max_seq_length: int = 128) -> None:
    """The flags every `finetune` task shares (defaults: the paper's, per task)."""
    p.add_argument("--model", required=True, help="pre-trained checkpoint directory (config.json, weights, vocab.txt) "
                   "or Hub id (org/name[@revision])")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--max-seq-length", type=int, default=max_seq_length)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--lr-grid", type=_lr_list, metavar="LR,LR,...",
                   help="try each learning rate (the paper: 5e-5,4e-5,3e-5,2e-5), keep the best on dev; runs go "
                   "to OUT/lr{LR}-seed{SEED}/ (even for one rate), the best model and summary.json to OUT")
    p.add_argument("--seeds", type=int, default=1, help="repeat with N seeds (--seed, --seed+1, ...): "
                   "mean, std, min, max of every metric in OUT/summary.json; with --resume, finished runs are "
                   "read back")
    p.add_argument("--epochs", type=float, default=epochs)
    p.add_argument("--batch-size", type=int, default=batch_size)
    p.add_argument("--grad-accum", type=int, help="micro-batches per optimizer step (default 1)")
    p.add_argument("--max-steps", type=int, help="optimizer steps (instead of --epochs)")
    p.add_argument("--warmup-ratio", type=float, default=0.1, help="share of the steps for linear warm-up")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="global-norm clipping; 0: none")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--eval-every", type=int, help="also evaluate every N steps (always at each epoch's end)")
    p.add_argument("--eval-batch-size", type=int, default=128)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--save-every", type=int, help="training checkpoints every N steps, for --resume")
    p.add_argument("--resume", action="store_true", help="continue OUT's run (a grid: skip finished runs)")
    p.add_argument("--max-minutes", type=float, help="wall-clock budget per run: then stop, evaluate, keep the best")
    p.add_argument("--group-by-length", action=argparse.BooleanOptionalAction, default=None,
                   help="batch examples of similar length (less padding; default: uniformly shuffled batches, "
                   "which --unpad makes as cheap)")
    p.add_argument("--unpad", action=argparse.BooleanOptionalAction, default=None,
                   help="the encoder computes only the real tokens of each batch (default: on; --no-unpad: the "
                   "padded path)")
    p.add_argument("--num-threads", type=int, help="torch threads")
    p.add_argument("--device", help="cpu, cuda, ... (default: the GPU if there is one)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def _add_long_input_flags(p: argparse.ArgumentParser) -> None:
    """Classification's handling of inputs longer than --max-seq-length."""
    p.add_argument("--long-input", choices=("truncate", "windows"), default="truncate",
                   help="truncate: cut a long input to --max-seq-length (Google's run_classifier); windows: "
                   "cut it into overlapping windows, train on each with the example's label, predict the mean "
                   "of the windows' logits")
    p.add_argument("--doc-stride", type=int, help="--long-input windows: tokens between window starts "
                   "(default: half a window)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bertforge", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("quickstart", help="the pipeline in miniature on the built-in Shakespeare corpus")
    p.add_argument("--output-dir", default="quickstart_out")
    p.set_defaults(func=cmd_quickstart)

    p = commands.add_parser("vocab", help="train a WordPiece vocabulary on text files")
    p.add_argument("--input", nargs="+", required=True, help="text files or globs")
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--output", required=True, help="vocab.txt to write")
    p.add_argument("--cased", action="store_true", help="keep case and accents (default: lower-case, strip accents)")
    p.add_argument("--min-frequency", type=int, default=2)
    p.add_argument("--extend", metavar="MODEL_OR_VOCAB", help="instead of training: put the --input domain's "
                   "words that this vocab.txt (or model directory) splits into --min-pieces or more pieces into "
                   "its [unusedN] slots, by tokens saved; every other id kept (report: OUTPUT's stem + .extend.json)")
    p.add_argument("--max-new", type=int, help="--extend: words to add (default: as many as there are free slots)")
    p.add_argument("--min-pieces", type=int, default=3, help="--extend: add only words split into this many pieces")
    p.add_argument("--min-count", type=int, default=2, help="--extend: add only words seen this many times")
    p.set_defaults(func=cmd_vocab)

    p = commands.add_parser("extract-features", help="hidden states of chosen layers as JSON lines")
    p.add_argument("--model", required=True, help="checkpoint directory (config.json, model.safetensors, vocab.txt)")
    p.add_argument("--input-file", required=True, help="one example per line; 'text_a ||| text_b' for pairs")
    p.add_argument("--output-file", required=True)
    p.add_argument("--layers", type=_layers, default=[-1, -2, -3, -4], help="encoder layers, -1 = last")
    p.add_argument("--max-seq-length", type=int, help="default 128, or the model's positions if fewer")
    p.add_argument("--batch-size", type=int, default=32)
    p.set_defaults(func=cmd_extract_features)

    p = commands.add_parser("convert-tf", help="convert a Google TensorFlow checkpoint (no TensorFlow needed)")
    p.add_argument("checkpoint", help="checkpoint prefix, e.g. uncased_L-12_H-768_A-12/bert_model.ckpt")
    p.add_argument("output_dir")
    p.add_argument("--config", help="bert_config.json (default: beside the checkpoint)")
    p.add_argument("--vocab", help="vocab.txt (default: beside the checkpoint)")
    p.set_defaults(func=cmd_convert_tf)

    p = commands.add_parser("prepare-pretraining", help="masked-LM / next-sentence instances from raw text")
    p.add_argument("--input", nargs="+", required=True, help="text files or globs")
    p.add_argument("--vocab", required=True, help="vocab.txt")
    p.add_argument("--output-dir", required=True, help="instances, index.json, and a copy of --vocab with the "
                   "tokenizer settings (all that `pretrain --data` needs)")
    p.add_argument("--input-format", choices=("auto", "bert", "text", "wiki"), default="auto",
                   help="auto: wiki for <doc> files, bert for one-sentence-per-line files, else text")
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--max-predictions-per-seq", type=int, default=20)
    p.add_argument("--masked-lm-prob", type=float, default=0.15)
    p.add_argument("--short-seq-prob", type=float, default=0.1)
    p.add_argument("--dupe-factor", type=int, default=5)
    p.add_argument("--whole-word-mask", action="store_true")
    p.add_argument("--masking", choices=("static", "dynamic"), default="static",
                   help="dynamic: store unmasked, mask at load time (new masks every epoch)")
    case = p.add_mutually_exclusive_group()
    case.add_argument("--do-lower-case", dest="do_lower_case", action="store_const", const=True, default=None,
                      help="(default: guessed from the vocabulary)")
    case.add_argument("--no-lower-case", dest="do_lower_case", action="store_const", const=False)
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--shard-size", type=int, default=65536, help="instances per shard")
    p.add_argument("--buffer-documents", type=int, default=1000, help="documents kept for NotNext sampling")
    p.add_argument("--buffer-tokens", type=int, default=4_000_000, help="tokens kept for NotNext sampling")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--strict", action="store_true", help="refuse input that is not UTF-8 (default: replace such "
                   "bytes with U+FFFD and report how many)")
    p.set_defaults(func=cmd_prepare_pretraining)

    p = commands.add_parser("pretrain", help="pre-train BERT (masked LM + next sentence) on prepared instances",
                            description="Pre-train on `prepare-pretraining` output. Multi-process: "
                            "torchrun --nproc_per_node N -m bertforge pretrain ... (--batch-size stays global).")
    p.add_argument("--data", required=True, help="prepared instances (prepare-pretraining's output directory)")
    p.add_argument("--config", help="tiny, mini, small, medium, base, large, or a config.json (default: base; "
                   "with --init-from the model's)")
    p.add_argument("--init-from", metavar="MODEL", help="continue pre-training MODEL (a checkpoint directory, "
                   "convert-tf output or Hub id such as google-bert/bert-base-uncased[@revision]): its weights "
                   "and architecture; the data prepared with its vocab.txt (or one with [unusedN] replaced)")
    p.add_argument("--output-dir", required=True, help="log.jsonl, checkpoints/ and final/ go here")
    p.add_argument("--vocab", help="the vocab.txt the data was prepared with (default: DATA/vocab.txt, which "
                   "prepare-pretraining writes, else --init-from's; needed only for data prepared without it)")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per micro-batch, all processes together")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--lr", type=float, help="peak learning rate (default 1e-4; with --init-from 5e-5)")
    p.add_argument("--warmup-steps", type=int, help="linear warm-up steps (default: 1%% of all steps; with "
                   "--init-from 10%%)")
    p.add_argument("--max-steps", type=int, help="optimizer steps, both phases (default: one epoch of --data)")
    p.add_argument("--epochs", type=float, help="passes over --data (instead of --max-steps)")
    p.add_argument("--max-minutes", type=float, help="wall-clock budget: when spent, stop as if at the last step "
                   "(final evaluation, checkpoint and model); the schedule still assumes --max-steps "
                   "unless --budget-schedule")
    p.add_argument("--budget-schedule", action="store_true",
                   help="with --max-minutes: warm up and decay the learning rate over the budget's time instead "
                   "of --max-steps, reaching 0 as it is spent (warm-up: --warmup-steps, default 1%% of the budget)")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="global-norm clipping; 0: none")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-every", type=int, default=1000, help="checkpoint every N steps (and at the end)")
    p.add_argument("--keep-last", type=int, default=3, help="checkpoints kept")
    p.add_argument("--resume", nargs="?", const=True, default=None, metavar="CHECKPOINT",
                   help="continue OUT's latest checkpoint (or the file/directory given)")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-data", help="prepared instances to evaluate on")
    p.add_argument("--eval-every", type=int, help="evaluate every N steps (default: at the end)")
    p.add_argument("--eval-batch-size", type=int, help="per process (default: --batch-size / processes)")
    p.add_argument("--phase2-data", help="second phase's instances (the paper: 512 tokens)")
    p.add_argument("--phase2-steps", type=int, help="the last N of --max-steps run on --phase2-data")
    p.add_argument("--phase2-batch-size", type=int, help="(default: --batch-size)")
    p.add_argument("--no-nsp", dest="nsp", action="store_false", help="masked LM only, no next-sentence loss")
    p.add_argument("--no-unpad", dest="unpad", action="store_false",
                   help="run the padded encoder (default: compute only the real tokens; same losses to rounding)")
    p.add_argument("--objective", choices=("mlm", "ltr"), default="mlm",
                   help="ltr: left-to-right LM with a causal encoder, no NSP (the paper's ablation)")
    p.add_argument("--fsdp", action="store_true", help="FullyShardedDataParallel under torchrun (GPU-oriented)")
    p.add_argument("--num-workers", type=int, default=0, help="data-loading worker processes")
    p.add_argument("--num-threads", type=int, help="torch threads per process")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: the GPU if there is one)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.set_defaults(func=cmd_pretrain)

    p = commands.add_parser("finetune", help="fine-tune on a task (GLUE, your own classification data, ...)")
    tasks = p.add_subparsers(dest="task_family", required=True, metavar="TASK")
    p = tasks.add_parser("glue", help="a GLUE task (paper defaults: batch 32, 3 epochs, lr 2e-5)")
    p.add_argument("--task", required=True, help="cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte or wnli")
    p.add_argument("--data-dir", required=True, help="the GLUE root (holding MRPC/, ...) or the task's directory")
    p.add_argument("--max-train-examples", type=int, help="train on the first N examples only")
    p.add_argument("--no-test-predictions", action="store_true", help="skip the submission file for test.tsv")
    _add_long_input_flags(p)
    _add_finetune_flags(p)
    p.set_defaults(func=cmd_finetune_glue)
    p = tasks.add_parser("classify", help="your own CSV/TSV/JSONL: columns text, [text_pair], label")
    p.add_argument("--train-file", required=True)
    p.add_argument("--dev-file", required=True)
    p.add_argument("--test-file", help="predicted with the best model into OUT/test_predictions.tsv")
    p.add_argument("--regression", action="store_true", help="numeric labels: one output, MSE loss")
    _add_long_input_flags(p)
    _add_finetune_flags(p)
    p.set_defaults(func=cmd_finetune_classify)
    p = tasks.add_parser("multiple-choice", help="SWAG-layout CSV (sent1, sent2, ending0..3, label); "
                         "paper defaults: batch 16, 3 epochs, lr 2e-5")
    p.add_argument("--train-file", required=True, help="SWAG CSV: [index], video-id, fold-ind, startphrase, sent1, "
                   "sent2, gold-source, ending0..ending3, label")
    p.add_argument("--dev-file", required=True, help="SWAG CSV with labels (SWAG's val.csv)")
    p.add_argument("--test-file", help="SWAG CSV, labels optional: predicted into OUT/test_predictions.tsv")
    p.add_argument("--max-train-examples", type=int, help="train on the first N examples only")
    _add_finetune_flags(p, lr=2e-5, epochs=3.0, batch_size=16, max_seq_length=128)
    p.set_defaults(func=cmd_finetune_multiple_choice)
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
    _add_finetune_flags(p, lr=5e-5, epochs=None, batch_size=None, max_seq_length=384)
    p.set_defaults(func=cmd_finetune_squad)

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
    # lr and epochs default per approach (see cmd_finetune_ner); None here means "that default".
    _add_finetune_flags(p, lr=None, epochs=None, batch_size=16, max_seq_length=128)
    p.set_defaults(func=cmd_finetune_ner)

    p = commands.add_parser("predict", help="predictions of a fine-tuned model for a file")
    p.add_argument("--model", required=True, help="a `bertforge finetune` output directory")
    p.add_argument("--input", help="GLUE test.tsv (or dev-shaped), or CSV/TSV/JSONL with text; SQuAD JSON; SWAG CSV")
    p.add_argument("--output", help="TSV: index, prediction (GLUE submission format); SQuAD: predictions JSON")
    p.add_argument("--task", help="default: the model's (finetuning_task in config.json)")
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
    p.set_defaults(func=cmd_predict)

    p = commands.add_parser("plot", help="PNG curves (loss, accuracy, lr, throughput) of a training run")
    p.add_argument("run", help="a training output directory (with log.jsonl) or a log.jsonl file")
    p.add_argument("--output-dir", help="where the PNGs go (default: RUN/plots)")
    p.set_defaults(func=cmd_plot)

    p = commands.add_parser("export-onnx", help="export a pipeline's graph to ONNX and check it against PyTorch")
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--output", required=True, help="the .onnx file to write")
    p.add_argument("--task", help="fill-mask, classify, tag, answer or embed (default: from config.json)")
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--atol", type=float, default=1e-4, help="largest difference from PyTorch allowed")
    p.add_argument("--no-check", action="store_true", help="skip the onnxruntime comparison")
    p.set_defaults(func=cmd_export_onnx)

    p = commands.add_parser("serve", help="HTTP server: JSON API with micro-batching, metrics and a test page")
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--task", action="append", help="pipeline(s) to serve, repeatable or comma-separated "
                   "(default: from config.json)")
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
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="how long a request waits to be batched")
    p.add_argument("--no-micro-batching", action="store_true", help="one forward pass per request")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20)
    p.add_argument("--max-texts", type=int, default=64, help="inputs per request")
    p.add_argument("--max-chars", type=int, default=10_000, help="characters per input text (413 over it)")
    p.add_argument("--body-timeout", type=float, default=10.0,
                   help="seconds to receive a request's whole body (408 and the connection closed after)")
    p.add_argument("--num-threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--graceful-timeout", type=float, default=30.0,
                   help="seconds to finish in-flight requests on shutdown")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=cmd_serve)
    return parser


def _attach_negative_values(argv: list[str]) -> list[str]:
    # argparse takes "-1,-2" for an option; `--layers -1,-2,-3,-4` is how users write it (Google's docs).
    out: list[str] = []
    for token in argv:
        if out and out[-1] == "--layers" and token.startswith("-"):
            out[-1] = f"--layers={token}"
        else:
            out.append(token)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(_attach_negative_values(argv))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        check_flags(args)  # every flag's limits, before a model is fetched or loads, or data is read
        # A Hub id names a model as a directory does (serve resolves its own, to report a failure its way).
        for flag in ("model", "init_from"):
            if isinstance(getattr(args, flag, None), str) and args.command != "serve":
                from .modeling.pretrained import resolve_model_dir

                setattr(args, flag, str(resolve_model_dir(getattr(args, flag))))
        check_positions(args)  # again: a Hub model's config.json is here once fetched
        args.func(args)
    except (FileNotFoundError, ValueError, ModuleNotFoundError) as error:
        # Bad input is the user's to fix: one clear line, no traceback.
        print(f"bertforge {args.command}: error: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:
        from .training.loop import NonFiniteLossError

        if not isinstance(error, NonFiniteLossError):
            raise
        # A diverged run (too high a learning rate, ...): one line naming the checkpoint to resume from.
        print(f"bertforge {args.command}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
