"""Models named by Hugging Face Hub id: resolved through huggingface_hub's cache, offline.

Each test builds a cache in the hub's own layout (`models--org--name/{blobs,refs,snapshots}`, written by
tests/conftest.py's `add_to_hub_cache`) under tmp_path, with HF_HUB_CACHE pointing to it and
HF_HUB_OFFLINE=1 (the `hub_cache` fixture): nothing here touches a network.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.modeling import BertConfig, BertForSequenceClassification, BertModel
from bertforge.modeling.pretrained import resolve_model_dir
from bertforge.serving.pipelines import pipeline

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "a", "dog", "##s", "."]
MAIN = "a" * 40
OTHER = "b" * 40


def tiny_model_files(tmp_path: Path, seed: int) -> dict[str, bytes]:
    """config.json, model.safetensors, vocab.txt and tokenizer_config.json of a tiny random BertModel."""
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32)
    directory = tmp_path / f"saved{seed}"
    BertModel(config).save_pretrained(directory)
    files = {name: (directory / name).read_bytes() for name in ("config.json", "model.safetensors")}
    files["vocab.txt"] = "".join(t + "\n" for t in VOCAB).encode()
    files["tokenizer_config.json"] = json.dumps({"do_lower_case": True}).encode()
    return files


def word_embeddings(directory: str | Path) -> torch.Tensor:
    return BertModel.from_pretrained(directory).embeddings.word_embeddings.weight


def test_a_hub_id_resolves_to_its_cached_snapshot(tmp_path, hub_cache, add_to_hub_cache):
    files = tiny_model_files(tmp_path, seed=0)
    snapshot = add_to_hub_cache(hub_cache, "acme/tiny-bert", MAIN, files)
    assert resolve_model_dir("acme/tiny-bert") == snapshot
    # from_pretrained and pipeline(model=...) take the name as they take a directory.
    expected = word_embeddings(tmp_path / "saved0")
    assert torch.equal(word_embeddings("acme/tiny-bert"), expected)
    classifier = BertForSequenceClassification.from_pretrained("acme/tiny-bert", num_labels=2)
    assert torch.equal(classifier.bert.embeddings.word_embeddings.weight, expected)
    embed = pipeline("embed", model="acme/tiny-bert")
    assert embed.model_dir == snapshot and embed.tokenizer.tokenize("The cats sat.") == ["the", "cat", "##s", "sat", "."]


def test_revision_picks_that_snapshot(tmp_path, hub_cache, add_to_hub_cache):
    add_to_hub_cache(hub_cache, "acme/tiny-bert", MAIN, tiny_model_files(tmp_path, seed=0))
    other = add_to_hub_cache(hub_cache, "acme/tiny-bert", OTHER, tiny_model_files(tmp_path, seed=1), ref="v1")
    assert resolve_model_dir("acme/tiny-bert@v1") == other  # a branch or tag, through refs/
    assert resolve_model_dir(f"acme/tiny-bert@{OTHER}") == other  # a commit
    assert torch.equal(word_embeddings("acme/tiny-bert@v1"), word_embeddings(tmp_path / "saved1"))
    assert not torch.equal(word_embeddings("acme/tiny-bert@v1"), word_embeddings("acme/tiny-bert"))
    with pytest.raises(FileNotFoundError, match=r"acme/tiny-bert \(revision v2\) is not in the Hub cache"):
        resolve_model_dir("acme/tiny-bert@v2")


def test_a_local_directory_shadows_a_hub_name(tmp_path, hub_cache, add_to_hub_cache, monkeypatch):
    add_to_hub_cache(hub_cache, "acme/tiny-bert", MAIN, tiny_model_files(tmp_path, seed=0))
    work = tmp_path / "work"
    local = work / "acme" / "tiny-bert"
    local.mkdir(parents=True)
    for name, content in tiny_model_files(tmp_path, seed=1).items():
        (local / name).write_bytes(content)
    monkeypatch.chdir(work)
    assert resolve_model_dir("acme/tiny-bert") == Path("acme/tiny-bert")
    assert torch.equal(word_embeddings("acme/tiny-bert"), word_embeddings(tmp_path / "saved1"))


def test_offline_without_a_cached_copy_is_one_clear_error(tmp_path, hub_cache, capsys):
    with pytest.raises(FileNotFoundError) as error:
        resolve_model_dir("google-bert/bert-base-uncased")
    message = str(error.value)
    assert message == (
        f"google-bert/bert-base-uncased: no such local directory, and the Hub model google-bert/bert-base-uncased "
        f"is not in the Hub cache {hub_cache} while HF_HUB_OFFLINE=1: unset HF_HUB_OFFLINE to download it, or run "
        "`hf download google-bert/bert-base-uncased config.json model.safetensors vocab.txt tokenizer_config.json` "
        "where the Hub is reachable")
    # The CLI says it in one line, for any command that names a model.
    out = tmp_path / "features.jsonl"
    (tmp_path / "in.txt").write_text("the cat sat\n")
    assert main(["extract-features", "--model", "google-bert/bert-base-uncased", "--input-file",
                 str(tmp_path / "in.txt"), "--output-file", str(out)]) == 2
    assert capsys.readouterr().err == f"bertforge extract-features: error: {message}\n"
    assert not out.exists()
    # A path that cannot be a Hub id keeps the plain message.
    with pytest.raises(FileNotFoundError, match=f"^model directory not found: {tmp_path / 'missing'}$"):
        resolve_model_dir(tmp_path / "missing")


def test_the_cli_takes_a_hub_id(tmp_path, hub_cache, add_to_hub_cache):
    add_to_hub_cache(hub_cache, "acme/tiny-bert", MAIN, tiny_model_files(tmp_path, seed=0))
    (tmp_path / "in.txt").write_text("the cat sat on the mat\n")
    out = tmp_path / "features.jsonl"
    assert main(["extract-features", "--model", "acme/tiny-bert", "--input-file", str(tmp_path / "in.txt"),
                 "--output-file", str(out), "--layers", "-1"]) == 0
    record = json.loads(out.read_text())
    assert [f["token"] for f in record["features"]] == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]


def test_weights_in_pytorch_model_bin_only(tmp_path, hub_cache, add_to_hub_cache):
    files = tiny_model_files(tmp_path, seed=0)
    tensors = BertModel.from_pretrained(tmp_path / "saved0").state_dict()
    torch.save(tensors, tmp_path / "weights.bin")
    files["pytorch_model.bin"] = (tmp_path / "weights.bin").read_bytes()
    del files["model.safetensors"]
    add_to_hub_cache(hub_cache, "acme/old-bert", MAIN, files)
    assert torch.equal(word_embeddings("acme/old-bert"), word_embeddings(tmp_path / "saved0"))
    del files["pytorch_model.bin"]
    add_to_hub_cache(hub_cache, "acme/no-weights", MAIN, files)
    with pytest.raises(FileNotFoundError, match="acme/no-weights has no model.safetensors or pytorch_model.bin in"):
        resolve_model_dir("acme/no-weights")


def test_a_finetuning_task_takes_a_hub_id(tmp_path, hub_cache, add_to_hub_cache):
    from bertforge.tasks.classify import classify_task

    add_to_hub_cache(hub_cache, "acme/tiny-bert", MAIN, tiny_model_files(tmp_path, seed=0))
    for split in ("train", "dev"):
        (tmp_path / f"{split}.tsv").write_text("text\tlabel\nthe cat sat\tyes\na dog sat on the mat\tno\n")
    task = classify_task("acme/tiny-bert", tmp_path / "train.tsv", tmp_path / "dev.tsv")
    assert task.train_features[0]["input_ids"][:5] == [2, 5, 6, 7, 3]  # [CLS] the cat sat [SEP]
    model = task.build_model()
    assert torch.equal(model.bert.embeddings.word_embeddings.weight, word_embeddings(tmp_path / "saved0"))


def test_online_only_the_files_bertforge_reads_are_fetched(tmp_path, hub_cache, add_to_hub_cache, monkeypatch):
    """Online, with huggingface_hub's download replaced by the cache it would fill (no network)."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    files = tiny_model_files(tmp_path, seed=0)
    snapshot = add_to_hub_cache(hub_cache, "acme/tiny-bert", MAIN, files)
    requested = []

    def download(repo_id, filename, *, revision=None, cache_dir=None, **_):
        requested.append((repo_id, filename, revision, cache_dir))
        if repo_id != "acme/tiny-bert":
            raise LocalEntryNotFoundError("An error happened while trying to locate the file on the Hub.")
        return str(snapshot / filename)

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    assert resolve_model_dir("acme/tiny-bert@v1") == snapshot
    assert requested == [("acme/tiny-bert", name, "v1", str(hub_cache))
                         for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json")]
    with pytest.raises(FileNotFoundError, match=r"^acme/other: no such local directory, and the Hub model acme/other "
                                                r"cannot be downloaded and is not in the Hub cache .*: An error happened"):
        resolve_model_dir("acme/other")
