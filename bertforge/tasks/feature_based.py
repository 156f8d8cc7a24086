"""The feature-based approach (§5.3, Table 7): a frozen BERT's hidden states as fixed word features for NER.

The encoder runs once over every training and dev window (the same windows as fine-tuning, see
`tagging.build_windows`, so `--document-context` applies here too) and its hidden states are
combined by one of the paper's strategies into one vector per word: the vector at the word's first
sub-token. Only those vectors are kept, as one (words, D) float16 array per data set, so the cache
of CoNLL's 204k training words is 204k × D × 2 bytes (156 MB at D = 384, 4 × that for
concat-last-4). Then a randomly initialised two-layer bidirectional LSTM (hidden 768 in the paper)
and a linear classifier are trained on those features through the shared fine-tuning engine; the
encoder never sees a gradient and is not run again.

Strategies (`hidden_states[0]` is the embedding layer's output, `hidden_states[i]` encoder layer i):

    embeddings       hidden_states[0]                                 D = H
    second-to-last   hidden_states[-2]                                D = H
    last             hidden_states[-1]                                D = H
    sum-last-4       hidden_states[-4] + ... + hidden_states[-1]      D = H
    concat-last-4    [hidden_states[-4]; ...; hidden_states[-1]]      D = 4H
    sum-all          hidden_states[1] + ... + hidden_states[L]        D = H  (all encoder layers)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from safetensors.torch import load_file
from tqdm import tqdm

from .._files import save_safetensors, write_text_atomic
from ..modeling import BertModel
from ..modeling.heads import TaskOutput
from ..modeling.modes import evaluating
from ..modeling.pretrained import resolve_model_dir
from ..tokenization import BertTokenizer
from ..training.finetune import FinetuneTask
from .conll import (DEV_PREDICTIONS, IGNORE_INDEX, TASK_NAME, NerData, build_windows, collate_windows, labelled_tokens,
                    ner_metrics, prepare_ner_data, read_for_prediction, read_model_config, word_piece_ids,
                    write_conll)

__all__ = ["FEATURE_STRATEGIES", "BiLSTMTagger", "WordFeatures", "cache_word_features", "feature_ner_task",
           "predict_conll_feature_based"]

HiddenStates = Sequence[torch.Tensor]  # (L + 1) tensors (B, S, H): the embeddings, then each encoder layer

FEATURE_STRATEGIES: dict[str, Callable[[HiddenStates], torch.Tensor]] = {
    "embeddings": lambda hs: hs[0],
    "second-to-last": lambda hs: hs[-2],
    "last": lambda hs: hs[-1],
    "sum-last-4": lambda hs: torch.stack(tuple(hs[-4:])).sum(0),
    "concat-last-4": lambda hs: torch.cat(tuple(hs[-4:]), dim=-1),
    "sum-all": lambda hs: torch.stack(tuple(hs[1:])).sum(0),
}
FEATURE_SIZE_FACTOR = {"concat-last-4": 4}  # D = factor × H


# ---------------------------------------------------------------------------- the feature cache

@dataclass
class WordFeatures:
    """One vector per word of a data set: sentence s's words are rows `offsets[s]:offsets[s + 1]` of
    `values` (total words, D), in the cache dtype (float16 by default)."""

    values: np.ndarray
    offsets: np.ndarray  # (sentences + 1,) int64

    def sentence(self, index: int) -> np.ndarray:
        return self.values[self.offsets[index]:self.offsets[index + 1]]


def _check_strategy(strategy: str) -> None:
    if strategy not in FEATURE_STRATEGIES:
        raise ValueError(f"unknown feature strategy {strategy!r}; one of {', '.join(FEATURE_STRATEGIES)}")


@torch.no_grad()
def cache_word_features(encoder, windows: Sequence[dict], sentence_lengths: Sequence[int], strategy: str,
                        batch_size: int = 64, pad_token_id: int = 0, dtype: Any = np.float16,
                        progress: bool = False) -> WordFeatures:
    """Run the frozen `encoder` (a `BertModel`) once over `windows` and keep each word's combined
    hidden-state vector at its first sub-token (see the module docstring for `strategy`)."""
    _check_strategy(strategy)
    combine = FEATURE_STRATEGIES[strategy]
    num_layers = encoder.config.num_hidden_layers
    if strategy in ("sum-last-4", "concat-last-4") and num_layers < 4:
        raise ValueError(f"{strategy} needs 4 encoder layers; the model has {num_layers}")
    offsets = np.zeros(len(sentence_lengths) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(sentence_lengths)
    size = FEATURE_SIZE_FACTOR.get(strategy, 1) * encoder.config.hidden_size
    values = np.zeros((int(offsets[-1]), size), dtype=dtype)
    filled = np.zeros(int(offsets[-1]), dtype=bool)
    device = next(encoder.parameters()).device
    encoder.eval()
    order = sorted(range(len(windows)), key=lambda i: len(windows[i]["input_ids"]))
    bar = tqdm(total=len(order), desc=f"features ({strategy})", unit="window", disable=not progress)
    for start in range(0, len(order), batch_size):
        rows = [windows[i] for i in order[start:start + batch_size]]
        batch = collate_windows([{"input_ids": w["input_ids"]} for w in rows], pad_token_id)
        out = encoder(**{k: v.to(device) for k, v in batch.items()}, output_hidden_states=True)
        combined = combine(out.hidden_states).float()  # (B, S, D)
        # Gather every predicted word's first sub-token in one indexing op, then one copy to the host.
        batch_rows = [r for r, w in enumerate(rows) for _ in w["positions"]]
        positions = [p for w in rows for p in w["positions"]]
        targets = [offsets[w["sentence"]] + w["word_start"] + k for w in rows for k in range(len(w["positions"]))]
        picked = combined[torch.tensor(batch_rows, device=device), torch.tensor(positions, device=device)]
        values[targets] = picked.cpu().numpy().astype(dtype, copy=False)
        filled[targets] = True
        bar.update(len(rows))
    bar.close()
    if not filled.all():
        raise RuntimeError(f"{int((~filled).sum())} words got no feature vector (no window predicts them)")
    return WordFeatures(values, offsets)


# ---------------------------------------------------------------------------- the tagger

class BiLSTMTagger(nn.Module):
    """Cached word features -> dropout -> a `num_layers`-layer BiLSTM (hidden `lstm_hidden` per direction)
    -> dropout -> a linear classifier per word. Saved as config.json + model.safetensors."""

    def __init__(self, config: dict[str, Any]):
        super().__init__()
        self.config = dict(config)
        dropout = float(config.get("dropout", 0.1))
        layers = int(config.get("num_layers", 2))
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.LSTM(int(config["input_size"]), int(config["lstm_hidden"]), num_layers=layers,
                            batch_first=True, bidirectional=True, dropout=dropout if layers > 1 else 0.0)
        self.classifier = nn.Linear(2 * int(config["lstm_hidden"]), int(config["num_labels"]))

    @property
    def id2label(self) -> dict[int, str]:
        return {int(k): v for k, v in self.config["id2label"].items()}

    def forward(self, features: torch.Tensor, lengths: torch.Tensor, labels: torch.Tensor | None = None):
        """features (B, T, D) float, lengths (B,) words per row, labels (B, T) with -100 on padding
        -> TaskOutput(logits (B, T, K), loss: mean cross-entropy over the labelled words)."""
        steps = features.shape[1]
        # Packed, so that the backward direction starts at each sentence's last word, not at padding.
        packed = pack_padded_sequence(self.dropout(features.float()), lengths.cpu(), batch_first=True,
                                      enforce_sorted=False)
        hidden, _ = self.lstm(packed)
        hidden, _ = pad_packed_sequence(hidden, batch_first=True, total_length=steps)  # (B, T, 2 hidden)
        logits = self.classifier(self.dropout(hidden))
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                                               ignore_index=IGNORE_INDEX)
        return TaskOutput(logits, loss)

    def save_pretrained(self, directory: str | os.PathLike) -> None:

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = {"architectures": [type(self).__name__], "model_type": "bertforge-feature-bilstm", **self.config}
        write_text_atomic(directory / "config.json", json.dumps(config, indent=2) + "\n")
        tensors = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_safetensors(tensors, directory / "model.safetensors")

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> "BiLSTMTagger":
        config = read_model_config(directory)
        config.pop("architectures", None)
        config.pop("model_type", None)
        model = cls(config)
        model.load_state_dict(load_file(str(Path(directory) / "model.safetensors")))
        return model.eval()


def collate_words(features: WordFeatures, sentences: Sequence[int], label_ids: Sequence[Sequence[int]] | None = None
                  ) -> dict[str, torch.Tensor]:
    """A batch of sentences: `features` (B, T, D) float32 (zeros on padding), `lengths` (B,),
    `attention_mask` (B, T) and, with `label_ids`, `labels` (B, T) with -100 on padding."""
    lengths = [int(features.offsets[s + 1] - features.offsets[s]) for s in sentences]
    steps = max(lengths)
    values = np.zeros((len(sentences), steps, features.values.shape[1]), dtype=np.float32)
    for row, (s, n) in enumerate(zip(sentences, lengths)):
        values[row, :n] = features.sentence(s)
    lengths_tensor = torch.tensor(lengths, dtype=torch.long)
    batch = {"features": torch.from_numpy(values), "lengths": lengths_tensor,
             "attention_mask": (torch.arange(steps)[None, :] < lengths_tensor[:, None]).long()}
    if label_ids is not None:
        labels = torch.full((len(sentences), steps), IGNORE_INDEX, dtype=torch.long)
        for row, s in enumerate(sentences):
            labels[row, :lengths[row]] = torch.tensor(label_ids[s], dtype=torch.long)
        batch["labels"] = labels
    return batch


def bilstm_step(model, batch: dict[str, torch.Tensor]):
    """Cross-entropy over the words, and their accuracy as (correct, count)."""
    out = model(batch["features"], batch["lengths"], batch["labels"])
    with torch.no_grad():
        mask = batch["labels"] != IGNORE_INDEX
        correct = ((out.logits.argmax(-1) == batch["labels"]) & mask).sum()
    return out.loss, {"accuracy": (correct, mask.sum())}


@torch.no_grad()
def predict_word_tags(model: BiLSTMTagger, features: WordFeatures, batch_size: int = 128) -> list[list[str]]:
    """The argmax tag of every word of every sentence (batched by length)."""
    count = len(features.offsets) - 1
    id2label = model.id2label
    order = sorted(range(count), key=lambda s: int(features.offsets[s + 1] - features.offsets[s]))
    tags: list[list[str]] = [[] for _ in range(count)]
    device = next(model.parameters()).device
    with evaluating(model):
        for start in range(0, count, batch_size):
            rows = order[start:start + batch_size]
            batch = collate_words(features, rows)
            logits = model(batch["features"].to(device), batch["lengths"]).logits
            best = logits.argmax(-1).cpu().numpy()
            for row, s in enumerate(rows):
                tags[s] = [id2label[int(k)] for k in best[row, :int(batch["lengths"][row])]]
    return tags


# ---------------------------------------------------------------------------- the task

def _default_device(device: str | None) -> torch.device:
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _encoder(model_dir: str | os.PathLike, device: torch.device):
    encoder = BertModel.from_pretrained(model_dir)
    for parameter in encoder.parameters():
        parameter.requires_grad_(False)  # frozen: the point of the feature-based approach
    return encoder.to(device).eval()


def feature_ner_task(model_dir: str | os.PathLike, train_file: str | os.PathLike, dev_file: str | os.PathLike, *,
                     features: str = "concat-last-4", lstm_hidden: int = 768, lstm_layers: int = 2,
                     dropout: float = 0.1, document_context: bool = False, max_seq_length: int = 128,
                     eval_batch_size: int = 128, feature_batch_size: int = 64, max_train_examples: int | None = None,
                     device: str | None = None, progress: bool = True, data: NerData | None = None):
    """The `FinetuneTask` of the feature-based approach: features cached now (once, shared by every seed
    and learning rate of a grid), a new BiLSTM tagger per run (`build_model`), entity F1 on dev."""
    _check_strategy(features)
    if data is None:
        data = prepare_ner_data(model_dir, train_file, dev_file, document_context=document_context,
                                max_seq_length=max_seq_length, max_train_examples=max_train_examples)
    encoder = _encoder(model_dir, _default_device(device))
    pad_id = data.tokenizer.pad_token_id
    train_features = cache_word_features(encoder, data.train_windows, [len(s) for s in data.train], features,
                                         feature_batch_size, pad_id, progress=progress)
    dev_features = cache_word_features(encoder, data.dev_windows, [len(s) for s in data.dev], features,
                                       feature_batch_size, pad_id, progress=progress)
    del encoder  # not needed again: training and evaluation read the cache
    label_map = data.label_map
    train_labels = [[label_map[t] for t in s.tags] for s in data.train]
    gold = [s.tags for s in data.dev]
    config = {"finetuning_task": TASK_NAME, "input_size": int(train_features.values.shape[1]),
              "lstm_hidden": lstm_hidden,
              "num_layers": lstm_layers, "dropout": dropout, "num_labels": len(data.labels),
              "id2label": {str(i): label for i, label in enumerate(data.labels)},
              "feature_based": {"encoder": str(Path(model_dir).resolve()), "features": features,
                                "document_context": data.document_context, "max_seq_length": data.max_seq_length}}

    def evaluate(model):
        predicted = predict_word_tags(model, dev_features, eval_batch_size)
        return ner_metrics(gold, predicted), predicted

    def write_predictions(output_dir: Path, predicted) -> None:
        write_conll(output_dir / DEV_PREDICTIONS, data.dev, predicted)

    return FinetuneTask(
        name=TASK_NAME, build_model=lambda: BiLSTMTagger(config), tokenizer=data.tokenizer,
        train_features=[{"sentence": s} for s in range(len(data.train))],
        collate=lambda rows: collate_words(train_features, [r["sentence"] for r in rows], train_labels),
        step_fn=bilstm_step, evaluate=evaluate, main_metric="f1", write_predictions=write_predictions,
        lengths=[len(s) for s in data.train], count_fn=labelled_tokens)


def predict_conll_feature_based(model_dir: str | os.PathLike, input_file: str | os.PathLike,
                                output_file: str | os.PathLike, *, document_context: bool | None = None,
                                max_seq_length: int | None = None, batch_size: int = 128,
                                device: str | None = None) -> tuple[Path, dict[str, float] | None]:
    """`tagging.predict_conll` for a feature-based model: the recorded encoder (config.json
    `feature_based.encoder`) computes the features of the input, the BiLSTM tags them."""
    tagger = BiLSTMTagger.from_pretrained(model_dir)
    settings = tagger.config["feature_based"]
    encoder_dir = Path(settings["encoder"])
    if not encoder_dir.is_dir():
        raise FileNotFoundError(f"{model_dir} was trained on the features of {encoder_dir}, which is gone; "
                                f"edit feature_based.encoder in its config.json to the checkpoint's new place")
    document_context = settings["document_context"] if document_context is None else document_context
    max_seq_length = max_seq_length or settings["max_seq_length"]
    tokenizer = BertTokenizer.from_pretrained(resolve_model_dir(model_dir))
    sentences, labelled = read_for_prediction(input_file, list(tagger.id2label.values()))
    pieces = word_piece_ids(tokenizer, (w for s in sentences for w in s.words))
    windows = build_windows(sentences, pieces, max_seq_length, tokenizer.cls_token_id, tokenizer.sep_token_id,
                            None, document_context)
    encoder = _encoder(encoder_dir, _default_device(device))
    features = cache_word_features(encoder, windows, [len(s) for s in sentences], settings["features"],
                                   batch_size, tokenizer.pad_token_id)
    predicted = predict_word_tags(tagger.to(next(encoder.parameters()).device), features, batch_size)
    path = write_conll(output_file, sentences, predicted)
    return path, ner_metrics([s.tags for s in sentences], predicted) if labelled else None

