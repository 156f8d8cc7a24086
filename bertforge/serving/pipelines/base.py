"""The pipeline base class: tokenize, batch, run (PyTorch or onnxruntime), postprocess.

Every pipeline works the same way: `preprocess` turns the inputs into *features* (token ids, one or
more per input: long inputs of `tag` and `answer` become overlapping windows), the features are
sorted by length and run in padded batches of `batch_size` through a *runner* (the model's
export-friendly graph on PyTorch, `bertforge.serving.runner`, or the same graph exported to ONNX,
`bertforge.serving.onnx`), and `postprocess` turns each input's feature outputs back into results,
in the order the inputs came.

A call takes any number of inputs, as a batch job would give it (`pipe(texts_of_a_test_set)`): its
inputs are run and postprocessed `batch_size * chunk_batches` at a time, so that the model outputs held
at once (a tagger's logits per token, `embed`'s hidden states) are bounded by the batch, not by the call.
A library pipeline has no per-call cost limits; the server gives its copies its per-request ones
(`with_limits`, `bertforge.serving.limits`), as may a caller (`limits=`), and those are checked over the
whole call before any forward pass. The class attributes `request_inputs`, `optional_request_inputs` and
`request_options` are the server's request schema of the pipeline.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from ...modeling import BertConfig, BertModel, optimize_for_inference, require_trained_head
from ...modeling.inference import default_row_bucket
from ...modeling.pretrained import resolve_model_dir
from ...tasks.arrays import MODEL_INPUTS, pad_inputs, pad_rows
from ...tasks.windows import windows as _windows
from ...tokenization import BertTokenizer
from ..limits import RequestLimits
from ..onnx import check_parity, export_onnx_bytes, onnx_runner
from ..runner import Batch, Runner, TorchRunner

logger = logging.getLogger("bertforge")

BASE_INPUTS = MODEL_INPUTS
MASK_TOKEN = "[MASK]"


class PipelineInputError(ValueError):
    """The caller's input cannot be processed (empty text, no [MASK], mismatched lengths ...).

    The server answers it with 422 and this message.
    """


@dataclass
class Feature:
    """One model input row: token ids plus what postprocessing needs to map outputs back."""

    example: int  # index of the input it came from
    input_ids: list[int]
    token_type_ids: list[int]
    extra_inputs: dict[str, list[int]] = field(default_factory=dict)  # e.g. masked_positions
    info: dict[str, Any] = field(default_factory=dict)


_WORD = re.compile(r"\w")


def tokenizes_to_nothing(tokenizer: BertTokenizer, text: str) -> bool:
    """Whether `text` holds no token at all: only whitespace, or characters the tokenizer drops
    (NUL, other controls, zero-width spaces ...). A text with a letter or digit is looked at no further."""
    return _WORD.search(text) is None and not tokenizer.tokenize(text)


def check_texts(texts: Any, what: str = "texts", allow_empty_list: bool = True) -> list[str]:
    """`texts` as a list of non-empty strings, else PipelineInputError naming `what` and the index."""
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



_check_texts = check_texts  # the name pipelines used before


def windows(length: int, max_tokens: int, stride: int) -> list[tuple[int, int]]:
    """`bertforge.tasks.windows.windows`; a window with no room for a token is the caller's input
    error here (answered with 422 by the server), not a bug."""
    try:
        return _windows(length, max_tokens, stride)
    except ValueError as error:
        raise PipelineInputError(str(error)) from None


def word_count(text: str) -> int:
    """Whitespace-separated words: a lower bound of a text's word pieces (each word is at least one; a
    word made only of characters the tokenizer drops counts one too), without the tokenizer."""
    return len(text.split())


def windowed_tokens(tokens: int, room: int, stride: int, overhead: int) -> int:
    """Tokens of the rows a text of `tokens` word pieces yields in windows of `room` at `stride`, each
    row `overhead` tokens more (its specials, a question)."""
    if room < 1 or stride < 1:
        return tokens + overhead
    return sum(end - start + overhead for start, end in _windows(tokens, room, stride))


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
        limits: what one call may cost (`bertforge.serving.limits.RequestLimits`: top_k, stride,
            rows); a call over them raises PipelineInputError before the forward pass. None (default):
            no limit but what the model allows (top_k within the vocabulary, a stride of at least one
            token), so that a batch job's call of any size runs; `bertforge serve` sets its per-request
            limits on the pipelines it serves.
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
    # Extra inputs that select rows (axis 1) of an output: input name -> output name. An ONNX file exported
    # before its graph took such an input gives the output at every row: the runner gathers it there.
    rows_selected_by: dict[str, str] = {}
    # Options the server accepts in a request body: name -> type(s).
    request_options: dict[str, tuple[type, ...]] = {}
    # The JSON keys of the server request that carry the inputs: (positional, keyword ...).
    request_inputs: tuple[str, ...] = ("texts",)
    optional_request_inputs: tuple[str, ...] = ()
    # Request inputs whose items are lists of strings rather than strings (multiple choice's endings).
    nested_request_inputs: tuple[str, ...] = ()
    # Pipelines served beside this one on the same model (`pipeline(name)`, `POST /v1/<name>`, and by default
    # in `bertforge serve`): embed's `similarity`. Each is resolved by its own name (`serving.registry`).
    companions: tuple[type["Pipeline"], ...] = ()

    def __init__(self, model: str | os.PathLike | nn.Module, tokenizer: BertTokenizer | None = None,
                 backend: str = "torch", device: str | torch.device | None = None,
                 max_length: int | None = None, onnx_model: str | os.PathLike | bytes | None = None,
                 runner: Runner | None = None, dtype: str | None = None, unpad: bool = True,
                 limits: RequestLimits | None = None):
        self.limits: RequestLimits | None = limits
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

    def check_inputs(self, inputs: tuple) -> tuple:
        """The positional inputs, checked (PipelineInputError with the reason): by default each a
        list of non-empty strings, named by `request_inputs` in messages."""
        return tuple(self.check_tokens(check_texts(value, name), name)
                     for value, name in zip(inputs, self.request_inputs))

    def check_tokens(self, texts: list[str], what: str = "texts") -> list[str]:
        """`texts`, unless one tokenizes to nothing ("\\u0000", a zero-width space): that is an empty text."""
        for i, text in enumerate(texts):
            if tokenizes_to_nothing(self.tokenizer, text):
                raise PipelineInputError(f"{what}[{i}] is empty (nothing in it is a token)")
        return texts

    def check_options(self, **options: Any) -> None:
        """PipelineInputError unless the options are usable and within `self.limits`; no input is
        looked at, so the server checks them before queueing a request. Subclasses check theirs."""

    def check_stride(self, name: str, stride: Any) -> None:
        """PipelineInputError unless `stride` (tag's stride, answer's doc_stride) is a positive integer of at
        least `limits.min_stride(max_length)` tokens: the windows a text yields stay bounded."""
        if not isinstance(stride, int) or isinstance(stride, bool) or stride < 1:
            raise PipelineInputError(f"{name} must be a positive integer, got {stride!r}")
        if self.limits is None:
            return
        least = self.limits.min_stride(self.max_length)
        if stride < least:
            raise PipelineInputError(f"{name} {stride} is under the limit of {least} tokens "
                                     f"({self.limits.min_stride_fraction:g} of max_length {self.max_length})")

    def check_rows(self, rows: int, what: str = "texts") -> None:
        """PipelineInputError when a call needs more than `limits.max_rows` model rows: counted
        before the rows are built, so an oversized call costs no forward pass. The pipelines whose
        inputs multiply into rows check it (tag and answer: windows, multiple choice: endings); one
        row per text (classify, embed, fill-mask) is bounded by the number of texts the caller sends
        (on the server: `max_texts`). Without `limits` (a library pipeline) any number of rows is run."""
        if self.limits is not None and rows > self.limits.max_rows:
            raise PipelineInputError(f"the inputs need {rows} model rows ({what}), over the limit of "
                                     f"{self.limits.max_rows} per call (max_rows): send fewer or shorter inputs")

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """Word pieces of each text, no specials, not truncated."""
        rows = self.tokenizer.encode_batch(list(texts), padding=False, truncation=False)
        return [len(row["input_ids"]) - 2 for row in rows]

    def work_tokens(self, inputs: dict[str, list], options: dict[str, Any]) -> int:
        """The model tokens a server request will run, each row's length with its specials, for the
        server's admission control (`serving.admission`): `inputs` keyed by `request_inputs`, `options` by
        `request_options`. Here one row per text (with its `text_pairs` item) cut to `max_length`; a
        pipeline whose rows are otherwise (windows, a row per choice) overrides it. Runs the tokenizer."""
        first = self.token_counts(inputs[self.request_inputs[0]])
        pairs = inputs.get("text_pairs")
        if pairs is None:
            return sum(min(self.max_length, n + 2) for n in first)
        return sum(min(self.max_length, n + p + 3) for n, p in zip(first, self.token_counts(pairs)))

    def least_work_tokens(self, inputs: dict[str, list], options: dict[str, Any]) -> int:
        """A lower bound of `work_tokens` counted in words (`word_count`), without the tokenizer: fast
        enough for the server's event loop."""
        pairs = inputs.get("text_pairs")
        return sum(min(self.max_length, word_count(text) + (word_count(pairs[i]) + 3 if pairs else 2))
                   for i, text in enumerate(inputs[self.request_inputs[0]]))

    def with_limits(self, limits: RequestLimits | None) -> "Pipeline":
        """This pipeline (sharing its model and tokenizer) with other cost limits: the server's."""
        other = copy.copy(self)
        other.limits = limits
        return other

    def preprocess(self, *inputs: Any, **options: Any) -> list[Feature]:
        raise NotImplementedError

    def encode_texts(self, texts: list[str], text_pairs: Any = None) -> list[Feature]:
        """One unpadded Feature per text (with its pair, when `text_pairs` is given and as long as `texts`),
        each cut to `max_length` tokens: the preprocessing of the sentence and sentence-pair pipelines."""
        if text_pairs is not None:
            text_pairs = self.check_tokens(check_texts(text_pairs, "text_pairs"), "text_pairs")
            if len(text_pairs) != len(texts):
                raise PipelineInputError(f"{len(texts)} texts but {len(text_pairs)} text_pairs")
        rows = self.tokenizer.encode_batch(texts, text_pairs, max_length=self.max_length, padding=False)
        return [Feature(i, r["input_ids"], r["token_type_ids"]) for i, r in enumerate(rows)]

    def postprocess(self, inputs: tuple, features: list[Feature], outputs: list[dict[str, np.ndarray]],
                    **options: Any) -> Any:
        """Results for each input; `inputs` are the (checked) positional inputs, e.g. (texts,)."""
        raise NotImplementedError

    # -- the shared machinery

    # A call's inputs are run and postprocessed this many batches' worth (`batch_size` inputs each) at a time:
    # the model outputs held at once are bounded by the batch, not by the call. None: the whole call at once.
    chunk_batches: int | None = 8

    def __call__(self, *inputs: Any, batch_size: int = 32, **options: Any) -> Any:
        """Results for each input, in input order (see the subclass for inputs and options), for any number of
        inputs: every input and option is checked first (over the whole call, so an error names the input
        by its index in the call), then the inputs run `batch_size * chunk_batches` at a time."""
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise PipelineInputError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.check_options(**options)
        inputs = self.check_inputs(inputs)
        features = self.preprocess(*inputs, **options)
        count = len(inputs[0]) if inputs else 0
        chunk = count if self.chunk_batches is None else batch_size * self.chunk_batches
        runner = self.runner_for(**options)
        if count <= chunk:
            return self.postprocess(inputs, features, self.run(features, batch_size, runner), **options)
        return self._call_in_chunks(inputs, features, chunk, batch_size, options, runner)

    def _call_in_chunks(self, inputs: tuple, features: list[Feature], chunk: int, batch_size: int,
                        options: dict[str, Any], runner: Runner | None = None) -> Any:
        """`__call__`'s results, `chunk` inputs at a time: each chunk's features (renumbered from 0 within it)
        are run and postprocessed with the chunk's inputs and per-input options (`optional_request_inputs`,
        e.g. text_pairs), then dropped; the chunks' results are joined (lists, or arrays row-wise)."""
        count = len(inputs[0])
        of_chunk: list[list[Feature]] = [[] for _ in range(0, count, chunk)]
        for feature in features:
            start = feature.example - feature.example % chunk
            of_chunk[feature.example // chunk].append(dataclasses.replace(feature, example=feature.example - start))
        features.clear()  # the call's list (the caller's too): each chunk's features go with the chunk
        parts = []
        for number, mine in enumerate(of_chunk):
            start = number * chunk
            if number and self.between_batches is not None:  # as between two forward batches of one run
                self.between_batches()
            part_inputs = tuple(value[start:start + chunk] for value in inputs)
            part_options = {name: (value[start:start + chunk] if name in self.optional_request_inputs
                                   and value is not None else value) for name, value in options.items()}
            parts.append(self.postprocess(part_inputs, mine, self.run(mine, batch_size, runner), **part_options))
            of_chunk[number] = []  # this chunk's features and outputs are no longer held
        if all(isinstance(part, np.ndarray) for part in parts):
            return np.concatenate(parts)
        if all(isinstance(part, list) for part in parts):
            return [result for part in parts for result in part]
        raise TypeError(f"{type(self).__name__}.postprocess returned {type(parts[0]).__name__}: a call run in "
                        "chunks joins lists or arrays; set chunk_batches = None to run its calls whole")

    # Padded tokens per forward batch (None: `batch_size` rows whatever their length). The server sets
    # it, so that one forward batch stays short and `between_batches` comes often.
    max_batch_tokens: int | None = None
    # Called on the calling thread between two forward batches of a call: the server runs a cheaper
    # waiting request there, so that it waits for one forward batch, not for a whole large call.
    between_batches: Callable[[], None] | None = None

    def runner_for(self, **options: Any) -> Runner:
        """The runner of a call with these (checked) options: `runner`, the one graph, unless a pipeline has
        a cheaper graph for some options (embed's last layer alone)."""
        return self.runner

    def run(self, features: Sequence[Feature], batch_size: int,
            runner: Runner | None = None) -> list[dict[str, np.ndarray]]:
        """Each feature's outputs (its row of every output), running shortest-first batches so that
        a batch pads to similar lengths; each batch at most `batch_size` rows and, when set,
        `max_batch_tokens` padded tokens (but at least one row). `runner`: default `self.runner`."""
        runner = self.runner if runner is None else runner
        results: list[dict[str, np.ndarray]] = [{} for _ in features]
        order = sorted(range(len(features)), key=lambda i: len(features[i].input_ids))
        start = 0
        while start < len(order):
            end = min(len(order), start + batch_size)
            while self.max_batch_tokens is not None and end - start > 1:
                longest = len(features[order[end - 1]].input_ids)  # sorted by length: the batch's last row
                if (end - start) * longest <= self.max_batch_tokens:
                    break
                end -= 1
            indexes = order[start:end]
            outputs = runner(self.collate([features[i] for i in indexes]))
            for row, index in enumerate(indexes):
                results[index] = {name: value[row] for name, value in outputs.items()}
            start = end
            if start < len(order) and self.between_batches is not None:
                self.between_batches()
        return results

    def collate(self, features: Sequence[Feature]) -> Batch:
        """Pad to the longest feature: int64 arrays (B, S), extra inputs padded with 0."""
        batch = pad_inputs([f.input_ids for f in features], [f.token_type_ids for f in features],
                           self.tokenizer.pad_token_id or 0)
        for name in self.extra_input_names:
            rows = [f.extra_inputs[name] for f in features]
            batch[name] = pad_rows(rows, 0, width=max(1, max(len(row) for row in rows)))
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


__all__ = ["BASE_INPUTS", "MASK_TOKEN", "Feature", "Pipeline", "PipelineInputError", "check_texts",
           "tokenizes_to_nothing", "windowed_tokens", "windows", "word_count"]
