"""The figures in RESULTS.md's and BENCHMARKS.md's prose, each held to a result file behind it.

The tables of those documents are rendered (render.py), so they cannot drift from their JSON; the prose around
them is hand-written and quotes figures too ("1.48× against the 1.5× goal", "the seed-0 model's 88.63"). A
measured figure in prose must have a result file behind it: `unbacked` finds every decimal figure in a
section's prose (outside rendered tables and code blocks) and looks for it among the numbers of the files that
section stands on: the sources of the tables rendered in it, and the JSON files and docs/results folders it
links (a folder's README counts as its folder). A figure is found when the section's rendered table states it
(the renderer computed it from those files), or when some number in the files, as it is or as points/percent
(×100), rounds to it at the figure's own precision. Figures that are not measurements (a goal,
a setting, a version, the paper's published figure) are declared in `DECLARED` with the reason, and figures
computed from the files (a ratio, a goal's bar, a p-value) with the computation, which the check runs.

Integers are not checked: in prose they are mostly counts of a setup (3 epochs, 2 cores, 1,024 questions).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from .harness import ROOT, RESULTS

DOCUMENTS = ("RESULTS.md", "BENCHMARKS.md")


@dataclass(frozen=True)
class Computed:
    """A prose figure computed from result files (a ratio, a goal's bar, a test statistic): `files` are glob
    patterns under docs/results/, `value` gives the figure, in the unit the prose prints it, from their
    parsed JSON keyed by path under docs/results/ (posix)."""

    files: tuple[str, ...]
    value: Callable[[dict[str, Any]], float]


def _welch_p(ours: list[float], peer: list[float]) -> float:
    from scipy.stats import ttest_ind  # a dependency of bertforge; imported here to keep `list` cheap

    return float(ttest_ind(ours, peer, equal_var=False).pvalue)


def _ner_p(sources: dict[str, Any]) -> float:
    ours = sources["ner/bertforge_summary.json"]
    return _welch_p([run["metrics"]["f1"] for run in ours["runs"] if run["lr"] == ours["best_lr"]],
                    [run["f1"] for name, data in sources.items() if name.startswith("ner/transformers_seed")
                     for run in data["runs"]])


def _head_init_change(settings: str) -> Computed:
    """The mean change in dev macro-F1, in points, from the paper's truncated-normal head to transformers' plain
    normal over the seeds of one settings block (goemotions/head_init.json)."""
    file = "goemotions/head_init.json"

    def change(sources: dict[str, Any]) -> float:
        pairs = sources[file][settings]
        return 100 * sum(pair["normal"]["macro_f1"] - pair["truncated_normal"]["macro_f1"] for pair in pairs) / len(pairs)

    return Computed((file,), change)


def _squad_bar(version: str) -> Computed:
    """The SQuAD goal's bar: the peer's mean F1 − ½ its std (official script's points)."""
    def bar(sources: dict[str, Any]) -> float:
        f1 = sources[f"squad/{version}.json"]["sides"]["peer"]["scores"]["f1"]
        return f1["mean"] - f1["std"] / 2

    return Computed((f"squad/{version}.json",), bar)


def _ratio(file: str, numerator: Callable[[Any], float], denominator: Callable[[Any], float]) -> Computed:
    return Computed((file,), lambda sources: numerator(sources[file]) / denominator(sources[file]))


def _student_fp32(fact: Callable[[Mapping[str, Any]], float]) -> Computed:
    """A figure of the 3-layer sentence-embedding student's fp32 case (embed/student.json)."""
    file = "embed/student.json"
    return Computed((file,), lambda sources: fact(next(case for case in sources[file]["cases"]
                                                         if case["params"]["dtype"] == "fp32")))


# (document, the start of a section's heading; "" for the text before the first) -> {figure: why it is not a
# measurement, or how it is computed}. A figure listed here that its section no longer states fails the
# check too (no stale entry).
DECLARED: dict[tuple[str, str], dict[str, str | Computed]] = {
    ("RESULTS.md", "CoNLL-2003 NER"): {"0.38": Computed(("ner/bertforge_summary.json", "ner/transformers_seed*.json"),
                                                        _ner_p)},
    ("RESULTS.md", "SQuAD v1.1 and v2.0"): {
        "51.97": _squad_bar("v1.1"), "17.51": _squad_bar("v2.0"), "24.87": _squad_bar("v2.0_3_epochs"),
        "88.5": "the paper's BERT-Base F1 on SQuAD v1.1 (its Table 2)", "76.3": "BERT-Base's published v2.0 F1"},
    ("RESULTS.md", "Sentence embeddings: STS-B"): {
        "0.01": "AdamW's weight decay (a setting)",
        "98.9": _student_fp32(lambda case: 100 * case["facts"]["student_dev_spearman"]
                              / case["facts"]["teacher_dev_spearman"]),
        "1.91": _student_fp32(lambda case: case["sides"]["teacher"]["median"] / case["sides"]["student"]["median"])},
    ("RESULTS.md", "Pre-training: 30 minutes"): {
        "2.1": Computed(("pretrain_budget_mini/ours.json", "pretrain_budget_mini/peer.json"),
                        lambda sources: sources["pretrain_budget_mini/ours.json"]["step"]
                        / sources["pretrain_budget_mini/peer.json"]["step"])},
    ("RESULTS.md", "Multi-label classification: GoEmotions"): {
        "4.27": _head_init_change("fast"), "6.70": _head_init_change("defaults")},
    ("BENCHMARKS.md", ""): {"5.24": "transformers' version (the machine line)"},
    ("BENCHMARKS.md", "How close to the machine's limit"): {
        "1.95": _ratio("machine_limit/base.json", lambda data: data["padded_tokens"], lambda data: data["real_tokens"])},
    ("BENCHMARKS.md", "Inference on real-length batches"): {
        **{figure: _ratio("inference/dtypes.json",
                          lambda data, case=case: data["cases"][case]["sides"]["bf16"]["median"],
                          lambda data, case=case: data["cases"][case]["sides"]["bf16_exact"]["median"])
           for figure, case in (("1.07", 0), ("1.06", 1))}},
    ("BENCHMARKS.md", "Sentence embeddings: a distilled"): {
        "94.6": _ratio("embed/student_layers_0_2_4.json",
                       lambda data: 100 * data["cases"][0]["facts"]["student_dev_spearman"],
                       lambda data: data["cases"][0]["facts"]["teacher_dev_spearman"])},
}

MARKED = re.compile(r"^<!-- render: (?P<name>[\w-]+) -->\n.*?^<!-- /render -->$", re.S | re.M)
CODE = re.compile(r"^```.*?^```$", re.S | re.M)
HEADING = re.compile(r"^## (.*)$", re.M)
LINK = re.compile(r"\]\(([^)#\s]*)(?:#[^)\s]*)?\)")
# A decimal figure: not part of a word, a path, a version's further digits or a commit hash.
FIGURE = re.compile(r"(?<![\w.\-/#])[-−]?\d[\d,]*\.\d+(?![\w.])")


def sections(text: str) -> Iterator[tuple[str, str]]:
    """(heading, body) of each `## ` section, the text before the first under the heading ""."""
    parts = HEADING.split(text)
    yield "", parts[0]
    for index in range(1, len(parts), 2):
        yield parts[index], parts[index + 1]


def figures(body: str) -> list[str]:
    """The decimal figures of a section's prose: rendered tables, code blocks and link targets left out."""
    prose = LINK.sub("]", CODE.sub("", MARKED.sub("", body)))
    return FIGURE.findall(prose)


def backing(document: Path, body: str, sources: Callable[[str], list[Path]], root: Path = ROOT) -> list[Path]:
    """The result files a section stands on: its rendered tables' sources (`sources(name)`), the JSON files it
    links, and every JSON file under a docs/results folder it links (or whose README it links); the
    docs/results folder itself is too broad to count."""
    results = (root / RESULTS).resolve()
    files = [path for name in MARKED.findall(body) for path in sources(name)]
    for target in LINK.findall(body):
        path = (document.parent / target).resolve() if target else None
        if path is None or not path.exists():
            continue
        if path.suffix == ".md" and path.parent != results and path.is_relative_to(results):
            path = path.parent
        if path.is_dir() and path != results and path.is_relative_to(results):
            files += sorted(path.rglob("*.json"))
        elif path.suffix == ".json":
            files.append(path)
    return list(dict.fromkeys(files))


def numbers(value: Any) -> Iterator[float]:
    """Every number in parsed JSON, those written inside its strings included ("torch 2.13.0" gives 2.13)."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield float(value)
    elif isinstance(value, dict):
        for item in value.values():
            yield from numbers(item)
    elif isinstance(value, list):
        for item in value:
            yield from numbers(item)
    elif isinstance(value, str):
        yield from (float(match) for match in re.findall(r"\d+\.\d+", value))


def found(figure: str, values: list[float], scales: tuple[float, ...] = (1, -1, 100, -100)) -> bool:
    """Whether some value, times one of `scales` (as it is or ×100, negated or not), rounds to `figure` at its
    precision."""
    text = figure.replace(",", "").replace("−", "-")
    target, half = float(text), 0.5 * 10 ** -len(text.split(".")[1]) + 1e-9
    return any(abs(scale * value - target) <= half for value in values for scale in scales)


def load(patterns: tuple[str, ...], root: Path = ROOT) -> dict[str, Any]:
    """The parsed JSON of every file matching `patterns` under docs/results/, keyed by its path there; raises
    when a pattern matches nothing."""
    base = root / RESULTS
    loaded: dict[str, Any] = {}
    for pattern in patterns:
        paths = sorted(base.glob(pattern))
        if not paths:
            raise ValueError(f"prose.DECLARED: no result file matches docs/results/{pattern}")
        loaded |= {path.relative_to(base).as_posix(): json.loads(path.read_text(encoding="utf-8")) for path in paths}
    return loaded


def unbacked(sources: Callable[[str], list[Path]], root: Path = ROOT,
             declared: Mapping[tuple[str, str], Mapping[str, str | Computed]] = DECLARED) -> list[str]:
    """Every prose figure with no result file behind it, and every declared figure its section no longer
    states, as `DOCUMENT, "SECTION": FIGURE (why)`."""
    problems: list[str] = []
    used: set[tuple[tuple[str, str], str]] = set()
    present = [name for name in DOCUMENTS if (root / name).exists()]  # a partial copy checks what it holds
    declared = {key: table for key, table in declared.items() if key[0] in present}
    for name in present:
        document = root / name
        for heading, body in sections(document.read_text(encoding="utf-8")):
            keys = [key for key in declared if key[0] == name and heading.startswith(key[1])
                    and (key[1] or not heading)]
            allowed = {figure: key for key in keys for figure in declared[key]}
            values: list[float] | None = None
            rendered = {match.group(0) for table in MARKED.finditer(body) for match in FIGURE.finditer(table.group(0))}
            for figure in figures(body):
                if figure in rendered:  # the section's own rendered table states it (computed from its JSON)
                    continue
                if figure in allowed:
                    key = allowed[figure]
                    used.add((key, figure))
                    entry = declared[key][figure]
                    if isinstance(entry, Computed):
                        value = entry.value(load(entry.files, root))
                        if not found(figure, [value], scales=(1,)):
                            problems.append(f'{name}, "{heading or "(top)"}": {figure} (computed from '
                                            f'{", ".join(entry.files)}: {value:.6g})')
                    continue
                if values is None:
                    values = [value for path in backing(document, body, sources, root)
                              for value in numbers(json.loads(path.read_text(encoding="utf-8")))]
                if not found(figure, values):
                    why = "in no result file it links" if values else "its section links no result file"
                    problems.append(f'{name}, "{heading or "(top)"}": {figure} ({why})')
    for key, table in declared.items():
        problems += [f'{key[0]}, "{key[1] or "(top)"}": {figure} is declared but is not in that '
                     f'section (drop it from prose.DECLARED)' for figure in table if (key, figure) not in used]
    return problems
