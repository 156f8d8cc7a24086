"""BERT pre-training (Devlin et al. 2019, §3.1 and appendix A.2) on the shared training engine.

The loss is the masked-LM cross-entropy over the masked positions only (the vocabulary projection is
computed just there, Google's `gather_indexes`) plus the next-sentence cross-entropy on the pooled
[CLS] vector. Two ablations of the paper's §5.1: `nsp=False` (MLM only) and `objective="ltr"`, a
left-to-right LM: a causal encoder predicts the next token at every real position from the unmasked
input (the instance's masked tokens are put back first), without NSP.

Training can run in two phases as the paper's (90% of the steps at 128 tokens, 10% at 512): the
second continues the same model, optimizer and learning-rate schedule on the second dataset.

`run_pretraining(PretrainingArguments(...))` is what `bertforge pretrain` calls; it writes
`OUT/log.jsonl`, `OUT/checkpoints/` and, at the end, `OUT/final/` in `from_pretrained` layout, written
into a staging directory and renamed into place; `OUT/RUNNING` marks the run unfinished until then.

Continued pre-training (`init_from=MODEL`, a directory or a Hub id) starts from MODEL's weights and
architecture: the encoder, and the MLM and NSP heads where MODEL has them (the others are initialised
and logged by name). The data must have been prepared with MODEL's vocabulary or an extension of it
(some `[unusedN]` entries replaced by new words; each such embedding row starts as the mean of the rows
of the pieces MODEL's tokenizer splits the new word into).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .._files import default_mode, finish_run, mark_running, own_directory
from ..modeling import BertConfig, BertForPreTraining
from ..modeling.config import CONFIG_NAME, PRESETS
from ..modeling.pretrained import resolve_model_dir
from ..tokenization import BertTokenizer
from ..tokenization.vocab import VOCAB_NAME, load_vocab, vocab_fingerprint
from ..training import Phase, Trainer
from ..training.checkpoint import latest_checkpoint, seed_everything
from ..training.distributed import setup
from ..training.loop import CHECKPOINT_DIR, LOG_NAME
from ..training.settings import RunSettings, override, setting
from .dataset import PretrainingDataset, collate
from .objectives import LeftToRightStep, MaskedLMStep, next_token_labels, perplexity, unmasked_input_ids  # noqa: F401
from .shards import INDEX_NAME

logger = logging.getLogger("bertforge")

OBJECTIVES = ("mlm", "ltr")
FINAL_DIR = "final"
# Peak learning rate and warm-up share when none is given: from scratch (Google's BERT-base recipe
# scaled to small batches), and when continuing a pre-trained model (a smaller step keeps what it knows).
SCRATCH_LR, SCRATCH_WARMUP_RATIO = 1e-4, 0.01
CONTINUED_LR, CONTINUED_WARMUP_RATIO = 5e-5, 0.1
# The config fields that fix the architecture (and so the shapes of the weights).
ARCHITECTURE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                       "hidden_act", "max_position_embeddings", "type_vocab_size")
_UNUSED = re.compile(r"\[unused\d+\]")


@dataclass
class PretrainingArguments(RunSettings):
    """`bertforge pretrain`'s settings: the shared ones (training/settings.py) and pre-training's own.
    `lr`, `warmup_steps` and `warmup_ratio` left None take the recipe's (SCRATCH_*, or CONTINUED_* with
    `init_from`); `epochs` and `max_steps` both None: one epoch."""

    data: str | os.PathLike = setting(help="prepared instances (prepare-pretraining's output directory)",
                                      kw_only=True)
    config: str | None = setting(None, "tiny, mini, small, medium, base, large, or a config.json (default: base; "
                                 "with --init-from the model's)")
    vocab: str | os.PathLike | None = setting(
        None, "the vocab.txt the data was prepared with (default: DATA/vocab.txt, which prepare-pretraining "
        "writes, else --init-from's; needed only for data prepared without it)")
    init_from: str | os.PathLike | None = setting(
        None, "continue pre-training MODEL (a checkpoint directory, convert-tf output or Hub id such as "
        "google-bert/bert-base-uncased[@revision]): its weights and architecture; the data prepared with its "
        "vocab.txt (or one with [unusedN] replaced)", metavar="MODEL")
    lr: float | None = override(RunSettings, "lr", None, help="peak learning rate (default 1e-4; with --init-from "
                                "5e-5)")
    warmup_steps: int | None = override(RunSettings, "warmup_steps", help="linear warm-up steps (default: 1%% of "
                                        "all steps; with --init-from 10%%)")
    max_steps: int | None = override(RunSettings, "max_steps", help="optimizer steps, both phases; wins over "
                                     "--epochs (default: one epoch of --data)")
    save_every: int | None = override(RunSettings, "save_every", 1000,
                                      help="checkpoint every N steps (and at the end)")
    eval_data: str | os.PathLike | None = setting(None, "prepared instances to evaluate on")
    phase2_data: str | os.PathLike | None = setting(None, "second phase's instances (the paper: 512 tokens)")
    # the last steps of max_steps (the paper: 100,000 of 1,000,000)
    phase2_steps: int | None = setting(None, "the last N of --max-steps run on --phase2-data")
    phase2_batch_size: int | None = setting(None, "(default: --batch-size)")
    nsp: bool = setting(True, "masked LM only, no next-sentence loss")  # the flag is --no-nsp
    objective: str = setting("mlm", "ltr: left-to-right LM with a causal encoder, no NSP (the paper's ablation)",
                             choices=OBJECTIVES)


def open_dataset(path: str | os.PathLike, seed: int) -> PretrainingDataset:
    """The prepared instances in `path` (bertforge prepare-pretraining's output)."""
    if not Path(path).is_dir():
        raise FileNotFoundError(f"pre-training data directory not found: {path}")
    return PretrainingDataset(path, seed=seed)


def resolve_config(name: str, vocab_size: int, objective: str, max_seq_length: int) -> BertConfig:
    """A preset or config.json, made to fit the data: the preset takes its vocabulary size from it."""
    if name in PRESETS:
        config = BertConfig.preset(name, vocab_size=vocab_size)
    else:
        path = Path(name)
        if path.suffix != ".json" and not path.is_file():
            raise ValueError(f"--config {name!r}: not a preset ({', '.join(PRESETS)}) nor a config.json file")
        config = BertConfig.from_json_file(path)
        if config.vocab_size != vocab_size:
            raise ValueError(f"{path}: vocab_size is {config.vocab_size}, but the data was prepared with a "
                             f"{vocab_size}-token vocabulary")
    return _fit_to_data(config, objective, max_seq_length, "the model")


def _fit_to_data(config: BertConfig, objective: str, max_seq_length: int, model: str) -> BertConfig:
    """`config` made causal for the LTR objective; an error if the data's sequences outgrow its positions."""
    if objective == "ltr":
        config = BertConfig.from_dict({**config.to_dict(), "is_causal": True})
    if max_seq_length > config.max_position_embeddings:
        raise ValueError(f"the data has sequences of {max_seq_length} tokens, {model} only "
                         f"{config.max_position_embeddings} position embeddings")
    return config


def _vocab_file(args: PretrainingArguments, data: PretrainingDataset, model_dir: Path | None = None) -> Path:
    """The vocabulary `data` was prepared with, shipped with the final model: DATA/vocab.txt (written by
    prepare-pretraining), else --init-from's vocab.txt (checked against the data by `check_init_vocabulary`),
    or --vocab, which must then have the data's fingerprint (index.json's `vocab_hash`).

    Data prepared before the vocabulary was copied into it has no DATA/vocab.txt and needs --vocab (or
    --init-from the model whose vocabulary it was prepared with).
    """
    shipped = Path(args.data) / VOCAB_NAME
    if not args.vocab:
        if not shipped.is_file() and model_dir is not None and (model_dir / VOCAB_NAME).is_file():
            return model_dir / VOCAB_NAME
        if not shipped.is_file():
            raise FileNotFoundError(f"vocabulary not found: {shipped}; pass --vocab, the vocab.txt the data was "
                                    "prepared with")
        return shipped
    path = Path(args.vocab)
    path = path / VOCAB_NAME if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"--vocab {path}: vocabulary file not found")
    given, expected = vocab_fingerprint(path), data.index.get("vocab_hash")
    if expected is not None and given != expected:
        made_with = shipped if shipped.is_file() else data.path / INDEX_NAME
        raise ValueError(f"--vocab {path} (fingerprint {given}) is not the vocabulary {args.data} was prepared with "
                         f"({made_with}, fingerprint {expected}): leave --vocab out, or prepare the data again with it")
    return path


def init_config(model_dir: Path, config: str | None, objective: str, max_seq_length: int) -> BertConfig:
    """MODEL's config.json: the architecture continued pre-training keeps. A --config that names
    another architecture is an error; the data must fit MODEL's position embeddings."""
    model_config = BertConfig.from_pretrained(model_dir)
    if config is not None:
        if config in PRESETS:  # (a preset takes the vocabulary size from the model's)
            given = BertConfig.preset(config, vocab_size=model_config.vocab_size)
        elif Path(config).is_file():
            given = BertConfig.from_json_file(config)
        else:
            raise ValueError(f"--config {config!r}: not a preset ({', '.join(PRESETS)}) nor a config.json file")
        differ = [f"{name}={getattr(given, name)!r} (the model: {getattr(model_config, name)!r})"
                  for name in ARCHITECTURE_FIELDS if getattr(given, name) != getattr(model_config, name)]
        if differ:
            raise ValueError(f"--config {config} disagrees with --init-from {model_dir / CONFIG_NAME}: "
                             f"{', '.join(differ)}; the architecture comes from the model: drop --config")
    return _fit_to_data(model_config, objective, max_seq_length, str(model_dir))


def check_init_vocabulary(model_dir: Path, vocab_file: Path, datasets: list[PretrainingDataset]) -> dict[int, str]:
    """Check that the data was prepared with MODEL's vocabulary or an extension of it; return the
    extension's new words by id (empty for MODEL's own vocabulary).

    An extension is MODEL's vocab.txt with some `[unusedN]` entries replaced by new words: the same
    size, every other id unchanged. Vocabularies are compared by `vocab_fingerprint`, the data by the
    fingerprint stored in its index. Raises ValueError naming the vocabulary to prepare the data with.
    """
    model_vocab_file = model_dir / "vocab.txt"
    if not model_vocab_file.is_file():
        raise FileNotFoundError(f"--init-from {model_dir} has no vocab.txt: the model's vocabulary is needed to "
                                "check the data")
    model_vocab, data_vocab = load_vocab(model_vocab_file), load_vocab(vocab_file)
    advice = (f"prepare it with the model's vocabulary (bertforge prepare-pretraining --vocab {model_vocab_file} "
              "...) or a copy of it whose [unusedN] entries were replaced by new words")
    fingerprints = {vocab_fingerprint(model_vocab): str(model_vocab_file),
                    vocab_fingerprint(data_vocab): str(vocab_file)}
    for dataset in datasets:
        made_with = dataset.index.get("vocab_hash")
        if made_with not in fingerprints:
            raise ValueError(f"pre-training data {dataset.path} was prepared with another vocabulary (vocab_hash "
                             f"{made_with}) than --init-from {model_dir}'s: {advice}")
        if made_with != vocab_fingerprint(data_vocab):
            raise ValueError(f"pre-training data {dataset.path} was prepared with {fingerprints[made_with]}, not "
                             f"with --vocab {vocab_file}: drop --vocab or pass that one")
    if vocab_fingerprint(data_vocab) == vocab_fingerprint(model_vocab):
        return {}
    model_tokens = sorted(model_vocab, key=model_vocab.get)
    data_tokens = sorted(data_vocab, key=data_vocab.get)
    changed = [(i, old, new) for i, (old, new) in enumerate(zip(model_tokens, data_tokens)) if old != new]
    wrong = [(i, old, new) for i, old, new in changed if not _UNUSED.fullmatch(old)]
    if len(model_tokens) != len(data_tokens) or wrong:
        what = (f"{len(data_tokens)} tokens, the model's {len(model_tokens)}" if len(model_tokens) != len(data_tokens)
                else "; ".join(f"id {i}: {new!r} for the model's {old!r}" for i, old, new in wrong[:3]))
        raise ValueError(f"the data's vocabulary {vocab_file} is not --init-from {model_dir}'s nor an extension of "
                         f"it (only [unusedN] entries replaced) ({what}): {advice}")
    return {i: new for i, _, new in changed}


@torch.no_grad()
def init_new_words(model: BertForPreTraining, model_dir: Path, new_words: dict[int, str]) -> None:
    """Start each new word's embedding row (and MLM output bias) as the mean of those of the pieces
    MODEL's tokenizer splits the word into, so it begins where MODEL already understood it; a word of
    unknown pieces keeps its random row. The MLM decoder, tied to the embeddings, follows."""
    if not new_words:
        return
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    embeddings = model.bert.embeddings.word_embeddings.weight
    bias = model.cls.predictions.bias
    for index, word in sorted(new_words.items()):
        continuation = word.startswith("##")
        pieces = tokenizer.tokenize(word[2:] if continuation else word)
        if continuation and pieces and f"##{pieces[0]}" in tokenizer.vocab:  # "##ness": a word's inside
            pieces[0] = f"##{pieces[0]}"
        ids = [tokenizer.vocab[p] for p in pieces if p in tokenizer.vocab and p != "[UNK]"]
        if not ids:
            logger.warning("new word %r (id %d): MODEL's tokenizer has no pieces for it; its embedding row is "
                           "initialised at random", word, index)
            continue
        embeddings[index] = embeddings[ids].mean(0)
        bias[index] = bias[ids].mean()
        logger.info("new word %r (id %d): embedding row initialised as the mean of %s", word, index, pieces)


def build_model(config: BertConfig, seed: int, nsp: bool, init_from: Path | None = None,
                new_words: dict[int, str] | None = None) -> BertForPreTraining:
    """A BertForPreTraining of `config`: initialised at random, or from `init_from`'s weights (heads it
    lacks initialised and logged by name; `new_words` rows by `init_new_words`)."""
    seed_everything(seed)
    if init_from is None:
        model = BertForPreTraining(config)
    else:
        model = BertForPreTraining.from_pretrained(init_from, config=config).train()
        init_new_words(model, init_from, new_words or {})
    if not nsp:
        # No NSP loss: the pooler and NSP classifier get no gradient. Frozen, they stay out of the
        # optimizer and of DDP's gradient reduction (which would wait for them forever).
        for module in (model.bert.pooler, model.cls.seq_relationship):
            module.requires_grad_(False)
    return model


def run_pretraining(args: PretrainingArguments, stop_at_step: int | None = None) -> Path:
    """Pre-train as `args` say; returns OUT/final (the model in from_pretrained layout).

    `stop_at_step` ends the run early (with a checkpoint, no final model), as an interruption would. OUT is
    locked for the run (`own_directory`): a second run into it is refused while this one lasts.
    """
    with own_directory(args.output_dir, "bertforge pre-training", enabled=int(os.environ.get("RANK", "0")) == 0):
        return _run_pretraining(args, stop_at_step)


def _run_pretraining(args: PretrainingArguments, stop_at_step: int | None) -> Path:
    if args.objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {args.objective!r}")
    if (args.phase2_data is None) != (args.phase2_steps is None):
        raise ValueError("a second phase needs both --phase2-data and --phase2-steps")
    step = LeftToRightStep() if args.objective == "ltr" else MaskedLMStep(nsp=args.nsp, unpad=args.unpad)
    output_dir = Path(args.output_dir)
    model_dir = resolve_model_dir(args.init_from) if args.init_from else None

    train = open_dataset(args.data, args.seed)
    phase2 = open_dataset(args.phase2_data, args.seed) if args.phase2_data else None
    evaluation = open_dataset(args.eval_data, args.seed) if args.eval_data else None
    datasets = [d for d in (train, phase2, evaluation) if d is not None]
    vocab_file = _vocab_file(args, train, model_dir)
    vocab = load_vocab(vocab_file)
    vocab_size = max(vocab.values()) + 1
    max_seq_length = max(d.index["max_seq_length"] for d in datasets)
    new_words: dict[int, str] = {}
    if model_dir is None:
        config = resolve_config(args.config or "base", vocab_size, args.objective, max_seq_length)
    else:
        config = init_config(model_dir, args.config, args.objective, max_seq_length)
        new_words = check_init_vocabulary(model_dir, vocab_file, datasets)
    for dataset in datasets:  # (sequence lengths may differ between phases; resolve_config checked them)
        dataset.check_compatible(config.vocab_size, vocab_fingerprint(vocab))

    resume = args.resume
    checkpoints = output_dir / CHECKPOINT_DIR
    if resume is True or resume == "auto":
        # The directory: its latest checkpoint, or the newest older one if that cannot be read.
        resume = checkpoints if latest_checkpoint(checkpoints) is not None else None
        if resume is None:
            logger.warning("--resume: no checkpoint in %s, starting from step 0", checkpoints)
    elif not resume and (latest_checkpoint(checkpoints) is not None or (output_dir / LOG_NAME).exists()):
        raise ValueError(f"{output_dir} already holds a run: pass --resume to continue it, or another --output-dir")

    phases = [Phase(train, name="phase 1")]  # the steps that phase 2 leaves
    if phase2 is not None:
        phases.append(Phase(phase2, steps=args.phase2_steps, batch_size=args.phase2_batch_size, name="phase 2"))
    training = args.training_arguments(
        output_dir=output_dir,
        epochs=args.epochs if args.epochs is not None or args.max_steps is not None else 1.0,
        lr=args.lr if args.lr is not None else CONTINUED_LR if model_dir else SCRATCH_LR,
        warmup_ratio=None if args.warmup_steps is not None else args.warmup_ratio if args.warmup_ratio is not None
        else CONTINUED_WARMUP_RATIO if model_dir else SCRATCH_WARMUP_RATIO)
    context = setup(args.device)
    try:
        model = build_model(config, args.seed, step.nsp, model_dir, new_words)
        trainer = Trainer(
            model, training, collate=collate, step_fn=step, phases=phases, count_fn=step.counts,
            eval_dataset=evaluation, eval_fn=step.eval, summarize_fn=perplexity, context=context,
            settings={"--data": data_fingerprint(train),
                      "--phase2-data": data_fingerprint(phase2) if phase2 is not None else None,
                      "--objective": args.objective, "--no-nsp": not step.nsp,
                      "--init-from": str(args.init_from) if args.init_from else None},
            checkpoint_extra={"pretraining": {
                "objective": args.objective, "nsp": step.nsp, "vocab_hash": vocab_fingerprint(vocab),
                "data": str(args.data), "phase2_data": str(args.phase2_data) if args.phase2_data else None,
                "init_from": str(args.init_from) if args.init_from else None}})
        if context.is_main:
            parameters = sum(p.numel() for p in model.parameters())
            logger.info("pre-training %s (%.1fM parameters) for %d steps on %d process(es)",
                        args.init_from or args.config or "base", parameters / 1e6, trainer.total_steps,
                        context.world_size)
        if context.is_main:  # until OUT/final is in place, OUT is an unfinished run
            mark_running(output_dir, "bertforge pre-training")
        result = trainer.train(resume_from=resume or None, stop_at_step=stop_at_step)
        final = output_dir / FINAL_DIR
        finished = trainer.step == trainer.total_steps or result.budget_spent
        model = trainer.final_model() if finished else None  # gathered from the shards under FSDP
        if context.is_main and finished:
            tokenizer = BertTokenizer(vocab_file, do_lower_case=train.index.get("do_lower_case"))
            _save_final(final, lambda directory: (model.save_pretrained(directory),
                                                  tokenizer.save_pretrained(directory)))
            finish_run(output_dir)
        context.barrier()
        return final
    finally:
        context.teardown()


def data_fingerprint(dataset: PretrainingDataset) -> str:
    """A SHA-256 of prepared data's index.json (settings, shards, counts, statistics): a resumed run on other
    data is refused rather than silently continued on it."""
    return hashlib.sha256(json.dumps(dataset.index, sort_keys=True, default=str).encode()).hexdigest()


def _save_final(final: Path, write) -> None:
    """`write(directory)` into a fresh directory beside `final`, then rename it to `final`: a run killed while
    saving leaves no half-written model (an earlier `final` is replaced only once the new one is complete)."""
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.tmp-"))
    try:
        write(staging)
        mode = default_mode()  # mkdtemp makes the directory owner-only; give it what mkdir would
        os.chmod(staging, mode | (mode & 0o444) >> 2)
        if final.exists():
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.replace(final, old)
            os.replace(staging, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, final)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def arguments_from(namespace) -> PretrainingArguments:
    """PretrainingArguments from the CLI's parsed flags (those with the same names; a flag left None takes
    the field's default)."""
    names = {f.name for f in dataclasses.fields(PretrainingArguments)}
    return PretrainingArguments(**{k: v for k, v in vars(namespace).items() if k in names and v is not None})
