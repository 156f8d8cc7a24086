"""Issue 61 (4): the library's pipelines take a batch job's call of any size, run in bounded chunks; the
per-request limits are the server's (and a caller's who passes `limits=`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertforge.serving import pipeline
from bertforge.serving.limits import RequestLimits
from bertforge.serving.pipelines import PipelineInputError
from bertforge.tasks.conll import read_conll

LONG = "john smith lives in paris and works for acme . " * 40  # ~400 tokens: many windows at 64 tokens


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _recording(pipe):
    """`pipe` with its postprocess recording how many inputs each postprocess call got."""
    sizes: list[int] = []
    postprocess = pipe.postprocess

    def recorded(inputs, features, outputs, **options):
        sizes.append(len(inputs[0]))
        return postprocess(inputs, features, outputs, **options)

    pipe.postprocess = recorded
    return sizes


def test_a_tagger_takes_a_thousand_conll_sentences_in_one_call(shared_data, tiny_dirs):
    """The issue's call: 1,024 CoNLL sentences through `pipeline("tag")` (refused before: 1024 rows over the
    limit of 256 per call). It runs `batch_size * chunk_batches` sentences at a time, with the results of
    calls of a few sentences each."""
    sentences = [" ".join(s.words) for s in read_conll(shared_data / "conll2003" / "valid.txt")[:1024]]
    assert len(sentences) == 1024
    pipe = pipeline("tag", model=tiny_dirs["tag"])
    assert pipe.limits is None
    sizes = _recording(pipe)
    results = pipe(sentences, batch_size=16)
    assert len(results) == 1024 and sizes == [16 * pipe.chunk_batches] * (1024 // (16 * pipe.chunk_batches))
    sizes.clear()
    for start in (0, 300, 1000):  # the same as calls of a few sentences
        assert _rounded(pipe(sentences[start:start + 24])) == _rounded(results[start:start + 24])
    # A caller who wants the server's per-request limits passes them, and gets the server's refusal.
    limited = pipeline("tag", model=tiny_dirs["tag"], limits=RequestLimits())
    with pytest.raises(PipelineInputError, match=r"the inputs need \d+ model rows \(texts x windows\), over the limit "
                                                 r"of 256 per call"):
        limited(sentences)


CALLS = {  # task -> (inputs of 40 items, options): each run whole and in chunks of 2 x 8 = 16 inputs
    "tag": (((["john smith lives in paris .", LONG, "mary works for acme ."] * 14)[:40],), {"stride": 16}),
    "answer": ((["who lives in paris ?"] * 40, ([LONG, "john smith lives in paris ."] * 20)), {"doc_stride": 16}),
    "classify": ((["a good film", "a very bad movie indeed"] * 20,), {"text_pairs": ["fun", "boring"] * 20}),
    "embed": ((["a good film", "a very bad movie indeed"] * 20,), {"pooling": "cls", "layers": [-1, -2]}),
    "fill-mask": ((["paris is the [MASK] of france .", "[MASK] [MASK] lives in london"] * 20,), {"top_k": 3}),
    "multiple-choice": ((["john lives in"] * 40, [["paris", "london", "acme"], ["a", "b"]] * 20),
                        {"starts": ["he", "she"] * 20}),
}


@pytest.mark.parametrize("task", sorted(CALLS))
def test_a_call_in_chunks_answers_as_the_whole_call(tiny_dirs, task):
    inputs, options = CALLS[task]
    pipe = pipeline(task, model=tiny_dirs[task])
    sizes = _recording(pipe)
    chunked = pipe(*inputs, batch_size=2, **options)
    assert sizes == [16, 16, 8]
    pipe.chunk_batches = None
    whole = pipe(*inputs, batch_size=2, **options)
    if isinstance(whole, np.ndarray):
        assert chunked.shape == whole.shape and np.allclose(chunked, whole, atol=1e-6)
    else:
        assert _rounded(chunked) == _rounded(whole)


def _rounded(value):
    """Results with their floats rounded (a row's batch neighbours change its float rounding only)."""
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def test_an_error_names_the_input_by_its_index_in_the_call_before_any_forward_pass(tiny_dirs):
    pipe = pipeline("fill-mask", model=tiny_dirs["fill-mask"])
    calls: list[int] = []
    runner = pipe.runner
    pipe.runner = lambda batch: calls.append(1) or runner(batch)
    texts = ["paris is the [MASK] ."] * 40
    texts[37] = "no mask here"
    with pytest.raises(PipelineInputError, match=r"^texts\[37\] has no \[MASK\] token$"):
        pipe(texts, batch_size=2)
    assert calls == []
    # Without limits, top_k is bounded by the vocabulary alone (the server's max_top_k is the server's).
    assert len(pipe(["paris is the [MASK] ."], top_k=60)[0][0]) == 60
    with pytest.raises(PipelineInputError, match=f"top_k 100000 is over the vocabulary's {len(pipe.tokenizer)} "):
        pipe(["paris is the [MASK] ."], top_k=100000)
