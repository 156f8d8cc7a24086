"""Inference pipelines: text in, task results out, on PyTorch or onnxruntime.

    >>> from bertforge import pipeline
    >>> fill = pipeline("fill-mask", model="path/to/checkpoint")
    >>> fill(["Paris is the [MASK] of France."], top_k=3)

Every pipeline works the same way: `preprocess` turns the inputs into *features* (token ids, one or
more per input: long inputs of `tag` and `answer` become overlapping windows), the features are
sorted by length and run in padded batches of `batch_size` through a *runner* (the model's
export-friendly graph on PyTorch, or the same graph exported to ONNX), and `postprocess` turns each
input's feature outputs back into results, in the order the inputs came.

The graph a pipeline runs (`Pipeline.build_graph`) is one `nn.Module` per task with plain tensors in
and a tuple of tensors out; `bertforge.serving.onnx` exports exactly that module, so the two
backends compute the same function. New tasks register themselves with `register_pipeline`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from ..modeling import (
    BertConfig,
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    optimize_for_inference,
    require_trained_head,
)
from ..modeling.inference import default_row_bucket
from ..modeling.pretrained import resolve_model_dir
from ..tasks.windows import max_context_window
from ..tasks.windows import windows as _windows
from ..tokenization import BertTokenizer

logger = logging.getLogger("bertforge")

BASE_INPUTS = ("input_ids", "token_type_ids", "attention_mask")
MASK_TOKEN = "[MASK]"


class PipelineInputError(ValueError):
    """The caller's input cannot be processed (empty text, no [MASK], mismatched lengths ...).

    The server answers it with 422 and this message.
    """


# ---------------------------------------------------------------------------- runners

Batch = dict[str, np.ndarray]
Runner = Callable[[Batch], dict[str, np.ndarray]]


class TorchRunner:
    """Runs a pipeline graph on PyTorch: int64 numpy arrays in, float32 numpy arrays out."""

    def __init__(self, graph: nn.Module, input_names: Sequence[str], output_names: Sequence[str],
                 device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.graph = graph.to(self.device).eval()
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)

    def __call__(self, batch: Batch) -> dict[str, np.ndarray]:
        with torch.inference_mode():
            inputs = [torch.from_numpy(batch[name]).to(self.device) for name in self.input_names]
            outputs = self.graph(*inputs)
        return {name: out.float().cpu().numpy() for name, out in zip(self.output_names, outputs)}


# ---------------------------------------------------------------------------- graphs
# One module per task: the pipeline's whole forward pass with positional tensor inputs and a tuple
# of outputs, so that torch.onnx.export sees the same function the PyTorch backend runs.


class FillMaskGraph(nn.Module):
    """MLM logits only at the given positions: (B, P) positions -> (B, P, V); the vocabulary
    projection of every other token would cost (B, S, V) for nothing."""

    def __init__(self, model: BertForMaskedLM):
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask, masked_positions):
        return (self.model(input_ids, token_type_ids, attention_mask, masked_lm_positions=masked_positions).logits,)


class LogitsGraph(nn.Module):
    """A head's logits: (B, K) for sequence classification, (B, S, K) for token classification."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask):
        return (self.model(input_ids, token_type_ids, attention_mask).logits,)


class SpanGraph(nn.Module):
    """Start and end logits of question answering, (B, S) each."""

    def __init__(self, model: BertForQuestionAnswering):
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask):
        out = self.model(input_ids, token_type_ids, attention_mask)
        return out.start_logits, out.end_logits


class HiddenStatesGraph(nn.Module):
    """Every encoder layer's output, stacked (B, L, S, H): pooling and the choice of layers happen
    after the graph, so one exported model serves every `embed` setting."""

    def __init__(self, model: BertModel):
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask):
        out = self.model(input_ids, token_type_ids, attention_mask, output_hidden_states=True)
        return (torch.stack(out.hidden_states[1:], dim=1),)


# ---------------------------------------------------------------------------- registry


PIPELINES: dict[str, type["Pipeline"]] = {}
_ALIASES: dict[str, str] = {}


def register_pipeline(name: str, *aliases: str) -> Callable[[type["Pipeline"]], type["Pipeline"]]:
    """Class decorator: make a Pipeline subclass available as `pipeline(name, ...)` (and on the server
    as `POST /v1/<name>`)."""

    def decorate(cls: type[Pipeline]) -> type[Pipeline]:
        cls.task = name
        PIPELINES[name] = cls
        for alias in aliases:
            _ALIASES[alias] = name
        return cls

    return decorate


def resolve_task(task: str) -> str:
    """The registered name of `task` (aliases such as "fill_mask" accepted)."""
    name = _ALIASES.get(task, task)
    if name not in PIPELINES:
        raise ValueError(f"unknown pipeline {task!r}; choose one of {', '.join(sorted(PIPELINES))}")
    return name


# Which pipeline a checkpoint's `architectures` entry serves when no task is named.
_ARCHITECTURE_TASKS = {
    "BertForMaskedLM": "fill-mask", "BertForPreTraining": "fill-mask",
    "BertForSequenceClassification": "classify", "BertForTokenClassification": "tag",
    "BertForQuestionAnswering": "answer", "BertModel": "embed",
}


def task_for_checkpoint(directory: str | os.PathLike) -> str:
    """The pipeline a checkpoint was trained for, from `config.json`'s `architectures` (default: embed)."""
    config = BertConfig.from_pretrained(directory)
    for architecture in config.extra.get("architectures") or []:
        if architecture in _ARCHITECTURE_TASKS:
            return _ARCHITECTURE_TASKS[architecture]
    return "embed"


@dataclass
class Feature:
    """One model input row: token ids plus what postprocessing needs to map outputs back."""

    example: int  # index of the input it came from
    input_ids: list[int]
    token_type_ids: list[int]
    extra_inputs: dict[str, list[int]] = field(default_factory=dict)  # e.g. masked_positions
    info: dict[str, Any] = field(default_factory=dict)


def _check_texts(texts: Any, what: str = "texts", allow_empty_list: bool = True) -> list[str]:
    if isinstance(texts, str):
        raise PipelineInputError(f"{what} must be a list of strings, not one string (wrap it in a list)")
    try:
        texts = list(texts)
    except TypeError:
        raise PipelineInputError(f"{what} must be a list of strings, got {type(texts).__name__}") from None
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise PipelineInputError(f"{what}[{i}] is {type(text).__name__}, not a string")
        if not text.strip():
            raise PipelineInputError(f"{what}[{i}] is empty")
    if not texts and not allow_empty_list:
        raise PipelineInputError(f"{what} is empty")
    return texts


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def windows(length: int, max_tokens: int, stride: int) -> list[tuple[int, int]]:
    """`bertforge.tasks.windows.windows`; a window with no room for a token is the caller's input
    error here (answered with 422 by the server), not a bug."""
    try:
        return _windows(length, max_tokens, stride)
    except ValueError as error:
        raise PipelineInputError(str(error)) from None


# ---------------------------------------------------------------------------- the base class


class Pipeline:
    """Tokenize, batch, run, postprocess. Subclasses set `model_class`, `output_names` and the hooks.

    Args:
        model: a checkpoint directory (config.json, model.safetensors, vocab.txt), or a model
            instance of `model_class` (then `tokenizer` is required).
        backend: "torch" or "onnx" (onnxruntime on the graph exported by `bertforge.serving.onnx`).
        device: torch device ("cpu", "cuda", "cuda:1"); for onnx, a CUDA device selects
            onnxruntime's CUDA provider where it is installed.
        max_length: tokens per model input, specials included (default: the tokenizer's
            model_max_length, at most the model's position embeddings).
        onnx_model: an exported .onnx file for backend="onnx" (default: export in memory now).
        runner: a callable that replaces the backend (tests, custom runtimes).
        dtype: backend="torch" only: "fp32" (exact), "bf16" (CPUs with AVX-512 BF16/AMX, GPUs),
            "fp16" (GPUs) or "int8" (CPU: int8 linear layers), applied with
            `bertforge.modeling.optimize_for_inference`; results move by what each costs in accuracy
            (BENCHMARKS.md, RESULTS.md). None (default): as loaded, float32 from a checkpoint.
        unpad: backend="torch" only: run the encoder on the real tokens of each batch, not the padding
            (exact to float rounding; the server's micro-batches mix lengths, where it pays most), and
            on CPU its packed length rounded up to a few sizes (`optimize_for_inference`, row_bucket).
            A model instance passed in is changed in place by `dtype` and `unpad`.
    """

    task: str = ""
    model_class: type[nn.Module] = BertModel
    extra_input_names: tuple[str, ...] = ()
    output_names: tuple[str, ...] = ()
    # ONNX dynamic axes of each output (batch first).
    output_axes: dict[str, dict[int, str]] = {}
    # Options the server accepts in a request body: name -> type(s).
    request_options: dict[str, tuple[type, ...]] = {}
    # The JSON keys of the server request that carry the inputs: (positional, keyword ...).
    request_inputs: tuple[str, ...] = ("texts",)
    optional_request_inputs: tuple[str, ...] = ()

    def __init__(self, model: str | os.PathLike | nn.Module, tokenizer: BertTokenizer | None = None,
                 backend: str = "torch", device: str | torch.device | None = None,
                 max_length: int | None = None, onnx_model: str | os.PathLike | bytes | None = None,
                 runner: Runner | None = None, dtype: str | None = None, unpad: bool = True):
        if backend == "onnx" and dtype not in (None, "fp32"):
            raise ValueError(f"dtype={dtype!r} is for backend='torch'; the ONNX graph is exported in float32")
        if isinstance(model, nn.Module):
            if tokenizer is None:
                raise ValueError("a model instance needs its tokenizer (tokenizer=...)")
            self.model_dir = None
            module = model.eval()
        else:
            self.model_dir = resolve_model_dir(model)  # a local directory, or a Hub id's cached snapshot
            module = None
        self.config: BertConfig = module.config if module is not None else BertConfig.from_pretrained(self.model_dir)
        self.tokenizer = tokenizer if tokenizer is not None else BertTokenizer.from_pretrained(self.model_dir)
        limit = min(self.tokenizer.model_max_length, self.config.max_position_embeddings)
        self.max_length = limit if max_length is None else min(max_length, limit)
        self.backend = backend
        self.device = str(device or "cpu")
        self.input_names = BASE_INPUTS + self.extra_input_names
        if runner is not None:
            self.runner = runner
        elif backend == "torch":
            if module is None:
                module = self._load_trained()
            module = module.to(self.device)
            if dtype is not None:
                optimize_for_inference(module, dtype=dtype, unpad=unpad)
            else:  # keep the weights as they are (a model instance may be bf16 or int8 already)
                for encoder in module.modules():
                    if isinstance(encoder, BertModel):
                        encoder.unpad = unpad
                        encoder.unpad_row_bucket = default_row_bucket(module)
            self.runner = TorchRunner(self.build_graph(module), self.input_names, self.output_names, self.device)
        elif backend == "onnx":
            from .onnx import check_parity, export_onnx_bytes, onnx_runner

            if onnx_model is None:
                # Export in memory, checked against PyTorch as `bertforge export-onnx` does.
                if module is None:
                    module = self._load_trained()
                self.runner = TorchRunner(self.build_graph(module), self.input_names, self.output_names, "cpu")
                onnx_model = export_onnx_bytes(self, module)
                check_parity(self, onnx_model, what=str(self.model_dir or "the model"))
                del module
            self.runner = onnx_runner(onnx_model, self, self.device)
        else:
            raise ValueError(f"backend must be 'torch' or 'onnx', got {backend!r}")

    # Weights of `model_class` this pipeline never runs: a checkpoint may lack them.
    unused_weights: tuple[str, ...] = ()

    def _load_trained(self) -> nn.Module:
        """`model_class` from the model directory; a ValueError when the checkpoint lacks weights this
        pipeline runs (a head trained for another task, or none): its outputs would be random."""
        module = self.model_class.from_pretrained(self.model_dir)
        require_trained_head(module, self.model_dir, self.task, ignore=self.unused_weights)
        return module

    # -- what subclasses provide

    @classmethod
    def build_graph(cls, model: nn.Module) -> nn.Module:
        """The export-friendly module this task runs (inputs `input_names`, outputs `output_names`)."""
        raise NotImplementedError

    def preprocess(self, *inputs: Any, **options: Any) -> list[Feature]:
        raise NotImplementedError

    def postprocess(self, inputs: tuple, features: list[Feature], outputs: list[dict[str, np.ndarray]],
                    **options: Any) -> Any:
        """Results for each input; `inputs` are the (checked) positional inputs, e.g. (texts,)."""
        raise NotImplementedError

    # -- the shared machinery

    def __call__(self, *inputs: Any, batch_size: int = 32, **options: Any) -> Any:
        """Results for each input, in input order (see the subclass for inputs and options)."""
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise PipelineInputError(f"batch_size must be a positive integer, got {batch_size!r}")
        inputs = tuple(_check_texts(value, name) for value, name in zip(inputs, self.request_inputs))
        features = self.preprocess(*inputs, **options)
        outputs = self.run(features, batch_size)
        return self.postprocess(inputs, features, outputs, **options)

    def run(self, features: Sequence[Feature], batch_size: int) -> list[dict[str, np.ndarray]]:
        """Each feature's outputs (its row of every output), running shortest-first batches so that
        a batch pads to similar lengths."""
        results: list[dict[str, np.ndarray]] = [{} for _ in features]
        order = sorted(range(len(features)), key=lambda i: len(features[i].input_ids))
        for start in range(0, len(order), batch_size):
            indexes = order[start:start + batch_size]
            outputs = self.runner(self.collate([features[i] for i in indexes]))
            for row, index in enumerate(indexes):
                results[index] = {name: value[row] for name, value in outputs.items()}
        return results

    def collate(self, features: Sequence[Feature]) -> Batch:
        """Pad to the longest feature: int64 arrays (B, S), extra inputs padded with 0."""
        length = max(len(f.input_ids) for f in features)
        batch = {name: np.zeros((len(features), length), dtype=np.int64) for name in BASE_INPUTS}
        if self.tokenizer.pad_token_id:
            batch["input_ids"].fill(self.tokenizer.pad_token_id)
        for row, feature in enumerate(features):
            n = len(feature.input_ids)
            batch["input_ids"][row, :n] = feature.input_ids
            batch["token_type_ids"][row, :n] = feature.token_type_ids
            batch["attention_mask"][row, :n] = 1
        for name in self.extra_input_names:
            width = max(1, max(len(f.extra_inputs[name]) for f in features))
            values = np.zeros((len(features), width), dtype=np.int64)
            for row, feature in enumerate(features):
                values[row, :len(feature.extra_inputs[name])] = feature.extra_inputs[name]
            batch[name] = values
        return batch

    def sample_batch(self, batch_size: int = 3, length: int = 13, seed: int = 0) -> Batch:
        """Random inputs of this shape, every other row padded, segments A and B (ONNX export and
        its parity check: the padded rows make the traced graph keep the attention mask)."""
        rng = np.random.default_rng(seed)
        low = min(999, self.config.vocab_size - 1)  # past the specials and [unused] tokens where there are many
        features = []
        for row in range(batch_size):
            n = length if row % 2 == 0 else max(3, length // 2 + row)
            n = min(n, length)
            ids = [self.tokenizer.cls_token_id, *rng.integers(low, self.config.vocab_size, n - 2).tolist(),
                   self.tokenizer.sep_token_id]
            extra = {name: sorted(rng.choice(np.arange(1, n - 1), size=min(1 + row % 2, n - 2), replace=False).tolist())
                     for name in self.extra_input_names}
            features.append(Feature(row, ids, [0] * (n // 2) + [1] * (n - n // 2), extra))
        return self.collate(features)

    def __repr__(self) -> str:
        source = self.model_dir if self.model_dir is not None else type(self.config).__name__
        return f"{type(self).__name__}(task={self.task!r}, model={str(source)!r}, backend={self.backend!r})"


# ---------------------------------------------------------------------------- fill-mask


@register_pipeline("fill-mask", "fill_mask", "mlm")
class FillMaskPipeline(Pipeline):
    """The `top_k` most likely tokens for each [MASK] of each text.

    `pipe(texts, top_k=5)` -> for each text, a list with one entry per [MASK] (in text order), each
    a list of `{"token", "token_id", "score", "sequence"}` (most likely first); `sequence` is the
    text with that [MASK] replaced by the token.
    """

    model_class = BertForMaskedLM
    extra_input_names = ("masked_positions",)
    output_names = ("logits",)
    output_axes = {"logits": {0: "batch", 1: "masks"}}
    request_options = {"top_k": (int,)}

    @classmethod
    def build_graph(cls, model):
        return FillMaskGraph(model)

    def preprocess(self, texts, top_k: int = 5):
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            raise PipelineInputError(f"top_k must be a positive integer, got {top_k!r}")
        for i, text in enumerate(texts):
            if MASK_TOKEN not in text:
                raise PipelineInputError(f"texts[{i}] has no {MASK_TOKEN} token")
        rows = self.tokenizer.encode_batch(texts, max_length=self.max_length, padding=False, return_offsets=True)
        features = []
        mask_id = self.tokenizer.mask_token_id
        for i, row in enumerate(rows):
            positions = [p for p, token in enumerate(row["input_ids"]) if token == mask_id]
            if not positions:
                raise PipelineInputError(f"texts[{i}]: every {MASK_TOKEN} lies beyond max_length={self.max_length} "
                                         "tokens")
            features.append(Feature(i, row["input_ids"], row["token_type_ids"], {"masked_positions": positions},
                                    {"spans": [row["offsets"][p] for p in positions]}))
        return features

    def postprocess(self, inputs, features, outputs, top_k: int = 5):
        texts = inputs[0]
        results = []
        for feature, output in zip(features, outputs):
            text = texts[feature.example]
            probs = _softmax(output["logits"][:len(feature.info["spans"])])
            k = min(top_k, probs.shape[-1])
            per_mask = []
            for (start, end), p in zip(feature.info["spans"], probs):
                best = np.argpartition(-p, k - 1)[:k]
                best = best[np.argsort(-p[best], kind="stable")]
                candidates = []
                for token_id in best.tolist():
                    token = self.tokenizer.ids_to_tokens[token_id]
                    word = token[2:] if token.startswith("##") else token
                    candidates.append({"token": token, "token_id": token_id, "score": float(p[token_id]),
                                       "sequence": text[:start] + word + text[end:]})
                per_mask.append(candidates)
            results.append(per_mask)
        return results

    def __call__(self, texts: Sequence[str], *, batch_size: int = 32, top_k: int = 5) -> list[list[list[dict]]]:
        return super().__call__(texts, batch_size=batch_size, top_k=top_k)


# ---------------------------------------------------------------------------- classify


@register_pipeline("classify", "text-classification", "sequence-classification")
class ClassifyPipeline(Pipeline):
    """A label and its probability per text (or text pair), from the model's `config.id2label`.

    `pipe(texts, text_pairs=None)` -> for each input `{"label", "score", "scores": {label: p}}`;
    a regression model (num_labels = 1) gives `{"score": value}`.
    """

    model_class = BertForSequenceClassification
    output_names = ("logits",)
    output_axes = {"logits": {0: "batch"}}
    optional_request_inputs = ("text_pairs",)

    @classmethod
    def build_graph(cls, model):
        return LogitsGraph(model)

    @property
    def labels(self) -> list[str]:
        id2label = self.config.id2label or {}
        return [id2label.get(i, f"LABEL_{i}") for i in range(self.config.num_labels)]

    def preprocess(self, texts, text_pairs=None):
        if text_pairs is not None:
            text_pairs = _check_texts(text_pairs, "text_pairs")
            if len(text_pairs) != len(texts):
                raise PipelineInputError(f"{len(texts)} texts but {len(text_pairs)} text_pairs")
        rows = self.tokenizer.encode_batch(texts, text_pairs, max_length=self.max_length, padding=False)
        return [Feature(i, r["input_ids"], r["token_type_ids"]) for i, r in enumerate(rows)]

    def postprocess(self, inputs, features, outputs, text_pairs=None):
        labels = self.labels
        results = []
        for output in outputs:
            logits = output["logits"]
            if len(labels) == 1:
                results.append({"score": float(logits[0])})
                continue
            probs = _softmax(logits)
            best = int(probs.argmax())
            results.append({"label": labels[best], "score": float(probs[best]),
                            "scores": {label: float(p) for label, p in zip(labels, probs)}})
        return results

    def __call__(self, texts: Sequence[str], text_pairs: Sequence[str] | None = None, *,
                 batch_size: int = 32) -> list[dict]:
        return super().__call__(texts, batch_size=batch_size, text_pairs=text_pairs)


# ---------------------------------------------------------------------------- embed


@register_pipeline("embed", "feature-extraction", "embedding")
class EmbedPipeline(Pipeline):
    """One vector per text: `pipe(texts, pooling="mean", layers=(-1,), normalize=False)`.

    pooling: "cls" (the [CLS] token's hidden state) or "mean" (the average over real tokens,
    specials included, as sentence-transformers does). layers: encoder layers, -1 = last, 0 = first
    (as `extract-features`); several are pooled each and concatenated in the order given (the
    paper's feature-based setup concatenates the last four). Returns a float32 array (N, H x layers).
    """

    model_class = BertModel
    unused_weights = ("pooler.",)  # hidden states only
    output_names = ("hidden_states",)
    output_axes = {"hidden_states": {0: "batch", 2: "sequence"}}
    request_options = {"pooling": (str,), "layers": (list,), "normalize": (bool,)}
    optional_request_inputs = ("text_pairs",)

    @classmethod
    def build_graph(cls, model):
        if not isinstance(model, BertModel):  # a head class: embed with its encoder
            model = model.bert
        return HiddenStatesGraph(model)

    def preprocess(self, texts, text_pairs=None, pooling="mean", layers=(-1,), normalize=False):
        if pooling not in ("cls", "mean"):
            raise PipelineInputError(f"pooling must be 'cls' or 'mean', got {pooling!r}")
        self._layer_indexes(layers)
        if text_pairs is not None:
            text_pairs = _check_texts(text_pairs, "text_pairs")
            if len(text_pairs) != len(texts):
                raise PipelineInputError(f"{len(texts)} texts but {len(text_pairs)} text_pairs")
        rows = self.tokenizer.encode_batch(texts, text_pairs, max_length=self.max_length, padding=False)
        return [Feature(i, r["input_ids"], r["token_type_ids"]) for i, r in enumerate(rows)]

    def _layer_indexes(self, layers) -> list[int]:
        num_layers = self.config.num_hidden_layers
        if isinstance(layers, int):
            layers = [layers]
        layers = list(layers)
        if not layers or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers):
            raise PipelineInputError(f"layers must be a non-empty list of integers, got {layers!r}")
        for index in layers:
            if not -num_layers <= index < num_layers:
                raise PipelineInputError(f"layer index {index} out of range for a {num_layers}-layer model "
                                         f"(use -{num_layers}..{num_layers - 1})")
        return [index % num_layers for index in layers]

    def postprocess(self, inputs, features, outputs, text_pairs=None, pooling="mean", layers=(-1,),
                    normalize=False):
        indexes = self._layer_indexes(layers)
        hidden = self.config.hidden_size
        vectors = np.zeros((len(inputs[0]), hidden * len(indexes)), dtype=np.float32)
        for feature, output in zip(features, outputs):
            states = output["hidden_states"][indexes, :len(feature.input_ids)]  # (layers, S, H)
            pooled = states[:, 0] if pooling == "cls" else states.mean(axis=1)
            vectors[feature.example] = pooled.reshape(-1)
        if normalize:
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return vectors

    def __call__(self, texts: Sequence[str], text_pairs: Sequence[str] | None = None, *, batch_size: int = 32,
                 pooling: str = "mean", layers: Sequence[int] | int = (-1,), normalize: bool = False) -> np.ndarray:
        return super().__call__(texts, batch_size=batch_size, text_pairs=text_pairs, pooling=pooling,
                                layers=layers, normalize=normalize)


# ---------------------------------------------------------------------------- tag


def _split_label(label: str) -> tuple[str | None, str]:
    """("B", "PER") for "B-PER" (also I-, E-, S-, L-, U- and "_" separators); (None, label) otherwise."""
    if len(label) > 2 and label[1] in "-_" and label[0] in "BIESLU":
        return label[0], label[2:]
    return None, label


def group_entities(text: str, words: Sequence[dict]) -> list[dict]:
    """Merge labelled words into entities: IOB2 (B- starts, I- continues), IOB1 (an I- after another
    type starts a new entity), BIOES/BILOU, or plain labels (neighbours with one label merge).
    "O" words are outside. Each entity: {"entity", "score" (mean over its words), "start", "end",
    "text"}; start/end are character offsets into `text`."""
    entities: list[dict] = []
    current: dict | None = None

    def close():
        nonlocal current
        if current is not None:
            scores = current.pop("_scores")
            current["score"] = float(np.mean(scores))
            current["text"] = text[current["start"]:current["end"]]
            entities.append(current)
        current = None

    for word in words:
        prefix, kind = _split_label(word["label"])
        if word["label"] == "O" or kind == "O":
            close()
            continue
        starts = (current is None or current["entity"] != kind or prefix in ("B", "S", "U")
                  or (prefix is None and current.get("_prefixed")))
        if starts:
            close()
            current = {"entity": kind, "start": word["start"], "end": word["end"], "_scores": [word["score"]]}
        else:
            current["end"] = word["end"]
            current["_scores"].append(word["score"])
        if current is not None:
            current["_prefixed"] = prefix is not None
        if prefix in ("E", "S", "L", "U"):
            close()
    close()
    for entity in entities:
        entity.pop("_prefixed", None)
    return [{k: e[k] for k in ("entity", "score", "start", "end", "text")} for e in entities]


@register_pipeline("tag", "ner", "token-classification")
class TagPipeline(Pipeline):
    """Labels per word and entities with character spans (NER).

    Each word is labelled by its first word piece (the paper's §4.3 setup); texts longer than
    `max_length` run as overlapping windows `stride` tokens apart, each token taking the window in
    which it has the most context. `pipe(texts, aggregation="simple")` -> for each text a list of
    entities `{"entity", "score", "start", "end", "text"}`; `aggregation="none"` gives every word
    `{"word", "label", "score", "start", "end"}` instead.
    """

    model_class = BertForTokenClassification
    output_names = ("logits",)
    output_axes = {"logits": {0: "batch", 1: "sequence"}}
    request_options = {"aggregation": (str,), "stride": (int,)}

    @classmethod
    def build_graph(cls, model):
        return LogitsGraph(model)

    def preprocess(self, texts, aggregation="simple", stride=None):
        if aggregation not in ("simple", "none"):
            raise PipelineInputError(f"aggregation must be 'simple' or 'none', got {aggregation!r}")
        max_tokens = self.max_length - 2
        stride = max_tokens // 2 if stride is None else stride
        if not isinstance(stride, int) or stride < 1:
            raise PipelineInputError(f"stride must be a positive integer, got {stride!r}")
        rows = self.tokenizer.encode_batch(texts, max_length=self.max_length, truncation=False, padding=False,
                                           return_offsets=True)
        cls, sep = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        features = []
        for i, row in enumerate(rows):
            ids, offsets = row["input_ids"][1:-1], row["offsets"][1:-1]
            spans = windows(len(ids), max_tokens, stride)
            for w, (start, end) in enumerate(spans):
                n = end - start + 2
                features.append(Feature(i, [cls, *ids[start:end], sep], [0] * n, info={
                    "ids": ids, "offsets": offsets, "spans": spans, "window": w}))
        return features

    def postprocess(self, inputs, features, outputs, aggregation="simple", stride=None):
        labels = self.config.id2label or {}
        per_example: dict[int, list[tuple[Feature, np.ndarray]]] = {}
        for feature, output in zip(features, outputs):
            per_example.setdefault(feature.example, []).append((feature, output["logits"]))
        results = []
        for i, text in enumerate(inputs[0]):
            pieces = per_example.get(i, [])
            if not pieces:
                results.append([])
                continue
            first = pieces[0][0].info
            ids, offsets, spans = first["ids"], first["offsets"], first["spans"]
            probs = [_softmax(logits) for _, logits in pieces]
            tokens = self.tokenizer.convert_ids_to_tokens(ids)
            words = []
            for position, token in enumerate(tokens):
                if token.startswith("##") and words:
                    words[-1]["end"] = offsets[position][1]  # a continuation piece extends the word
                    continue
                window = max_context_window(position, spans)
                p = probs[window][1 + position - spans[window][0]]  # +1: [CLS]
                best = int(p.argmax())
                words.append({"label": labels.get(best, f"LABEL_{best}"), "score": float(p[best]),
                              "start": offsets[position][0], "end": offsets[position][1]})
            if aggregation == "none":
                results.append([{"word": text[w["start"]:w["end"]], **w} for w in words])
            else:
                results.append(group_entities(text, words))
        return results

    def __call__(self, texts: Sequence[str], *, batch_size: int = 32, aggregation: str = "simple",
                 stride: int | None = None) -> list[list[dict]]:
        return super().__call__(texts, batch_size=batch_size, aggregation=aggregation, stride=stride)


# ---------------------------------------------------------------------------- answer


@register_pipeline("answer", "question-answering", "qa")
class AnswerPipeline(Pipeline):
    """Extractive question answering (SQuAD): the best span of each context for its question.

    `pipe(questions, contexts, doc_stride=128, max_answer_length=30)` -> for each pair
    `{"answer", "score", "start", "end"}` with character offsets into the context. Contexts longer
    than the model's input run as windows `doc_stride` tokens apart (Google's run_squad), each
    candidate start scored only in its max-context window. With `handle_impossible_answer` (default:
    the checkpoint's `config.json` key `version_2_with_negative`, written for SQuAD 2.0 models) the
    answer is empty (`start`/`end` None) when the [CLS] "no answer" score beats the best span by more
    than `null_threshold`. `score` is P(start) x P(end) of the chosen span (or of [CLS]).
    """

    model_class = BertForQuestionAnswering
    output_names = ("start_logits", "end_logits")
    output_axes = {"start_logits": {0: "batch", 1: "sequence"}, "end_logits": {0: "batch", 1: "sequence"}}
    request_inputs = ("questions", "contexts")
    request_options = {"doc_stride": (int,), "max_answer_length": (int,), "handle_impossible_answer": (bool,),
                       "null_threshold": (int, float)}
    n_best = 20
    max_query_length = 64

    @classmethod
    def build_graph(cls, model):
        return SpanGraph(model)

    def preprocess(self, questions, contexts, doc_stride=128, max_answer_length=30,
                   handle_impossible_answer=None, null_threshold=0.0):
        if len(questions) != len(contexts):
            raise PipelineInputError(f"{len(questions)} questions but {len(contexts)} contexts")
        for name, value in (("doc_stride", doc_stride), ("max_answer_length", max_answer_length)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PipelineInputError(f"{name} must be a positive integer, got {value!r}")
        question_rows = self.tokenizer.encode_batch(questions, max_length=self.max_query_length + 2, padding=False)
        context_rows = self.tokenizer.encode_batch(contexts, max_length=self.max_length, truncation=False,
                                                   padding=False, return_offsets=True)
        cls, sep = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        features = []
        for i, (q, c) in enumerate(zip(question_rows, context_rows)):
            question = q["input_ids"][1:-1]
            ids, offsets = c["input_ids"][1:-1], c["offsets"][1:-1]
            spans = windows(len(ids), self.max_length - len(question) - 3, doc_stride)
            for w, (start, end) in enumerate(spans):
                input_ids = [cls, *question, sep, *ids[start:end], sep]
                token_types = [0] * (len(question) + 2) + [1] * (end - start + 1)
                features.append(Feature(i, input_ids, token_types, info={
                    "offsets": offsets, "spans": spans, "window": w, "context_start": len(question) + 2}))
        return features

    def postprocess(self, inputs, features, outputs, doc_stride=128, max_answer_length=30,
                    handle_impossible_answer=None, null_threshold=0.0):
        if handle_impossible_answer is None:
            handle_impossible_answer = bool(self.config.extra.get("version_2_with_negative", False))
        per_example: dict[int, list] = {}
        for feature, output in zip(features, outputs):
            per_example.setdefault(feature.example, []).append((feature, output))
        results = []
        for i, context in enumerate(inputs[1]):
            best = None  # (logit sum, probability, start char, end char)
            null = None  # (logit sum, probability): the lowest over windows, as Google's run_squad
            for feature, output in per_example.get(i, []):
                info = feature.info
                start_window, end_window = info["spans"][info["window"]]
                offset = info["context_start"]
                length = end_window - start_window
                # Softmax over [CLS] and this window's context tokens (not the question).
                valid = np.r_[0, offset:offset + length]
                start_logits, end_logits = output["start_logits"], output["end_logits"]
                p_start = np.zeros_like(start_logits)
                p_end = np.zeros_like(end_logits)
                p_start[valid] = _softmax(start_logits[valid])
                p_end[valid] = _softmax(end_logits[valid])
                null_logit = float(start_logits[0] + end_logits[0])
                if null is None or null_logit < null[0]:
                    null = (null_logit, float(p_start[0] * p_end[0]))
                context_positions = np.arange(offset, offset + length)
                top_starts = context_positions[np.argsort(-start_logits[context_positions], kind="stable")[:self.n_best]]
                top_ends = context_positions[np.argsort(-end_logits[context_positions], kind="stable")[:self.n_best]]
                for s in top_starts.tolist():
                    token = start_window + s - offset  # index into the whole context's tokens
                    if max_context_window(token, info["spans"]) != info["window"]:
                        continue
                    for e in top_ends.tolist():
                        if e < s or e - s + 1 > max_answer_length:
                            continue
                        logit = float(start_logits[s] + end_logits[e])
                        if best is None or logit > best[0]:
                            best = (logit, float(p_start[s] * p_end[e]), info["offsets"][token][0],
                                    info["offsets"][start_window + e - offset][1])
            no_answer = {"answer": "", "score": null[1] if null else 0.0, "start": None, "end": None}
            if best is None or (handle_impossible_answer and null is not None
                                and null[0] - best[0] > null_threshold):
                results.append(no_answer)
            else:
                _, score, start, end = best
                results.append({"answer": context[start:end], "score": score, "start": start, "end": end})
        return results

    def __call__(self, questions: Sequence[str], contexts: Sequence[str], *, batch_size: int = 32,
                 doc_stride: int = 128, max_answer_length: int = 30, handle_impossible_answer: bool | None = None,
                 null_threshold: float = 0.0) -> list[dict]:
        return super().__call__(questions, contexts, batch_size=batch_size, doc_stride=doc_stride,
                                max_answer_length=max_answer_length,
                                handle_impossible_answer=handle_impossible_answer, null_threshold=null_threshold)


# ---------------------------------------------------------------------------- the factory


def pipeline(task: str | None = None, model: str | os.PathLike | None = None, *, backend: str = "torch",
             device: str | torch.device | None = None, max_length: int | None = None,
             onnx_model: str | os.PathLike | bytes | None = None, **kwargs: Any) -> Pipeline:
    """A ready pipeline: `pipeline("classify", model="runs/sst2/final")`.

    task: fill-mask, classify, embed, tag or answer (default: what the checkpoint's config.json
    `architectures` says). backend: "torch" or "onnx". See `Pipeline` for the other arguments.
    """
    if model is None:
        raise ValueError("pipeline() needs model=<checkpoint directory>")
    if task is None:
        task = task_for_checkpoint(model)
    cls = PIPELINES[resolve_task(task)]
    return cls(model, backend=backend, device=device, max_length=max_length, onnx_model=onnx_model, **kwargs)


__all__ = [
    "PIPELINES", "Pipeline", "PipelineInputError", "FillMaskPipeline", "ClassifyPipeline", "EmbedPipeline",
    "TagPipeline", "AnswerPipeline", "TorchRunner", "Feature", "pipeline", "register_pipeline", "resolve_task",
    "task_for_checkpoint", "group_entities", "windows", "max_context_window",
]
