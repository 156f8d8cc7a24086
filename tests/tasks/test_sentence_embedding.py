"""The sentence-embedding family (bi-encoders): a toy STS task learns, predict / pipeline / server / distill
round trips, sentence-transformers' files both ways (its peer: test-only), and bad input named by file and line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.serving import pipeline
from bertforge.tasks.registry import family_for_checkpoint, resolve
from bertforge.tasks.sentence_embedding import (SentenceEncoder, SentencePooling, read_pooling, read_sentence_file,
                                                sentence_embedding_task)

pytestmark = pytest.mark.usefixtures("one_thread")

TOPICS = {"pets": ["cat", "dog", "puppy", "kitten", "pet", "fur"], "cars": ["car", "bus", "road", "wheel", "truck", "engine"],
          "food": ["bread", "soup", "apple", "cheese", "rice", "meal"]}
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "is", "and", *(w for ws in TOPICS.values() for w in ws)]


def _sentence(rng: random.Random, topic: str) -> str:
    return " ".join(["the", *rng.sample(TOPICS[topic], 2), "is", "a", rng.choice(TOPICS[topic])])


def _mixed(rng: random.Random, topics: tuple[str, ...]) -> str:
    words = [word for topic in topics for word in rng.sample(TOPICS[topic], 3 // len(topics) + 1)]
    rng.shuffle(words)
    return " ".join(["the", *words[:2], "is", "a", *words[2:]])


def _sts_rows(count: int, seed: int) -> list[tuple[str, str, float]]:
    """A learnable STS-like set: each sentence is about one or two topics; the gold score is 5 x the Jaccard
    overlap of the two sentences' topics (0, 5/3, 2.5 or 5)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        first, second = (tuple(rng.sample(list(TOPICS), rng.choice([1, 2]))) for _ in range(2))
        score = 5 * len(set(first) & set(second)) / len(set(first) | set(second))
        rows.append((_mixed(rng, first), _mixed(rng, second), round(score, 3)))
    return rows


def write_sts(path: Path, rows) -> Path:
    """GLUE STS-B's TSV layout (its ten columns, sentence1/sentence2/score named in the header)."""
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    path.write_text(header + "".join(f"{i}\ttoy\tnone\t2026\t{i}\tnone\tnone\t{a}\t{b}\t{s}\n"
                                     for i, (a, b, s) in enumerate(rows)))
    return path


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, save_tiny_checkpoint):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_sts"), WORDS)


@pytest.fixture(scope="module")
def sts_files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sts")
    return write_sts(directory / "train.tsv", _sts_rows(96, 0)), write_sts(directory / "dev.tsv", _sts_rows(48, 1))


@pytest.fixture(scope="module")
def trained(tiny_dir, sts_files, tmp_path_factory):
    """`bertforge finetune sentence-embedding` on the toy STS task (cosine loss), and its dev Spearman before."""
    train, dev = sts_files
    task = sentence_embedding_task(tiny_dir, train, dev, max_seq_length=16)
    before = task.evaluate(task.build_model())[0]["spearman"]
    out = tmp_path_factory.mktemp("runs") / "sts"
    assert main(["finetune", "sentence-embedding", "--train-file", str(train), "--dev-file", str(dev), "--model",
                 str(tiny_dir), "--output-dir", str(out), "--lr", "1e-3", "--epochs", "4", "--max-seq-length", "16",
                 "--no-progress"]) == 0
    return out, before


def test_a_toy_sts_task_learns(trained):
    out, before = trained
    results = json.loads((out / "eval_results.json").read_text())
    assert results["task"] == "sentence-embedding"
    assert results["metrics"]["spearman"] > before + 0.2 and results["metrics"]["spearman"] > 0.8
    assert "pearson" in results["metrics"]
    config = json.loads((out / "config.json").read_text())
    assert config["finetuning_task"] == "sentence-embedding" and config["architectures"] == ["BertModel"]
    assert config["sentence_embedding"]["pooling"] == "mean" and config["sentence_embedding"]["normalize"] is True
    assert family_for_checkpoint(out).name == "sentence-embedding"
    assert read_pooling(out) == SentencePooling("mean", True, 16)
    modules = json.loads((out / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    assert (out / "dev_predictions.jsonl").is_file()


def test_the_recipe_is_stated_once_in_the_family():
    family = resolve("sentence-embedding")
    assert resolve("sentence-similarity") is family and family.pipeline == "embed"
    command, = family.finetune
    assert command.recipe == {"lr": 2e-5, "batch_size": 16, "epochs": 4.0, "max_seq_length": 128}


def test_predict_writes_embeddings_and_pair_scores(trained, sts_files, tmp_path, capsys):
    out, _ = trained
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat is a dog\nthe car is a bus\n")
    npy = tmp_path / "emb.npy"
    assert main(["predict", "--model", str(out), "--input", str(texts), "--output", str(npy)]) == 0
    vectors = np.load(npy)
    assert vectors.shape == (2, 32) and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    jsonl = tmp_path / "emb.jsonl"
    assert main(["predict", "--model", str(out), "--input", str(texts), "--output", str(jsonl)]) == 0
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert np.allclose(np.array([r["embedding"] for r in rows]), vectors, atol=1e-6)
    # the pipeline serves the same vectors, with the model's pooling and normalisation read from its directory
    pipe = pipeline("sentence-embedding", model=out)
    assert type(pipe).__name__ == "EmbedPipeline"
    assert np.allclose(pipe(["the cat is a dog", "the car is a bus"]), vectors, atol=1e-5)
    scores = tmp_path / "scores.tsv"
    capsys.readouterr()
    assert main(["predict", "--model", str(out), "--input", str(sts_files[1]), "--output", str(scores)]) == 0
    assert "spearman" in capsys.readouterr().out
    lines = scores.read_text().splitlines()
    assert lines[0] == "index\tscore" and len(lines) == 49


def test_similarity_ranks_texts_and_is_served(trained):
    out, _ = trained
    pipe = pipeline("similarity", model=out)
    ranked, = pipe(["the cat is a puppy"], [["the car is a truck", "the dog is a kitten", "the soup is a meal"]])
    assert ranked[0]["text"] == "the dog is a kitten" and ranked[0]["index"] == 1
    assert [r["score"] for r in ranked] == sorted((r["score"] for r in ranked), reverse=True)
    from starlette.testclient import TestClient  # optional extra

    from bertforge.serving.server import create_app, load_pipelines
    pipelines = load_pipelines(str(out))
    assert set(pipelines) == {"embed", "similarity"}
    with TestClient(create_app(pipelines)) as client:
        answer = client.post("/v1/similarity", json={"queries": ["the cat is a puppy"],
                                                     "texts": [["the car is a truck", "the dog is a kitten"]],
                                                     "top_k": 1})
        assert answer.status_code == 200, answer.text
        assert [r["index"] for r in answer.json()["results"][0]] == [1]
        embedded = client.post("/v1/embed", json={"texts": ["the cat is a dog"]})
        assert np.allclose(embedded.json()["results"][0], pipeline("embed", model=out)(["the cat is a dog"])[0],
                           atol=1e-5)
        refused = client.post("/v1/embed", json={"texts": ["the cat"], "pooling": "cls"})
        assert refused.status_code == 422 and "declares 'mean'" in refused.json()["error"]


def test_contrastive_and_mnrl_losses_train(tiny_dir, sts_files, tmp_path):
    train, dev = sts_files
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"text_a": a, "text_b": b, "label": int(s >= 4)}) + "\n"
                             for a, b, s in _sts_rows(32, 3)))
    rng = random.Random(4)
    triplets = tmp_path / "triplets.csv"
    lines = ["anchor,positive,negative"]
    for _ in range(32):
        same, other = rng.sample(list(TOPICS), 2)
        lines.append(f"{_sentence(rng, same)},{_sentence(rng, same)},{_sentence(rng, other)}")
    triplets.write_text("\n".join(lines) + "\n")
    for loss, data in (("contrastive", pairs), ("mnrl", triplets)):
        out = tmp_path / loss
        assert main(["finetune", "sentence-embedding", "--train-file", str(data), "--dev-file", str(dev), "--model",
                     str(tiny_dir), "--output-dir", str(out), "--loss", loss, "--lr", "1e-3", "--epochs", "2",
                     "--max-seq-length", "16", "--no-progress", "--pooling", "cls"]) == 0
        results = json.loads((out / "eval_results.json").read_text())
        assert results["metrics"]["spearman"] > 0.3, (loss, results)
        assert read_pooling(out).pooling == "cls"


# ---------------------------------------------------------------------------- sentence-transformers, both ways

def _stsb_sentences(shared_data, count: int = 24) -> list[str]:
    rows = read_sentence_file(shared_data / "glue" / "STS-B" / "dev.tsv", texts=2, scored=True)
    return [text for row in rows[:count // 2] for text in row.texts]


def test_minilm_embeddings_equal_sentence_transformers(minilm_dir, shared_data, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    sentences = _stsb_sentences(shared_data, 1000)  # issue 60: 1,000 dev sentences
    assert read_pooling(minilm_dir) == SentencePooling("mean", True, 256)
    ours = pipeline("embed", model=minilm_dir)(sentences)
    theirs = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(sentences, convert_to_numpy=True)
    assert np.abs(ours - theirs).max() <= 1e-5
    # `bertforge predict --task sentence-embedding` reads the same directory the same way
    texts = tmp_path / "sentences.txt"
    texts.write_text("\n".join(sentences[:4]) + "\n")
    assert main(["predict", "--model", str(minilm_dir), "--task", "sentence-embedding", "--input", str(texts),
                 "--output", str(tmp_path / "e.npy")]) == 0
    assert np.abs(np.load(tmp_path / "e.npy") - theirs[:4]).max() <= 1e-5


def test_saved_model_loads_in_sentence_transformers(trained):
    st = pytest.importorskip("sentence_transformers")
    out, _ = trained
    texts = ["the cat is a dog", "the bread is a soup and a meal"]
    ours = pipeline("embed", model=out)(texts)
    theirs = st.SentenceTransformer(str(out), device="cpu").encode(texts, convert_to_numpy=True)
    assert np.abs(ours - theirs).max() <= 1e-5


def test_a_sentence_transformers_directory_loads_with_its_pooling(minilm_dir):
    model = SentenceEncoder.from_pretrained(minilm_dir)
    assert model.sentence_pooling == SentencePooling("mean", True, 256)
    assert family_for_checkpoint(minilm_dir).pipeline == "embed"


# ---------------------------------------------------------------------------- bad input: one line, file and line

@pytest.mark.parametrize("content, loss, message", [
    ("sentence1\tsentence2\tscore\nthe cat\tthe dog\t7\n", "cosine", "train.tsv:2: score 7 is outside the declared range [0, 5]"),
    ("sentence1\tsentence2\tscore\nthe cat\tthe dog\t3\nthe cat\n", "cosine", "train.tsv:3: a row with 1 text(s) where 2"),
    ("sentence1\tscore\nthe cat\t3\n", "cosine", "train.tsv:1: pairs are expected"),
    ("sentence1\tsentence2\tscore\nthe cat\t \t3\n", "cosine", "train.tsv:2: empty text"),
    ("sentence1\tsentence2\tscore\nthe cat\tthe dog\t0.5\n", "contrastive", "train.tsv:2: label 0.5 is not 0 or 1"),
    ("sentence1\tsentence2\tscore\nthe cat\tthe dog\tfive\n", "cosine", "train.tsv:2: score 'five' is not a number"),
])
def test_bad_training_rows_are_one_line_naming_file_and_line(tiny_dir, sts_files, tmp_path, content, loss, message):
    train = tmp_path / "train.tsv"
    train.write_text(content)
    with pytest.raises(ValueError) as error:
        sentence_embedding_task(tiny_dir, train, sts_files[1], loss=loss)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_bad_pipeline_and_server_input_is_named(trained):
    from bertforge.serving import PipelineInputError

    out, _ = trained
    pipe = pipeline("similarity", model=out)
    with pytest.raises(PipelineInputError, match=r"texts\[0\]\[1\] is empty"):
        pipe(["the cat"], [["the dog", "  "]])
    with pytest.raises(PipelineInputError, match="1 queries but 2 lists of texts"):
        pipe(["the cat"], [["the dog"], ["the bus"]])
    with pytest.raises(PipelineInputError, match="top_k must be a positive integer"):
        pipe(["the cat"], [["the dog"]], top_k=0)
    with pytest.raises(PipelineInputError, match=r"texts\[0\] is empty"):
        pipeline("embed", model=out)(["", "the cat"])


def test_a_pooling_the_checkpoint_does_not_declare_is_refused(trained, sts_files, tmp_path, minilm_dir, capsys):
    out, _ = trained
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat\n")
    assert main(["predict", "--model", str(out), "--input", str(texts), "--output", str(tmp_path / "e.npy"),
                 "--pooling", "cls"]) != 0
    error = capsys.readouterr().err.strip()
    assert error == f"bertforge predict: error: --pooling cls: {out} declares mean pooling; leave --pooling out or give mean"
    with pytest.raises(ValueError, match=r"--pooling cls: .* declares mean pooling"):
        sentence_embedding_task(minilm_dir, sts_files[0], sts_files[1], pooling="cls")


# ---------------------------------------------------------------------------- distillation

def test_distill_regresses_a_smaller_student_onto_the_teachers_embeddings(trained, sts_files, tmp_path):
    teacher, _ = trained
    train, dev = sts_files
    out = tmp_path / "student"
    assert main(["distill", "--teacher", str(teacher), "--train-file", str(train), "--dev-file", str(dev),
                 "--output-dir", str(out), "--layers", "1", "--lr", "1e-3", "--epochs", "3", "--batch-size", "16",
                 "--no-progress"]) == 0
    results = json.loads((out / "eval_results.json").read_text())
    assert results["metrics"]["teacher_agreement"] > 0.8 and results["metrics"]["spearman"] > 0.7
    info = json.loads((out / "distillation.json").read_text())
    assert info["family"] == "sentence-embedding" and info["pooling"] == "mean" and info["normalize"] is True
    teacher_layers = json.loads((teacher / "config.json").read_text())["num_hidden_layers"]
    assert info["teacher_layers"] == [teacher_layers - 1]  # a bi-encoder's student keeps the last layer
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and family_for_checkpoint(out).name == "sentence-embedding"
    assert read_pooling(out) == read_pooling(teacher)  # served as the teacher is: pipeline, predict, ST files
    vectors = pipeline("embed", model=out)(["the cat is a dog"])
    assert np.isclose(np.linalg.norm(vectors), 1.0, atol=1e-5)
