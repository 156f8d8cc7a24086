"""Pre-training for the ablations: one corpus, one vocabulary, one set of instances, every variant on them.

`prepare_data` writes, once, the pre-training text (the plays not held out, optionally the shared books),
a WordPiece vocabulary trained on it, the masked-LM/NSP instances of that text and of the held-out plays
(for the held-out masked-LM loss), and the downstream tasks' files. `pretrain_variant` trains one
variant with `bertforge.pretraining`'s trainer. Every variant gets the same data, the same seed, batch
size, steps and learning-rate schedule, so the same batches in the same order (the data order is drawn
from the seed and the data alone); only the objective (MLM + NSP, MLM alone, left-to-right LM) or the
architecture differs. An interrupted run continues from its last checkpoint (`resume`).

Completion is marked by a file written atomically last (`DONE.json` for the data, `final/` renamed into
place and no `RUNNING` for a pre-training run), so a rerun skips what is finished.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from .._files import RUNNING, write_text_atomic
from ..corpus import Play, shakespeare_plays
from ..modeling import BertConfig
from ..pretraining import prepare_pretraining
from ..pretraining.text import split_sentences, text_paragraphs
from ..pretraining.trainer import FINAL_DIR, PretrainingArguments, build_model, resolve_config, run_pretraining
from ..tokenization import BertTokenizer, train_vocab
from ..tokenization.vocab import load_vocab
from ..training.loop import LOG_NAME
from .downstream import build_tasks, is_held_out
from .settings import ReproduceSettings, Variant, config_size

DONE = "DONE.json"
MAX_SEQ_LENGTH = 128


def _play_file(directory: Path, play: Play) -> Path:
    name = play.title.lower().replace(" ", "_").replace("/", "_").replace("'", "").replace(",", "")
    return directory / f"{play.genre}__{name}.txt"


def choose_plays(plays: list[Play], limit: int | None) -> list[Play]:
    """The held-out plays and `limit` others spread evenly over the list (sorted by genre, so every genre
    is represented once `limit` is 6 or more); all of them with None."""
    others = [p for p in plays if not is_held_out(p)]
    if limit is None or limit >= len(others):
        return plays
    kept = {id(others[i * len(others) // limit]) for i in range(limit)}
    return [p for p in plays if is_held_out(p) or id(p) in kept]


def write_corpus(plays: list[Play], directory: Path, books: list[Path]) -> tuple[list[Path], list[Path]]:
    """BERT's input format, one document per file: a play with one speech per line (as the quickstart), a
    book with one sentence per line (its paragraphs split by blingfire). Returns the pre-training files
    (the plays not held out, then the books) and the held-out plays' files."""
    directory.mkdir(parents=True, exist_ok=True)
    train, held_out = [], []
    for play in plays:
        path = _play_file(directory, play)
        write_text_atomic(path, "\n".join(play.speeches) + "\n")
        (held_out if is_held_out(play) else train).append(path)
    for book in books:
        text = book.read_text(encoding="utf-8", errors="replace")
        sentences = [s for paragraph in text_paragraphs(text) for s in split_sentences(paragraph) if s.strip()]
        path = directory / f"book__{book.stem}.txt"
        write_text_atomic(path, "\n".join(sentences) + "\n")
        train.append(path)
    return train, held_out


def book_files(books_dir: Path) -> list[Path]:
    """The shared books (`*.txt`); FileNotFoundError naming the directory when there are none."""
    files = sorted(books_dir.glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"--corpus shakespeare+books: no *.txt book in {books_dir} (pass --books-dir)")
    return files


def prepare_data(settings: ReproduceSettings, data_dir: Path, books_dir: Path) -> dict:
    """Corpus, vocabulary, instances and downstream tasks in `data_dir` (skipped when DONE.json is there);
    returns DONE.json's record."""
    done = data_dir / DONE
    if done.is_file():
        return json.loads(done.read_text(encoding="utf-8"))
    if data_dir.exists():
        shutil.rmtree(data_dir)  # an interrupted preparation: start it again (a minute at most)
    started = time.perf_counter()
    books = book_files(books_dir) if settings.corpus == "shakespeare+books" else []
    plays = choose_plays(shakespeare_plays(), settings.plays)
    train_files, held_out_files = write_corpus(plays, data_dir / "corpus", books)
    vocab_file = data_dir / "vocab.txt"
    train_vocab(train_files, vocab_size=settings.vocab_size, lowercase=True, output=vocab_file, show_progress=False)
    index = prepare_pretraining(train_files, vocab_file, data_dir / "instances", max_seq_length=MAX_SEQ_LENGTH,
                                dupe_factor=settings.dupe_factor, seed=settings.seed, input_format="bert",
                                progress=settings.progress)
    held_out = prepare_pretraining(held_out_files, vocab_file, data_dir / "held_out", max_seq_length=MAX_SEQ_LENGTH,
                                   dupe_factor=1, seed=settings.seed + 1, input_format="bert", progress=False)
    tasks = build_tasks(plays, data_dir / "tasks", settings.max_train_examples, settings.max_dev_examples,
                        settings.seed, settings.max_choice_examples)
    record = {"instances": index["num_instances"], "held_out_instances": held_out["num_instances"],
              "pretraining_files": len(train_files), "books": len(books), "tasks": tasks.counts,
              "wall_seconds": round(time.perf_counter() - started, 1)}
    write_text_atomic(done, json.dumps(record, indent=2) + "\n")  # last: the data is complete
    return record


def size_config(size: tuple[int, int, int], vocab_file: Path, path: Path) -> Path:
    """A config.json for Table 6's (#L, #H, #A), the feed-forward 4H as in the paper; returns its path."""
    layers, hidden, heads = size
    config = BertConfig(vocab_size=len(load_vocab(vocab_file)), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=4 * hidden, max_position_embeddings=512)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(config.to_dict(), indent=2) + "\n")
    return path


def variant_config(variant: Variant, settings: ReproduceSettings, data_dir: Path, path: Path) -> Path:
    """The variant's architecture as a config.json at `path`, sized to the data's vocabulary: Table 6's size,
    else --config (a preset, #L/#H/#A, or a config.json whose vocab_size is replaced by the data's)."""
    vocab_file = data_dir / "vocab.txt"
    size = variant.size or config_size(settings.config)
    if size is not None:
        return size_config(size, vocab_file, path)
    config = json.loads(Path(settings.config).read_text(encoding="utf-8"))
    config["vocab_size"] = len(load_vocab(vocab_file))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(config, indent=2) + "\n")
    return path


def is_pretrained(run_dir: Path) -> bool:
    """A finished pre-training run: its final model in place and no RUNNING marker."""
    return (run_dir / FINAL_DIR / "config.json").is_file() and not (run_dir / RUNNING).exists()


def pretrain_variant(variant: Variant, settings: ReproduceSettings, data_dir: Path, run_dir: Path) -> Path:
    """Pre-train `variant` into `run_dir` (continuing an interrupted run); returns its final model directory."""
    config = str(variant_config(variant, settings, data_dir, run_dir.parent / f"{variant.pretrain}.json"))
    started = run_dir.exists() and (run_dir / LOG_NAME).exists()
    if run_dir.exists() and not started:  # a directory without a log: nothing to continue
        shutil.rmtree(run_dir)
    every = max(1, settings.steps // 10)
    return run_pretraining(PretrainingArguments(
        data=data_dir / "instances", eval_data=data_dir / "held_out", output_dir=run_dir, config=config,
        batch_size=settings.batch_size, lr=settings.pretrain_lr, warmup_ratio=0.1, max_steps=settings.steps,
        eval_every=every, eval_batch_size=128, save_every=every, keep_last=1, seed=settings.seed,
        log_every=max(1, every // 4),
        nsp=variant.nsp, objective=variant.objective, resume=started, num_threads=settings.num_threads,
        device=settings.device, progress=settings.progress))


def random_init_variant(variant: Variant, settings: ReproduceSettings, data_dir: Path, run_dir: Path) -> Path:
    """The architecture's random weights (seeded as a pre-training run's start) saved as `run_dir/final`, with
    the data's vocabulary: the no-pre-training reference row."""
    config = str(variant_config(variant, settings, data_dir, run_dir.parent / f"{variant.pretrain}.json"))
    vocab_file = data_dir / "vocab.txt"
    model = build_model(resolve_config(config, len(load_vocab(vocab_file)), "mlm", MAX_SEQ_LENGTH), settings.seed,
                        nsp=True)
    final = run_dir / FINAL_DIR
    final.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(final)
    BertTokenizer(vocab_file, do_lower_case=True).save_pretrained(final)
    return final


def held_out_curve(run_dir: Path) -> list[dict]:
    """The held-out evaluations of a run: [{"step", "loss", "perplexity", "objective"}], in step order.
    The loss is masked-LM cross-entropy, or next-token cross-entropy for the LTR model (not comparable)."""
    points = {}
    log = run_dir / LOG_NAME
    for line in log.read_text(encoding="utf-8").splitlines() if log.is_file() else []:
        record = json.loads(line)
        for name, objective in (("eval_mlm_loss", "mlm"), ("eval_lm_loss", "ltr")):
            if name in record:
                points[record["step"]] = {"step": record["step"], "loss": record[name],
                                          "perplexity": record.get("eval_perplexity"), "objective": objective}
    return [points[s] for s in sorted(points)]
