"""The `sentence-embedding` task family: bi-encoders (Sentence-BERT, Reimers & Gurevych 2019).

One vector per text, pooled from the encoder's last layer (mean over real tokens, or [CLS]) and optionally
normalised, so that the cosine of two vectors scores the two texts' similarity (semantic search,
clustering, retrieval). Each text is encoded alone (no cross-attention between the two of a pair): a
corpus is embedded once and compared to any query at the cost of a dot product.

* `SentenceEncoder`: the head, a `BertModel` that knows its pooling and normalisation (config.json's
  `sentence_embedding`, and the sentence-transformers files beside the weights: `modules.json`,
  `1_Pooling/config.json`, `2_Normalize/`, `config_sentence_transformers.json`,
  `sentence_bert_config.json`), so that sentence-transformers loads what bertforge saves and bertforge
  loads a sentence-transformers directory (all-MiniLM-L6-v2) with its pooling (`read_pooling`).
* `read_sentence_file`: scored pairs (`text_a, text_b, score`; GLUE STS-B's TSV as it ships), 0/1-labelled
  pairs, (anchor, positive[, negative]) rows, or texts alone; each bad row is one line naming file and line.
* The losses, as sentence-transformers': `cosine` (CosineSimilarityLoss: MSE between the cosine of the two
  embeddings and the gold score scaled to [0, 1]), `contrastive` (ContrastiveLoss: cosine distance, margin
  0.5, on 0/1 labels), `mnrl` (MultipleNegativesRankingLoss: cross-entropy over the scaled cosines (×20) of
  each anchor with every positive, and negative, of its batch: in-batch negatives).
* `sentence_embedding_task(...)`: the `FinetuneTask`; dev metric Spearman (and Pearson) of the cosine
  against the gold scores, as sentence-transformers' EmbeddingSimilarityEvaluator.
* `predict_file(...)`: one embedding per text (`.npy`, or JSON lines), or a cosine per pair (TSV/JSONL).
* The command functions: `add_sentence_embedding_flags`, `sentence_embedding_from_args` (`bertforge finetune
  sentence-embedding`; its recipe `RECIPE`), `add_predict_flags`, `predict_from_args` (`bertforge predict`).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .._files import read_text, write_text_atomic
from ..metrics.glue import pearson, spearman
from ..modeling import BertModel
from ..modeling.pretrained import check_pretrained, resolve_model_dir
from ..tokenization import BertTokenizer
from ..training.finetune import FinetuneTask
from .arrays import pad_inputs

__all__ = ["DISTILL_RECIPE", "LOSSES", "MNRL_SCALE", "POOLINGS", "RECIPE", "TASK_NAME", "SentenceEncoder", "SentenceExample",
           "SentencePooling", "add_predict_flags", "add_sentence_embedding_flags", "cosine_scores", "embed_texts",
           "batch_of", "encode", "load_encoder", "pool", "predict_file", "predict_from_args", "read_pooling", "read_sentence_file", "sentence_embedding_from_args",
           "sentence_embedding_task", "similarity_metrics", "write_sentence_transformers_files"]

TASK_NAME = "sentence-embedding"  # the `finetuning_task` of a fine-tuned model, its CLI command and family
# `bertforge finetune sentence-embedding`: sentence-transformers' STS-B training script (training_stsbenchmark.py):
# batch 16, 4 epochs, lr 2e-5, 10% linear warm-up (the engine's `warmup_ratio` default), sequences of 128.
RECIPE = {"lr": 2e-5, "batch_size": 16, "epochs": 4.0, "max_seq_length": 128}
# `bertforge distill` of a sentence-embedding teacher: sentence-transformers' model_distillation.py (lr 1e-4,
# batch 64, 1 epoch over the transfer texts; warm-up the engine's 10%).
DISTILL_RECIPE = {"lr": 1e-4, "batch_size": 64, "epochs": 1.0, "max_seq_length": 128}
POOLINGS = ("mean", "cls")
LOSSES = ("cosine", "contrastive", "mnrl")
MNRL_SCALE = 20.0  # sentence-transformers' MultipleNegativesRankingLoss scale (cosines x 20 as logits)
CONTRASTIVE_MARGIN = 0.5  # sentence-transformers' ContrastiveLoss margin (on the cosine distance)
CONFIG_KEY = "sentence_embedding"  # config.json: {"pooling": "mean", "normalize": true}
STSB_RANGE = (0.0, 5.0)  # GLUE STS-B's scores; --score-range for other data


# ---------------------------------------------------------------------------- pooling and the head

@dataclass(frozen=True)
class SentencePooling:
    """How token states become a text's vector: `pooling` ("mean": the average of the real tokens' last-layer
    states, [CLS] and [SEP] included, as sentence-transformers; "cls": the [CLS] state), `normalize` (to unit
    length), `max_seq_length` (sentence-transformers' `max_seq_length`, None: the tokenizer's)."""

    pooling: str = "mean"
    normalize: bool = False
    max_seq_length: int | None = None


def _read_json(path: Path) -> Any:
    return json.loads(read_text(path))


def read_pooling(directory: str | os.PathLike) -> SentencePooling | None:
    """The pooling a model directory declares: sentence-transformers' `modules.json` (its Pooling module's
    `config.json`, a Normalize module, `sentence_bert_config.json`'s max_seq_length), else config.json's
    `sentence_embedding` (what `SentenceEncoder` writes), else None (a bare encoder: nothing declared).
    ValueError, one line, for a Pooling mode bertforge does not compute (max, mean of sqrt length...)."""
    directory = Path(resolve_model_dir(directory))
    modules = directory / "modules.json"
    if modules.is_file():
        entries = _read_json(modules)
        pooling, normalize = None, False
        for entry in entries:
            kind = str(entry.get("type", ""))
            if kind.endswith("Pooling"):
                settings = _read_json(directory / entry.get("path", "") / "config.json")
                modes = [name for name in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens",
                                           "weightedmean_tokens", "lasttoken")
                         if settings.get(f"pooling_mode_{name}")]
                if modes not in (["cls_token"], ["mean_tokens"]):
                    raise ValueError(f"{directory / entry.get('path', '')}/config.json: pooling {'+'.join(modes) or 'none'}"
                                     f" is not one bertforge computes ({', '.join(POOLINGS)})")
                pooling = "cls" if modes == ["cls_token"] else "mean"
            elif kind.endswith("Normalize"):
                normalize = True
        if pooling is not None:
            settings_file = directory / "sentence_bert_config.json"
            length = _read_json(settings_file).get("max_seq_length") if settings_file.is_file() else None
            return SentencePooling(pooling, normalize, int(length) if length else None)
    config = directory / "config.json"
    declared = _read_json(config).get(CONFIG_KEY) if config.is_file() else None
    if isinstance(declared, dict) and declared.get("pooling") in POOLINGS:
        return SentencePooling(declared["pooling"], bool(declared.get("normalize")), declared.get("max_seq_length"))
    return None


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """(B, S, H) last-layer states and the (B, S) mask -> (B, H): the [CLS] row, or the mean of the real
    tokens' rows (sentence-transformers' Pooling: sum over the mask / max(count, 1e-9))."""
    if pooling == "cls":
        return hidden[:, 0]
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


def write_sentence_transformers_files(directory: str | os.PathLike, pooling: SentencePooling, hidden_size: int,
                                      do_lower_case: bool = True) -> None:
    """The files with which sentence-transformers loads `directory` as its model (Transformer, Pooling and,
    when normalised, Normalize modules): modules.json, 1_Pooling/config.json, 2_Normalize/,
    sentence_bert_config.json, config_sentence_transformers.json."""
    directory = Path(directory)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if pooling.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (directory / "2_Normalize").mkdir(parents=True, exist_ok=True)
    (directory / "1_Pooling").mkdir(parents=True, exist_ok=True)
    write_text_atomic(directory / "modules.json", json.dumps(modules, indent=2) + "\n")
    write_text_atomic(directory / "1_Pooling" / "config.json", json.dumps({
        "word_embedding_dimension": hidden_size, "pooling_mode_cls_token": pooling.pooling == "cls",
        "pooling_mode_mean_tokens": pooling.pooling == "mean", "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False}, indent=2) + "\n")
    write_text_atomic(directory / "sentence_bert_config.json", json.dumps(
        {"max_seq_length": pooling.max_seq_length or 512, "do_lower_case": False}, indent=2) + "\n")
    write_text_atomic(directory / "config_sentence_transformers.json", json.dumps(
        {"__version__": {"bertforge": "sentence-embedding"}, "prompts": {}, "default_prompt_name": None,
         "similarity_fn_name": "cosine"}, indent=2) + "\n")


class SentenceEncoder(BertModel):
    """The sentence-embedding head: the encoder, its pooling and normalisation (`sentence_pooling`, kept in
    config.json's `sentence_embedding`). Its weights are a `BertModel`'s (saved as one, `architectures`
    BertModel: transformers' AutoModel and sentence-transformers read them); `save_pretrained` also writes
    sentence-transformers' module files, and `from_pretrained` reads a sentence-transformers directory's."""

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, config=None, **config_overrides) -> "SentenceEncoder":
        model = super().from_pretrained(directory, config=config, **config_overrides)
        if CONFIG_KEY not in model.config.extra:
            declared = read_pooling(directory) or SentencePooling()
            model.sentence_pooling = declared
        return model

    @property
    def sentence_pooling(self) -> SentencePooling:
        declared = self.config.extra.get(CONFIG_KEY) or {}
        return SentencePooling(declared.get("pooling", "mean"), bool(declared.get("normalize", False)),
                               declared.get("max_seq_length"))

    @sentence_pooling.setter
    def sentence_pooling(self, value: SentencePooling) -> None:
        self.config.extra[CONFIG_KEY] = {"pooling": value.pooling, "normalize": value.normalize,
                                         "max_seq_length": value.max_seq_length}

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
              attention_mask: torch.Tensor, normalize: bool | None = None) -> torch.Tensor:
        """(B, S) inputs -> (B, H) pooled vectors, normalised when the model is (or `normalize` says)."""
        settings = self.sentence_pooling
        hidden = self(input_ids, token_type_ids, attention_mask).last_hidden_state
        vectors = pool(hidden, attention_mask, settings.pooling)
        if settings.normalize if normalize is None else normalize:
            vectors = F.normalize(vectors, p=2, dim=-1)
        return vectors

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        directory = Path(directory)
        super().save_pretrained(directory)
        config_file = directory / "config.json"  # saved as the BertModel its weights are
        values = json.loads(config_file.read_text(encoding="utf-8"))
        values["architectures"] = ["BertModel"]
        write_text_atomic(config_file, json.dumps(values, indent=2, sort_keys=True) + "\n")
        write_sentence_transformers_files(directory, self.sentence_pooling, self.config.hidden_size)


# ---------------------------------------------------------------------------- data

@dataclass(frozen=True)
class SentenceExample:
    """One row: its `texts` (one: a text alone; two: a pair, or anchor and positive; three: anchor, positive,
    negative), its `score` (None: unscored; scaled to [0, 1] from the declared range), `line` (1-based)."""

    texts: tuple[str, ...]
    score: float | None
    line: int


FIRST = ("text_a", "sentence1", "anchor", "text", "query", "sentence", "premise")
SECOND = ("text_b", "sentence2", "positive", "text_pair", "hypothesis")
THIRD = ("negative", "text_c")
SCORE = ("score", "label", "similarity", "gold")


def _column(names: Sequence[str], choices: Sequence[str]) -> str | None:
    lowered = {name.strip().lower(): name for name in names}
    return next((lowered[c] for c in choices if c in lowered), None)


def _rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line, {column: value}) per data row of a TSV/CSV with a header, or a JSONL file; a .txt file: one
    text per line ({"text": line})."""
    text = read_text(path)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not JSON ({error.msg})") from None
            if not isinstance(value, dict):
                raise ValueError(f"{path}:{number}: expected a JSON object per line")
            rows.append((number, value))
        return rows
    if suffix == ".txt":
        return [(number, {"text": line}) for number, line in enumerate(text.splitlines(), start=1)]
    if suffix == ".csv":
        reader = csv.reader(io.StringIO(text, newline=""))
    else:  # TSV as GLUE ships it: no quoting (STS-B's sentences hold quotes)
        reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
    lines = list(reader)
    if not lines:
        return []
    header = lines[0]
    return [(number, dict(zip(header, row))) for number, row in enumerate(lines[1:], start=2) if row]


def read_sentence_file(path: str | os.PathLike, *, texts: int | None = None, scored: bool | None = None,
                       score_range: tuple[float, float] = STSB_RANGE, binary: bool = False) -> list[SentenceExample]:
    """The rows of a sentence file (see `_rows` for the layouts; columns by name: text_a/sentence1/anchor/text,
    text_b/sentence2/positive, negative, score/label). `texts`: how many texts each row must hold (1: texts
    alone, 2: pairs, 3: triplets; None: whatever the header gives, at least one); `scored`: a score per row is
    required (True), refused (False: ignored) or read when present (None); `score_range`: the declared (low,
    high) of the scores, scaled to [0, 1]; `binary`: scores must be 0 or 1 (contrastive labels, not scaled).
    ValueError, one line naming file and line: a missing file or column, an empty text, a row with fewer
    texts than asked, a score that is not a number or lies outside the range."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    rows = _rows(path)
    if not rows:
        raise ValueError(f"{path}: no examples (an empty file)")
    names = list(rows[0][1])
    columns = [_column(names, FIRST), _column(names, SECOND), _column(names, THIRD)]
    if columns[0] is None:
        raise ValueError(f"{path}:1: no text column (one of {', '.join(FIRST)}); columns: {', '.join(map(str, names))}")
    wanted = texts if texts is not None else 1 + (columns[1] is not None) + (columns[1] is not None and columns[2] is not None)
    for count in range(1, wanted):
        if columns[count] is None:
            kind = "pairs" if wanted == 2 else "(anchor, positive, negative) rows"
            raise ValueError(f"{path}:1: {kind} are expected, but there is no "
                             f"{'second' if count == 1 else 'third'} text column (one of "
                             f"{', '.join(SECOND if count == 1 else THIRD)}); columns: {', '.join(map(str, names))}")
    score_column = _column(names, SCORE) if scored is not False else None
    if scored and score_column is None:
        raise ValueError(f"{path}:1: no score column (one of {', '.join(SCORE)}); columns: {', '.join(map(str, names))}")
    low, high = score_range
    examples = []
    for number, row in rows:
        values = []
        for count, column in enumerate(columns[:wanted]):
            value = row.get(column)
            if value is None:
                raise ValueError(f"{path}:{number}: a row with {count} text(s) where {wanted} are expected "
                                 f"(no {column})")
            value = str(value).strip()
            if not value:
                raise ValueError(f"{path}:{number}: empty text in column {column}")
            values.append(value)
        score = None
        if score_column is not None:
            raw = row.get(score_column)
            raw = "" if raw is None else str(raw).strip()
            if not raw and scored:
                raise ValueError(f"{path}:{number}: no score (column {score_column})")
            if raw:
                try:
                    value = float(raw)
                except ValueError:
                    raise ValueError(f"{path}:{number}: score {raw!r} is not a number") from None
                if binary:
                    if value not in (0.0, 1.0):
                        raise ValueError(f"{path}:{number}: label {raw} is not 0 or 1 (the contrastive loss's "
                                         "dissimilar / similar)")
                    score = value
                else:
                    if not (math.isfinite(value) and low <= value <= high):
                        raise ValueError(f"{path}:{number}: score {raw} is outside the declared range "
                                         f"[{low:g}, {high:g}] (--score-range)")
                    score = (value - low) / (high - low)
        examples.append(SentenceExample(tuple(values), score, number))
    return examples


def encode(tokenizer: BertTokenizer, texts: Sequence[str], max_seq_length: int) -> list[list[int]]:
    """`[CLS] text [SEP]` ids per text, cut to `max_seq_length` (each text is encoded alone)."""
    return [row["input_ids"] for row in tokenizer.encode_batch(list(texts), None, max_length=max_seq_length,
                                                                padding=False)]


def batch_of(rows: Sequence[Sequence[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """(B, S) `input_ids`, `token_type_ids`, `attention_mask` padded to the longest row."""
    return {name: torch.from_numpy(value)
            for name, value in pad_inputs(list(rows), [[0] * len(r) for r in rows], pad_id).items()}


# ---------------------------------------------------------------------------- losses and metrics

def cosine_scores(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor) -> np.ndarray:
    """(N,) cosines of the rows of two (N, H) arrays."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    norms = np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
    return (a * b).sum(1) / norms


def similarity_metrics(predicted: Sequence[float], gold: Sequence[float]) -> dict[str, float]:
    """Spearman (the main metric: rank agreement, what STS is judged on) and Pearson of predicted similarities
    against gold scores."""
    return {"spearman": spearman(predicted, gold), "pearson": pearson(predicted, gold)}


def pair_loss(loss: str, a: torch.Tensor, b: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """The loss of (B, H) embedding pairs against (B,) scores in [0, 1]: `cosine` MSE(cos, score); `contrastive`
    0.5·(y·d² + (1-y)·relu(margin - d)²) with d = 1 - cos, as sentence-transformers' ContrastiveLoss."""
    cos = F.cosine_similarity(a.float(), b.float(), dim=-1)
    if loss == "cosine":
        return F.mse_loss(cos, scores.float())
    distance = 1.0 - cos
    return 0.5 * (scores * distance.pow(2) + (1 - scores) * F.relu(CONTRASTIVE_MARGIN - distance).pow(2)).mean()


def ranking_loss(anchors: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Multiple-negatives ranking: (B, H) anchors against (C, H) candidates (the B positives first, then any
    negatives); anchor i's positive is candidate i, every other candidate of the batch is a negative.
    Cross-entropy over `MNRL_SCALE` × the cosines."""
    logits = MNRL_SCALE * F.normalize(anchors.float(), dim=-1) @ F.normalize(candidates.float(), dim=-1).T
    return F.cross_entropy(logits, torch.arange(len(anchors), device=logits.device))


@torch.no_grad()
def embed_texts(model: SentenceEncoder, tokenizer: BertTokenizer, texts: Sequence[str], max_seq_length: int,
                batch_size: int = 128) -> np.ndarray:
    """(N, H) float32 embeddings of `texts` (the model's pooling and normalisation), in order; batches of
    similar length."""
    was_training = model.training
    model.eval()
    ids = encode(tokenizer, texts, max_seq_length)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    device = next(model.parameters()).device
    out = np.zeros((len(ids), model.config.hidden_size), dtype=np.float32)
    pad_id = tokenizer.pad_token_id or 0
    for start in range(0, len(order), batch_size):
        chosen = order[start:start + batch_size]
        batch = {k: v.to(device) for k, v in batch_of([ids[i] for i in chosen], pad_id).items()}
        out[chosen] = model.embed(**batch).float().cpu().numpy()
    model.train(was_training)
    return out


# ---------------------------------------------------------------------------- the task

def sentence_embedding_task(model_dir: str | os.PathLike, train_file: str | os.PathLike, dev_file: str | os.PathLike, *,
                            loss: str = "cosine", pooling: str | None = None, normalize: bool = True,
                            score_range: tuple[float, float] = STSB_RANGE, max_seq_length: int = 128,
                            eval_batch_size: int = 128) -> FinetuneTask:
    """The `FinetuneTask` of a bi-encoder (see the module docstring). The training file's layout follows
    `loss` (cosine: scored pairs; contrastive: 0/1-labelled pairs; mnrl: anchor, positive[, negative]); the
    dev file is scored pairs, judged by Spearman of the cosine (the main metric) and Pearson. `pooling`: the
    checkpoint's declared one when None (else mean); a pooling other than a declared one is refused.
    `normalize`: the saved model's embeddings are unit vectors (the cosine, and so training, is the same
    either way; what `predict`, the pipeline and sentence-transformers give is normalised)."""
    if loss not in LOSSES:
        raise ValueError(f"--loss must be one of {', '.join(LOSSES)}, got {loss!r}")
    model_path = resolve_model_dir(model_dir)
    declared = read_pooling(model_path)
    if pooling is not None and pooling not in POOLINGS:
        raise ValueError(f"--pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    if declared is not None and pooling is not None and pooling != declared.pooling:
        raise ValueError(f"--pooling {pooling}: {model_dir} declares {declared.pooling} pooling (its modules.json / "
                         f"config.json); leave --pooling out or give {declared.pooling}")
    settings = SentencePooling(pooling or (declared.pooling if declared else "mean"), normalize, max_seq_length)
    if loss == "mnrl":
        train = read_sentence_file(train_file, scored=False)
        if len(train[0].texts) < 2:
            raise ValueError(f"{train_file}:1: mnrl needs (anchor, positive[, negative]) rows; this file has one text "
                             "column")
    else:
        train = read_sentence_file(train_file, texts=2, scored=True, score_range=score_range,
                                   binary=loss == "contrastive")
    dev = read_sentence_file(dev_file, texts=2, scored=True, score_range=score_range)
    check_pretrained(model_path)
    tokenizer = BertTokenizer.from_pretrained(model_path)
    pad_id = tokenizer.pad_token_id or 0
    columns = len(train[0].texts)
    encoded = [encode(tokenizer, [e.texts[c] for e in train], max_seq_length) for c in range(columns)]
    train_features = [{"texts": tuple(encoded[c][i] for c in range(columns)), "score": e.score}
                      for i, e in enumerate(train)]
    gold = np.array([e.score for e in dev])

    def build_model() -> SentenceEncoder:
        model = SentenceEncoder.from_pretrained(model_dir, finetuning_task=TASK_NAME)
        model.sentence_pooling = settings
        return model

    def collate(rows: list[dict]) -> dict[str, torch.Tensor]:
        batch = {}
        for c in range(columns):
            for name, value in batch_of([r["texts"][c] for r in rows], pad_id).items():
                batch[f"{name}_{c}"] = value
        if loss != "mnrl":
            batch["scores"] = torch.tensor([r["score"] for r in rows], dtype=torch.float32)
        return batch

    def step(model, batch: dict[str, torch.Tensor]):
        module = getattr(model, "module", model)
        vectors = [module.embed(batch[f"input_ids_{c}"], batch[f"token_type_ids_{c}"], batch[f"attention_mask_{c}"])
                   for c in range(columns)]
        if loss == "mnrl":
            return ranking_loss(vectors[0], torch.cat(vectors[1:])), {}
        return pair_loss(loss, vectors[0], vectors[1], batch["scores"]), {}

    def evaluate(model):
        module = getattr(model, "module", model)
        a = embed_texts(module, tokenizer, [e.texts[0] for e in dev], max_seq_length, eval_batch_size)
        b = embed_texts(module, tokenizer, [e.texts[1] for e in dev], max_seq_length, eval_batch_size)
        predicted = cosine_scores(a, b)
        return similarity_metrics(predicted, gold), predicted

    def write_predictions(output_dir: Path, predicted) -> None:
        lines = [json.dumps({"line": e.line, "text_a": e.texts[0], "text_b": e.texts[1], "score": e.score,
                             "cosine": round(float(p), 6)}, ensure_ascii=False) for e, p in zip(dev, predicted)]
        write_text_atomic(output_dir / "dev_predictions.jsonl", "\n".join(lines) + "\n")

    return FinetuneTask(name=TASK_NAME, build_model=build_model, tokenizer=tokenizer, train_features=train_features,
                        collate=collate, step_fn=step, evaluate=evaluate, main_metric="spearman",
                        write_predictions=write_predictions,
                        lengths=[max(len(t) for t in f["texts"]) for f in train_features])


# ---------------------------------------------------------------------------- prediction

def load_encoder(model_dir: str | os.PathLike, pooling: str | None = None) -> SentenceEncoder:
    """A `SentenceEncoder` from any encoder checkpoint, with its declared pooling (`read_pooling`); `pooling`
    given: that one, refused (ValueError, one line) when the checkpoint declares another."""
    model = SentenceEncoder.from_pretrained(model_dir).eval()
    declared = read_pooling(model_dir)
    if pooling is not None:
        if pooling not in POOLINGS:
            raise ValueError(f"--pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        if declared is not None and declared.pooling != pooling:
            raise ValueError(f"--pooling {pooling}: {model_dir} declares {declared.pooling} pooling; leave --pooling "
                             f"out or give {declared.pooling}")
        model.sentence_pooling = SentencePooling(pooling, model.sentence_pooling.normalize,
                                                 model.sentence_pooling.max_seq_length)
    return model


def predict_file(model_dir: str | os.PathLike, input_file: str | os.PathLike, output_file: str | os.PathLike, *,
                 max_seq_length: int | None = None, batch_size: int = 128, pooling: str | None = None,
                 score_range: tuple[float, float] = STSB_RANGE) -> tuple[Path, dict[str, float] | None]:
    """Embeddings or similarities for a file. Rows of one text (a .txt file, or a table with one text column):
    one embedding per row into `output_file` (.npy: an (N, H) float32 array; .jsonl: {"embedding": [...]} per
    line). Pairs: `index<TAB>score` (the cosine) per row (.jsonl: {"score": ...}), and, when every row is
    scored, `similarity_metrics` against the gold scores. Returns the path and those metrics (or None)."""
    examples = read_sentence_file(input_file, scored=None, score_range=score_range)
    model = load_encoder(model_dir, pooling)
    tokenizer = BertTokenizer.from_pretrained(resolve_model_dir(model_dir))
    length = max_seq_length or model.sentence_pooling.max_seq_length or 128
    length = min(length, model.config.max_position_embeddings)
    output_file = Path(output_file)
    output_file.parent.mkdir(parents=True, exist_ok=True)
    suffix = output_file.suffix.lower()
    if len(examples[0].texts) == 1:
        vectors = embed_texts(model, tokenizer, [e.texts[0] for e in examples], length, batch_size)
        if suffix == ".npy":
            buffer = io.BytesIO()
            np.save(buffer, vectors)
            output_file.write_bytes(buffer.getvalue())
        else:
            write_text_atomic(output_file, "".join(json.dumps({"embedding": [round(float(x), 7) for x in row]}) + "\n"
                                                   for row in vectors))
        return output_file, None
    a = embed_texts(model, tokenizer, [e.texts[0] for e in examples], length, batch_size)
    b = embed_texts(model, tokenizer, [e.texts[1] for e in examples], length, batch_size)
    scores = cosine_scores(a, b)
    if suffix in (".jsonl", ".json"):
        write_text_atomic(output_file, "".join(json.dumps({"score": round(float(s), 6)}) + "\n" for s in scores))
    else:
        write_text_atomic(output_file, "index\tscore\n" + "".join(f"{i}\t{s:.6f}\n" for i, s in enumerate(scores)))
    metrics = None
    if all(e.score is not None for e in examples):
        metrics = similarity_metrics(scores, [e.score for e in examples])
    return output_file, metrics


# ---------------------------------------------------------------------------- the command functions

def _score_range(text: str) -> tuple[float, float]:
    try:
        low, high = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH (e.g. 0,5), got {text!r}") from None
    if not low < high:
        raise argparse.ArgumentTypeError(f"LOW must be under HIGH, got {text!r}")
    return low, high


def add_sentence_embedding_flags(p: argparse.ArgumentParser) -> None:
    """`bertforge finetune sentence-embedding`'s own flags (the shared engine's are added by the CLI)."""
    p.add_argument("--train-file", required=True, help="TSV/CSV with a header, or JSONL: text_a/sentence1, text_b/"
                   "sentence2, score (GLUE STS-B's train.tsv as it is); --loss mnrl: anchor, positive[, negative]")
    p.add_argument("--dev-file", required=True, help="scored pairs: Spearman of the cosine picks the best epoch")
    p.add_argument("--loss", choices=LOSSES, default="cosine", help="cosine: MSE of the cosine against the score "
                   "scaled to [0, 1]; contrastive: 0/1 labels; mnrl: in-batch negatives (default: cosine)")
    p.add_argument("--pooling", choices=POOLINGS, help="mean or cls (default: the checkpoint's declared pooling, "
                   "else mean)")
    p.add_argument("--score-range", type=_score_range, default=STSB_RANGE, metavar="LOW,HIGH",
                   help="the scores' declared range, scaled to [0, 1] (default 0,5: STS-B's)")
    p.add_argument("--no-normalize", dest="normalize", action="store_false",
                   help="keep the embeddings' length (default: normalised to unit length, as all-MiniLM-L6-v2)")


def sentence_embedding_from_args(args: argparse.Namespace) -> FinetuneTask:
    """The `FinetuneTask` of `bertforge finetune sentence-embedding`'s parsed flags."""
    return sentence_embedding_task(args.model, args.train_file, args.dev_file, loss=args.loss, pooling=args.pooling,
                                   normalize=args.normalize, score_range=args.score_range,
                                   max_seq_length=args.max_seq_length, eval_batch_size=args.eval_batch_size)


def add_predict_flags(p: argparse.ArgumentParser) -> None:
    """`bertforge predict`'s flags for a sentence-embedding model, beyond the shared ones."""
    p.add_argument("--pooling", choices=POOLINGS, help="sentence-embedding: the pooling (default: the model's "
                   "declared one; another is refused)")
    p.add_argument("--score-range", type=_score_range, default=STSB_RANGE, metavar="LOW,HIGH",
                   help="sentence-embedding: the gold scores' range, to score the cosines against (default 0,5)")


def predict_from_args(args: argparse.Namespace) -> None:
    """`bertforge predict` for a sentence-embedding model: --input to --output (`predict_file`)."""
    path, metrics = predict_file(args.model, args.input, args.output, max_seq_length=args.max_seq_length,
                                 batch_size=args.batch_size, pooling=getattr(args, "pooling", None),
                                 score_range=getattr(args, "score_range", STSB_RANGE))
    print(f"wrote {path}")
    if metrics is not None:
        print(", ".join(f"{name} {value:.4f}" for name, value in metrics.items()))
