"""benchmarks/tapt.py's corpora on the real data: every training sentence's text is kept exactly once
(pre-training or held out), documents stay whole, and the split and the labelled sample are fixed."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def tapt():
    sys.path.insert(0, str(BENCHMARKS))  # the scripts import their shared `_common` from their own folder
    try:
        yield importlib.import_module("tapt")
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_conll_corpus_keeps_every_sentence_and_document(tapt, shared_data, tmp_path):
    documents = tapt.read_conll(shared_data / "conll2003" / "train.txt")
    # CoNLL-2003's English training file: 946 documents, 14,041 sentences, and it opens with "EU rejects".
    assert len(documents) == 946
    assert sum(map(len, documents)) == 14041
    assert [line.split()[0] for line in documents[0][0]][:2] == ["EU", "rejects"]
    train, held_out = tapt.split_held_out(documents)
    assert (len(train), len(held_out)) == (927, 19)
    assert sorted(map(id, train + held_out)) == sorted(map(id, documents))
    assert tapt.split_held_out(documents) == (train, held_out)  # seeded: the same every run
    text = tapt.bert_format([[" ".join(line.split()[0] for line in s) for s in d] for d in held_out])
    assert text.count("\n\n") == len(held_out) - 1  # a blank line between documents, none inside one


def test_sst2_labelled_sample_is_fixed_and_from_train(tapt, shared_data, tmp_path):
    class Args:
        task, data, labelled, dev_examples = "sst2", shared_data, 50, 10

    first = tapt.stage_labelled(Args, tmp_path / "a")
    again = tapt.stage_labelled(Args, tmp_path / "b")
    train = (first / "train.tsv").read_text(encoding="utf-8")
    assert train == (again / "train.tsv").read_text(encoding="utf-8")
    header, rows = tapt.read_sst2(first / "train.tsv")
    _, all_rows = tapt.read_sst2(shared_data / "glue" / "SST-2" / "train.tsv")
    assert header == "sentence\tlabel" and len(rows) == 50 and all(r in all_rows for r in rows)
    assert len(tapt.read_sst2(first / "dev.tsv")[1]) == 10
    assert not (tmp_path / "a.partial").exists()


def test_sst2_bad_row_names_file_and_line(tapt, tmp_path):
    bad = tmp_path / "train.tsv"
    bad.write_text("sentence\tlabel\na fine film\t1\nno label here\n", encoding="utf-8")
    with pytest.raises(tapt.StageError, match=r"train.tsv:3: expected 2 tab-separated columns"):
        tapt.read_sst2(bad)
