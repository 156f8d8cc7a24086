"""GLUE readers on the real files and on layout fixtures, the user's own files, features, batches,
length grouping and the prediction writers."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from bertforge.metrics import main_metric
from bertforge.tasks.classify_features import collate, convert_examples_to_features
from bertforge.tasks.classify_reader import InputExample, id2label, read_classify_file, sort_labels
from bertforge.tasks.glue_data import (GLUE_TASKS, get_task, glue_task_dir, read_glue_examples, write_dev_predictions,
                                       write_predictions)
from bertforge.training.order import length_grouped_order
from bertforge.tokenization import BertTokenizer

REPO = Path(__file__).resolve().parents[2]
SHARED_GLUE = REPO.parent / "shared" / "data" / "glue"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "glue"


@pytest.fixture(scope="module")
def glue_dir() -> Path:
    if not SHARED_GLUE.is_dir():
        pytest.skip(f"GLUE data not found at {SHARED_GLUE}")
    return SHARED_GLUE


# ---------------------------------------------------------------------------- real GLUE files

# (train, dev, test) data rows, the published split sizes (see shared/data/PROVENANCE.md).
REAL_COUNTS = {
    "cola": (8551, 1043, 1063),
    "sst2": (67349, 872, 1821),
    "mrpc": (3668, 408, 1725),
    "stsb": (5749, 1500, 1379),
    "rte": (2490, 277, 3000),
    "wnli": (635, 71, 146),
}
# Label balance of the dev sets (PROVENANCE.md).
DEV_BALANCE = {
    "cola": {"1": 721, "0": 322},
    "sst2": {"1": 444, "0": 428},
    "mrpc": {"1": 279, "0": 129},
    "rte": {"entailment": 146, "not_entailment": 131},
    "wnli": {"0": 40, "1": 31},
}


@pytest.mark.parametrize("task", sorted(REAL_COUNTS))
def test_real_glue_files(glue_dir, task):
    spec = get_task(task)
    pair = task not in ("cola", "sst2")
    for split, expected in zip(("train", "dev", "test"), REAL_COUNTS[task]):
        examples = read_glue_examples(task, glue_dir, split)
        assert len(examples) == expected, (task, split)
        assert len({e.guid for e in examples}) == expected  # ids unique within a file
        assert all(e.guid.startswith(f"{split}-") for e in examples)
        assert all((e.text_b is not None) == pair for e in examples)
        assert all(e.text_a.strip() and (e.text_b is None or e.text_b.strip()) for e in examples)
        if split == "test":
            assert all(e.label is None for e in examples)
            # Every GLUE test file numbers its rows 0..n-1 in its index column.
            assert [e.id for e in examples] == [str(i) for i in range(expected)]
        elif spec.regression:
            assert all(isinstance(e.label, float) and 0.0 <= e.label <= 5.0 for e in examples)
        else:
            assert {e.label for e in examples} == set(spec.labels)
    if task in DEV_BALANCE:
        assert Counter(e.label for e in read_glue_examples(task, glue_dir, "dev")) == DEV_BALANCE[task]


def test_real_glue_columns(glue_dir):
    cola = read_glue_examples("CoLA", glue_dir, "dev")  # no header: the first line is an example
    assert cola[0] == InputExample("dev-0", "The sailors rode the breeze clear of the rocks.", None, "1")
    assert read_glue_examples("cola", glue_dir, "test")[0].text_a == "Bill whistled past the house."
    assert read_glue_examples("SST-2", glue_dir, "train")[0] == InputExample(
        "train-0", "hide new secretions from the parental units ", None, "0")
    assert read_glue_examples("sst2", glue_dir, "test")[0].text_a == "uneasy mishmash of styles and genres ."

    # MRPC: UTF-8 BOM, label first, texts in columns 3 and 4, bare `"` kept as text (QUOTE_NONE).
    mrpc = read_glue_examples("mrpc", glue_dir / "MRPC", "dev")  # the task's own directory works too
    assert mrpc[0].label == "1"
    assert mrpc[0].text_b == '" The foodservice pie business does not fit our long-term growth strategy .'
    assert mrpc[1].text_b.startswith('His wife said he was " 100 percent behind George Bush "')
    mrpc_test = read_glue_examples("mrpc", glue_dir, "test")
    assert mrpc_test[0].text_a.startswith("PCCW 's chief operating officer")
    assert mrpc_test[1].text_b.startswith("Domestic sales at both GM")

    stsb = read_glue_examples("STS-B", glue_dir, "dev")
    assert (stsb[0].text_a, stsb[0].text_b, stsb[0].label) == (
        "A man with a hard hat is dancing.", "A man wearing a hard hat is dancing.", 5.0)
    assert stsb[1].label == 4.75
    stsb_test = read_glue_examples("stsb", glue_dir, "test")
    assert (stsb_test[0].text_a, stsb_test[0].text_b) == ("A girl is styling her hair.", "A girl is brushing her hair.")

    rte = read_glue_examples("rte", glue_dir, "train")
    assert rte[0] == InputExample("train-0", "No Weapons of Mass Destruction Found in Iraq Yet.",
                                  "Weapons of Mass Destruction Found in Iraq.", "not_entailment")
    wnli = read_glue_examples("wnli", glue_dir, "dev")
    assert (wnli[1].text_b, wnli[1].label) == ("Susan did not answer.", "1")


# ---------------------------------------------------------------------------- layout fixtures

def test_mnli_fixture():
    spec = get_task("MNLI")
    assert spec.label_list == ["contradiction", "entailment", "neutral"]
    assert spec.dev_splits == ("dev_matched", "dev_mismatched")
    assert [spec.split(s).file for s in spec.splits] == [
        "train.tsv", "dev_matched.tsv", "dev_mismatched.tsv", "test_matched.tsv", "test_mismatched.tsv"]
    train = read_glue_examples("mnli", FIXTURES, "train")
    assert [e.label for e in train] == ["neutral", "entailment", "entailment", "entailment", "contradiction"]
    assert train[0] == InputExample(
        "train-0", "Conceptually cream skimming has two basic dimensions - product and geography.",
        "Product and geography are what make cream skimming work. ", "neutral")
    assert train[-1].guid == "train-8"  # the index column, not the row number

    matched = read_glue_examples("mnli", FIXTURES, "dev")  # "dev" is dev_matched
    assert [e.guid for e in matched] == ["dev_matched-0", "dev_matched-1", "dev_matched-2"]
    # gold_label is the last of 16 columns; label1 (column 10) of the first row disagrees with it.
    assert matched[0].label == "neutral" and matched[2].label == "entailment"
    mismatched = read_glue_examples("mnli", FIXTURES, "dev_mismatched")
    assert [e.label for e in mismatched] == ["contradiction", "contradiction"]
    assert "`operate'" in mismatched[1].text_a
    assert spec.split("dev_matched").metrics_task == "mnli"
    assert spec.split("dev_mismatched").metrics_task == "mnli-mm"

    test = read_glue_examples("mnli", FIXTURES, "test")
    assert [e.guid for e in test] == ["test_matched-0", "test_matched-1"]
    assert test[0].text_b == "Hierbas is a name worth looking out for." and test[0].label is None
    test_mm = read_glue_examples("mnli", FIXTURES, "test_mismatched")
    assert '"teaching unit"' in test_mm[0].text_a
    assert (spec.split("test_matched").submission, spec.split("test_mismatched").submission) == (
        "MNLI-m.tsv", "MNLI-mm.tsv")


def test_qqp_and_qnli_fixtures():
    qqp = read_glue_examples("qqp", FIXTURES, "train")
    assert [(e.id, e.label) for e in qqp] == [("133273", "0"), ("402555", "1"), ("360472", "0")]
    assert qqp[1].text_a == "How do I control my horny emotions?"
    assert [e.label for e in read_glue_examples("qqp", FIXTURES, "dev")] == ["0", "0", "1"]
    qqp_test = read_glue_examples("qqp", FIXTURES, "test")  # id, question1, question2
    assert qqp_test[1].text_a.startswith("Which one dissolve") and qqp_test[1].text_b.startswith("Which fish")
    assert [e.label for e in qqp_test] == [None, None]

    qnli = read_glue_examples("qnli", FIXTURES, "train")
    assert [e.label for e in qnli] == ["not_entailment", "not_entailment", "entailment"]
    assert qnli[0].text_a == "When did the third Digimon series begin?"
    assert [e.label for e in read_glue_examples("qnli", FIXTURES, "dev")] == ["entailment", "not_entailment"]
    qnli_test = read_glue_examples("qnli", FIXTURES, "test")
    assert 'took a "quiet" stance' in qnli_test[0].text_b


def test_task_specs():
    assert list(GLUE_TASKS) == ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"]
    assert {name: spec.metric for name, spec in GLUE_TASKS.items()} == {
        "cola": "mcc", "sst2": "accuracy", "mrpc": "f1", "stsb": "pearson", "qqp": "f1",
        "mnli": "accuracy", "qnli": "accuracy", "rte": "accuracy", "wnli": "accuracy"}
    assert all(spec.metric == main_metric(name) for name, spec in GLUE_TASKS.items())
    assert get_task("STS-B").regression and get_task("stsb").num_labels == 1
    assert get_task("rte").label_list == ["entailment", "not_entailment"] and get_task("rte").num_labels == 2
    assert get_task("mnli").num_labels == 3
    assert get_task("sst-2") is get_task("SST2") is GLUE_TASKS["sst2"]
    with pytest.raises(ValueError, match="unknown GLUE task 'squad'"):
        get_task("squad")
    with pytest.raises(ValueError, match="has no split 'dev_matched'"):
        get_task("rte").split("dev_matched")
    with pytest.raises(FileNotFoundError, match="RTE"):
        read_glue_examples("rte", FIXTURES, "train")
    assert glue_task_dir("qqp", FIXTURES) == FIXTURES / "QQP"
    assert glue_task_dir("qqp", FIXTURES / "QQP") == FIXTURES / "QQP"


# ---------------------------------------------------------------------------- malformed rows

MRPC_HEADER = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"


def _mrpc(tmp_path, rows: list[str]) -> Path:
    directory = tmp_path / "MRPC"
    directory.mkdir(exist_ok=True)
    (directory / "dev.tsv").write_text(MRPC_HEADER + "".join(r + "\n" for r in rows), encoding="utf-8")
    return directory / "dev.tsv"


GOOD_MRPC = "1\t11\t12\tThe cat sat .\tA cat sat ."


def test_malformed_rows_name_file_and_line(tmp_path):
    rows = [GOOD_MRPC] * 15 + ["0\t21\tonly three"]  # line 17 (header is line 1)
    path = _mrpc(tmp_path, rows)
    with pytest.raises(ValueError) as error:
        read_glue_examples("mrpc", tmp_path, "dev")
    assert str(error.value) == f"{path}:17: expected 5 tab-separated fields, found 3"

    _mrpc(tmp_path, [GOOD_MRPC, "yes\t1\t2\ta\tb"])
    with pytest.raises(ValueError, match=r"dev.tsv:3: expected a label in column 0 from \['0', '1'\], found 'yes'"):
        read_glue_examples("mrpc", tmp_path, "dev")
    _mrpc(tmp_path, [GOOD_MRPC, "1\t1\t2\t \tb"])
    with pytest.raises(ValueError, match=r"dev.tsv:3: empty text in column 3"):
        read_glue_examples("mrpc", tmp_path, "dev")
    _mrpc(tmp_path, [GOOD_MRPC, "", GOOD_MRPC])
    with pytest.raises(ValueError, match=r"dev.tsv:3: empty line"):
        read_glue_examples("mrpc", tmp_path, "dev")
    _mrpc(tmp_path, [GOOD_MRPC, GOOD_MRPC, "", ""])  # blank lines at the end are harmless
    assert len(read_glue_examples("mrpc", tmp_path, "dev")) == 2
    (tmp_path / "MRPC" / "dev.tsv").write_text("1\t1\t2\ta\n" + GOOD_MRPC + "\n")
    with pytest.raises(ValueError, match=r"dev.tsv:1: expected a header line of 5 tab-separated fields, found 4"):
        read_glue_examples("mrpc", tmp_path, "dev")

    # skip_malformed drops the bad rows (the numbering of the rest is unchanged).
    _mrpc(tmp_path, [GOOD_MRPC, "0\t1\tx", GOOD_MRPC])
    assert [e.guid for e in read_glue_examples("mrpc", tmp_path, "dev", skip_malformed=True)] == ["dev-0", "dev-2"]


@pytest.mark.parametrize("score", ["abc", "nan", "", "inf"])
def test_stsb_score_must_be_a_number(tmp_path, score):
    directory = tmp_path / "STS-B"
    directory.mkdir()
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    row = "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane.\tAn air plane.\t{}\n"
    (directory / "train.tsv").write_text(header + row.format("5.000") + row.format(score))
    with pytest.raises(ValueError, match=rf"train.tsv:3: expected a numeric score in column 9, found '{score}'"):
        read_glue_examples("stsb", tmp_path, "train")


def test_cola_file_with_a_header_is_an_error(tmp_path):
    (tmp_path / "train.tsv").write_text("source\tlabel\tmark\tsentence\ngj04\t1\t\tFine .\n")
    with pytest.raises(ValueError, match=r"train.tsv:1: expected a label in column 1 .* found 'label'"):
        read_glue_examples("cola", tmp_path, "train")


# ---------------------------------------------------------------------------- the user's own files

def test_classify_csv_string_labels_sorted(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text('text,label,source\n"Great, really great",positive,web\nawful,negative,web\n'
                    'meh,neutral,x\n"multi\nline ""quoted""",positive,y\n', encoding="utf-8")
    examples, labels = read_classify_file(path)
    assert labels == ["negative", "neutral", "positive"]  # sorted, not first-seen
    assert id2label(labels) == {0: "negative", 1: "neutral", 2: "positive"}
    assert [e.label for e in examples] == ["positive", "negative", "neutral", "positive"]
    assert examples[0].text_a == "Great, really great" and examples[0].text_b is None
    assert examples[3].text_a == 'multi\nline "quoted"'
    assert [e.guid for e in examples] == ["train-0", "train-1", "train-2", "train-3"]

    dev = tmp_path / "dev.csv"
    dev.write_text("text,label\nfine,positive\n")
    assert read_classify_file(dev, label_list=labels) == ([InputExample("dev-0", "fine", None, "positive")], labels)
    dev.write_text("text,label\nfine,positive\nhm,mixed\n")
    with pytest.raises(ValueError, match=r"dev.csv:3: label 'mixed' is not one of the training labels"):
        read_classify_file(dev, label_list=labels)


def test_classify_tsv_pairs_and_numeric_labels(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("text\ttext_pair\tlabel\na\tb\t10\nc\td\t2\ne\tf\t0\n")
    examples, labels = read_classify_file(path)
    assert labels == ["0", "2", "10"]  # integer labels sort numerically
    assert examples[0] == InputExample("pairs-0", "a", "b", "10")
    assert sort_labels(["b", "a", "b"]) == ["a", "b"]

    examples, labels = read_classify_file(path, regression=True)
    assert labels is None and [e.label for e in examples] == [10.0, 2.0, 0.0]


def test_classify_jsonl(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "good", "label": 1}\n\n{"text": "bad", "text_pair": "x", "label": 0, "extra": 3}\n')
    examples, labels = read_classify_file(path)
    assert labels == ["0", "1"]
    assert examples == [InputExample("data-0", "good", None, "1"), InputExample("data-1", "bad", "x", "0")]
    score = tmp_path / "scores.json"
    score.write_text('{"text": "a", "label": 0.25}\n{"text": "b", "label": "3.5"}\n')
    assert [e.label for e in read_classify_file(score, regression=True)[0]] == [0.25, 3.5]
    with pytest.raises(ValueError, match=r"scores.json:1: label 0.25 is a fractional number; .*regression=True"):
        read_classify_file(score)

    unlabelled = tmp_path / "predict.jsonl"
    unlabelled.write_text('{"text": "a"}\n{"text": "b", "label": null}\n')
    assert read_classify_file(unlabelled, require_labels=False) == (
        [InputExample("predict-0", "a"), InputExample("predict-1", "b")], None)
    with pytest.raises(ValueError, match=r"predict.jsonl:1: no 'label' key; pass require_labels=False"):
        read_classify_file(unlabelled)


@pytest.mark.parametrize("name, content, message", [
    ("a.csv", "sentence,label\nx,1\n", r"a.csv:1: no 'text' column in the header \(found: sentence, label\)"),
    ("a.csv", "text,label\nx,1\ny\n", r"a.csv:3: expected 2 fields \(text, label\), found 1"),
    ("a.csv", "text,label\nx,1\n  ,0\n", r"a.csv:3: empty 'text'"),
    ("a.csv", "text,label\nx,1\ny,\n", r"a.csv:3: empty label"),
    ("a.csv", "text\nx\n", r"a.csv:2: no 'label' column in the header"),
    ("a.tsv", "text\ttext_pair\tlabel\nx\t\t1\n", r"a.tsv:2: empty 'text_pair'"),
    ("a.jsonl", '{"text": "x", "label": 1}\n{"text": "y", "label": 1\n', r"a.jsonl:2: not valid JSON"),
    ("a.jsonl", '{"text": "x", "label": 1}\n["y", 1]\n', r"a.jsonl:2: expected a JSON object"),
    ("a.jsonl", '{"sentence": "x", "label": 1}\n', r"a.jsonl:1: no 'text' key \(found: sentence, label\)"),
    ("a.jsonl", '{"text": "", "label": 1}\n', r"a.jsonl:1: empty 'text'"),
    ("a.jsonl", '{"text": 5, "label": 1}\n', r"a.jsonl:1: 'text' must be a string, got int"),
    ("a.txt", "x\n", r"unknown extension '.txt'"),
    ("a.csv", "text,label\n", r"a.csv: no examples"),
])
def test_classify_errors(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_classify_file(path)


def test_classify_regression_errors(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("text,label\na,1.5\nb,high\n")
    with pytest.raises(ValueError, match=r"r.csv:3: label 'high' is not a number \(regression=True"):
        read_classify_file(path, regression=True)


# ---------------------------------------------------------------------------- features and batches

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "dog", ".", "a", "##s"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    vocab = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    vocab.write_text("\n".join(WORDS) + "\n")
    return BertTokenizer(vocab)


def test_features_and_collate(tokenizer):
    ids = {w: i for i, w in enumerate(WORDS)}
    examples = [InputExample("t-0", "the cat sat", None, "b"),
                InputExample("t-1", "the dog", "a cats on the mat .", "a"),
                InputExample("t-2", "dog", None, "b")]
    features = convert_examples_to_features(examples, tokenizer, ["a", "b"], max_seq_length=8)
    assert features[0] == {"input_ids": [2, 5, 6, 7, 3], "token_type_ids": [0] * 5, "label": 1}
    # 2 + 7 tokens do not fit 8 - 3: the longer second text is cut first (Google's _truncate_seq_pair).
    assert features[1]["input_ids"] == [2, ids["the"], ids["dog"], 3, ids["a"], ids["cat"], ids["##s"], 3]
    assert features[1]["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert features[1]["label"] == 0 and features[2]["input_ids"] == [2, ids["dog"], 3]

    batch = collate(features)
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    assert batch["input_ids"].shape == batch["token_type_ids"].shape == batch["attention_mask"].shape == (3, 8)
    assert batch["input_ids"].dtype == torch.long and batch["labels"].dtype == torch.long
    assert batch["input_ids"][2].tolist() == [2, ids["dog"], 3, 0, 0, 0, 0, 0]
    assert batch["attention_mask"].sum(1).tolist() == [5, 8, 3]
    assert batch["token_type_ids"][1].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert batch["labels"].tolist() == [1, 0, 1]
    assert collate(features[:1])["input_ids"].shape == (1, 5)  # padded to the batch, not max_seq_length
    assert collate(features, pad_token_id=99)["input_ids"][2, -1] == 99

    with pytest.raises(ValueError, match=r"example t-0: label 'b' is not in the label list \['a'\]"):
        convert_examples_to_features(examples, tokenizer, ["a"], 8)


def test_features_regression_and_unlabelled(tokenizer):
    examples = [InputExample("s-0", "the cat", "the dog", 3.8), InputExample("s-1", "a mat", "a cat", 0.0)]
    batch = collate(convert_examples_to_features(examples, tokenizer, None, 16))
    assert batch["labels"].dtype == torch.float32 and batch["labels"].tolist() == pytest.approx([3.8, 0.0])
    unlabelled = convert_examples_to_features([InputExample("u-0", "the cat")], tokenizer, ["0", "1"], 16)
    assert unlabelled[0]["label"] is None and "labels" not in collate(unlabelled)
    with pytest.raises(ValueError, match="1 of 2 features in the batch have no label"):
        collate(unlabelled + convert_examples_to_features(examples[:1], tokenizer, None, 16))


def test_features_on_real_rte(glue_dir, tokenizer):
    examples = read_glue_examples("rte", glue_dir, "dev")[:64]
    features = convert_examples_to_features(examples, tokenizer, get_task("rte").label_list, 128)
    assert max(len(f["input_ids"]) for f in features) <= 128
    batch = collate(features[:8])
    assert batch["input_ids"].shape[0] == 8 and batch["labels"].tolist() == [
        get_task("rte").label_list.index(e.label) for e in examples[:8]]


def test_length_grouped_order():
    lengths = [(i * 37) % 101 + 1 for i in range(1000)]
    order = length_grouped_order(lengths, batch_size=8, seed=3, epoch=0, chunk_batches=10)
    assert sorted(order) == list(range(1000))
    assert order == length_grouped_order(lengths, 8, seed=3, epoch=0, chunk_batches=10)
    assert order != length_grouped_order(lengths, 8, seed=3, epoch=1, chunk_batches=10)
    assert order != length_grouped_order(lengths, 8, seed=4, epoch=0, chunk_batches=10)
    batches = [order[i:i + 8] for i in range(0, 1000, 8)]
    assert max(lengths[i] for i in batches[0]) == max(lengths)  # the longest batch first

    def padding(batches):
        return sum(len(b) * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in batches)

    shuffled = torch.randperm(1000, generator=torch.Generator().manual_seed(0)).tolist()
    assert padding(batches) < padding([shuffled[i:i + 8] for i in range(0, 1000, 8)]) / 5
    # Batches come from different chunks, in random order: not sorted by length overall.
    maxima = [max(lengths[i] for i in b) for b in batches[1:]]
    assert maxima != sorted(maxima, reverse=True)

    # A final partial batch stays last, so every slice of batch_size is one batch.
    # One chunk, sorted longest first: batches [19..12], [11..4], the longest first, then the rest [3..0].
    assert length_grouped_order(list(range(1, 21)), batch_size=8, seed=0) == list(range(19, -1, -1))
    assert length_grouped_order([], 8, 0) == [] and length_grouped_order([5, 3], 8, 0) in ([0, 1], [1, 0])


# ---------------------------------------------------------------------------- prediction writers

def test_write_predictions(tmp_path):
    path = write_predictions(tmp_path / "out" / "RTE.tsv", "rte", ["0", "1", "2"], [1, 0, 1])
    assert path.read_text() == "index\tprediction\n0\tnot_entailment\n1\tentailment\n2\tnot_entailment\n"
    path = write_predictions(tmp_path / "MRPC.tsv", "mrpc", [0, 1], torch.tensor([1, 0]))
    assert path.read_text() == "index\tprediction\n0\t1\n1\t0\n"
    path = write_predictions(tmp_path / "STS-B.tsv", "stsb", ["0", "1"], [4.81234, -0.1])
    assert path.read_text() == "index\tprediction\n0\t4.812\n1\t-0.100\n"
    path = write_predictions(tmp_path / "MNLI-m.tsv", "mnli", ["0", "1", "2"], [0, 1, 2])
    assert path.read_text().splitlines()[1:] == ["0\tcontradiction", "1\tentailment", "2\tneutral"]
    with pytest.raises(ValueError, match=r"prediction 1: prediction 2 is not a label id in 0..1"):
        write_predictions(tmp_path / "x.tsv", "rte", ["0", "1"], [0, 2])
    with pytest.raises(ValueError, match="2 ids but 1 predictions"):
        write_predictions(tmp_path / "x.tsv", "rte", ["0", "1"], [0])
    with pytest.raises(ValueError, match="argmax"):
        write_predictions(tmp_path / "x.tsv", "rte", ["0"], [[0.1, 0.9]])


def test_write_predictions_for_real_test_ids(glue_dir, tmp_path):
    examples = read_glue_examples("cola", glue_dir, "test")
    spec = get_task("cola")
    path = write_predictions(tmp_path / spec.split("test").submission, spec, [e.id for e in examples],
                             [i % 2 for i in range(len(examples))])
    lines = path.read_text().splitlines()
    assert path.name == "CoLA.tsv" and lines[0] == "index\tprediction" and len(lines) == 1064
    assert lines[1:3] == ["0\t0", "1\t1"]


def test_write_dev_predictions(tmp_path):
    examples = [InputExample("dev-0", "a", "b", "entailment"), InputExample("dev-1", "c", None, "not_entailment")]
    path = write_dev_predictions(tmp_path / "dev.jsonl", examples, [0, 0], ["entailment", "not_entailment"])
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records == [
        {"guid": "dev-0", "text_a": "a", "text_b": "b", "label": "entailment", "prediction": "entailment",
         "correct": True},
        {"guid": "dev-1", "text_a": "c", "text_b": None, "label": "not_entailment", "prediction": "entailment",
         "correct": False}]
    path = write_dev_predictions(tmp_path / "stsb.jsonl", [InputExample("dev-0", "a", "b", 3.0)], [2.5])
    assert json.loads(path.read_text()) == {"guid": "dev-0", "text_a": "a", "text_b": "b", "label": 3.0,
                                            "prediction": 2.5}
