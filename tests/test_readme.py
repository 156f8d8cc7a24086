"""Every shell command in the docs runs, as written, so the README and the user guide cannot drift from the code.

The pages are README.md and every docs/guide/*.md (PAGES). Each ```bash block of a page is one test, named by
the page and the heading above it: its commands (`\\` continuations joined, trailing `# comments` dropped) run in
order in a scratch directory of that page's own, shared by its blocks in page order, that holds the inputs the
pages name (`corpus/*.txt`, `glue/`, `train.json`, ...), made from a few rows of the real data in
../shared/data. Only two things change, both in the tables below, keyed by the pages' literal text:

- SUBSTITUTIONS: sizes (a small vocabulary, 2 steps instead of 10,000, smaller batches) and the model
  (`DIR`: a checkpoint of BERT-Tiny's width with 4 layers, enough for `--features concat-last-4`, random
  weights, with bert-base-uncased's real vocabulary from the packaged all-MiniLM-L6-v2: it loads as any
  checkpoint does, at a fraction of MiniLM's compute);
- INPUTS: how each input path a page names is made.

`bertforge ...` runs in this process through `bertforge.cli.main` (what the `bertforge` console script
calls), but `bertforge serve`, which runs until stopped: it starts as a process on a free loopback port,
must answer /health, and on SIGTERM must exit cleanly within its --graceful-timeout; `torchrun` runs as `python -m torch.distributed.run` (two processes, Gloo on CPU) on a free port.
A block that cannot run here is marked in its page by a comment line just before it,
`<!-- readme-test: skip REASON -->`, and skipped with that reason (a marker anywhere else fails: it would
skip nothing). A Hub id a page names (HUB_IDS) resolves offline
from a Hub cache in the hub's own layout that holds DIR's files: nothing touches a network.

A new command on a page needs at most a new row in a table: a size to shrink, an input to make, a reason to
skip it; a new page in docs/guide/ is picked up as it is.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch

from bertforge.cli import main

REPO = Path(__file__).resolve().parents[1]
# The pages whose ```bash blocks run: the README, then the user guide's pages.
PAGES = [REPO / "README.md", *sorted((REPO / "docs" / "guide").glob("*.md"))]
TF_CHECKPOINT = Path(__file__).parent / "fixtures" / "tf_bert_tiny"
SWAG = Path(__file__).parent / "fixtures" / "swag"
Make = Callable[[Path, Path], None]  # writes one input: (its path in the scratch directory, ../shared/data)

# The pages' text -> what runs instead. A key is one argument or a flag with its value ("--flag value"),
# matched as whole arguments; the value replaces them. `{model}` is the `model_dir` fixture's checkpoint.
SUBSTITUTIONS: dict[str, str] = {
    "--vocab-size 30522": "--vocab-size 300",
    "--dupe-factor 5": "--dupe-factor 1",
    "--batch-size 32": "--batch-size 4",
    "--max-steps 10000": "--max-steps 2",
    "--max-steps 1000000": "--max-steps 2",
    "--eval-every 500": "--eval-every 1",
    "--save-every 1000": "--save-every 1",
    "--lr-grid 5e-5,4e-5,3e-5,2e-5": "--lr-grid 5e-5,2e-5",
    "--seeds 5": "--seeds 1",
    "DIR": "{model}",
}

# Hub ids the pages name: served offline from a Hub cache in the hub's own layout holding DIR's files.
HUB_IDS = ("google-bert/bert-base-uncased",)


def _lines(path: Path, count: int, header: bool = True) -> Make:
    """An input made of the first `count` rows of a shared-data file (after its header line)."""
    def make(target: Path, shared: Path) -> None:
        with open(shared / path, encoding="utf-8", newline="") as source:
            rows = [line for _, line in zip(range(count + header), source)]
        target.write_text("".join(rows), encoding="utf-8", newline="")
    return make


def _conll(path: str, sentences: int) -> Make:
    """The first `sentences` sentences of a CoNLL-2003 file (-DOCSTART- lines kept)."""
    def make(target: Path, shared: Path) -> None:
        text = (shared / "conll2003" / path).read_text(encoding="utf-8")
        blocks = text.split("\n\n")
        kept, count = [], 0
        for block in blocks:
            kept.append(block)
            count += not block.startswith("-DOCSTART-")
            if count == sentences:
                break
        target.write_text("\n\n".join(kept) + "\n\n", encoding="utf-8")
    return make


def _squad(path: str, questions: int) -> Make:
    """The first paragraph of a SQuAD file's first article, with its first `questions` questions."""
    def make(target: Path, shared: Path) -> None:
        data = json.loads((shared / "squad" / path).read_text(encoding="utf-8"))
        article = data["data"][0]
        paragraph = dict(article["paragraphs"][0], qas=article["paragraphs"][0]["qas"][:questions])
        data["data"] = [dict(article, paragraphs=[paragraph])]
        target.write_text(json.dumps(data), encoding="utf-8")
    return make


def _sst2_csv(split: str, count: int) -> Make:
    """`finetune classify`'s CSV (text, label) from the first `count` SST-2 rows."""
    def make(target: Path, shared: Path) -> None:
        with open(shared / "glue" / "SST-2" / f"{split}.tsv", encoding="utf-8") as source:
            rows = list(csv.DictReader(source, delimiter="\t", quoting=csv.QUOTE_NONE))[:count]
        with open(target, "w", encoding="utf-8", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(["text", "label"])
            writer.writerows([row["sentence"].strip(), row["label"]] for row in rows)
    return make


def _sst2_sentences(split: str, count: int) -> Make:
    """The first `count` SST-2 sentences, one a line, no label: transfer text for a distilled student."""
    def make(target: Path, shared: Path) -> None:
        with open(shared / "glue" / "SST-2" / f"{split}.tsv", encoding="utf-8") as source:
            rows = list(csv.DictReader(source, delimiter="\t", quoting=csv.QUOTE_NONE))[:count]
        target.write_text("".join(row["sentence"].strip() + "\n" for row in rows), encoding="utf-8")
    return make


def _copy(source: Path) -> Make:
    def make(target: Path, shared: Path) -> None:
        shutil.copyfile(source, target)
    return make


def _tf_checkpoint(target: Path, shared: Path) -> None:
    """A Google TF checkpoint prefix (`DIR/bert_model.ckpt`): the tiny fixture's files, config and vocab beside."""
    for source in TF_CHECKPOINT.iterdir():
        if source.name.startswith("bert_model.ckpt") or source.name in ("bert_config.json", "vocab.txt"):
            shutil.copyfile(source, target.parent / source.name)


BOOKS = Path("pretraining") / "books"

# Input paths the pages name -> how to make them (target path, ../shared/data).
INPUTS: dict[str, Make] = {
    "corpus/a.txt": _lines(Path("pretraining") / "sample_text.txt", 200, header=False),
    "corpus/b.txt": _lines(BOOKS / "Carroll_Alice_1865.txt", 300, header=False),
    "heldout.txt": _lines(BOOKS / "Doyle_Hound_1902.txt", 40, header=False),
    "domain/a.txt": _lines(BOOKS / "Doyle_Hound_1902.txt", 400, header=False),
    "glue/MRPC/train.tsv": _lines(Path("glue") / "MRPC" / "train.tsv", 8),
    "glue/MRPC/dev.tsv": _lines(Path("glue") / "MRPC" / "dev.tsv", 8),
    "glue/MRPC/test.tsv": _lines(Path("glue") / "MRPC" / "test.tsv", 4),
    "glue/RTE/train.tsv": _lines(Path("glue") / "RTE" / "train.tsv", 8),
    "glue/RTE/dev.tsv": _lines(Path("glue") / "RTE" / "dev.tsv", 8),
    "glue/RTE/test.tsv": _lines(Path("glue") / "RTE" / "test.tsv", 4),
    "train.csv": _sst2_csv("train", 8),
    "dev.csv": _sst2_csv("dev", 8),
    "train.json": _squad("v2.0/train-v2.0.first10.json", 4),
    "dev.json": _squad("v2.0/dev-v2.0.cs224n-half.json", 4),
    "conll/train.txt": _conll("train.txt", 10),  # every tag of the 4 dev sentences (I-MISC from the 9th)
    "conll/valid.txt": _conll("valid.txt", 4),
    "swag/train.csv": _copy(SWAG / "train.csv"),
    "swag/val.csv": _copy(SWAG / "val.csv"),
    # GoEmotions: no header; the first 40 training rows hold 20 of its 28 emotions, 7 rows two or three
    "goemotions/train.tsv": _lines(Path("goemotions") / "train.tsv", 40, header=False),
    "goemotions/dev.tsv": _lines(Path("goemotions") / "dev.tsv", 12, header=False),
    "goemotions/emotions.txt": _lines(Path("goemotions") / "emotions.txt", 28, header=False),
    "sts/train.tsv": _lines(Path("glue") / "STS-B" / "train.tsv", 16),
    "sts/dev.tsv": _lines(Path("glue") / "STS-B" / "dev.tsv", 8),
    "sentences.txt": _lines(Path("pretraining") / "sample_text.txt", 3, header=False),
    "text/a.txt": _sst2_sentences("test", 6),  # unlabelled transfer text: one sentence a line
    "uncased_L-12_H-768_A-12/bert_model.ckpt": _tf_checkpoint,
}

SKIP = re.compile(r"<!--\s*readme-test:\s*skip\s+(.*?)\s*-->")


def readme_blocks(text: str) -> list[dict]:
    """A page's ```bash blocks: {"name" (the heading above and the block's number in the page), "commands"
    (argument lists), "skip" (the reason of a `<!-- readme-test: skip REASON -->` line just before the block, or
    None)}."""
    blocks = []
    heading = "top"
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):  # any fenced block: its `#` lines are comments, not headings
            language = line[3:].strip()
            end = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("```"))
            if language == "bash":
                marker = SKIP.search(lines[i - 1]) if i else None
                body = "\n".join(lines[i + 1:end]).replace("\\\n", " ")  # join `\` continuations
                commands = [shlex.split(command, comments=True) for command in body.splitlines()]
                blocks.append({"name": f"{heading}-{len(blocks)}".replace(" ", "-"),
                               "commands": [c for c in commands if c], "skip": marker.group(1) if marker else None})
            i = end
        elif line.startswith("#"):
            heading = line.lstrip("#").strip()
        i += 1
    return blocks


def substitute(arguments: list[str], model: Path) -> list[str]:
    """`arguments` with every SUBSTITUTIONS key (one argument, or a flag and its value) replaced."""
    out: list[str] = []
    i = 0
    while i < len(arguments):
        pair = " ".join(arguments[i:i + 2])
        if i + 1 < len(arguments) and pair in SUBSTITUTIONS:
            out += shlex.split(SUBSTITUTIONS[pair].format(model=model))
            i += 2
        elif arguments[i] in SUBSTITUTIONS:
            out += shlex.split(SUBSTITUTIONS[arguments[i]].format(model=model))
            i += 1
        else:
            out.append(arguments[i])
            i += 1
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_server(rest: list[str], cwd: Path, shown: str) -> None:
    """`bertforge serve ...` as a process on a free loopback port: up (/health answers 200), then SIGTERM, and
    it must exit cleanly within its graceful timeout (and a margin for the interpreter's exit)."""
    import signal
    import time
    import urllib.request

    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    server = subprocess.Popen([sys.executable, "-m", "bertforge", *rest, "--host", "127.0.0.1", "--port", str(port)],
                              cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, f"`{shown}` exited with {server.returncode}:\n{server.stdout.read()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"`{shown}`: /health did not answer within 180 s"
            time.sleep(0.5)
        grace = float(rest[rest.index("--graceful-timeout") + 1]) if "--graceful-timeout" in rest else 30.0
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=grace + 15)
        log = server.stdout.read()
        # uvicorn re-raises the signal once shut down: -SIGTERM is its clean exit, as 0
        assert code in (0, -signal.SIGTERM) and "Traceback" not in log, f"`{shown}` after SIGTERM: exit {code}\n{log[-3000:]}"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def run_command(arguments: list[str], cwd: Path, capsys) -> None:
    """Run one page's command in `cwd`; fail with its command line and error output unless it succeeds."""
    program, rest = arguments[0], arguments[1:]
    shown = shlex.join(arguments)
    if program == "bertforge" and rest[:1] == ["serve"]:
        run_server(rest, cwd, shown)
    elif program == "bertforge":
        capsys.readouterr()
        try:
            code = main(rest)
        except SystemExit as exit:  # argparse's usage errors, and a command's own exit
            code = exit.code
        captured = capsys.readouterr()
        assert code in (0, None), f"`{shown}` exited with {code}:\n{captured.err[-3000:]}"
        for flag in ("--output", "--output-dir"):  # what the command says it writes is there
            if flag in rest:
                written = cwd / rest[rest.index(flag) + 1]
                assert written.is_file() and written.stat().st_size or written.is_dir() and any(
                    written.iterdir()), f"`{shown}` succeeded but wrote nothing at {written}"
    elif program == "torchrun":
        command = [sys.executable, "-m", "torch.distributed.run", "--master_addr", "127.0.0.1",
                   "--master_port", str(_free_port()), *rest]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
            [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
        result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"`{shown}` exited with {result.returncode}:\n{result.stderr[-3000:]}"
    else:
        pytest.fail(f"docs command `{shown}`: no way to run {program!r} here; add a case to run_command "
                    "or mark the block <!-- readme-test: skip REASON -->")


def page_name(page: Path) -> str:
    """A page as the tests name it: its path in the repository, without `.md` (`README`, `docs/guide/distil`)."""
    return page.relative_to(REPO).with_suffix("").as_posix()


# Every page's blocks, in page order; "page" names the page, "id" the test (`docs/guide/distil:Distil-0`).
BLOCKS = [dict(block, page=page_name(page), id=f"{page_name(page)}:{block['name']}")
          for page in PAGES for block in readme_blocks(page.read_text(encoding="utf-8"))]


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory, shared_data) -> Callable[[str], Path]:
    """A page's scratch directory, made on its first block: every input the pages name (INPUTS), then what the
    page's blocks write, in page order. Pages do not share one, so each page's blocks run on their own (`-k`)."""
    made: dict[str, Path] = {}

    def workspace(page: str) -> Path:
        if page not in made:
            root = tmp_path_factory.mktemp("docs")
            for name, make in INPUTS.items():
                target = root / name
                target.parent.mkdir(parents=True, exist_ok=True)
                make(target, shared_data)
            made[page] = root
        return made[page]
    return workspace


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, uncased_vocab) -> Path:
    """DIR: BERT-Tiny's width (H=128) with 4 layers (concat-last-4 needs them), random weights, and
    bert-base-uncased's vocabulary."""
    from bertforge import BertConfig, BertForPreTraining, BertTokenizer

    directory = tmp_path_factory.mktemp("model")
    torch.manual_seed(0)
    BertForPreTraining(BertConfig.preset("tiny", vocab_size=30522, num_hidden_layers=4)).save_pretrained(directory)
    BertTokenizer(uncased_vocab, do_lower_case=True).save_pretrained(directory)
    return directory


def _is_slow(block: dict) -> bool:
    """Blocks that run the quickstart or two torchrun processes take minutes: marked `slow`."""
    return any(command[:2] in (["bertforge", "quickstart"], ["make", "quickstart"]) or command[0] == "torchrun"
               for command in block["commands"])


@pytest.mark.parametrize("block", [pytest.param(b, marks=[pytest.mark.slow] if _is_slow(b) else []) for b in BLOCKS],
                         ids=[b["id"] for b in BLOCKS])
def test_docs_block_runs_as_written(block, workspaces, model_dir, monkeypatch, capsys, tmp_path, add_to_hub_cache):
    if block["skip"]:
        pytest.skip(block["skip"])
    workspace = workspaces(block["page"])
    monkeypatch.chdir(workspace)
    cache = tmp_path / "hub"
    for repo_id in HUB_IDS:
        files = {p.name: p.read_bytes() for p in model_dir.iterdir() if p.is_file()}
        add_to_hub_cache(cache, repo_id, "0" * 40, files)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for arguments in block["commands"]:
            run_command(substitute(arguments, model_dir), workspace, capsys)
    finally:
        torch.set_num_threads(threads)


def test_docs_skip_markers_each_precede_a_bash_block():
    """A skip marker skips only the ```bash block on the next line: one left elsewhere (the block moved, or
    another language's fence) would silently skip nothing, so it fails here, as a marker without a reason."""
    stray = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        stray += [f"{page.relative_to(REPO)}:{n + 1}: {line.strip()}" for n, line in enumerate(lines)
                  if "readme-test" in line and not (SKIP.search(line) and SKIP.search(line).group(1)
                                                    and n + 1 < len(lines) and lines[n + 1].strip() == "```bash")]
    assert stray == [], "readme-test markers that skip no ```bash block (or give no reason):\n" + "\n".join(stray)


def test_readme_opens_with_the_two_commands():
    """The README's first block is the two commands a newcomer runs: the quickstart, then the test suite."""
    first = next(b for b in BLOCKS if b["page"] == "README")
    assert [c[:2] for c in first["commands"]] == [["make", "quickstart"], ["make", "test"]]


def test_guide_pages_are_run_and_linked():
    """The README links the guide's index, and the index links every guide page."""
    guide = REPO / "docs" / "guide"
    index = (guide / "README.md").read_text(encoding="utf-8")
    assert "(docs/guide/README.md)" in (REPO / "README.md").read_text(encoding="utf-8")
    assert [p.name for p in guide.glob("*.md") if p.name != "README.md" and f"]({p.name})" not in index] == []


def test_docs_tables_match_the_docs():
    """Every substitution and input is still named by some page: a stale row fails instead of lingering."""
    arguments = [a for block in BLOCKS for command in block["commands"] for a in command]
    joined = [" ".join(arguments[i:i + 2]) for i in range(len(arguments))]
    assert [key for key in SUBSTITUTIONS if key not in arguments and key not in joined] == []
    named = {a.rstrip("/") for a in arguments}
    for path in INPUTS:
        parents = {str(Path(path).parent)} | {str(p) for p in Path(path).parents}
        assert path in named or parents & named or any(
            "*" in a and Path(path).match(a) for a in named), f"INPUTS[{path!r}]: no page names such an input"
    assert any(not b["skip"] for b in BLOCKS if b["page"] == "README"), "the README runs no block"
