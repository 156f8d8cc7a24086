"""NER (CoNLL) and the feature-based approach: reader, sub-word alignment, document-context windows,
conlleval metrics, fine-tuning end to end on the shared engine, `predict`, and the BiLSTM on cached features."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.modeling import BertModel
from bertforge.modeling.heads import TaskOutput
from bertforge.tasks.feature_based import (FEATURE_STRATEGIES, BiLSTMTagger, cache_word_features, feature_ner_task)
from bertforge.tasks.tag import ner_task, predict_conll, predict_window_tags
from bertforge.tasks.conll import (IGNORE_INDEX, build_windows, label_list_from, ner_metrics, read_conll, to_iob2,
                                   word_piece_ids)
from bertforge.tokenization import BertTokenizer
from bertforge.training.finetune import FinetuneArguments, finetune

# A learnable toy NER task: the tag follows from the word (and "new york" is one two-word LOC).
PERSONS = ["alice", "bob", "carol"]
PLACES = ["paris", "hamburg"]  # "hamburg" splits into "ham ##burg"
ORGS = ["acme"]  # "acme" splits into "ac ##me"
FILLER = ["the", "met", "in", "visited", "said", "and", "today", "from", "smith"]
PIECES = ["ham", "##burg", "ac", "##me", "new", "york"]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ","] + PERSONS + ["paris"] + FILLER + PIECES


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, save_tiny_checkpoint) -> Path:
    """A random 2-layer encoder with a word-level vocabulary (some words split into two pieces)."""
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), VOCAB)


@pytest.fixture(scope="module")
def tiny_model_4(tmp_path_factory, save_tiny_checkpoint) -> Path:
    """The same with 4 layers, for the last-four-layers feature strategies."""
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny4"), VOCAB, num_hidden_layers=4)


def toy_sentence(rng: random.Random) -> list[tuple[str, str]]:
    words: list[tuple[str, str]] = []
    for _ in range(rng.randint(2, 6)):
        roll = rng.random()
        if roll < 0.2:
            words.append((rng.choice(PERSONS), "B-PER"))
        elif roll < 0.3:
            words += [("new", "B-LOC"), ("york", "I-LOC")]
        elif roll < 0.45:
            words.append((rng.choice(PLACES), "B-LOC"))
        elif roll < 0.55:
            words.append((rng.choice(ORGS), "B-ORG"))
        else:
            words.append((rng.choice(FILLER), "O"))
    return words + [(".", "O")]


def write_toy_conll(path: Path, sentences: int, seed: int, per_document: int = 4) -> Path:
    """CoNLL-2003 columns (word POS chunk TAG), -DOCSTART- every `per_document` sentences."""
    rng = random.Random(seed)
    lines = []
    for index in range(sentences):
        if index % per_document == 0:
            lines += ["-DOCSTART- -X- -X- O", ""]
        lines += [f"{word} NN I-NP {tag}" for word, tag in toy_sentence(rng)] + [""]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def toy_files(tmp_path_factory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("conll")
    return write_toy_conll(directory / "train.txt", 240, 1), write_toy_conll(directory / "dev.txt", 60, 2)


# ---------------------------------------------------------------------------- reading

def test_reader_counts_on_the_shared_conll_files(shared_data):
    train = read_conll(shared_data / "conll2003" / "train.txt")
    valid = read_conll(shared_data / "conll2003" / "valid.txt")
    assert len(train) == 14_041 and len({s.document for s in train}) == 946
    assert len(valid) == 3_250 and len({s.document for s in valid}) == 216
    assert sum(map(len, train)) == 203_621 and sum(map(len, valid)) == 51_362
    assert train[0].words[:3] == ["EU", "rejects", "German"] and train[0].tags[:3] == ["B-ORG", "O", "B-MISC"]
    assert label_list_from(train) == ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]


def test_iob1_is_read_as_iob2(tmp_path):
    # IOB1: an entity starts with I- unless it directly follows one of its own type (then B-).
    path = tmp_path / "iob1.txt"
    path.write_text("-DOCSTART- -X- O\n\nU.N. NNP I-ORG\nofficial NN O\nEkeus NNP I-PER\nheads VBZ O\n"
                    "for IN O\nBaghdad NNP I-LOC\nBasra NNP B-LOC\nCity NNP I-LOC\n. . O\n")
    sentence, = read_conll(path)
    assert sentence.tags == ["B-ORG", "O", "B-PER", "O", "O", "B-LOC", "B-LOC", "I-LOC", "O"]
    assert sentence.columns[0] == ["U.N.", "NNP", "I-ORG"]  # the file's columns are kept as read
    assert to_iob2(sentence.tags) == sentence.tags  # IOB2 passes unchanged
    assert to_iob2(["I-PER", "I-LOC", "I-LOC", "O", "I-LOC"]) == ["B-PER", "B-LOC", "I-LOC", "O", "B-LOC"]


@pytest.mark.parametrize("text, line, message", [
    ("a NN O\nb NN\n", 2, "2 columns where the file has 3"),
    ("a NN O\n\nb NN X-PER\n", 3, "not a tag"),
    ("a\nb\n", 1, "one column"),
])
def test_malformed_lines_name_file_and_line(tmp_path, text, line, message):
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"bad\.txt:{line}: .*{message}"):
        read_conll(path)


# ---------------------------------------------------------------------------- sub-words and windows

def test_first_sub_token_carries_the_label(minilm_dir, tmp_path):
    path = tmp_path / "s.txt"
    path.write_text("Grobbelaar NNP B-NP B-PER\nbeat VBD B-VP O\nEkeus NNP B-NP B-PER\n")
    sentences = read_conll(path)
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    pieces = word_piece_ids(tokenizer, sentences[0].words)
    assert len(pieces["Grobbelaar"]) == 4 and len(pieces["Ekeus"]) == 2  # gr ##ob ##bel ##aar, ek ##eus
    labels = ["O", "B-PER"]
    window, = build_windows(sentences, pieces, 32, tokenizer.cls_token_id, tokenizer.sep_token_id,
                            {label: i for i, label in enumerate(labels)})
    tokens = tokenizer.convert_ids_to_tokens(window["input_ids"])
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    n_first = len(pieces["Grobbelaar"])
    assert window["positions"] == [1, 1 + n_first, 2 + n_first]
    expected = [IGNORE_INDEX] * len(tokens)
    expected[1], expected[1 + n_first], expected[2 + n_first] = 1, 0, 1
    assert window["labels"] == expected  # continuation pieces, [CLS] and [SEP] are ignored
    assert all(tokens[p + 1].startswith("##") for p in (1, 2 + n_first))


class EchoTagger(torch.nn.Module):
    """A stand-in model: the 'tag' of each position is the id of its own input token."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        return TaskOutput(torch.nn.functional.one_hot(input_ids, self.vocab_size).float())


def test_document_context_fills_the_window_and_predicts_only_the_centre(tiny_model, tmp_path):
    path = tmp_path / "doc.txt"
    path.write_text("-DOCSTART- -X- -X- O\n\n"
                    "alice NN O B-PER\nmet NN O O\nbob NN O B-PER\n. NN O O\n\n"
                    "paris NN O B-LOC\n. NN O O\n\n"
                    "the NN O O\nacme NN O B-ORG\n. NN O O\n\n"
                    "-DOCSTART- -X- -X- O\n\n"
                    "carol NN O B-PER\nsaid NN O O\n")
    sentences = read_conll(path)
    tokenizer = BertTokenizer.from_pretrained(tiny_model)
    pieces = word_piece_ids(tokenizer, (w for s in sentences for w in s.words))
    labels = label_list_from(sentences)
    label_map = {label: i for i, label in enumerate(labels)}
    windows = build_windows(sentences, pieces, 10, tokenizer.cls_token_id, tokenizer.sep_token_id, label_map,
                            document_context=True)
    assert [w["sentence"] for w in windows] == [0, 1, 2, 3]
    tokens = [tokenizer.convert_ids_to_tokens(w["input_ids"]) for w in windows]
    # The centre sentence "paris ." gets 3 tokens of context on each side, from its own document.
    assert tokens[1] == ["[CLS]", "met", "bob", ".", "paris", ".", "the", "ac", "##me", "[SEP]"]
    assert [i for i, label in enumerate(windows[1]["labels"]) if label != IGNORE_INDEX] == [4, 5]
    # The last sentence of a document takes all its context from the left; nothing crosses documents.
    assert tokens[2] == ["[CLS]", "bob", ".", "paris", ".", "the", "ac", "##me", ".", "[SEP]"]
    assert tokens[3] == ["[CLS]", "carol", "said", "[SEP]"]
    # Without document context, the window is the sentence alone.
    plain = build_windows(sentences, pieces, 10, tokenizer.cls_token_id, tokenizer.sep_token_id, label_map)
    assert tokenizer.convert_ids_to_tokens(plain[1]["input_ids"]) == ["[CLS]", "paris", ".", "[SEP]"]
    # Each word is predicted from its own first piece in the window of its sentence, never from context.
    echo = EchoTagger(len(tokenizer.vocab))
    id2token = {i: t for t, i in tokenizer.vocab.items()}
    predicted = predict_window_tags(echo, windows, [len(s) for s in sentences], id2token, batch_size=3)
    assert predicted == [["alice", "met", "bob", "."], ["paris", "."], ["the", "ac", "."], ["carol", "said"]]


def test_a_sentence_longer_than_the_window_is_split_into_chunks_of_whole_words(tiny_model, tmp_path):
    path = tmp_path / "long.txt"
    words = ["alice", "acme", "hamburg", "met", "bob", "acme", "."]  # 10 pieces
    path.write_text("\n".join(f"{w} O" for w in words) + "\n")
    sentences = read_conll(path)
    tokenizer = BertTokenizer.from_pretrained(tiny_model)
    pieces = word_piece_ids(tokenizer, words)
    windows = build_windows(sentences, pieces, 8, tokenizer.cls_token_id, tokenizer.sep_token_id, {"O": 0})
    # A window holds 6 pieces: alice ac ##me ham ##burg met | bob ac ##me . (with 2 pieces of left context)
    assert [w["word_start"] for w in windows] == [0, 4]
    assert tokenizer.convert_ids_to_tokens(windows[1]["input_ids"])[1:-1] == ["##burg", "met", "bob", "ac", "##me", "."]
    assert all(len(w["input_ids"]) <= 8 for w in windows)
    echo = EchoTagger(len(tokenizer.vocab))
    id2token = {i: t for t, i in tokenizer.vocab.items()}
    assert predict_window_tags(echo, windows, [7], id2token) == [["alice", "ac", "ham", "met", "bob", "ac", "."]]


# ---------------------------------------------------------------------------- metrics

GOLD = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O", "B-MISC", "I-MISC"]]
PREDICTED = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O", "B-MISC", "O"]]


def test_metrics_match_hand_computed_conlleval_values():
    # Gold: PER, LOC, ORG, MISC(2 words). Predicted: PER (right), ORG (wrong type), ORG (right), MISC (wrong end).
    metrics = ner_metrics(GOLD, PREDICTED)
    assert metrics["precision"] == pytest.approx(2 / 4) and metrics["recall"] == pytest.approx(2 / 4)
    assert metrics["f1"] == pytest.approx(0.5)
    assert metrics["accuracy"] == pytest.approx(6 / 8)
    assert metrics["f1_PER"] == 1.0 and metrics["f1_LOC"] == 0.0 and metrics["f1_MISC"] == 0.0
    assert metrics["precision_ORG"] == 0.5 and metrics["recall_ORG"] == 1.0
    assert metrics["f1_ORG"] == pytest.approx(2 / 3)
    # The same entities written in IOB1 score the same (conlleval's chunk rules read both).
    iob1 = [["I-PER", "I-PER", "O", "I-LOC"], ["I-ORG", "O", "I-MISC", "I-MISC"]]
    assert ner_metrics(iob1, PREDICTED)["f1"] == pytest.approx(0.5)
    from seqeval.metrics import f1_score, precision_score, recall_score

    assert metrics["f1"] == pytest.approx(f1_score(GOLD, PREDICTED))
    assert metrics["precision"] == pytest.approx(precision_score(GOLD, PREDICTED))
    assert metrics["recall"] == pytest.approx(recall_score(GOLD, PREDICTED))
    assert ner_metrics(GOLD, GOLD)["f1"] == 1.0


# ---------------------------------------------------------------------------- fine-tuning and predict

def test_finetune_beats_the_majority_class_and_predict_writes_conll(tiny_model, toy_files, tmp_path):
    train, dev = toy_files
    out = tmp_path / "out"
    code = main(["finetune", "ner", "--train-file", str(train), "--dev-file", str(dev), "--model", str(tiny_model),
                 "--output-dir", str(out), "--lr", "5e-3", "--epochs", "6", "--batch-size", "16",
                 "--document-context", "--max-seq-length", "24", "--no-progress", "--log-every", "20"])
    assert code == 0
    results = json.loads((out / "eval_results.json").read_text())
    assert results["task"] == "ner"
    # Always predicting the majority tag "O" finds no entity (F1 0) and gets the O share of tags right.
    gold = [s.tags for s in read_conll(dev)]
    majority_accuracy = sum(t == "O" for s in gold for t in s) / sum(map(len, gold))
    assert results["metrics"]["f1"] > 0.8, results["metrics"]
    assert results["metrics"]["accuracy"] > majority_accuracy
    config = json.loads((out / "config.json").read_text())
    assert config["finetuning_task"] == "ner" and config["ner_document_context"] is True
    assert config["id2label"]["0"] == "O" and "B-LOC" in config["id2label"].values()
    # dev predictions: the dev file's columns plus the predicted tag; -DOCSTART- lines kept.
    lines = (out / "dev_predictions.txt").read_text().splitlines()
    assert lines[0] == "-DOCSTART- -X- -X- O O" and len(lines[2].split()) == 5

    # predict on an unlabelled one-column file: each line becomes "word TAG".
    plain = tmp_path / "plain.txt"
    plain.write_text("alice\nvisited\nnew\nyork\n.\n\nacme\nsaid\n")
    assert main(["predict", "--model", str(out), "--input", str(plain), "--output", str(tmp_path / "p.txt")]) == 0
    rows = [line.split() for line in (tmp_path / "p.txt").read_text().splitlines()]
    assert rows[:6] == [["alice", "B-PER"], ["visited", "O"], ["new", "B-LOC"], ["york", "I-LOC"], [".", "O"], []]
    assert rows[6][0] == "acme" and len(rows[6]) == 2
    # predict on a labelled file scores it (the gold tags are the last column).
    path, metrics = predict_conll(out, dev, tmp_path / "dev_pred.txt")
    assert metrics["f1"] == pytest.approx(results["metrics"]["f1"])
    assert path.read_text() == (out / "dev_predictions.txt").read_text()
    path, _ = predict_conll(out, dev, tmp_path / "dev_pred_fp32.txt", dtype="fp32")  # unpadded: the same tags
    assert path.read_text() == (out / "dev_predictions.txt").read_text()


def test_ner_task_trains_through_the_engine_with_a_token_level_loss(tiny_model, toy_files, tmp_path):
    train, dev = toy_files
    task = ner_task(tiny_model, train, dev, max_seq_length=32)
    batch = task.collate(task.train_features[:4])
    assert task.count_fn(batch) == sum(len(f["positions"]) for f in task.train_features[:4])
    assert batch["labels"].shape == batch["input_ids"].shape
    results = finetune(task, FinetuneArguments(output_dir=tmp_path / "o", lr=5e-3, epochs=1, batch_size=16,
                                               progress=False))
    assert set(results["metrics"]) >= {"f1", "precision", "recall", "accuracy", "f1_PER", "f1_LOC", "f1_ORG"}


# ---------------------------------------------------------------------------- the feature-based approach

def test_feature_strategies_pick_the_right_hidden_states(tiny_model_4, toy_files):
    _, dev = toy_files
    sentences = read_conll(dev)[:5]
    tokenizer = BertTokenizer.from_pretrained(tiny_model_4)
    pieces = word_piece_ids(tokenizer, (w for s in sentences for w in s.words))
    windows = build_windows(sentences, pieces, 32, tokenizer.cls_token_id, tokenizer.sep_token_id)
    encoder = BertModel.from_pretrained(tiny_model_4)
    window = windows[0]
    with torch.no_grad():
        states = encoder(torch.tensor([window["input_ids"]]), output_hidden_states=True).hidden_states
    first = window["positions"]
    expected = {
        "embeddings": states[0][0, first], "last": states[4][0, first], "second-to-last": states[3][0, first],
        "sum-last-4": sum(states[i][0, first] for i in (1, 2, 3, 4)),
        "concat-last-4": torch.cat([states[i][0, first] for i in (1, 2, 3, 4)], -1),
        "sum-all": sum(states[i][0, first] for i in (1, 2, 3, 4)),
    }
    assert set(expected) == set(FEATURE_STRATEGIES)
    for strategy, vectors in expected.items():
        cached = cache_word_features(encoder, windows, [len(s) for s in sentences], strategy, dtype=np.float32)
        assert cached.values.shape == (sum(map(len, sentences)), vectors.shape[-1])
        np.testing.assert_allclose(cached.sentence(0), vectors.numpy(), atol=1e-5, err_msg=strategy)
    assert cache_word_features(encoder, windows, [len(s) for s in sentences], "last").values.dtype == np.float16


def test_feature_based_bilstm_trains_on_cached_features_and_predicts(tiny_model_4, toy_files, tmp_path):
    train, dev = toy_files
    task = feature_ner_task(tiny_model_4, train, dev, features="concat-last-4", lstm_hidden=16, progress=False)
    out = tmp_path / "fb"
    results = finetune(task, FinetuneArguments(output_dir=out, lr=1e-2, epochs=3, batch_size=16, progress=False))
    assert results["metrics"]["f1"] > 0.5, results["metrics"]  # the majority class scores 0
    model = BiLSTMTagger.from_pretrained(out)
    assert model.config["input_size"] == 4 * 32 and model.config["feature_based"]["features"] == "concat-last-4"
    path, metrics = predict_conll(out, dev, tmp_path / "pred.txt")
    assert metrics["f1"] == pytest.approx(results["metrics"]["f1"])
    assert path.read_text() == (out / "dev_predictions.txt").read_text()
    with pytest.raises(ValueError, match="feature-based"):
        predict_conll(out, dev, tmp_path / "pred8.txt", dtype="int8")
