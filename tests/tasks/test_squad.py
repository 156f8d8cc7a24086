"""SQuAD: reader, windows and maximal context, answer alignment, prediction, fine-tuning and the CLI."""

from __future__ import annotations

import importlib.util
import json
import logging
import string
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.metrics.squad import evaluate_v1, evaluate_v2
from bertforge.tasks.answer import answer_questions, predict_squad_file, squad_task
from bertforge.tasks.squad_data import SquadExample, SquadSettings, convert_examples_to_features, read_squad_file
from bertforge.tasks.squad_postprocess import postprocess
from bertforge.tasks.windows import aggregate_window_logits, max_context_flags, max_context_window, windows
from bertforge.tokenization import BertTokenizer
from bertforge.training.finetune import FinetuneArguments, finetune

REPO = Path(__file__).resolve().parents[2]
SHARED_SQUAD = "squad/v2.0/dev-v2.0.cs224n-half.json"

WORDS = ("the a an is was of and to in on who what where when which did does capital city paris france london "
         "england berlin germany river seine thames rhine flows through born year mary john smith lives works "
         "company acme old new north south east west bridge").split()

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, save_tiny_checkpoint) -> Path:
    """A tiny random BERT (2 layers, H=32) with a small uncased vocabulary: words, letters, ##letters."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *string.ascii_lowercase,
              *[f"##{c}" for c in string.ascii_lowercase], *string.digits, *".,!?;:'\"()-", *WORDS]
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_squad"), list(dict.fromkeys(tokens)),
                                max_position_embeddings=128)


@pytest.fixture(scope="module")
def tokenizer(tiny_dir) -> BertTokenizer:
    return BertTokenizer.from_pretrained(tiny_dir)


def squad_json(paragraphs: list[tuple[str, list[tuple]]], title: str = "Rivers") -> dict:
    """An official-format file: paragraphs of (context, [(id, question, answer text or None), ...]);
    answer_start is where the text first occurs (None: unanswerable)."""
    out = []
    for context, questions in paragraphs:
        qas = []
        for qid, question, answer in questions:
            if answer is None:
                qas.append({"id": qid, "question": question, "answers": [], "is_impossible": True,
                            "plausible_answers": [{"text": "paris", "answer_start": 0}]})
            else:
                start = context.index(answer)
                assert start >= 0
                qas.append({"id": qid, "question": question, "is_impossible": False,
                            "answers": [{"text": answer, "answer_start": start}]})
        out.append({"context": context, "qas": qas})
    return {"version": "v2.0", "data": [{"title": title, "paragraphs": out}]}


LONG_PASSAGE = ("the old city of paris is in the north of france and the river seine flows through it . "
                "london is the capital of england and the thames flows through london . "
                "mary smith was born in berlin in the east of germany and the rhine flows west .")

TRAIN = [
    ("paris is the capital of france .", [("q1", "what is the capital of france ?", "paris"),
                                          ("q2", "what is the capital of germany ?", None)]),
    ("berlin is the capital of germany .", [("q3", "what is the capital of germany ?", "berlin"),
                                            ("q4", "who lives in berlin ?", None)]),
    ("john smith works at acme .", [("q5", "where does john smith work ?", "acme"),
                                    ("q6", "who works at acme ?", "john smith")]),
    (LONG_PASSAGE, [("q7", "which river flows through london ?", "thames"),
                    ("q8", "where was mary smith born ?", "berlin")]),
]


def write(path: Path, value) -> Path:
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------- reader

def test_reader_counts_on_the_shared_file(shared_data):
    data = read_squad_file(shared_data / SHARED_SQUAD)
    assert len(data.examples) == 6078 and data.num_answerable == 2910
    assert len(data.dataset) == 16 and len({e.title for e in data.examples}) == 16
    assert all(not e.answers for e in data.examples if e.is_impossible)
    assert len({e.qas_id for e in data.examples}) == 6078


def test_whole_shared_file_converts_in_seconds(shared_data, uncased_vocab):
    import time

    tokenizer = BertTokenizer(uncased_vocab, do_lower_case=True)
    data = read_squad_file(shared_data / SHARED_SQUAD)
    began = time.perf_counter()
    features = convert_examples_to_features(data.examples, tokenizer, is_training=True)
    assert time.perf_counter() - began < 20  # about 1 s on one core; generous for a busy machine
    assert not features.skipped  # every answer of the official file aligns
    assert len(features.features) > len(data.examples)  # some passages need two windows at 384
    assert max(features.lengths) <= 384


@pytest.mark.parametrize("mutate, message", [
    (lambda qa: qa["answers"][0].pop("answer_start"), "answer_start"),
    (lambda qa: qa.update(is_impossible=True), "is_impossible is true but it has answers"),
    (lambda qa: qa.update(answers=[]), "no answers and not marked is_impossible"),
    (lambda qa: qa.pop("question"), "no 'question'"),
])
def test_reader_errors_name_the_file_and_question(tmp_path, mutate, message):
    value = squad_json(TRAIN[:1])
    mutate(value["data"][0]["paragraphs"][0]["qas"][0])
    path = write(tmp_path / "bad.json", value)
    with pytest.raises(ValueError, match=message) as error:
        read_squad_file(path)
    assert str(path) in str(error.value) and "q1" in str(error.value)


def test_reader_rejects_duplicate_ids_and_non_squad_files(tmp_path):
    value = squad_json(TRAIN[:1])
    value["data"][0]["paragraphs"][0]["qas"][1]["id"] = "q1"
    with pytest.raises(ValueError, match="q1: the id appears twice"):
        read_squad_file(write(tmp_path / "dup.json", value))
    with pytest.raises(ValueError, match="not a SQuAD file"):
        read_squad_file(write(tmp_path / "list.json", [1, 2]))
    with pytest.raises(FileNotFoundError):
        read_squad_file(tmp_path / "absent.json")


# ---------------------------------------------------------------------------- windows

def google_check_is_max_context(doc_spans, cur_span_index, position):
    """Google's run_squad.py `_check_is_max_context` (doc_spans as (start, length))."""
    best_score, best_span_index = None, None
    for span_index, (start, length) in enumerate(doc_spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        num_left_context = position - start
        num_right_context = end - position
        score = min(num_left_context, num_right_context) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_span_index = score, span_index
    return cur_span_index == best_span_index


def google_doc_spans(length, max_tokens_for_doc, doc_stride):
    spans, start_offset = [], 0
    while start_offset < length:
        span_length = min(length - start_offset, max_tokens_for_doc)
        spans.append((start_offset, span_length))
        if start_offset + span_length == length:
            break
        start_offset += min(span_length, doc_stride)
    return spans


@pytest.mark.parametrize("length, max_tokens, stride", [(40, 19, 8), (10, 4, 2), (5, 10, 3), (100, 30, 30),
                                                        (97, 25, 7), (31, 16, 1)])
def test_windows_and_max_context_are_googles(length, max_tokens, stride):
    spans = windows(length, max_tokens, stride)
    assert [(s, e - s) for s, e in spans] == google_doc_spans(length, max_tokens, stride)
    for index in range(len(spans)):
        flags = max_context_flags(spans, index)
        assert flags == [google_check_is_max_context([(s, e - s) for s, e in spans], index, p)
                         for p in range(*spans[index])]
    for position in range(length):  # every token has exactly one max-context window
        owners = [i for i, (start, end) in enumerate(spans)
                  if start <= position < end and max_context_flags(spans, i)[position - start]]
        assert owners == [max_context_window(position, spans)]


def test_aggregate_window_logits():
    logits = np.array([[1.0, 0.0], [3.0, 2.0], [0.0, 5.0], [2.0, 2.0]], dtype=np.float32)
    mean, order = aggregate_window_logits(logits, [7, 7, 3, 7], "mean")
    assert order == [7, 3] and mean.dtype == np.float32
    np.testing.assert_allclose(mean, [[2.0, 4 / 3], [0.0, 5.0]], rtol=1e-6)
    largest, _ = aggregate_window_logits(logits, [7, 7, 3, 7], "max")
    np.testing.assert_allclose(largest, [[3.0, 2.0], [0.0, 5.0]])
    with pytest.raises(ValueError):
        aggregate_window_logits(logits, [0, 1], "mean")


def _overlap_example(tokenizer):
    """A passage of 40 one-token words with the answer ("thames", token 17) inside three windows of 19
    tokens 8 apart: (0, 19), (8, 27), (16, 35), (24, 40); its max-context window is (8, 27)."""
    words = ["old"] * 40
    words[17] = "thames"
    words[14] = "seine"
    context = " ".join(words)
    example = SquadExample("w1", "which river ?", context, [("thames", context.index("thames"))])
    settings = SquadSettings(max_seq_length=19 + 3 + 3, doc_stride=8, max_query_length=8)
    assert tokenizer.tokenize("which river ?") == ["which", "river", "?"]
    return example, settings


def test_answer_in_the_overlap_of_windows(tokenizer):
    example, settings = _overlap_example(tokenizer)
    features = convert_examples_to_features([example], tokenizer, settings, is_training=True)
    assert features.spans[0] == [(0, 19), (8, 27), (16, 35), (24, 40)]
    assert max_context_window(17, features.spans[0]) == 1
    rows = features.features
    assert [len(r["input_ids"]) for r in rows] == [25, 25, 25, 22]
    for row in rows:
        start, end = row["start_position"], row["end_position"]
        if row["window_index"] == 3:  # the answer is not in this window: [CLS]
            assert start == end == 0
            continue
        assert start == end and tokenizer.convert_ids_to_tokens([row["input_ids"][start]]) == ["thames"]
        assert row["token_type_ids"][start] == 1 and row["token_type_ids"][row["context_offset"] - 1] == 0
        window_start = features.spans[0][row["window_index"]][0]
        s, e = features.offsets[0][window_start + start - row["context_offset"]]
        assert example.context[s:e] == "thames"


def test_prediction_scores_a_start_only_in_its_max_context_window(tokenizer):
    example, settings = _overlap_example(tokenizer)
    features = convert_examples_to_features([example], tokenizer, settings)
    logits = []
    for row in features.features:
        n, offset = len(row["input_ids"]), row["context_offset"]
        window_start = features.spans[0][row["window_index"]][0]
        start, end = np.full(n, -10.0, np.float32), np.full(n, -10.0, np.float32)
        answer, decoy = offset + 17 - window_start, offset + 14 - window_start
        if row["window_index"] == 0:  # strongest here, but token 17 has more context in window 1
            start[answer] = end[answer] = 10.0
        if row["window_index"] == 1:
            start[answer] = end[answer] = 3.0
            start[decoy] = end[decoy] = 4.0  # "seine" (token 14): its max-context window is this one
        logits.append((start, end))
    result = postprocess([example], features, logits)
    assert result.predictions == {"w1": "seine"}
    best = {entry["text"]: entry for entry in result.nbest["w1"]}
    assert best["thames"]["start_logit"] == 3.0  # window 0's 10.0 was never a candidate
    assert sum(entry["probability"] for entry in result.nbest["w1"]) == pytest.approx(1.0)
    # v2.0: the null score is the lowest [CLS] score over the windows, and τ decides.
    for start, end in logits:
        start[0] = end[0] = 5.0
    logits[2][0][0] = 2.5  # window 2: [CLS] scores 2.5 + 5.0 = 7.5, the lowest
    v2 = postprocess([example], features, logits, version_2_with_negative=True)
    assert v2.null_odds["w1"] == pytest.approx(7.5 - 8.0) and v2.predictions["w1"] == "seine"
    assert postprocess([example], features, logits, version_2_with_negative=True,
                       null_score_diff_threshold=-1.0).predictions["w1"] == ""
    assert v2.with_threshold(-1.0).predictions["w1"] == ""
    assert "" in {entry["text"] for entry in v2.nbest["w1"]}


def test_span_rules_end_after_start_and_max_answer_length(tokenizer):
    context = "paris is the capital of france ."
    example = SquadExample("s1", "what ?", context, [("paris", 0)])
    features = convert_examples_to_features([example], tokenizer)
    (row,) = features.features
    n, offset = len(row["input_ids"]), row["context_offset"]
    start, end = np.zeros(n, np.float32), np.zeros(n, np.float32)
    start[offset + 5] = 9.0  # "france"
    end[offset + 1] = 9.0  # "is": before the start, never paired with it
    end[offset + 5] = 1.0
    start[1] = end[1] = 50.0  # a question token: not part of the passage
    result = postprocess([example], features, [(start, end)], n_best_size=5)
    assert result.predictions["s1"] == "france"
    start[offset], end[offset + 1] = 20.0, -5.0  # "paris": to "france" is 6 tokens
    assert postprocess([example], features, [(start, end)], max_answer_length=5).predictions["s1"] != "paris is the capital of france"
    assert postprocess([example], features, [(start, end)], max_answer_length=6).predictions["s1"] == \
        "paris is the capital of france"


def test_unalignable_answers_are_reported_and_skipped(tokenizer, caplog):
    context = "the river seine flows through paris \u200b ."
    examples = [
        SquadExample("ok", "which river ?", context, [("seine", context.index("seine"))]),
        SquadExample("moved", "which river ?", context, [("seine", 3)]),  # answer_start off
        SquadExample("zero-width", "what ?", context, [("\u200b", context.index("\u200b"))]),  # no token
        SquadExample("beyond", "what ?", context, [("paris", 500)]),
        SquadExample("none", "who ?", context, [], is_impossible=True),
    ]
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        features = convert_examples_to_features(examples, tokenizer, is_training=True)
    reasons = dict(features.skipped)
    assert set(reasons) == {"moved", "zero-width", "beyond"}
    assert "not at answer_start 3" in reasons["moved"] and "no token covers" in reasons["zero-width"]
    assert "skipped 3 of 5 training questions" in caplog.text
    assert sorted({f["example_index"] for f in features.features}) == [0, 4]
    # Evaluation keeps every question: the gold texts are scored as text.
    assert len(convert_examples_to_features(examples, tokenizer).features) == 5


def test_answer_inside_a_word_covers_the_whole_word(uncased_vocab):
    tokenizer = BertTokenizer(uncased_vocab, do_lower_case=True)
    context = "The Japanese army landed in 1894."
    example = SquadExample("j", "who ?", context, [("Japan", 4)])
    (row,) = convert_examples_to_features([example], tokenizer, is_training=True).features
    assert tokenizer.convert_ids_to_tokens(row["input_ids"][row["start_position"]:row["end_position"] + 1]) == ["japanese"]


def _target_spans(features, index: int) -> list[tuple[int, int]]:
    """The [first, last] passage-token indices of each answer-holding window's training target."""
    spans = []
    for row in features.features:
        if row["example_index"] == index and row["start_position"] != 0:
            window_start = features.spans[index][row["window_index"]][0]
            spans.append((window_start + row["start_position"] - row["context_offset"],
                          window_start + row["end_position"] - row["context_offset"]))
    return spans


def test_training_targets_are_exactly_the_tokens_of_the_gold_answer(shared_data, uncased_vocab):
    """Every question of the shared v1.1 train file: each window holding the answer is trained on the
    first token that contains the answer's first character and the last token that contains its last,
    never a token more (a longer target would teach longer answers, issue #28). The answer text is the
    target's text whenever the answer starts and ends at token boundaries."""
    tokenizer = BertTokenizer(uncased_vocab, do_lower_case=True)
    data = read_squad_file(shared_data / "squad/v1.1/train-v1.1.first11.json")
    features = convert_examples_to_features(data.examples, tokenizer, is_training=True)
    assert not features.skipped
    inside_words = 0
    for index, example in enumerate(data.examples):
        text, start_char = example.answers[0]
        end_char = start_char + len(text)
        offsets = features.offsets[index]
        spans = _target_spans(features, index)
        assert spans, example.qas_id
        for first, last in spans:
            assert offsets[first][0] <= start_char < offsets[first][1], example.qas_id
            assert offsets[last][0] < end_char <= offsets[last][1], example.qas_id
            target = example.context[offsets[first][0]:offsets[last][1]]
            on_boundaries = offsets[first][0] == start_char and offsets[last][1] == end_char
            assert (target == text) == on_boundaries, example.qas_id
        inside_words += not on_boundaries
    assert inside_words < len(data.examples) / 100  # e.g. "Japan" of "Japanese": a token holds more
    # "some 30 public performances": the target is "30", not "30 public".
    index = next(i for i, e in enumerate(data.examples) if e.qas_id == "56cbd2f96d243a140015ed71")
    ((first, last),) = _target_spans(features, index)
    assert data.examples[index].context[features.offsets[index][first][0]:features.offsets[index][last][1]] == "30"


BOUNDARY_CASES = [  # (context, gold answer, a neighbouring rival span): issue #28's boundary errors
    ("The fund had paid out over €90,000 by the end of 2009.", "€90,000", "over €90,000"),
    ("Laws on the matter differ between 30 US states and the federal government.", "30", "30 US states"),
    ("The strongest aftershock, a magnitude 6.7 event, came on 25 May.", "6.7", "a magnitude 6.7"),
    ("Children may be taught through homeschooling, or in the wider community.", "homeschooling",
     "homeschooling, or in the wider community"),
]


@pytest.mark.parametrize("context, gold, rival", BOUNDARY_CASES)
def test_answers_keep_exact_boundaries(uncased_vocab, context, gold, rival):
    """The training target of such an answer is its own tokens, and logits peaked on those tokens give
    back exactly its characters, though the rival span's extra tokens score almost as high: the text is
    the passage between the chosen tokens' offsets (no widening to whitespace-separated words, as
    Google's `get_final_text` starts from) and a span scores start + end logit only."""
    tokenizer = BertTokenizer(uncased_vocab, do_lower_case=True)
    example = SquadExample("b", "what ?", context, [(gold, context.index(gold))])
    (row,) = convert_examples_to_features([example], tokenizer, is_training=True).features
    offsets = convert_examples_to_features([example], tokenizer).offsets[0]
    first, last = row["start_position"] - row["context_offset"], row["end_position"] - row["context_offset"]
    assert context[offsets[first][0]:offsets[last][1]] == gold
    rival_start = context.index(rival)
    rival_first = next(t for t, (s, e) in enumerate(offsets) if e > rival_start)
    rival_last = max(t for t, (s, e) in enumerate(offsets) if s < rival_start + len(rival))
    assert context[offsets[rival_first][0]:offsets[rival_last][1]] == rival
    features = convert_examples_to_features([example], tokenizer)
    n, offset = len(row["input_ids"]), row["context_offset"]
    start, end = np.zeros(n, np.float32), np.zeros(n, np.float32)
    start[offset + first], end[offset + last] = 8.0, 8.0
    start[offset + rival_first] += 7.9
    end[offset + rival_last] += 7.9
    result = postprocess([example], features, [(start, end)])
    assert result.predictions["b"] == gold
    best = result.nbest["b"][0]
    assert (best["text"], best["start"], best["end"]) == (gold, context.index(gold), context.index(gold) + len(gold))
    # With the rival a hair higher, the rival span wins: the scores alone decide the boundaries.
    start[offset + rival_first] = max(start[offset + rival_first], 8.1)
    end[offset + rival_last] = max(end[offset + rival_last], 8.1)
    assert postprocess([example], features, [(start, end)]).predictions["b"] == rival


@pytest.mark.parametrize("name", ["squad/v1.1/train-v1.1.first11.json", "squad/v2.0/train-v2.0.first10.json"])
def test_targets_and_answers_match_run_qa(shared_data, minilm_dir, name):
    """Side by side with the peer (run_qa's preprocessing and post-processing, `benchmarks/squad_targets.py`)
    on real questions: the same training targets in characters, and, given the same score for each
    passage token in every window, the same answers (issue #28: no lean toward longer spans here)."""
    transformers = pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("squad_targets", REPO / "benchmarks" / "squad_targets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    examples = read_squad_file(shared_data / name).examples[:120]
    counts = module.compare_file(examples, BertTokenizer.from_pretrained(minilm_dir),
                                 transformers.AutoTokenizer.from_pretrained(str(minilm_dir)), SquadSettings(),
                                 window_noise=0.0)
    targets, answers = counts["targets"], counts["postprocessing"]
    assert targets["questions_whose_targets_differ"] == 0 and targets["answerable"] > 60
    assert targets["bertforge_target_not_gold"] == targets["peer_target_not_gold"]
    assert targets["bertforge_questions_without_target"] == targets["peer_questions_without_target"] == 0
    assert answers["answers_differ"] == 0 and answers["bertforge_words"] == answers["peer_words"]


def test_settings_are_checked(tokenizer):
    with pytest.raises(ValueError, match="max_query_length"):
        convert_examples_to_features([], tokenizer, SquadSettings(max_seq_length=60, max_query_length=64))


# ---------------------------------------------------------------------------- fine-tuning and prediction

def test_finetune_learns_a_handful_and_predicts(tmp_path, tiny_dir):
    train = write(tmp_path / "train.json", squad_json(TRAIN))
    settings = SquadSettings(max_seq_length=32, doc_stride=8, max_query_length=12)
    task = squad_task(tiny_dir, train, train, version="2.0", settings=settings, tune_threshold=True,
                      eval_batch_size=8)
    assert len(task.train_features) > 8  # the long passage runs as several windows
    out = tmp_path / "out"
    results = finetune(task, FinetuneArguments(output_dir=out, lr=2e-3, epochs=60, batch_size=8, warmup_ratio=0.05,
                                               weight_decay=0.0, seed=0, progress=False, log_every=1000))
    # Always "no answer" scores 2/8; the tiny random model learns most of the rest in a few seconds.
    assert results["task"] == "squad_v2" and results["metrics"]["f1"] >= 0.75, results
    for name in ("predictions.json", "nbest_predictions.json", "null_odds.json", "squad_eval.json", "config.json",
                 "model.safetensors", "vocab.txt", "eval_results.json"):
        assert (out / name).is_file(), name
    # The files agree with the official v2.0 script run on them.
    dataset = json.loads(train.read_text())["data"]
    predictions = json.loads((out / "predictions.json").read_text())
    null_odds = json.loads((out / "null_odds.json").read_text())
    official = evaluate_v2(dataset, predictions, null_odds)
    assert json.loads((out / "squad_eval.json").read_text()) == pytest.approx(official)
    assert results["metrics"]["f1"] == pytest.approx(official["f1"] / 100, abs=1e-12)
    assert set(predictions) == {qid for _, qs in TRAIN for qid, _, _ in qs}
    config = json.loads((out / "config.json").read_text())
    assert config["version_2_with_negative"] is True and config["finetuning_task"] == "squad_v2"
    assert config["squad"]["null_score_diff_threshold"] == results["metrics"]["null_score_diff_threshold"]
    assert config["squad"]["max_seq_length"] == 32
    # The fine-tuned model answers with its stored settings, and the answer pipeline sees it as v2.
    (answer,) = answer_questions(out, ["what is the capital of france ?"], ["paris is the capital of france ."])
    assert answer["answer"] == "paris" and (answer["start"], answer["end"]) == (0, 5)
    scores = predict_squad_file(out, train, tmp_path / "pred" / "p.json")
    assert (tmp_path / "pred" / "p.nbest.json").is_file() and (tmp_path / "pred" / "p.null_odds.json").is_file()
    assert scores["f1"] == pytest.approx(official["f1"])
    from bertforge.serving import pipeline

    assert pipeline("answer", model=out).config.extra["version_2_with_negative"] is True


def test_cli_finetune_and_predict(tmp_path, tiny_dir, capsys):
    answerable = [(context, [q for q in questions if q[2] is not None]) for context, questions in TRAIN]
    train = write(tmp_path / "v1.json", squad_json(answerable))
    out = tmp_path / "out"
    common = ["finetune", "squad", "--train-file", str(train), "--dev-file", str(train), "--model", str(tiny_dir),
              "--max-seq-length", "32", "--doc-stride", "8", "--max-query-length", "12", "--no-progress"]
    assert main(common + ["--output-dir", str(out), "--max-steps", "2", "--batch-size", "4"]) == 0
    printed = capsys.readouterr().out
    assert "squad: best at" in printed and "exact_match" in printed
    results = json.loads((out / "eval_results.json").read_text())
    assert set(results["metrics"]) == {"exact_match", "f1"}
    official = evaluate_v1(json.loads(train.read_text())["data"], json.loads((out / "predictions.json").read_text()))
    assert results["metrics"]["f1"] == pytest.approx(official["f1"] / 100, abs=1e-12)
    assert not (out / "null_odds.json").exists()

    assert main(["predict", "--model", str(out), "--question", "who works at acme ?",
                 "--context", "john smith works at acme ."]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert set(answer) == {"answer", "start", "end", "probability", "null_odds"}
    assert main(["predict", "--model", str(out), "--question", "who works at acme ?",
                 "--context", "john smith works at acme .", "--dtype", "fp32"]) == 0
    unpadded = json.loads(capsys.readouterr().out)
    assert unpadded["answer"] == answer["answer"]
    assert unpadded["probability"] == pytest.approx(answer["probability"], abs=1e-5)
    assert answer["answer"] == "john smith works at acme ."[answer["start"]:answer["end"]]
    assert main(["predict", "--model", str(out), "--input", str(train), "--output", str(tmp_path / "p.json")]) == 0
    assert set(json.loads((tmp_path / "p.json").read_text())) == {"q1", "q3", "q5", "q6", "q7", "q8"}

    # Errors are the user's: one line, exit status 2.
    assert main(common + ["--output-dir", str(tmp_path / "o2"), "--tune-threshold"]) == 2
    assert "--version 2.0" in capsys.readouterr().err
    v2 = write(tmp_path / "v2.json", squad_json(TRAIN))
    assert main(common[:3] + [str(v2)] + common[4:] + ["--output-dir", str(tmp_path / "o3")]) == 2
    assert "q2 is unanswerable" in capsys.readouterr().err


def test_version_defaults_follow_the_paper(monkeypatch, tmp_path, tiny_dir):
    import bertforge.training.finetune as engine

    seen = {}
    monkeypatch.setattr(engine, "finetune_grid", lambda task, args, lrs, seeds: seen.update(args=args) or {
        "task": task.name, "metrics": {"f1": 0.0}, "epoch": 0, "step": 0})
    train = write(tmp_path / "t.json", squad_json(TRAIN))
    for version, epochs, batch in (("2.0", 2.0, 48), ("1.1", 3.0, 32)):
        data = train if version == "2.0" else write(tmp_path / "t1.json", squad_json(
            [(c, [q for q in qs if q[2] is not None]) for c, qs in TRAIN]))
        assert main(["finetune", "squad", "--train-file", str(data), "--dev-file", str(data), "--model", str(tiny_dir),
                     "--output-dir", str(tmp_path / version), "--version", version, "--max-seq-length", "32",
                     "--max-query-length", "12", "--doc-stride", "8"]) == 0
        assert (seen["args"].epochs, seen["args"].batch_size, seen["args"].lr) == (epochs, batch, 5e-5)


# ---------------------------------------------------------------------------- the split script

def test_split_script_keeps_articles_apart(shared_data, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("split_squad", REPO / "scripts" / "split_squad.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--input", str(shared_data / SHARED_SQUAD), "--output-dir", str(tmp_path / "a")]) == 0
    assert "train:" in capsys.readouterr().out
    module.main(["--input", str(shared_data / SHARED_SQUAD), "--output-dir", str(tmp_path / "b")])
    train, held_out = (read_squad_file(tmp_path / "a" / f"{name}.json") for name in ("train", "eval"))
    assert not {e.title for e in train.examples} & {e.title for e in held_out.examples}
    assert len(train.examples) + len(held_out.examples) == 6078
    assert train.num_answerable + held_out.num_answerable == 2910
    assert (tmp_path / "a" / "train.json").read_bytes() == (tmp_path / "b" / "train.json").read_bytes()
    with pytest.raises(SystemExit):
        module.main(["--output-dir", str(REPO / "squad-split")])  # never into the repository


def test_answerable_script_writes_the_v11_dev_set(shared_data, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("squad_answerable", REPO / "scripts" / "squad_answerable.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    output = tmp_path / "dev-v1.1.json"
    assert module.main(["--input", str(shared_data / SHARED_SQUAD), "--output", str(output)]) == 0
    assert json.loads(capsys.readouterr().out)["questions"] == 2910
    dev = read_squad_file(output)
    assert dev.version == "1.1"
    assert len(dev.examples) == dev.num_answerable == 2910
    source = {e.qas_id: e for e in read_squad_file(shared_data / SHARED_SQUAD).examples}
    assert all(e.answers == source[e.qas_id].answers for e in dev.examples)
    with pytest.raises(SystemExit):
        module.main(["--input", str(shared_data / SHARED_SQUAD), "--output", str(output)])  # never overwrites
    (tmp_path / "bad.json").write_text('{"version": "2.0"}')
    with pytest.raises(SystemExit):
        module.main(["--input", str(tmp_path / "bad.json"), "--output", str(tmp_path / "out.json")])
    assert 'bad.json: no "data" list' in capsys.readouterr().err and not (tmp_path / "out.json").exists()


def test_tuned_threshold_keeps_the_official_decisions_with_a_margin():
    from bertforge.tasks.squad_postprocess import SquadPredictions, tune_null_threshold

    def qa(qid, answer):
        return {"id": qid, "question": "q", "answers": [{"text": answer, "answer_start": 0}] if answer else []}

    dataset = [{"title": "t", "paragraphs": [{"context": "paris rome", "qas": [
        qa("a", "paris"), qa("b", "rome"), qa("c", None), qa("d", None)]}]}]
    best_span = {"a": "paris", "b": "rome", "c": "paris", "d": "rome"}
    # Answering the two questions with odds <= -1.0 is best; the official threshold is -1.0 itself.
    odds = {"a": -3.0, "b": -1.0, "c": 2.0, "d": 5.0}
    predictions = SquadPredictions(predictions=dict(best_span), nbest={}, null_odds=odds, best_span=best_span)
    official = evaluate_v2(dataset, best_span, odds)
    assert official["best_f1"] == 100.0 and official["best_f1_thresh"] == -1.0
    tau = tune_null_threshold(dataset, predictions)
    assert tau == pytest.approx(0.5)  # midway to the next odds: "b" no longer sits on the threshold
    tuned = predictions.with_threshold(tau).predictions
    assert tuned == {"a": "paris", "b": "rome", "c": "", "d": ""}


def test_error_analysis_slices_and_boundaries(shared_data, tmp_path, capsys):
    """`benchmarks/squad_errors.py` on real questions (the first v1.1 train articles): the gold answers
    score 100 in every slice; answers widened by a word before them are all 'too long' boundary errors
    on the questions whose gold answer has a word before it, and score EM 0 there."""
    spec = importlib.util.spec_from_file_location("squad_errors", REPO / "benchmarks" / "squad_errors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    source = shared_data / "squad/v1.1/train-v1.1.first11.json"
    data = json.loads(source.read_text(encoding="utf-8"))
    data["data"] = data["data"][:2]
    dev = tmp_path / "dev.json"
    dev.write_text(json.dumps(data), encoding="utf-8")
    gold, widened = {}, {}
    for article in data["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                answer = qa["answers"][0]
                start, end = answer["answer_start"], answer["answer_start"] + len(answer["text"])
                before = paragraph["context"][:start].split()
                gold[qa["id"]] = answer["text"]
                widened[qa["id"]] = (paragraph["context"][start - len(before[-1]) - 1:end]
                                     if before and paragraph["context"][start - 1] == " " else answer["text"])
    (tmp_path / "gold.json").write_text(json.dumps(gold))
    (tmp_path / "wide.json").write_text(json.dumps(widened))
    assert module.main(["--dev-file", str(dev), "--side", f"gold={tmp_path / 'gold.json'}",
                        "--side", f"wide={tmp_path / 'wide.json'}"]) == 0
    report = json.loads(capsys.readouterr().out)
    sides = report["sides"]
    assert sides["gold"]["overall"] == {"exact_match": {"mean": 100.0}, "f1": {"mean": 100.0}}
    assert all(s["f1"]["mean"] == 100.0 for s in sides["gold"]["wh_word"].values())
    assert sum(s["n"] for s in sides["gold"]["passage_words"].values()) == report["questions"] == len(gold)
    widened_ids = [q for q in gold if widened[q] != gold[q]]
    wide = sides["wide"]
    assert len(widened_ids) > 0.5 * len(gold)
    # a widened answer can still match another gold answer, or normalise to it ("the X" -> "X")
    assert wide["boundary_too_long"]["mean"] <= 100.0 * len(widened_ids) / len(gold)
    assert wide["boundary_too_long"]["mean"] > 0.4 * 100.0 * len(widened_ids) / len(gold)
    assert wide["boundary_too_short"]["mean"] == wide["boundary_shifted"]["mean"] == 0.0
    assert wide["predicted_words"]["mean"] > sides["gold"]["predicted_words"]["mean"]
    assert module.wh_word("How many US states?") == "how many / how much"
    assert module.wh_word("In which year did it start, and who?") == "which"


def test_side_by_side_runs_each_side_once_and_resumes(shared_data, minilm_dir, tmp_path):
    """`benchmarks/squad_side_by_side.py` on a few real questions, with a tiny random model on MiniLM's
    vocabulary: one run per side, each side's recorded scores equal those re-read from its
    predictions.json (checked inside), the summary holds both sides and the goal test, and the same
    command again runs nothing."""
    import shutil
    import subprocess
    import sys

    import torch

    from bertforge.modeling import BertConfig, BertForQuestionAnswering

    model_dir = tmp_path / "tiny"
    model_dir.mkdir()
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(minilm_dir / name, model_dir / name)
    torch.manual_seed(0)
    BertForQuestionAnswering(BertConfig.preset("tiny", vocab_size=30522)).save_pretrained(model_dir)
    source = shared_data / "squad/v1.1/train-v1.1.first11.json"
    data = json.loads(source.read_text(encoding="utf-8"))
    data["data"] = data["data"][:1]
    data["data"][0]["paragraphs"] = data["data"][0]["paragraphs"][:2]
    dev = tmp_path / "dev.json"
    dev.write_text(json.dumps(data), encoding="utf-8")
    out = tmp_path / "out"
    command = [sys.executable, str(REPO / "benchmarks" / "squad_side_by_side.py"), "--model", str(model_dir),
               "--version", "1.1", "--train-file", str(source), "--dev-file", str(dev), "--output-dir", str(out),
               "--seeds", "1", "--max-train-examples", "16", "--epochs", "1", "--batch-size", "8",
               "--max-seq-length", "128", "--doc-stride", "32", "--num-threads", "1", "--device", "cpu"]
    first = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads(first.stdout)
    questions = sum(len(p["qas"]) for p in data["data"][0]["paragraphs"])
    for side in ("bertforge", "peer"):
        run = summary["sides"][side]["runs"]["1"]
        assert 0.0 <= run["scores"]["exact"] <= run["scores"]["f1"] <= 100.0
        assert len(run["epochs"]) == 1 and run["peak_rss_mib"] > 0
        assert len(json.loads((out / side / "seed1" / "predictions.json").read_text())) == questions
        record = json.loads((out / side / "seed1" / "run.json").read_text())
        assert record["command"][0] == "python" and str(REPO) not in " ".join(record["command"])
    assert isinstance(summary["goal_met"], bool)
    again = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert again.returncode == 0 and "start " not in again.stderr
    assert json.loads(again.stdout)["sides"] == summary["sides"]
    wrong = subprocess.run([*command, "--sides", "ours"], capture_output=True, text=True, cwd=tmp_path)
    assert wrong.returncode == 2 and "--sides: unknown ['ours']" in wrong.stderr


def test_a_v2_run_stopped_after_an_evaluation_resumes_to_the_uninterrupted_weights(tmp_path, tiny_dir,
                                                                                   stopped_and_resumed):
    """Issue 61 (1): SQuAD 2.0's tuned no-answer threshold is written into the model's config at each
    evaluation; a run stopped after one resumes and ends as a run never stopped (weights and threshold)."""
    train = write(tmp_path / "train.json", squad_json(TRAIN))
    settings = SquadSettings(max_seq_length=32, doc_stride=8, max_query_length=12)

    def make_task():
        return squad_task(tiny_dir, train, train, version="2.0", settings=settings, tune_threshold=True,
                          eval_batch_size=8)

    steps = -(-len(make_task().train_features) // 8)  # an epoch's
    args = FinetuneArguments(output_dir=tmp_path / "out", lr=2e-3, epochs=3, batch_size=8, seed=0, progress=False,
                             log_every=1000, save_every=steps + 1)
    straight, resumed, resumed_from = stopped_and_resumed(make_task, args, stop_at_evaluation=3)
    assert "null_score_diff_threshold" in resumed_from["squad"]  # saved after the first evaluation
    assert resumed["step"] == straight["step"] == 3 * steps
    for name, tensor in straight["model"].items():
        assert torch.equal(resumed["model"][name], tensor), name
    assert resumed["config"] == straight["config"]
