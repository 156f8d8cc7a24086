"""Pipelines: outputs per task on tiny random checkpoints, the logic of spans and windows on scripted
logits, and real outputs of the MiniLM checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import bertforge
from bertforge.modeling import BertForTokenClassification
from bertforge.serving import PipelineInputError, pipeline
from bertforge.serving.pipelines import BASE_INPUTS, group_entities, max_context_window, task_for_checkpoint, windows

SENTENCES = ["John Smith lives in Paris, France.", "a good film", "It was a great movie and the story was fun.",
             "bad", "Mary Jones moved to Berlin in Germany with the company."]


def test_exported_from_the_package():
    assert bertforge.pipeline is pipeline


def test_task_from_the_checkpoint(tiny_dirs):
    assert task_for_checkpoint(tiny_dirs["classify"]) == "classify"
    assert task_for_checkpoint(tiny_dirs["tag"]) == "tag"
    assert task_for_checkpoint(tiny_dirs["answer"]) == "answer"
    assert task_for_checkpoint(tiny_dirs["fill-mask"]) == "fill-mask"
    assert task_for_checkpoint(tiny_dirs["embed"]) == "embed"
    assert type(pipeline(model=tiny_dirs["tag"])).__name__ == "TagPipeline"


def test_unknown_task_and_backend(tiny_dirs):
    with pytest.raises(ValueError, match="unknown pipeline"):
        pipeline("summarize", model=tiny_dirs["embed"])
    with pytest.raises(ValueError, match="backend"):
        pipeline("embed", model=tiny_dirs["embed"], backend="tensorflow")
    with pytest.raises(FileNotFoundError):
        pipeline("embed", model="/nonexistent/model")


def test_classify_labels_scores_and_order(tiny_dirs):
    pipe = pipeline("classify", model=tiny_dirs["classify"])
    one_by_one = [pipe([s], batch_size=1)[0] for s in SENTENCES]
    batched = pipe(SENTENCES, batch_size=2)  # sorted by length inside, order restored
    for a, b in zip(one_by_one, batched):
        assert a["label"] == b["label"]
        assert a["score"] == pytest.approx(b["score"], abs=1e-5)
    for result in batched:
        assert set(result["scores"]) == {"negative", "positive"}
        assert sum(result["scores"].values()) == pytest.approx(1.0, abs=1e-5)
        assert result["score"] == max(result["scores"].values())
        assert result["label"] == max(result["scores"], key=result["scores"].get)


def test_classify_matches_the_model(tiny_dirs):
    pipe = pipeline("classify", model=tiny_dirs["classify"])
    model = bertforge.BertForSequenceClassification.from_pretrained(tiny_dirs["classify"])
    batch = pipe.tokenizer.encode_batch(SENTENCES[:2], ["the movie", "the film"], return_tensors="pt")
    with torch.no_grad():
        probs = model(**batch).logits.softmax(-1)
    results = pipe(SENTENCES[:2], text_pairs=["the movie", "the film"])
    for row, result in zip(probs, results):
        assert result["scores"]["positive"] == pytest.approx(float(row[1]), abs=1e-5)


def test_classify_pairs_and_regression(tiny_dirs):
    pipe = pipeline("classify", model=tiny_dirs["classify"])
    with pytest.raises(PipelineInputError, match="text_pairs"):
        pipe(["a", "b"], text_pairs=["c"])
    regression = pipeline("classify", model=tiny_dirs["regression"])
    results = regression(["a good film", "bad"])
    assert all(set(r) == {"score"} and isinstance(r["score"], float) for r in results)


def test_unpad_by_default_and_dtype(tiny_dirs):
    """The encoder runs unpadded unless told not to (the same scores to float rounding); `dtype` goes
    through optimize_for_inference (torch backend only)."""
    from bertforge.modeling import BertModel, Int8Linear

    padded = pipeline("classify", model=tiny_dirs["classify"], unpad=False)
    unpadded = pipeline("classify", model=tiny_dirs["classify"])
    int8 = pipeline("classify", model=tiny_dirs["classify"], dtype="int8")
    encoders = lambda pipe: [m for m in pipe.runner.graph.modules() if isinstance(m, BertModel)]  # noqa: E731
    assert [e.unpad for e in encoders(padded)] == [False] and [e.unpad for e in encoders(unpadded)] == [True]
    assert any(isinstance(m, Int8Linear) for m in int8.runner.graph.modules())
    pairs = ["the movie", "a film", "it", "the story of a film", "x"]
    reference = padded(SENTENCES, text_pairs=pairs)
    for other, tolerance in ((unpadded, 1e-5), (int8, 0.05)):
        for a, b in zip(reference, other(SENTENCES, text_pairs=pairs)):
            assert b["scores"]["positive"] == pytest.approx(a["scores"]["positive"], abs=tolerance)
    with pytest.raises(ValueError, match="backend='torch'"):
        pipeline("classify", model=tiny_dirs["classify"], backend="onnx", dtype="int8")
    with pytest.raises(ValueError, match="dtype must be one of"):
        pipeline("classify", model=tiny_dirs["classify"], dtype="fp64")


def test_truncation_to_max_length(tiny_dirs):
    pipe = pipeline("classify", model=tiny_dirs["classify"], max_length=16)
    long = "the film " * 200
    assert pipe([long])[0]["label"] in ("negative", "positive")
    short_and_truncated = pipeline("classify", model=tiny_dirs["classify"])  # 64 positions: truncates too
    assert short_and_truncated([long])[0]["label"] in ("negative", "positive")


def test_bad_inputs_are_rejected(tiny_dirs):
    pipe = pipeline("classify", model=tiny_dirs["classify"])
    with pytest.raises(PipelineInputError, match="not one string"):
        pipe("a single string")
    with pytest.raises(PipelineInputError, match="empty"):
        pipe(["fine", "   "])
    with pytest.raises(PipelineInputError, match="not a string"):
        pipe(["fine", 3])
    with pytest.raises(PipelineInputError, match="batch_size"):
        pipe(["fine"], batch_size=0)
    assert pipe([]) == []


def test_fill_mask(tiny_dirs):
    pipe = pipeline("fill-mask", model=tiny_dirs["fill-mask"])
    texts = ["Paris is the [MASK] of France.", "John [MASK] in London and [MASK] works."]
    results = pipe(texts, top_k=3)
    assert [len(r) for r in results] == [1, 2]  # one entry per [MASK]
    for text, per_mask in zip(texts, results):
        for candidates in per_mask:
            assert len(candidates) == 3
            scores = [c["score"] for c in candidates]
            assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1
            for c in candidates:
                assert pipe.tokenizer.convert_ids_to_tokens([c["token_id"]]) == [c["token"]]
                if text.count("[MASK]") == 1:  # the filled text, for a text with one [MASK] only
                    word = c["token"].removeprefix("##")
                    assert c["sequence"] == text.replace("[MASK]", word) and "[MASK]" not in c["sequence"]
                else:  # not repeated per candidate: that grows with masks^2 x top_k
                    assert "sequence" not in c
    with pytest.raises(PipelineInputError, match=r"no \[MASK\]"):
        pipe(["no mask here"])
    with pytest.raises(PipelineInputError, match="max_length"):
        pipe(["the " * 100 + "[MASK]"])


def test_fill_mask_scores_are_the_model_softmax(tiny_dirs):
    pipe = pipeline("fill-mask", model=tiny_dirs["fill-mask"])
    model = bertforge.BertForMaskedLM.from_pretrained(tiny_dirs["fill-mask"])
    text = "Paris is the [MASK] of France."
    encoded = pipe.tokenizer.encode_batch([text], return_tensors="pt")
    position = int((encoded["input_ids"][0] == pipe.tokenizer.mask_token_id).nonzero())
    with torch.no_grad():
        probs = model(**encoded).logits[0, position].softmax(-1)
    best = pipe([text], top_k=1)[0][0][0]
    assert best["token_id"] == int(probs.argmax())
    assert best["score"] == pytest.approx(float(probs.max()), abs=1e-5)


def test_embed_pooling_and_layers(tiny_dirs):
    pipe = pipeline("embed", model=tiny_dirs["embed"])
    model = bertforge.BertModel.from_pretrained(tiny_dirs["embed"])
    encoded = pipe.tokenizer.encode_batch(SENTENCES[:1], return_tensors="pt")
    with torch.no_grad():
        out = model(**encoded, output_hidden_states=True)
    mean = pipe(SENTENCES, pooling="mean", batch_size=2)
    assert mean.shape == (len(SENTENCES), 32) and mean.dtype == np.float32
    np.testing.assert_allclose(mean[0], out.last_hidden_state[0].mean(0).numpy(), atol=1e-5)
    cls = pipe(SENTENCES[:1], pooling="cls")
    np.testing.assert_allclose(cls[0], out.last_hidden_state[0, 0].numpy(), atol=1e-5)
    layers = pipe(SENTENCES[:1], pooling="cls", layers=[-1, 0])
    np.testing.assert_allclose(layers[0, 32:], out.hidden_states[1][0, 0].numpy(), atol=1e-5)
    normalized = pipe(SENTENCES, normalize=True)
    np.testing.assert_allclose(np.linalg.norm(normalized, axis=1), 1.0, atol=1e-5)
    with pytest.raises(PipelineInputError, match="out of range"):
        pipe(["x"], layers=[5])
    with pytest.raises(PipelineInputError, match="pooling"):
        pipe(["x"], pooling="max")


def test_embed_default_call_runs_the_last_layer_graph(tiny_dirs):
    """The default call (the last layer) runs `LastHiddenStateGraph`, any other layer choice the general
    graph; both give the general graph's vectors (the ONNX backend has only that one)."""
    pipe = pipeline("embed", model=tiny_dirs["embed"])
    assert pipe.runner_for() is pipe.last_layer_runner is not None
    assert pipe.runner_for(layers=[-1, 0]) is pipe.runner and pipe.runner_for(layers=[0]) is pipe.runner
    last_index = pipe.config.num_hidden_layers - 1
    assert pipe.runner_for(layers=[last_index]) is pipe.last_layer_runner
    features = pipe.preprocess(SENTENCES)
    general = pipe.postprocess((SENTENCES,), features, pipe.run(features, 2, pipe.runner))
    np.testing.assert_allclose(pipe(SENTENCES, batch_size=2), general, atol=1e-6)
    both = pipe(SENTENCES, layers=[0, -1], batch_size=2)
    np.testing.assert_allclose(both[:, 32:], general, atol=1e-6)
    calls = []
    counted = pipeline("embed", model=tiny_dirs["embed"], runner=lambda batch: calls.append(batch) or
                       pipe.runner(batch))
    assert counted.last_layer_runner is None and counted.runner_for() is counted.runner
    np.testing.assert_allclose(counted(SENTENCES, batch_size=2), general, atol=1e-6)
    assert len(calls) == (len(SENTENCES) + 1) // 2


def test_windows_and_max_context():
    assert windows(5, 10, 3) == [(0, 5)]
    assert windows(10, 4, 2) == [(0, 4), (2, 6), (4, 8), (6, 10)]
    spans = windows(10, 4, 2)
    assert max_context_window(0, spans) == 0 and max_context_window(9, spans) == 3
    assert max_context_window(5, spans) == 2  # (4, 8): one token on the left, two on the right


def test_group_entities_iob2_iob1_bioes():
    text = "John Smith met Mary in New York"
    def words(*labels):
        spans, at = [], 0
        for word, label in zip(text.split(), labels):
            start = text.index(word, at)
            at = start + len(word)
            spans.append({"label": label, "score": 0.5, "start": start, "end": at})
        return spans
    iob2 = group_entities(text, words("B-PER", "I-PER", "O", "B-PER", "O", "B-LOC", "I-LOC"))
    assert [(e["entity"], e["text"]) for e in iob2] == [("PER", "John Smith"), ("PER", "Mary"), ("LOC", "New York")]
    iob1 = group_entities(text, words("I-PER", "I-PER", "O", "I-PER", "O", "I-LOC", "I-LOC"))
    assert [e["text"] for e in iob1] == ["John Smith", "Mary", "New York"]
    adjacent = group_entities(text, words("B-PER", "B-PER", "O", "O", "O", "O", "O"))
    assert [e["text"] for e in adjacent] == ["John", "Smith"]
    plain = group_entities(text, words("PER", "PER", "O", "PER", "O", "LOC", "LOC"))
    assert [e["text"] for e in plain] == ["John Smith", "Mary", "New York"]
    bioes = group_entities(text, words("B-PER", "E-PER", "O", "S-PER", "O", "B-LOC", "E-LOC"))
    assert [e["text"] for e in bioes] == ["John Smith", "Mary", "New York"]


def _scripted(pipe, scores_by_token: dict[str, list[float]]):
    """A runner giving each token fixed logits by its text, at the rows the pipeline asks for (each word's
    first piece, `word_positions`): the pipeline logic without a model."""
    vocab = pipe.tokenizer.vocab
    table = np.zeros((len(vocab), pipe.config.num_labels), dtype=np.float32)
    table[:, 0] = 5.0  # "O" everywhere else
    for token, logits in scores_by_token.items():
        table[vocab[token]] = logits
    calls = []

    def runner(batch):
        calls.append(batch["input_ids"].shape)
        return {"logits": table[np.take_along_axis(batch["input_ids"], batch["word_positions"], axis=1)]}

    return runner, calls


def test_tag_entities_spans_from_word_pieces_and_windows(tiny_dirs):
    # Labels: O, B-PER, I-PER, B-LOC, I-LOC; the first piece of a word decides.
    probe = pipeline("tag", model=tiny_dirs["tag"])
    runner, calls = _scripted(probe, {"john": [0, 9, 0, 0, 0], "smith": [0, 0, 9, 0, 0], "paris": [0, 0, 0, 9, 0],
                                      "z": [0, 0, 0, 9, 0], "##q": [9, 0, 0, 0, 0]})
    pipe = pipeline("tag", model=tiny_dirs["tag"], runner=runner)
    text = "John Smith lives in Paris and zqq."
    entities = pipe([text])[0]
    assert [(e["entity"], e["text"], e["start"], e["end"]) for e in entities] == [
        ("PER", "John Smith", 0, 10), ("LOC", "Paris", 20, 25), ("LOC", "zqq", 30, 33)]
    assert all(0 < e["score"] <= 1 for e in entities)
    words = pipe([text], aggregation="none")[0]
    assert [w["word"] for w in words] == ["John", "Smith", "lives", "in", "Paris", "and", "zqq", "."]
    # A text far longer than max_length (64): windows, each word labelled once, spans still exact.
    long = " ".join(["the film was fun"] * 40) + " John Smith lives in Paris."
    calls.clear()
    entities = pipe([long, text], stride=20)
    assert len(calls) >= 1 and sum(shape[0] for shape in calls) > 2  # several windows ran
    found = [(e["text"], long[e["start"]:e["end"]]) for e in entities[0]]
    assert found == [("John Smith", "John Smith"), ("Paris", "Paris")]
    assert len(pipe([long], aggregation="none")[0]) == len(long.replace(".", " .").split())


def test_tag_reads_the_full_models_logits_at_each_words_first_piece(tiny_dirs):
    """The graph runs the last layer and the classifier at the words' first pieces only: its answers are
    those of the full model's per-token logits read there (windows included), and it computes fewer rows."""
    model = BertForTokenClassification.from_pretrained(tiny_dirs["tag"]).eval()
    full_rows = []

    def full_runner(batch):  # every token's logits, then the rows the pipeline asked for
        with torch.no_grad():
            logits = model(*(torch.from_numpy(batch[name]) for name in BASE_INPUTS)).logits.numpy()
        full_rows.append(batch["input_ids"].size)
        return {"logits": np.take_along_axis(logits, batch["word_positions"][..., None], axis=1)}

    texts = ["John Smith lives in Paris and zqq.", " ".join(["the unbelievably fun film"] * 25) + " Mary Jones.",
             "Ça va, Zürich?"]
    got = pipeline("tag", model=tiny_dirs["tag"])(texts, aggregation="none", stride=20)
    expected = pipeline("tag", model=tiny_dirs["tag"], runner=full_runner)(texts, aggregation="none", stride=20)
    for a, b in zip(got, expected):
        assert [(w["word"], w["label"], w["start"], w["end"]) for w in a] == \
            [(w["word"], w["label"], w["start"], w["end"]) for w in b]
        assert [w["score"] for w in a] == pytest.approx([w["score"] for w in b], abs=1e-5)
    features = pipeline("tag", model=tiny_dirs["tag"]).preprocess(texts, stride=20)
    asked = sum(len(f.extra_inputs["word_positions"]) for f in features)
    assert asked == sum(len(words) for words in got) < sum(len(f.input_ids) for f in features)


def _qa_runner(pipe, start_token: str, end_token: str, null: float = -5.0):
    vocab = pipe.tokenizer.vocab

    def runner(batch):
        ids = batch["input_ids"]
        start = np.where(ids == vocab[start_token], 8.0, 0.0).astype(np.float32)
        end = np.where(ids == vocab[end_token], 8.0, 0.0).astype(np.float32)
        start[:, 0] = end[:, 0] = null  # [CLS]: the no-answer score
        # The question is segment A: a span there must never be chosen, so make it tempting.
        start[batch["token_type_ids"] == 0] += 1.0
        start[:, 0] = null
        return {"start_logits": start, "end_logits": end}

    return runner


def test_answer_span_and_characters(tiny_dirs):
    probe = pipeline("answer", model=tiny_dirs["answer"])
    pipe = pipeline("answer", model=tiny_dirs["answer"], runner=_qa_runner(probe, "paris", "france"))
    context = "Mary Jones lives in Paris, France with John."
    result = pipe(["where does mary live?"], [context])[0]
    assert result["answer"] == "Paris, France"
    assert context[result["start"]:result["end"]] == "Paris, France"
    assert 0 < result["score"] <= 1


def test_answer_sliding_windows_find_a_late_answer(tiny_dirs):
    probe = pipeline("answer", model=tiny_dirs["answer"])
    pipe = pipeline("answer", model=tiny_dirs["answer"], runner=_qa_runner(probe, "berlin", "germany"))
    context = "the film was fun . " * 30 + "John moved to Berlin in Germany."
    assert len(probe.tokenizer.tokenize(context)) > 64
    result = pipe(["where did john move?"], [context], doc_stride=16)[0]
    assert result["answer"] == "Berlin in Germany"
    assert context[result["start"]:result["end"]] == "Berlin in Germany"
    with pytest.raises(PipelineInputError, match="contexts"):
        pipe(["a", "b"], [context])


def test_answer_no_answer_for_v2(tiny_dirs):
    probe = pipeline("answer", model=tiny_dirs["answer"])
    runner = _qa_runner(probe, "paris", "france", null=30.0)  # [CLS] beats every span
    context = "Mary Jones lives in Paris, France with John."
    v1 = pipeline("answer", model=tiny_dirs["answer"], runner=runner)
    assert v1(["where?"], [context])[0]["answer"] == "Paris, France"  # SQuAD 1.1: always a span
    v2 = pipeline("answer", model=tiny_dirs["answer-v2"], runner=runner)  # config: version_2_with_negative
    result = v2(["where?"], [context])[0]
    assert result["answer"] == "" and result["start"] is None and result["end"] is None
    assert v2(["where?"], [context], null_threshold=100.0)[0]["answer"] == "Paris, France"


def test_tag_and_answer_run_on_real_tiny_models(tiny_dirs):
    entities = pipeline("tag", model=tiny_dirs["tag"])(SENTENCES)
    for text, found in zip(SENTENCES, entities):
        for e in found:
            assert text[e["start"]:e["end"]] == e["text"] and e["entity"] in ("PER", "LOC")
    answers = pipeline("answer", model=tiny_dirs["answer"])(["where?"] * 2, SENTENCES[:2])
    for context, a in zip(SENTENCES, answers):
        assert context[a["start"]:a["end"]] == a["answer"]


# ---------------------------------------------------------------------------- the real MiniLM checkpoint


@pytest.fixture(scope="module")
def minilm_embed(minilm_dir):
    return pipeline("embed", model=minilm_dir)


def test_minilm_embeddings_match_transformers(minilm_dir, minilm_embed):
    transformers = pytest.importorskip("transformers")
    sentences = ["A man is eating food.", "A man is eating a piece of bread.", "A man is riding a horse.",
                 "The new movie is awesome and I loved every minute of it."]
    reference = transformers.BertModel.from_pretrained(str(minilm_dir)).eval()
    tokenizer = minilm_embed.tokenizer
    batch = tokenizer.encode_batch(sentences, return_tensors="pt")
    with torch.no_grad():
        hidden = reference(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    expected = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    ours = minilm_embed(sentences, pooling="mean", batch_size=3, normalize=False)
    np.testing.assert_allclose(ours, expected, atol=1e-5)
    # by default, the pooling and normalisation its directory declares (modules.json: mean, Normalize)
    np.testing.assert_allclose(minilm_embed(sentences), expected / np.linalg.norm(expected, axis=1, keepdims=True),
                               atol=1e-5)


def test_minilm_embeddings_rank_paraphrases_first(minilm_embed):
    vectors = minilm_embed(["A man is eating food.", "A man is eating a piece of bread.", "A man is riding a horse.",
                            "The stock market fell sharply today."], normalize=True)
    similarity = vectors @ vectors.T
    assert similarity[0, 1] > similarity[0, 2] > similarity[0, 3]


def test_minilm_fill_mask_runs_on_real_sentences(minilm_dir, caplog):
    # all-MiniLM-L6-v2 ships no MLM head: from its directory the pipeline refuses (its words would be
    # random); a model instance is the caller's choice. The structure of the results on real text is
    # what is checked here, not the words.
    with pytest.raises(ValueError, match="is a BertModel checkpoint, not trained for fill-mask: its BertForMaskedLM "
                                         "weights cls.predictions.bias"):
        pipeline("fill-mask", model=minilm_dir)
    from bertforge.modeling import BertForMaskedLM

    from bertforge.serving.pipelines import FillMaskPipeline
    from bertforge.tokenization import BertTokenizer

    pipe = FillMaskPipeline(BertForMaskedLM.from_pretrained(minilm_dir), BertTokenizer.from_pretrained(minilm_dir))
    results = pipe(["The capital of France is [MASK].", "I [MASK] this movie, it was [MASK]!"], top_k=5)
    assert [len(r) for r in results] == [1, 2]
    assert all(len(c) == 5 and c[0]["score"] >= c[-1]["score"] for r in results for c in r)
    assert results[0][0][0]["sequence"].startswith("The capital of France is ")
