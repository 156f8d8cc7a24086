"""The `embed` task family (`bertforge extract-features`): hidden states of chosen layers as JSON lines.

The fixed contextual features of the paper's feature-based approach (§5.3), written for any use; the
feature-based NER tagger trained on such features is `bertforge.tasks.feature_based`.

`extract_features` writes the JSON-lines format of Google's `extract_features.py`: one line per
input example, `{"linex_index": i, "features": [{"token": t, "layers": [{"index": -1, "values":
[...]}, ...]}, ...]}`, values rounded to 6 decimals. Layer indexes count encoder layers as Google
does: -1 is the last layer, 0 the first.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
from tqdm import tqdm

from .._files import atomic_open, read_text
from ..modeling import BertModel
from ..modeling.pretrained import resolve_model_dir
from ..tokenization import BertTokenizer
from .arrays import pad_inputs

PAIR_SEPARATOR = " ||| "


def read_examples(path: str | os.PathLike) -> list[tuple[str, str | None]]:
    """One example per line; `text_a ||| text_b` for a pair. An empty line is an error naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    examples = []
    with io.StringIO(read_text(path), newline=None) as handle:  # a byte that is not UTF-8: file and line
        for number, line in enumerate(handle, start=1):
            line = line.rstrip("\n")
            if not line.strip():
                raise ValueError(f"{path}:{number}: empty line (every line must hold a text)")
            text_a, _, text_b = line.partition("|||")
            examples.append((text_a.strip(), text_b.strip() if _ else None))
    if not examples:
        raise ValueError(f"{path}: no examples (an empty file)")
    return examples


def convert_examples_to_features(examples: Sequence[tuple[str, str | None]], tokenizer: BertTokenizer,
                                 max_seq_length: int = 128) -> list[dict]:
    """The model inputs of each example, unpadded: `{"input_ids", "token_type_ids"}` (`[CLS] A [SEP]`, or
    `[CLS] A [SEP] B [SEP]` for a pair), truncated to `max_seq_length`, in the examples' order."""
    rows: list = [None] * len(examples)
    # Pairs and singles are packed differently: encode each kind, keep the input order.
    for pair in (False, True):
        idx = [i for i, (_, b) in enumerate(examples) if (b is not None) == pair]
        if idx:
            enc = tokenizer.encode_batch([examples[i][0] for i in idx], [examples[i][1] for i in idx] if pair else None,
                                         max_length=max_seq_length, padding=False)
            for i, row in zip(idx, enc):
                rows[i] = row
    return rows


def layer_states(model: BertModel, tokenizer: BertTokenizer, examples: Sequence[tuple[str, str | None]],
                 layers: Sequence[int], max_seq_length: int = 128, batch_size: int = 32,
                 progress: bool = False) -> Iterator[tuple[list[str], np.ndarray]]:
    """For each example: its tokens and an array (len(layers), tokens, H) of the chosen layers' hidden states."""
    num_layers = model.config.num_hidden_layers
    for index in layers:
        if not -num_layers <= index < num_layers:
            raise ValueError(f"layer index {index} out of range for a {num_layers}-layer model "
                             f"(use -{num_layers}..{num_layers - 1})")
    device = next(model.parameters()).device
    bar = tqdm(total=len(examples), desc="features", unit="ex", disable=not progress)
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        rows = convert_examples_to_features(chunk, tokenizer, max_seq_length)
        batch = {name: torch.from_numpy(value) for name, value in
                 pad_inputs([r["input_ids"] for r in rows], [r["token_type_ids"] for r in rows],
                            tokenizer.pad_token_id).items()}
        with torch.inference_mode():
            out = model(batch["input_ids"].to(device), batch["token_type_ids"].to(device),
                        batch["attention_mask"].to(device), output_hidden_states=True)
        encoder_layers = out.hidden_states[1:]
        stacked = torch.stack([encoder_layers[i] for i in layers], dim=1).float().cpu().numpy()  # (B, layers, S, H)
        for b, row in enumerate(rows):
            n = len(row["input_ids"])
            yield tokenizer.convert_ids_to_tokens(row["input_ids"]), stacked[b, :, :n]
        bar.update(len(chunk))
    bar.close()


def extract_features(model_dir: str | os.PathLike, input_file: str | os.PathLike, output_file: str | os.PathLike,
                     layers: Sequence[int] = (-1, -2, -3, -4), max_seq_length: int = 128, batch_size: int = 32,
                     progress: bool = True) -> int:
    """Write Google's extract_features.py JSON lines for every example of `input_file`; returns the count."""
    examples = read_examples(input_file)  # bad input is reported before the model loads
    model = BertModel.from_pretrained(model_dir)
    tokenizer = BertTokenizer.from_pretrained(resolve_model_dir(model_dir))
    output_file = Path(output_file)
    output_file.parent.mkdir(parents=True, exist_ok=True)
    # Written under a temporary name and renamed when complete: never a half-written file under the final name.
    with atomic_open(output_file, "w", encoding="utf-8", prefix=f".{output_file.name}.") as out:
        states = layer_states(model, tokenizer, examples, layers, max_seq_length, batch_size, progress)
        for line_index, (tokens, values) in enumerate(states):
            values = np.round(values, 6)
            record = {"linex_index": line_index, "features": [
                {"token": token, "layers": [{"index": layer, "values": values[j, t].tolist()}
                                            for j, layer in enumerate(layers)]}
                for t, token in enumerate(tokens)]}
            out.write(json.dumps(record) + "\n")
    return len(examples)
