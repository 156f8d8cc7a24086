"""Sentence-embedding throughput: `pipeline("embed")` against sentence-transformers' `encode` on the same texts.

Texts: the first 10,000 sentences of GLUE STS-B's training pairs (each pair's first, then its second
sentence), as a user embeds a corpus; batch 64, all-MiniLM-L6-v2 as its sentence-transformers directory
declares it (mean pooling, normalised, 256 tokens at most: bertforge reads the same from `modules.json`).
One call embeds every text. Precisions, one case each: fp32 on both sides; bf16 on both sides (bertforge
`dtype="bf16"`; sentence-transformers with the model's weights in bfloat16, `model_kwargs={"dtype": ...}`);
int8: bertforge's int8 linear layers against the peer's fastest precision here (sentence-transformers'
int8 needs its ONNX/OpenVINO backends and `optimum`, which it does not install: the peer offers fp32 and
bf16 on torch). The check: the sides' embeddings of the first call, the largest cosine distance between a
text's two vectors and their largest elementwise difference (fp32 within 1e-5 both; bf16 and int8 recorded).

    python -m benchmarks run embed                   # the figures (minutes)
    python -m benchmarks run embed --quick           # seconds: 256 texts on a tiny random model
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    raise SystemExit("benchmarks/embed.py runs through the harness, from the repository root: "
                     "python -m benchmarks run embed [--quick]")

import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from .harness import Benchmark, Params, Prepared  # noqa: E402
from .inference import GLUE, GOAL, held, minilm_directory, quiet_libraries, saved_model  # noqa: E402

SIDES = ("bertforge", "sentence-transformers")
FP32_COSINE_TOLERANCE = FP32_TOLERANCE = 1e-5  # fp32: the sides' vectors of a text, as the parity tests hold them
TEXTS, BATCH = 10_000, 64


def cases(quick: bool) -> list[Params]:
    """fp32, bf16 and int8 on MiniLM over 10,000 STS-B sentences; `quick`: 256 texts on a tiny random model."""
    model, texts = ("tiny", 256) if quick else ("minilm", TEXTS)
    return [{"model": model, "dtype": dtype, "texts": texts, "batch_size": BATCH} for dtype in ("fp32", "bf16", "int8")]


def sentences(count: int) -> list[str]:
    """STS-B train's sentences: each pair's first, then its second, in file order, the first `count`."""
    lines = (GLUE / "STS-B" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    pairs = [line.split("\t")[7:9] for line in lines if line.strip()]
    return [text for pair in pairs for text in pair][:count]


def model_directory(model: str, workdir: Path) -> Path:
    """MiniLM's sentence-transformers directory as installed, or a tiny random BERT (`inference.saved_model`)
    with MiniLM's vocabulary, which declares no pooling (both sides: mean, not normalised)."""
    directory = saved_model(model, workdir)
    if model != "minilm":
        for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
            (directory / name).write_bytes((minilm_directory() / name).read_bytes())
    return directory


def sides(model: str, dtype: str) -> dict[str, Any]:
    """Both sides' callables for one model and precision (`held`: one pair in memory at a time)."""
    def build() -> dict[str, Any]:
        import torch
        from sentence_transformers import SentenceTransformer

        from bertforge.serving.pipelines import pipeline

        with tempfile.TemporaryDirectory(prefix="bertforge-bench-") as workdir:
            directory = model_directory(model, Path(workdir))
            ours = pipeline("embed", model=str(directory), dtype=dtype)
            peer_dtype = torch.float32 if dtype == "fp32" else torch.bfloat16  # int8: the peer's fastest here (bf16)
            peer = SentenceTransformer(str(directory), device="cpu", model_kwargs={"dtype": peer_dtype})
        return {"bertforge": ours, "sentence-transformers": peer, "peer_dtype": str(peer_dtype).split(".")[-1]}

    return held(("embed", model, dtype), build)


def setup(params: Params) -> Prepared:
    quiet_libraries()
    texts = sentences(params["texts"])
    built = sides(params["model"], params["dtype"])
    ours, peer, batch = built["bertforge"], built["sentence-transformers"], params["batch_size"]
    return Prepared(
        sides={"bertforge": lambda: ours(texts, batch_size=batch),
               "sentence-transformers": lambda: peer.encode(texts, batch_size=batch, convert_to_numpy=True)},
        facts={"peer_dtype": built["peer_dtype"], "normalize": bool(getattr(ours.declared, "normalize", False)),
               "max_length": ours.max_length})


def check(params: Params, outputs: dict[str, Any]) -> dict[str, Any]:
    """The largest cosine distance between the sides' vectors of one text; fp32 must agree."""
    import numpy as np

    a, b = (np.asarray(outputs[side], dtype=np.float64) for side in SIDES)
    if a.shape != b.shape:
        raise ValueError(f"embed {params}: bertforge gave {a.shape}, sentence-transformers {b.shape}")
    cosine = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
    distance, largest = float((1 - cosine).max()), float(np.abs(a - b).max())
    if params["dtype"] == "fp32" and (distance > FP32_COSINE_TOLERANCE or largest > FP32_TOLERANCE):
        raise ValueError(f"embed {params}: fp32 embeddings differ (cosine distance {distance:.2e}, "
                         f"largest difference {largest:.2e})")
    return {"max_cosine_distance": distance, "max_abs_difference": largest}


def table(result: dict[str, Any]) -> str:
    """One row per precision: each side's texts per second and the ratio."""
    lines = ["| precision | bertforge `pipeline(\"embed\")`, texts/s | sentence-transformers `encode`, texts/s | "
             f"ratio (goal ≥ {GOAL}×) | largest difference, cosine distance |", "|---|---|---|---|---|"]
    for case in result["cases"]:
        params, facts = case["params"], case["facts"]
        ours = params["texts"] / case["sides"]["bertforge"]["median"]
        peer = params["texts"] / case["sides"]["sentence-transformers"]["median"]
        peer_label = f"{peer:,.0f}" + ("" if facts["peer_dtype"] == {"fp32": "float32", "bf16": "bfloat16"}.get(
            params["dtype"]) else f" ({facts['peer_dtype']}: its fastest here)")
        lines.append(f"| {params['dtype']} | {ours:,.0f} | {peer_label} | {ours / peer:.2f}× | "
                     f"{facts['max_abs_difference']:.1e}, {facts['max_cosine_distance']:.1e} |")
    return "\n".join(lines)


BENCHMARKS = (
    Benchmark(name="embed", figure="BENCHMARKS.md, \"Sentence embeddings: encoding throughput\"", sides=SIDES,
              cases=cases, setup=setup, check=check, table=table, result="embed/throughput.json",
              packages=("sentence-transformers",), repeats=3, quick_repeats=1),
)
