"""prepare-pretraining and PretrainingDataset on the real pre-training text in ../shared/data.

Statistics are checked on four books (1.16 MB, ~10,400 instances with dupe_factor 4), so the
tolerances are about three standard errors or wider: IsNext 50 % +- 1.5 (sd 0.5 %), short targets
10 % +- 1 (sd 0.3 %: each instance draws its target once), masked share 15 % +- 0.5 (sd < 0.1 %;
the expected value is 15.2 %: 19 of the 125 maskable tokens of a full sequence), 80/10/10 +- 1.5.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.pretraining import FORMAT, IGNORE_INDEX, PretrainingDataset, collate, prepare_pretraining
from bertforge.pretraining.masking import num_to_predict
from bertforge.pretraining.text import detect_format, read_documents, text_paragraphs
from bertforge.tokenization import train_vocab, vocab_fingerprint

REPO = Path(__file__).resolve().parents[2]
PRETRAINING = REPO.parent / "shared" / "data" / "pretraining"
BOOK_NAMES = ("Carroll_Alice_1865", "Doyle_Hound_1902", "Stevenson_Treasure_1883", "Wells_WarOfTheWorlds_1898")
SEQ, PREDS = 128, 20
PAD, CLS, SEP, MASK = 0, 2, 3, 4  # train_vocab puts the specials first


def _data() -> Path:
    if not PRETRAINING.is_dir():
        pytest.skip(f"pre-training data not found at {PRETRAINING}")
    return PRETRAINING


@pytest.fixture(scope="module")
def books() -> list[str]:
    return [str(_data() / "books" / f"{name}.txt") for name in BOOK_NAMES]


@pytest.fixture(scope="module")
def vocab(books, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    train_vocab(books, vocab_size=8000, output=path, show_progress=False)
    return str(path)


def _prepare(inputs, vocab, out, **kwargs) -> dict:
    settings = dict(max_seq_length=SEQ, max_predictions_per_seq=PREDS, dupe_factor=4, seed=12345, progress=False)
    settings.update(kwargs)
    return prepare_pretraining(inputs, vocab, out, **settings)


@pytest.fixture(scope="module")
def static_dir(books, vocab, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("static")
    _prepare(books, vocab, out)
    return out


@pytest.fixture(scope="module")
def dynamic_dir(books, vocab, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dynamic")
    _prepare(books, vocab, out, masking="dynamic")
    return out


def load_all(directory: Path) -> tuple[dict, dict[str, np.ndarray]]:
    index = json.loads((directory / "index.json").read_text())
    fields = ["input_ids", "lengths", "segment_b_start", "next_sentence_labels"]
    if index["masking"] == "static":
        fields += ["masked_lm_positions", "masked_lm_ids"]
    arrays = {f: np.concatenate([np.load(directory / f"{s['name']}.{f}.npy") for s in index["shards"]])
              for f in fields}
    return index, arrays


def unmasked(arrays: dict[str, np.ndarray]) -> np.ndarray:
    ids = arrays["input_ids"].astype(np.int64)
    rows, cols = np.nonzero(arrays["masked_lm_positions"])
    ids[rows, arrays["masked_lm_positions"][rows, cols]] = arrays["masked_lm_ids"][rows, cols]
    return ids


def check_structure(index: dict, arrays: dict[str, np.ndarray]) -> None:
    """Layout invariants of every instance: [CLS] A [SEP] B [SEP], padding, masked positions."""
    ids, lengths, b = arrays["input_ids"], arrays["lengths"].astype(np.int64), arrays["segment_b_start"].astype(np.int64)
    n = len(lengths)
    assert n == index["num_instances"] == sum(s["num_instances"] for s in index["shards"])
    assert ids.dtype == np.uint16 and ids.shape == (n, SEQ)
    assert arrays["lengths"].dtype == np.int16 and arrays["segment_b_start"].dtype == np.int16
    assert arrays["next_sentence_labels"].dtype == np.int8
    assert set(np.unique(arrays["next_sentence_labels"])) <= {0, 1}
    assert lengths.max() <= SEQ
    assert (b >= 3).all() and (lengths - b >= 2).all()  # A and B non-empty
    rows = np.arange(n)
    assert (ids[:, 0] == CLS).all()
    assert (ids[rows, b - 1] == SEP).all() and (ids[rows, lengths - 1] == SEP).all()
    columns = np.arange(SEQ)[None, :]
    assert (ids[columns >= lengths[:, None]] == PAD).all()
    if "masked_lm_positions" in arrays:
        positions = arrays["masked_lm_positions"].astype(np.int64)
        assert arrays["masked_lm_positions"].dtype == np.int16 and arrays["masked_lm_ids"].dtype == np.uint16
        real = positions > 0
        assert (arrays["masked_lm_ids"][~real] == 0).all()
        # 0-padding only at the end, real positions ascending and never [CLS]/[SEP]/padding
        assert (np.diff(real.astype(np.int8), axis=1) <= 0).all()
        p = np.where(real, positions, np.iinfo(np.int64).max)
        assert (np.diff(p, axis=1)[real[:, 1:]] > 0).all()
        assert (positions[real] < np.repeat(lengths, real.sum(1)) - 1).all()
        assert (positions[real] != np.repeat(b, real.sum(1)) - 1).all()
        # outside the masked positions no special token appears inside the sequence
        originals = unmasked(arrays)
        structural = np.zeros_like(ids, dtype=bool)
        structural[:, 0] = True
        structural[rows, b - 1] = True
        structural[rows, lengths - 1] = True
        structural |= columns >= lengths[:, None]
        masked = np.zeros_like(structural)
        r, c = np.nonzero(real)
        masked[r, positions[r, c]] = True
        inner = ~structural & ~masked
        assert not np.isin(ids[inner], [PAD, CLS, SEP, MASK]).any()
        assert not np.isin(originals[~structural], [PAD, CLS, SEP, MASK]).any()


# ---------------------------------------------------------------- statistics


def test_instance_statistics(static_dir):
    index, arrays = load_all(static_dir)
    check_structure(index, arrays)
    assert index["format"] == FORMAT and index["masking"] == "static" and index["num_documents"] == 4
    assert index["input_formats"] == {"text": 4}
    n = index["num_instances"]
    assert n > 9000
    lengths = arrays["lengths"].astype(np.int64)
    positions = arrays["masked_lm_positions"]
    real = positions > 0
    maskable = lengths - 3
    # exactly Google's count (of the maskable tokens) per instance
    expected = np.array([num_to_predict(int(m), 0.15, PREDS) for m in maskable])
    assert (real.sum(1) == expected).all()
    assert abs(real.sum() / maskable.sum() - 0.15) < 0.005
    # 80 % [MASK], 10 % random token, 10 % unchanged
    rows, cols = np.nonzero(real)
    now = arrays["input_ids"][rows, positions[rows, cols]].astype(np.int64)
    before = arrays["masked_lm_ids"][rows, cols].astype(np.int64)
    as_mask = (now == MASK).mean()
    kept = ((now == before) & (now != MASK)).mean()
    random_ = 1 - as_mask - kept
    assert abs(as_mask - 0.80) < 0.015 and abs(kept - 0.10) < 0.015 and abs(random_ - 0.10) < 0.015
    is_next = (arrays["next_sentence_labels"] == 0).mean()
    assert abs(is_next - 0.5) < 0.015
    stats = index["stats"]
    assert abs(stats["short_target"] / n - 0.10) < 0.01
    # the index's statistics describe the arrays
    assert stats["instances"] == n and stats["tokens"] == lengths.sum() and stats["masked"] == real.sum()
    assert stats["is_next"] == (arrays["next_sentence_labels"] == 0).sum()
    assert stats["masked_as_mask"] == (now == MASK).sum()
    assert stats["not_next_same_document"] == 0
    # short targets give short instances, though whole sentences overshoot a short target: about
    # half of the 10 % are drawn under 63 tokens, and 2-3 % of the instances end up that short
    assert 0.015 < (lengths < SEQ // 2).mean() < 0.05
    assert (lengths >= SEQ - 5).mean() > 0.75


def test_masked_lm_ids_are_the_original_tokens(static_dir, dynamic_dir):
    """Masking draws from its own random stream: static and dynamic data with one seed hold the
    same instances, so undoing the static masks must give the stored dynamic sequences."""
    _, static = load_all(static_dir)
    dynamic_index, dynamic = load_all(dynamic_dir)
    check_structure(dynamic_index, dynamic)
    for field in ("lengths", "segment_b_start", "next_sentence_labels"):
        assert np.array_equal(static[field], dynamic[field])
    assert np.array_equal(unmasked(static), dynamic["input_ids"].astype(np.int64))
    # and the corruption touched nothing but the masked positions
    changed = static["input_ids"] != dynamic["input_ids"]
    rows, cols = np.nonzero(changed)
    assert (static["masked_lm_positions"][rows] == cols[:, None]).any(axis=1).all()


def _words_fully_masked(ids: np.ndarray, length: int, b_start: int, masked: set[int], is_piece) -> bool:
    for segment in (range(1, b_start - 1), range(b_start, length - 1)):
        word: list[int] = []
        for position in list(segment) + [None]:
            if position is None or not word or not is_piece[ids[position]]:
                if word and len({p in masked for p in word}) > 1:
                    return False
                word = []
            if position is not None:
                word.append(position)
    return True


def test_whole_word_masking(books, vocab, tmp_path):
    tokens = Path(vocab).read_text(encoding="utf-8").split("\n")[:-1]
    is_piece = np.array([t.startswith("##") for t in tokens])
    index = _prepare(books[:2], vocab, tmp_path / "wwm", whole_word_mask=True, dupe_factor=1)
    assert index["whole_word_mask"] is True
    _, arrays = load_all(tmp_path / "wwm")
    originals = unmasked(arrays)
    words_with_pieces = 0
    for i in range(len(originals)):
        masked = {int(p) for p in arrays["masked_lm_positions"][i] if p > 0}
        length, b = int(arrays["lengths"][i]), int(arrays["segment_b_start"][i])
        assert 0 < len(masked) <= num_to_predict(length - 3, 0.15, PREDS)
        assert _words_fully_masked(originals[i], length, b, masked, is_piece)
        words_with_pieces += sum(1 for p in masked if is_piece[originals[i][p]])
    assert words_with_pieces > 100  # multi-piece words were masked, whole
    # dynamic whole-word masking in the dataset follows the same rule
    _prepare(books[:1], vocab, tmp_path / "wwm-dyn", whole_word_mask=True, dupe_factor=1, masking="dynamic")
    dataset = PretrainingDataset(tmp_path / "wwm-dyn", seed=3)
    _, stored = load_all(tmp_path / "wwm-dyn")
    for i in range(0, len(dataset), 7):
        item = dataset[i]
        masked = {int(p) for p in item["masked_lm_positions"] if p > 0}
        assert _words_fully_masked(stored["input_ids"][i], int(item["attention_mask"].sum()),
                                   int(stored["segment_b_start"][i]), masked, is_piece)


# ---------------------------------------------------------------- input formats


def test_sample_text_is_bert_format(vocab, tmp_path):
    path = _data() / "sample_text.txt"
    assert detect_format(path) == "bert"
    # documents = blocks of non-empty lines between blank lines; each line one sentence
    blocks = [b for b in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")) if b.strip()]
    documents = list(read_documents(path))
    assert len(documents) == len(blocks) == 3
    assert [len(d) for d in documents] == [sum(1 for line in b.split("\n") if line.strip()) for b in blocks]
    assert documents[1][0].startswith("The rain had only ceased with the gray streaks of morning")
    index = _prepare([path], vocab, tmp_path / "sample", dupe_factor=1)
    assert index["num_documents"] == 3 and index["input_formats"] == {"bert": 1}
    # a corpus that fits the window: every NotNext B comes from another document
    assert index["stats"]["not_next_same_document"] == 0


def test_wiki_documents():
    path = _data() / "wiki" / "enwiki_wikiextractor_AA_00.txt"
    assert detect_format(path) == "wiki"
    text = path.read_text(encoding="utf-8")
    titles = re.findall(r'^<doc [^>]*title="([^"]*)"', text, flags=re.M)
    documents = list(read_documents(path))
    assert len(documents) == len(titles) == text.count("\n</doc>") == 38
    assert documents[0][0].startswith("Anarchism is a political philosophy")
    for title, document in zip(titles, documents):
        assert document[0] != title  # the repeated title line is dropped
        assert not any(s.startswith("<doc") or s.startswith("</doc") for s in document)
        assert document  # (a disambiguation page may be one line: "Alien may refer to:")
    assert sum(len(d) for d in documents) > 20 * len(documents)


def test_format_detection_on_the_corpus():
    data = _data()
    assert {detect_format(p) for p in (data / "books").glob("*.txt")} == {"text"}
    assert {detect_format(p) for p in (data / "wiki").glob("*.txt")} == {"wiki"}


def test_text_paragraphs_and_sentences(tmp_path):
    wrapped = ("It was a dark night. The wind blew\nhard over the moor, and Mr. Holmes\nsaid nothing.\n\n"
               "Next paragraph here.\n")
    assert text_paragraphs(wrapped) == [
        "It was a dark night. The wind blew hard over the moor, and Mr. Holmes said nothing.",
        "Next paragraph here."]
    long_line = "A sentence that goes on. " * 10
    assert text_paragraphs(f"{long_line}\n{long_line}\n") == [long_line.strip()] * 2
    path = tmp_path / "book.txt"
    path.write_text(wrapped, encoding="utf-8")
    assert list(read_documents(path, "text")) == [
        ["It was a dark night.", "The wind blew hard over the moor, and Mr. Holmes said nothing.",
         "Next paragraph here."]]


def test_batch_token_ids_equal_tokenize(vocab):
    """The batch path (with its reference fallback for characters the fast normaliser gets wrong)
    gives exactly the ids of `BertTokenizer.tokenize`."""
    from bertforge.pretraining.instances import tokenize_document
    from bertforge.tokenization import BertTokenizer

    tokenizer = BertTokenizer(vocab)
    sentences = [s for document in read_documents(_data() / "sample_text.txt") for s in document]
    sentences += ["Ο Σίσυφος ήταν βασιλιάς.", "   ", "naïve café — “quotes” ﬁ ligature", "\u200b"]
    document = tokenize_document(sentences, tokenizer, tokenizer.unk_token_id, ())
    expected = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(s)) for s in sentences]
    expected = [ids for ids in expected if ids]
    assert document.num_sentences == len(expected) == len(sentences) - 2
    assert [document.tokens[a:b].tolist() for a, b in zip(document.bounds[:-1], document.bounds[1:])] == expected


def test_literal_special_tokens_cannot_fake_structure(vocab, tmp_path):
    path = tmp_path / "odd.txt"
    path.write_text("The cat sat [SEP] on the [MASK] mat.\nIt was [CLS] happy.\n\nA dog barked.\nIt ran off.\n")
    _prepare([path], vocab, tmp_path / "odd", input_format="bert", masking="dynamic", dupe_factor=3)
    index, arrays = load_all(tmp_path / "odd")
    check_structure(index, arrays)
    rows = np.arange(len(arrays["lengths"]))
    inner = arrays["input_ids"].copy()
    inner[:, 0] = PAD
    inner[rows, arrays["segment_b_start"] - 1] = PAD
    inner[rows, arrays["lengths"] - 1] = PAD
    assert not np.isin(inner, [CLS, SEP, MASK]).any()


# ---------------------------------------------------------------- determinism and workers


def test_same_seed_gives_identical_bytes(books, vocab, tmp_path):
    first = _prepare(books[:2], vocab, tmp_path / "a", dupe_factor=1, shard_size=1000)
    _prepare(books[:2], vocab, tmp_path / "b", dupe_factor=1, shard_size=1000)
    assert len(first["shards"]) > 1
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    _prepare(books[:2], vocab, tmp_path / "c", dupe_factor=1, shard_size=1000, seed=7)
    assert ((tmp_path / "a" / "shard-00000.input_ids.npy").read_bytes()
            != (tmp_path / "c" / "shard-00000.input_ids.npy").read_bytes())


def test_two_workers(books, vocab, tmp_path):
    index = _prepare(books, vocab, tmp_path / "w2", workers=2, shard_size=4000)
    assert index["workers"] == 2 and index["num_documents"] == 4
    assert [s["name"] for s in index["shards"]] == [f"shard-{k:05d}" for k in range(len(index["shards"]))]
    assert not list((tmp_path / "w2").glob(".tmp-*"))
    _, arrays = load_all(tmp_path / "w2")
    check_structure(index, arrays)
    n = index["num_instances"]
    stats = index["stats"]
    assert abs(stats["masked"] / stats["maskable_tokens"] - 0.15) < 0.005
    assert abs(stats["masked_as_mask"] / stats["masked"] - 0.8) < 0.015
    assert abs(stats["masked_as_random"] / stats["masked"] - 0.1) < 0.015
    assert abs(stats["is_next"] / n - 0.5) < 0.015
    assert abs(stats["short_target"] / n - 0.1) < 0.01
    assert len(PretrainingDataset(tmp_path / "w2")) == n


# ---------------------------------------------------------------- the dataset


def test_dataset_items_and_collate(static_dir):
    dataset = PretrainingDataset(static_dir)
    _, arrays = load_all(static_dir)
    assert len(dataset) == len(arrays["lengths"])
    assert dataset.max_seq_length == SEQ and dataset.max_predictions_per_seq == PREDS
    assert dataset.index["vocab_size"] == 8000
    for i in (0, 1, len(dataset) // 2, len(dataset) - 1, -1):
        item = dataset[i]
        row = i % len(dataset)
        assert {k: (tuple(v.shape), v.dtype) for k, v in item.items()} == {
            "input_ids": ((SEQ,), torch.int64), "token_type_ids": ((SEQ,), torch.int64),
            "attention_mask": ((SEQ,), torch.int64), "masked_lm_positions": ((PREDS,), torch.int64),
            "masked_lm_labels": ((PREDS,), torch.int64), "next_sentence_label": ((), torch.int64)}
        length, b = int(arrays["lengths"][row]), int(arrays["segment_b_start"][row])
        assert item["input_ids"].tolist() == arrays["input_ids"][row].tolist()
        assert item["attention_mask"].tolist() == [1] * length + [0] * (SEQ - length)
        assert item["token_type_ids"].tolist() == [0] * b + [1] * (length - b) + [0] * (SEQ - length)
        real = item["masked_lm_positions"] > 0
        assert (item["masked_lm_labels"][~real] == IGNORE_INDEX).all()
        assert item["masked_lm_labels"][real].tolist() == arrays["masked_lm_ids"][row][real.numpy()].tolist()
        assert int(item["next_sentence_label"]) == int(arrays["next_sentence_labels"][row])
    with pytest.raises(IndexError):
        dataset[len(dataset)]
    short = [i for i in range(len(dataset)) if arrays["lengths"][i] < 60][:4]
    batch = collate([dataset[i] for i in short])
    longest = int(arrays["lengths"][short].max())
    assert batch["input_ids"].shape == batch["token_type_ids"].shape == batch["attention_mask"].shape == (4, longest)
    assert batch["masked_lm_positions"].shape == batch["masked_lm_labels"].shape == (4, PREDS)
    assert batch["next_sentence_label"].shape == (4,)
    assert (batch["masked_lm_positions"] < longest).all()
    loader = torch.utils.data.DataLoader(pickle.loads(pickle.dumps(dataset)), batch_size=16, collate_fn=collate)
    assert next(iter(loader))["input_ids"].shape[0] == 16


def test_shards_are_indexed_across_boundaries(books, vocab, tmp_path):
    index = _prepare(books[:1], vocab, tmp_path / "small", max_seq_length=32, max_predictions_per_seq=5,
                     dupe_factor=1, shard_size=97)
    assert len(index["shards"]) > 5 and index["shards"][-1]["num_instances"] <= 97
    dataset = PretrainingDataset(tmp_path / "small")
    _, arrays = load_all(tmp_path / "small")
    for i in range(90, 300):
        assert dataset[i]["input_ids"].tolist() == arrays["input_ids"][i].tolist()
    assert arrays["lengths"].max() <= 32


def test_dynamic_masking_changes_with_the_epoch_only(dynamic_dir):
    dataset = PretrainingDataset(dynamic_dir, seed=0)
    assert dataset.masking == "dynamic"
    picks = range(0, len(dataset), len(dataset) // 40)
    epoch0 = [dataset[i] for i in picks]
    again = [dataset[i] for i in picks]
    for a, b in zip(epoch0, again):
        assert all(torch.equal(a[k], b[k]) for k in a)
    dataset.set_epoch(1)
    epoch1 = [dataset[i] for i in picks]
    differ = sum(not torch.equal(a["masked_lm_positions"], b["masked_lm_positions"]) for a, b in zip(epoch0, epoch1))
    assert differ >= len(epoch0) - 2
    for a, b in zip(epoch0, epoch1):  # the instance itself does not change
        assert torch.equal(a["attention_mask"], b["attention_mask"])
        assert torch.equal(a["next_sentence_label"], b["next_sentence_label"])
    # an exact resume: a fresh object at the same (seed, epoch) gives the same masks
    resumed = PretrainingDataset(dynamic_dir, seed=0)
    resumed.set_epoch(1)
    assert torch.equal(resumed[picks[3]]["input_ids"], epoch1[3]["input_ids"])
    # dynamic masks follow the same 15 % and 80/10/10 rule
    _, stored = load_all(dynamic_dir)
    masked = as_mask = kept = maskable = 0
    for i in range(0, len(dataset), 3):
        item = dataset[i]
        real = item["masked_lm_positions"] > 0
        positions = item["masked_lm_positions"][real]
        now, before = item["input_ids"][positions], item["masked_lm_labels"][real]
        assert before.tolist() == stored["input_ids"][i][positions.numpy()].tolist()
        masked += int(real.sum())
        maskable += int(item["attention_mask"].sum()) - 3
        as_mask += int((now == MASK).sum())
        kept += int(((now == before) & (now != MASK)).sum())
    assert abs(masked / maskable - 0.15) < 0.005
    assert abs(as_mask / masked - 0.8) < 0.015 and abs(kept / masked - 0.1) < 0.015


def test_check_compatible(static_dir):
    dataset = PretrainingDataset(static_dir)
    vocab_hash = dataset.index["vocab_hash"]
    dataset.check_compatible(8000, vocab_hash, SEQ)
    dataset.check_compatible(8000)
    with pytest.raises(ValueError, match="vocab_size=30522"):
        dataset.check_compatible(30522, vocab_hash, SEQ)
    with pytest.raises(ValueError, match="different vocabulary"):
        dataset.check_compatible(8000, "0123456789abcdef", SEQ)
    with pytest.raises(ValueError, match="max_seq_length=512"):
        dataset.check_compatible(8000, vocab_hash, 512)


# ---------------------------------------------------------------- errors and the command line


def test_errors(vocab, tmp_path):
    sample = _data() / "sample_text.txt"
    with pytest.raises(FileNotFoundError, match="no_such_file.txt"):
        prepare_pretraining([sample, tmp_path / "no_such_file.txt"], vocab, tmp_path / "out", progress=False)
    with pytest.raises(FileNotFoundError):
        prepare_pretraining([sample], tmp_path / "missing_vocab.txt", tmp_path / "out", progress=False)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n")
    with pytest.raises(ValueError, match="empty"):
        prepare_pretraining([empty], vocab, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "index.json").exists()
    with pytest.raises(ValueError, match="max_seq_length"):
        prepare_pretraining([sample], vocab, tmp_path / "out", max_seq_length=7, progress=False)
    for probability in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="masked_lm_prob"):
            prepare_pretraining([sample], vocab, tmp_path / "out", masked_lm_prob=probability, progress=False)
    with pytest.raises(ValueError, match="masking"):
        prepare_pretraining([sample], vocab, tmp_path / "out", masking="sometimes", progress=False)
    with pytest.raises(FileNotFoundError, match="index.json"):
        PretrainingDataset(tmp_path / "nothing here")


def test_cli(vocab, tmp_path, capsys):
    from bertforge.cli import main

    sample = str(_data() / "sample_text.txt")
    out = tmp_path / "cli"
    code = main(["prepare-pretraining", "--input", sample, "--vocab", vocab, "--output-dir", str(out),
                 "--max-seq-length", "64", "--max-predictions-per-seq", "10", "--dupe-factor", "2",
                 "--masking", "dynamic", "--whole-word-mask", "--do-lower-case", "--seed", "3", "--quiet"])
    assert code == 0
    assert "instances" in capsys.readouterr().out
    index = json.loads((out / "index.json").read_text())
    assert (index["max_seq_length"], index["max_predictions_per_seq"], index["masking"], index["seed"],
            index["whole_word_mask"], index["do_lower_case"], index["dupe_factor"]) == (64, 10, "dynamic", 3, True,
                                                                                       True, 2)
    assert len(PretrainingDataset(out)) == index["num_instances"] > 0
    code = main(["prepare-pretraining", "--input", str(tmp_path / "absent.txt"), "--vocab", vocab,
                 "--output-dir", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "absent.txt" in err and len(err.strip().splitlines()) == 1
    code = main(["prepare-pretraining", "--input", sample, "--vocab", vocab, "--output-dir", str(out),
                 "--masked-lm-prob", "1.5", "--quiet"])
    assert code == 2 and "--masked-lm-prob must be in (0, 1), got 1.5" in capsys.readouterr().err


def test_output_dir_gets_the_vocabulary_and_keeps_the_users(vocab, tmp_path):
    sample = _data() / "sample_text.txt"
    out = tmp_path / "data"
    _prepare([sample], vocab, out, dupe_factor=1)
    assert (out / "vocab.txt").read_bytes() == Path(vocab).read_bytes()
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["do_lower_case"] is True and config["tokenizer_class"] == "BertTokenizer"
    assert json.loads((out / "index.json").read_text())["vocab_hash"] == vocab_fingerprint(vocab)
    # Preparing again into the same directory with another vocabulary replaces the previous run's copy...
    lines = Path(vocab).read_text().splitlines()
    other = tmp_path / "other" / "vocab.txt"
    other.parent.mkdir()
    other.write_text("\n".join(lines[:-1]) + "\n")
    _prepare([sample], other, out, dupe_factor=1)
    assert (out / "vocab.txt").read_bytes() == other.read_bytes()
    # ... and the vocabulary given may live in the output directory itself.
    _prepare([sample], out / "vocab.txt", out, dupe_factor=1)
    assert (out / "vocab.txt").read_bytes() == other.read_bytes()
    # A failed run leaves nothing that looks finished, and does not block the next one.
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        _prepare([empty], vocab, out, dupe_factor=1)
    assert sorted(p.name for p in out.iterdir()) == []
    _prepare([sample], vocab, out, dupe_factor=1)
    assert (out / "vocab.txt").read_bytes() == Path(vocab).read_bytes()
    # A vocab.txt the user put there is not overwritten: an error before any work, the directory untouched.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "vocab.txt").write_text("my own\n")
    with pytest.raises(ValueError) as error:
        _prepare([sample], vocab, mine, dupe_factor=1)
    assert str(error.value) == (f"{mine / 'vocab.txt'} already exists and is another vocabulary than {vocab}; the "
                                "output directory gets the vocabulary its data is made with: choose another "
                                f"--output-dir or move {mine / 'vocab.txt'} away")
    assert sorted(p.name for p in mine.iterdir()) == ["vocab.txt"]
    assert (mine / "vocab.txt").read_text() == "my own\n"


# ---------------------------------------------------------------- sentences far over max_seq_length


def test_a_sentence_far_over_the_instance_length_is_reported_once_per_file(uncased_vocab, tmp_path, caplog):
    # Issue 49: Google's script keeps one instance's worth of a 2,000,000-word line and says nothing.
    short = "the cat sat on the mat .\nit was happy .\n\na dog barked .\nit ran off .\n"
    words = " ".join(["house", "tree", "river", "stone"] * 250)  # 1,000 tokens, one line, no full stop
    long_file, plain = tmp_path / "long.txt", tmp_path / "plain.txt"
    long_file.write_text(short + "\n" + words + "\nthe end .\n\n" + " ".join(["cat"] * 200) + "\n")
    plain.write_text(short + " ".join(["cat"] * 100) + "\n")  # 100 tokens: over 61, under twice 64
    with caplog.at_level("WARNING", logger="bertforge"):
        index = prepare_pretraining([long_file, plain], uncased_vocab, tmp_path / "out", max_seq_length=64,
                                    max_predictions_per_seq=10, dupe_factor=1, input_format="bert", progress=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [f"{long_file}:7: a sentence of 1000 tokens, over twice --max-seq-length 64: an instance "
                        "keeps at most 61 of a sentence's tokens; 2 such sentence(s) in this file, 1078 tokens more "
                        "than their instances hold (one sentence per line, or text with sentence punctuation, "
                        "avoids it)"]  # (1000 - 61) + (200 - 61)
    assert index["long_sentences"] == {str(long_file): {"sentences": 2, "tokens_dropped": 1078, "longest": 1000,
                                                        "line": 7, "limit": 128}}
    assert max(index_lengths(tmp_path / "out")) <= 64


def index_lengths(directory: Path) -> list[int]:
    _, arrays = load_all(directory)
    return arrays["lengths"].tolist()
