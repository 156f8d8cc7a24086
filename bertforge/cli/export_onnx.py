"""`bertforge export-onnx`: a pipeline's graph as ONNX, checked against PyTorch (onnx, onnxruntime: the
`onnx` extra, imported by bertforge.serving.onnx when it exports)."""

from __future__ import annotations

import argparse

from .._checks import check_output
from ..serving.onnx import OnnxParityError, export_onnx


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("export-onnx", help="export a pipeline's graph to ONNX and check it against PyTorch")
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--output", required=True, help="the .onnx file to write")
    p.add_argument("--task", help="the task whose pipeline to export, by name or alias: classify, tag, answer, embed "
                   "or fill-mask (default: the model's, from config.json)")
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--atol", type=float, default=1e-4, help="largest difference from PyTorch allowed")
    p.add_argument("--no-check", action="store_true", help="skip the onnxruntime comparison")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    p.set_defaults(func=run, check=check)


def check(args: argparse.Namespace) -> None:
    """--output before the model loads and exports: never a special file, nor an existing file without
    --overwrite."""
    check_output(args.output, [], args.overwrite)


def run(args: argparse.Namespace) -> None:
    try:
        report = export_onnx(args.model, args.output, task=args.task, opset=args.opset, check=not args.no_check,
                             atol=args.atol)
    except OnnxParityError as error:  # the export is wrong: say by how much, write nothing
        raise SystemExit(f"bertforge export-onnx: error: {error}") from None
    check = ("check skipped" if report.max_abs_diff is None else
             f"max |torch - onnxruntime| = {report.max_abs_diff:.3g} over {report.batches_checked} batches "
             f"(tolerance {args.atol:g})")
    print(f"wrote {report.path}: {report.task} pipeline, opset {report.opset}, dynamic batch and sequence; {check}")
