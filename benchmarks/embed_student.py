"""A distilled 3-layer student of a fine-tuned bi-encoder: what it keeps of its teacher's STS-B dev Spearman,
and how much faster it encodes.

The pair, built once under runs/embed_student/ (untimed; about half an hour on two cores) and reused:

* the teacher: all-MiniLM-L6-v2 fine-tuned on STS-B train with RESULTS.md's recipe (`bertforge finetune
  sentence-embedding`, cosine loss, batch 16, 4 epochs, lr 2e-5, seed 0; the best epoch's model);
* the student: the teacher's 3-layer copy (layers 0, 2, 4), distilled with `bertforge distill` (the student's
  embedding regressed onto the teacher's, MSE) over STS-B train's texts plus transfer text (`transfer_texts`:
  MRPC's and RTE's training sentences and the sentences of the pre-training corpus's Wikipedia files), one
  epoch, bf16 autocast, length-grouped batches of 64, lr 1e-4; the teacher's outputs cached under
  runs/embed_student/teacher_outputs.

Timed: `pipeline("embed")` of each over the same 10,000 STS-B train sentences as `embed`, batch 64, at fp32,
bf16 and int8 (each side at the same precision). Facts per case: each side's dev Spearman at that precision
(cosine of the two sentences' embeddings against the gold scores, GLUE STS-B dev).

    python -m benchmarks run embed-student            # the figures (the pair, then minutes)
    python -m benchmarks run embed-student --quick    # seconds: a tiny random teacher, a 1-layer student
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    raise SystemExit("benchmarks/embed_student.py runs through the harness, from the repository root: "
                     "python -m benchmarks run embed-student [--quick]")

import contextlib  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from ._common import scratch  # noqa: E402
from .embed import BATCH, TEXTS, model_directory, sentences  # noqa: E402
from .harness import ROOT, Benchmark, Params, Prepared  # noqa: E402
from .inference import GLUE, quiet_libraries  # noqa: E402

SIDES = ("student", "teacher")
KEPT_GOAL, SPEED_GOAL = 0.97, 1.8  # the student's dev Spearman / the teacher's; its texts per second / the teacher's
WORK = ROOT / "runs" / "embed_student"
WIKI = ROOT / ".." / "shared" / "data" / "pretraining" / "wiki"
TEACHER_RECIPE = ["--epochs", "4", "--lr", "2e-5", "--batch-size", "16", "--seed", "0", "--pooling", "mean"]
STUDENT_RECIPE = ["--layers", "3", "--epochs", "1", "--lr", "1e-4", "--batch-size", "64", "--seed", "0", "--precision",
                  "bf16", "--group-by-length"]


def transfer_texts() -> list[str]:
    """The student's transfer text beyond STS-B train: MRPC's and RTE's training sentences, then every sentence of
    5-40 words of the Wikipedia files (paragraphs split after . ! ? before a capital), each once, in file order."""
    texts = []
    for line in (GLUE / "MRPC" / "train.tsv").read_text(encoding="utf-8-sig").splitlines()[1:]:
        texts += line.split("\t")[3:5]
    for line in (GLUE / "RTE" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        texts += line.split("\t")[1:3]
    for path in sorted(WIKI.glob("*.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.startswith("<"):
                texts += [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", line.strip()) if 5 <= len(s.split()) <= 40]
    return [text for text in dict.fromkeys(t.strip().replace("\t", " ") for t in texts) if text]


def cli(argv: list[str]) -> None:
    """One `bertforge` command, its report sent to stderr (progress, not a result)."""
    from bertforge.cli import main

    with contextlib.redirect_stdout(sys.stderr):
        code = main([*argv, "--no-progress"])
    if code != 0:
        raise SystemExit(f"bertforge {' '.join(argv[:2])} failed ({code})")


def quick_work() -> Path:
    """--quick's folder, one per process (its cases share the pair): a temporary one, not the repository's."""
    return scratch("bertforge-embed-student-")


def build_pair(quick: bool) -> tuple[Path, Path]:
    """The teacher's and the student's directories, trained when missing (a run that stopped short leaves no
    eval_results.json: it is trained again from the start). `quick`: a tiny random teacher trained 4 steps on 64
    STS-B rows, a 1-layer student 4 steps, in a temporary folder (`quick_work`)."""
    work = quick_work() if quick else WORK
    train, dev = GLUE / "STS-B" / "train.tsv", GLUE / "STS-B" / "dev.tsv"
    teacher, student = work / "teacher", work / "student"
    if quick:
        work.mkdir(parents=True, exist_ok=True)
        rows = train.read_text(encoding="utf-8").splitlines(keepends=True)
        (work / "train.tsv").write_text("".join(rows[:65]), encoding="utf-8")
        (work / "dev.tsv").write_text("".join(dev.read_text(encoding="utf-8").splitlines(keepends=True)[:33]),
                                      encoding="utf-8")
        train, dev = work / "train.tsv", work / "dev.tsv"
    if not (teacher / "eval_results.json").exists():
        start = model_directory("tiny", work) if quick else model_directory("minilm", work)
        recipe = ["--max-steps", "4", "--pooling", "mean"] if quick else TEACHER_RECIPE
        cli(["finetune", "sentence-embedding", "--train-file", str(train), "--dev-file", str(dev), "--model",
             str(start), "--output-dir", str(teacher), *recipe])
    if not (student / "eval_results.json").exists():
        transfer = work / "transfer.txt"
        texts = transfer_texts()[:64] if quick else transfer_texts()
        transfer.write_text("\n".join(texts) + "\n", encoding="utf-8")
        recipe = ["--layers", "1", "--max-steps", "4"] if quick else STUDENT_RECIPE
        cli(["distill", "--teacher", str(teacher), "--train-file", str(train), "--dev-file", str(dev),
             "--unlabeled", str(transfer), "--output-dir", str(student), "--cache-dir", str(work / "teacher_outputs"),
             *recipe])
    return teacher, student


def cases(quick: bool) -> list[Params]:
    """fp32, bf16 and int8, the pair of `build_pair`; `quick`: 256 texts."""
    return [{"quick": quick, "dtype": dtype, "texts": 256 if quick else TEXTS, "batch_size": BATCH}
            for dtype in ("fp32", "bf16", "int8")]


def dev_spearman(embed: Any, dev: Path) -> float:
    """Spearman of the cosine of each dev pair's embeddings against its gold score."""
    from bertforge.tasks.sentence_embedding import cosine_scores, read_sentence_file, similarity_metrics

    rows = read_sentence_file(dev, texts=2, scored=True)
    vectors = embed([t for row in rows for t in row.texts], batch_size=BATCH)
    cosine = cosine_scores(vectors[0::2], vectors[1::2])
    return similarity_metrics(cosine.tolist(), [row.score for row in rows])["spearman"]


def setup(params: Params) -> Prepared:
    from bertforge.serving.pipelines import pipeline

    quiet_libraries()
    teacher_dir, student_dir = build_pair(params["quick"])  # trained by the first case, found by the others
    dev = (quick_work() / "dev.tsv") if params["quick"] else GLUE / "STS-B" / "dev.tsv"
    texts, batch = sentences(params["texts"]), params["batch_size"]
    built = {side: pipeline("embed", model=str(directory), dtype=params["dtype"])
             for side, directory in (("student", student_dir), ("teacher", teacher_dir))}
    facts: dict[str, Any] = {f"{side}_dev_spearman": dev_spearman(embed, dev) for side, embed in built.items()}
    facts.update({f"{side}_layers": embed.config.num_hidden_layers for side, embed in built.items()})
    return Prepared(sides={side: (lambda embed=embed: embed(texts, batch_size=batch)) for side, embed in built.items()},
                    facts=facts)


def check(params: Params, outputs: dict[str, Any]) -> dict[str, Any]:
    """Both sides embed every text into vectors of one width (the student keeps the teacher's hidden size)."""
    import numpy as np

    shapes = {side: np.asarray(output).shape for side, output in outputs.items()}
    if len(set(shapes.values())) != 1 or shapes["teacher"][0] != params["texts"]:
        raise ValueError(f"embed-student {params}: embeddings of shapes {shapes} for {params['texts']} texts")
    return {}


def table(result: dict[str, Any]) -> str:
    """One row per precision: each model's texts per second and dev Spearman, the speed-up and what is kept."""
    first = result["cases"][0]["facts"]
    lines = [f"| precision | teacher ({first['teacher_layers']} layers), texts/s | "
             f"student ({first['student_layers']} layers), texts/s | "
             f"speed-up (goal ≥ {SPEED_GOAL}×) | dev Spearman, teacher | student | kept (goal ≥ {KEPT_GOAL:.0%}) |",
             "|---|---|---|---|---|---|---|"]
    for case in result["cases"]:
        params, facts, timed = case["params"], case["facts"], case["sides"]
        student, teacher = (params["texts"] / timed[side]["median"] for side in SIDES)
        kept = facts["student_dev_spearman"] / facts["teacher_dev_spearman"]
        lines.append(f"| {params['dtype']} | {teacher:,.0f} | {student:,.0f} | {student / teacher:.2f}× | "
                     f"{100 * facts['teacher_dev_spearman']:.2f} | {100 * facts['student_dev_spearman']:.2f} | "
                     f"{kept:.1%} |")
    return "\n".join(lines)


BENCHMARKS = (
    Benchmark(name="embed-student", figure="BENCHMARKS.md, \"Sentence embeddings: a distilled 3-layer student\"",
              sides=SIDES, cases=cases, setup=setup, check=check, table=table, result="embed/student.json",
              repeats=3, quick_repeats=1),
)
