"""Encoder forward: bertforge's BertModel against transformers' on padded batches of one length.

The same weights on both sides, fp32, eval mode, `torch.inference_mode()`; bertforge's `BertModel` as
loaded (no `optimize_for_inference`), transformers' with attn_implementation="sdpa". Inputs: the first
`batch_size` sentences of GLUE SST-2 dev, each padded or truncated to exactly 128 tokens (attention mask
included): both sides do the same arithmetic on the padding, so the gain is the kernels (real-length
batches: `inference.py`). Models: MiniLM (all-MiniLM-L6-v2), and BERT-base with random weights; batches of
1 and 32. A side's call is a fixed number of forward passes (`passes_for`: a second or two of work on two
cores), which the harness alternates between the sides round by round. The check: both sides' outputs of
the first call, the largest absolute difference of last_hidden_state at real positions (must stay within
`inference.FP32_TOLERANCE`) and of the pooled vector, recorded.

    python -m benchmarks run encoder                        # the figures (minutes)
    python -m benchmarks run encoder --quick --threads 1    # seconds: a toy model

`--quick`: a random 2-layer BERT (the `tiny` preset) on speeches of the built-in Shakespeare corpus padded
to 32 tokens, batches of 1 and 4. `BERTFORGE_ONEDNN_LINEAR=0` before the command runs bertforge's fp32
matmuls through `F.linear`, the peer's BLAS calls: the peer's outputs bit for bit, slower (the result's
facts record which: `onednn_linear`).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    raise SystemExit("benchmarks/encoder.py runs through the harness, from the repository root: "
                     "python -m benchmarks run encoder [--quick]")

import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

from . import legacy  # noqa: E402
from .harness import Benchmark, Params, Prepared  # noqa: E402
from .inference import FP32_TOLERANCE, GLUE, held, minilm_directory, plural, quiet_libraries, saved_model  # noqa: E402

SIDES = ("bertforge", "transformers")


def passes_for(batch: int, model: str) -> int:
    """Forward passes per call: roughly a second or two of work on two cores (base costs about 4× MiniLM)."""
    per_pass = batch * (4 if model == "base" else 1)
    return max(2, min(40, 64 // per_pass))


def cases(quick: bool) -> list[Params]:
    """MiniLM and base at batch 1 and 32, 128 tokens; `quick`: the tiny preset at batch 1 and 4, 32 tokens."""
    if quick:
        return [{"model": "tiny", "data": "speeches", "batch_size": batch, "seq_length": 32, "passes": 2}
                for batch in (1, 4)]
    return [{"model": model, "data": "sst2", "batch_size": batch, "seq_length": 128, "passes": passes_for(batch, model)}
            for model in ("minilm", "base") for batch in (1, 32)]


def sentences(data: str) -> list[str]:
    """SST-2 dev's sentences in file order, or for `--quick` the Shakespeare corpus's first speeches."""
    if data == "speeches":
        from bertforge.corpus import shakespeare_plays

        return shakespeare_plays()[0].speeches[:64]
    lines = (GLUE / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0].strip() for line in lines if line.strip()]


def models(model: str) -> tuple[Any, Any]:
    """(bertforge's BertModel, transformers' BertModel) on the same weights, eval mode (`inference.held`:
    built once for all the model's cases, MiniLM's pair freed before base's is built)."""
    def build() -> tuple[Any, Any]:
        import transformers

        from bertforge.modeling import BertModel

        with tempfile.TemporaryDirectory(prefix="bertforge-bench-") as workdir:
            directory = saved_model(model, Path(workdir))
            return (BertModel.from_pretrained(directory).eval(),
                    transformers.BertModel.from_pretrained(directory, attn_implementation="sdpa").eval())

    return held(("encoder", model), build)


def setup(params: Params) -> Prepared:
    """Both sides as calls of `passes` forward passes on one padded batch; each returns its last outputs and
    the batch's attention mask (what `check` compares them on)."""
    import torch

    from bertforge.modeling.kernels import onednn_linear_op
    from bertforge.tokenization import BertTokenizer

    quiet_libraries()
    texts = sentences(params["data"])
    batch = [texts[i % len(texts)] for i in range(params["batch_size"])]
    inputs = BertTokenizer.from_pretrained(minilm_directory()).encode_batch(
        batch, max_length=params["seq_length"], padding="max_length", return_tensors="pt")

    def forward(model: Any) -> Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        def call() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            with torch.inference_mode():
                for _ in range(params["passes"]):
                    out = model(**inputs)
            return out.last_hidden_state, out.pooler_output, inputs["attention_mask"]
        return call

    ours, peer = models(params["model"])
    return Prepared({"bertforge": forward(ours), "transformers": forward(peer)},
                    {"onednn_linear": onednn_linear_op() is not None})


def check(params: Params, outputs: dict[str, Any]) -> dict[str, Any]:
    """The largest absolute differences of the two sides' outputs; raises past `FP32_TOLERANCE`."""
    (ours, ours_pooled, mask), (peer, peer_pooled, _) = outputs["bertforge"], outputs["transformers"]
    hidden = (ours - peer)[mask.bool()].abs().max().item()
    pooled = (ours_pooled - peer_pooled).abs().max().item()
    if not hidden <= FP32_TOLERANCE:
        raise AssertionError(f"bertforge's hidden states differ from transformers' by {hidden:.3g}")
    return {"max_abs_diff_last_hidden_state": hidden, "max_abs_diff_pooler_output": pooled}


def table(result: dict[str, Any]) -> str:
    """Each model and batch size: both sides' sequences per second at their medians, the ratio, the difference."""
    first = result["cases"][0]
    repeats = len(first["sides"]["bertforge"]["repeats"])
    data = {"sst2": "SST-2 dev sentences", "speeches": "Shakespeare speeches"}[first["params"]["data"]]
    passes = ", ".join(str(case["params"]["passes"]) for case in result["cases"])
    rows = [f"{data} padded or truncated to {first['params']['seq_length']} tokens; forward passes per call "
            f"(by row): {passes}; medians of {plural(repeats, 'repeat')}, {plural(result['threads'], 'thread')}; "
            f"load average {result['load_average_1min']} at the start.",
            "",
            "| model | batch | bertforge seq/s | peer seq/s | ratio | max abs diff |",
            "|---|---|---|---|---|---|"]
    for case in result["cases"]:
        params, sides = case["params"], case["sides"]
        work = params["batch_size"] * params["passes"]
        rows.append(f"| {params['model']} | {params['batch_size']} | {work / sides['bertforge']['median']:.2f} | "
                    f"{work / sides['transformers']['median']:.2f} | "
                    f"**{legacy.ratio_text(case, 'bertforge', 'transformers', 3)}** | "
                    f"{case['facts']['max_abs_diff_last_hidden_state']:.1e} |")
    return "\n".join(rows)


def adapt(old: dict[str, Any]) -> dict[str, Any]:
    """docs/results/encoder/encoder_forward.json as benchmarks/encoder.py wrote it: per model and batch size,
    every repeat's rate (sequences per second, rounded to 0.01) and the median rates and their ratio of the
    unrounded medians; each call's seconds are taken back from the rates (`legacy.side_from_rates`)."""
    versions = {"torch": old["torch_version"], "transformers": old["transformers_version"]}
    result = {**legacy.header("encoder", "python -m benchmarks run encoder", [old["provenance"]], versions,
                              round(old["load_average_before"], 2)),
              "threads": old["threads"], "cases": []}
    for cell in old["results"]:
        work = cell["batch_size"] * cell["passes_per_repeat"]
        result["cases"].append({
            "params": {"model": cell["model"], "data": "sst2", "batch_size": cell["batch_size"],
                       "seq_length": cell["seq_length"], "passes": cell["passes_per_repeat"]},
            "facts": {"onednn_linear": old["bertforge_onednn_linear"],
                      "max_abs_diff_last_hidden_state": cell["max_abs_diff_last_hidden_state"],
                      "max_abs_diff_pooler_output": cell["max_abs_diff_pooler_output"],
                      "ratios": {"bertforge/transformers": cell["ratio_ours_over_peer"]}},
            "sides": {"bertforge": legacy.side_from_rates(work, cell["ours_seq_per_s_all"], cell["ours_seq_per_s"]),
                      "transformers": legacy.side_from_rates(work, cell["peer_seq_per_s_all"],
                                                             cell["peer_seq_per_s"])},
        })
    return result


BENCHMARKS = (
    Benchmark(name="encoder", figure='BENCHMARKS.md, "Encoder forward"', sides=SIDES, cases=cases, setup=setup,
              check=check, table=table, result="encoder/encoder_forward.json", legacy=adapt),
)
