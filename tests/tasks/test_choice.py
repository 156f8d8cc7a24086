"""Multiple choice (SWAG): the reader on format-exact fixtures, features, batches, a tiny fine-tune, predict."""

import json
import random
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.modeling import BertForMultipleChoice
from bertforge.tasks.multiple_choice import (TASK_NAME, ChoiceExample, collate, convert_examples_to_features,
                                    multiple_choice_task, predict_choice_file, read_swag_file, write_swag_file)
from bertforge.tokenization import BertTokenizer
from bertforge.training.finetune import FinetuneArguments, finetune

SWAG = Path(__file__).resolve().parents[1] / "fixtures" / "swag"
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "cat", "dog", "bird", "sat", "ran", "flew",
         "on", "mat", "it", "good", "bad", "then", "and", "far", ".", ",", "\"", "'"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, save_tiny_checkpoint):
    """A randomly initialised tiny BERT with a 25-word vocabulary."""
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_choice"), WORDS, preset="tiny", max_position_embeddings=64)


# ---------------------------------------------------------------------------- reading

def test_reader_on_the_swag_fixtures():
    train = read_swag_file(SWAG / "train.csv")
    assert len(train) == 4 and [e.label for e in train] == [0, 3, 0, 2]
    first = train[0]
    assert first.index == "0" and first.video_id == "lsmdc3001_21_JUMP_STREET-422" and first.fold_ind == "11783"
    assert first.context == "Members of the procession walk down the street holding small horn brass instruments."
    assert first.start == "A drum line" and first.gold_source == "gold"
    assert first.second_segments()[0] == "A drum line passes by walking down the street playing their instruments."
    # quoted fields: commas and doubled quotes inside a field
    assert train[2].context == 'A woman is seen speaking to the camera, holding a "hula hoop".'
    assert train[3].endings[0] == "pats her shoulder, then saunters toward someone."
    assert train[1].endings[3] == "continue to play marching, interspersed."
    val = read_swag_file(SWAG / "val.csv")
    assert [e.label for e in val] == [0, 2] and val[0].endings[2] == 'looks at the ceiling, "thinking".'


def test_unlabelled_test_file():
    with pytest.raises(ValueError, match=r"test\.csv:1: no 'label' column"):
        read_swag_file(SWAG / "test.csv")
    test = read_swag_file(SWAG / "test.csv", require_labels=False)
    assert [e.label for e in test] == [None, None]
    assert test[0].endings == read_swag_file(SWAG / "val.csv")[0].endings


def _swag_text(*rows: str) -> str:
    header = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label"
    return "\n".join([header, *rows]) + "\n"


@pytest.mark.parametrize("row, message", [
    ("0,v,1,a b,a,b,gold,e0,e1,e2,e3", r"bad\.csv:3: expected 12 fields"),
    ("0,v,1,a b,a,b,gold,e0,e1,e2,e3,4", r"bad\.csv:3: label 4 is not in 0\.\.3"),
    ("0,v,1,a b,a,b,gold,e0,e1,e2,e3,x", r"bad\.csv:3: label 'x' is not an integer"),
    ("0,v,1,a b,a,b,gold,e0,,e2,e3,1", r"bad\.csv:3: empty ending1"),
    ("0,v,1,a b,,b,gold,e0,e1,e2,e3,1", r"bad\.csv:3: empty sent1"),
    ('0,v,1,"a b,a,b,gold,e0,e1,e2,e3,1', r"bad\.csv:3: (expected 12 fields|unexpected end of data)"),
])
def test_malformed_rows_name_file_and_line(tmp_path, row, message):
    path = tmp_path / "bad.csv"
    path.write_text(_swag_text("0,v,1,a b,a,b,gold,e0,e1,e2,e3,1", row))
    with pytest.raises(ValueError, match=message):
        read_swag_file(path)


def test_header_errors(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("text,label\nhello,1\n")
    with pytest.raises(ValueError, match=r"h\.csv:1: not a SWAG header"):
        read_swag_file(path)
    path.write_text("sent1,sent2,ending0,ending2,label\na,b,c,d,0\n")
    with pytest.raises(ValueError, match="without gaps"):
        read_swag_file(path)
    with pytest.raises(FileNotFoundError):
        read_swag_file(tmp_path / "missing.csv")


def test_columns_by_name_without_index_column(tmp_path):
    path = tmp_path / "reordered.csv"
    path.write_text("label,ending1,ending0,sent2,sent1\n1,\"b, B\",a,She,Ctx.\n")
    (example,) = read_swag_file(path)
    assert example.endings == ["a", "b, B"] and example.label == 1 and example.index == "0"


def test_writer_round_trips(tmp_path):
    examples = read_swag_file(SWAG / "train.csv")
    again = read_swag_file(write_swag_file(tmp_path / "train.csv", examples))
    assert [(e.context, e.start, e.endings, e.label, e.index, e.video_id) for e in again] == \
        [(e.context, e.start, e.endings, e.label, e.index, e.video_id) for e in examples]


# ---------------------------------------------------------------------------- features

def test_features_are_four_sequences_of_context_and_start_plus_ending(minilm_dir):
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    examples = read_swag_file(SWAG / "train.csv")
    features = convert_examples_to_features(examples, tokenizer, max_seq_length=128)
    assert len(features) == 4 and all(len(f["input_ids"]) == 4 for f in features)
    e, f = examples[3], features[3]
    for c in range(4):
        expected = tokenizer.encode(e.context, f"{e.start} {e.endings[c]}")
        assert f["input_ids"][c] == expected["input_ids"]
        assert f["token_type_ids"][c] == expected["token_type_ids"]
    tokens = tokenizer.convert_ids_to_tokens(f["input_ids"][0])
    assert tokens[:7] == ["[CLS]", "students", "lower", "their", "eyes", "nervously", "."]
    assert tokens[7:11] == ["[SEP]", "she", "pat", "##s"] and tokens[-1] == "[SEP]"
    assert f["label"] == 2
    short = convert_examples_to_features(examples, tokenizer, max_seq_length=16)
    assert all(len(ids) <= 16 and ids[-1] == tokenizer.sep_token_id for f in short for ids in f["input_ids"])

    batch = collate(features)
    longest = max(len(ids) for f in features for ids in f["input_ids"])
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (4, 4, longest)
    assert batch["labels"].tolist() == [0, 3, 0, 2]
    assert batch["attention_mask"][3, 1].sum() == len(features[3]["input_ids"][1])
    assert batch["input_ids"][3, 1, len(features[3]["input_ids"][1]):].eq(0).all()  # [PAD] is 0
    out = BertForMultipleChoice.from_pretrained(minilm_dir)(**batch)
    assert out.logits.shape == (4, 4) and torch.isfinite(out.loss)


def test_collate_without_labels_and_mixed():
    rows = [{"input_ids": [[2, 5, 3], [2, 6, 7, 3]], "token_type_ids": [[0, 0, 0], [0, 0, 1, 1]], "label": None}]
    batch = collate(rows)
    assert "labels" not in batch and batch["input_ids"].shape == (1, 2, 4)
    with pytest.raises(ValueError, match="have no label"):
        collate(rows + [dict(rows[0], label=1)])


# ---------------------------------------------------------------------------- fine-tuning and prediction

def _learnable(n: int, seed: int) -> list[ChoiceExample]:
    """The right ending is the one holding "good"; the other three hold "bad". Everything else is noise."""
    rng = random.Random(seed)
    nouns, verbs = ["cat", "dog", "bird"], ["sat", "ran", "flew"]
    examples = []
    for i in range(n):
        label = rng.randrange(4)
        endings = [" ".join([rng.choice(verbs), "good" if c == label else "bad", rng.choice(["far", "on the mat",
                                                                                              "then ran"])]) + " ."
                   for c in range(4)]
        examples.append(ChoiceExample(f"x-{i}", f"the {rng.choice(nouns)} {rng.choice(verbs)} .", "it", endings,
                                      label, video_id=f"v{i}", fold_ind=str(i)))
    return examples


def test_tiny_finetune_learns_and_predicts(tiny_dir, tmp_path):
    train = write_swag_file(tmp_path / "train.csv", _learnable(96, seed=1))
    dev = write_swag_file(tmp_path / "dev.csv", _learnable(40, seed=2))
    task = multiple_choice_task(tiny_dir, train, dev, max_seq_length=32)
    out = tmp_path / "out"
    results = finetune(task, FinetuneArguments(out, lr=2e-3, epochs=6, batch_size=8, warmup_ratio=0.0,
                                               progress=False, log_every=1000, device="cpu"))
    assert results["task"] == TASK_NAME
    assert results["metrics"]["accuracy"] >= 0.7  # chance is 0.25
    config = json.loads((out / "config.json").read_text())
    assert config["finetuning_task"] == TASK_NAME and config["architectures"] == ["BertForMultipleChoice"]
    records = [json.loads(line) for line in (out / "dev_predictions.jsonl").read_text().splitlines()]
    assert len(records) == 40 and abs(sum(records[0]["probabilities"]) - 1) < 1e-4
    assert sum(r["correct"] for r in records) / 40 == pytest.approx(results["metrics"]["accuracy"])

    # predict (library and CLI, dispatched on the model's finetuning_task) on an unlabelled copy
    path = predict_choice_file(out, dev, tmp_path / "pred.tsv", max_seq_length=32)
    lines = path.read_text().splitlines()
    assert lines[0] == "index\tprediction\tscore" and len(lines) == 41
    predicted = [int(line.split("\t")[1]) for line in lines[1:]]
    assert predicted == [r["prediction"] for r in records]
    assert main(["predict", "--model", str(out), "--input", str(dev), "--output", str(tmp_path / "cli.tsv"),
                 "--max-seq-length", "32"]) == 0
    assert (tmp_path / "cli.tsv").read_text() == path.read_text()
    unpadded = predict_choice_file(out, dev, tmp_path / "fp32.tsv", max_seq_length=32, dtype="fp32")
    assert [line.split("\t")[1] for line in unpadded.read_text().splitlines()] == \
        [line.split("\t")[1] for line in path.read_text().splitlines()]


def test_cli_finetune_multiple_choice_on_fixtures(tiny_dir, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["finetune", "multiple-choice", "--train-file", str(SWAG / "train.csv"), "--dev-file",
                 str(SWAG / "val.csv"), "--test-file", str(SWAG / "test.csv"), "--model", str(tiny_dir),
                 "--output-dir", str(out), "--epochs", "1", "--no-progress", "--max-seq-length", "48"])
    assert code == 0
    assert "multiple-choice: best at epoch" in capsys.readouterr().out
    assert json.loads((out / "eval_results.json").read_text())["task"] == TASK_NAME
    assert (out / "test_predictions.tsv").read_text().splitlines()[1].split("\t")[0] == "0"


def test_cli_defaults_are_the_papers_swag_recipe():
    from bertforge.cli import build_parser
    from bertforge.cli.finetune import _arguments

    args = build_parser().parse_args(["finetune", "multiple-choice", "--train-file", "t", "--dev-file", "d",
                                      "--model", "m", "--output-dir", "o"])
    settings = _arguments(args)  # --epochs is None unless given (so --max-steps can win); the recipe fills it
    assert (args.lr, args.batch_size, settings.epochs, args.max_seq_length) == (2e-5, 16, 3.0, 128)


def test_cli_reports_a_malformed_row(tiny_dir, tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text(_swag_text("0,v,1,a b,a,b,gold,e0,e1,e2,e3,7"))
    code = main(["finetune", "multiple-choice", "--train-file", str(bad), "--dev-file", str(SWAG / "val.csv"),
                 "--model", str(tiny_dir), "--output-dir", str(tmp_path / "o"), "--max-seq-length", "64"])
    assert code == 2 and "bad.csv:2: label 7 is not in 0..3" in capsys.readouterr().err


def test_book_choice_script_splits_by_book_and_is_deterministic(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_book_choice", Path(__file__).resolve().parents[2] /
                                                  "scripts" / "make_book_choice.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    books = tmp_path / "books"
    books.mkdir()
    for b in range(3):  # three tiny books: 120 distinct sentences each, a paragraph every 5
        sentences = [f"In book {b} the traveller number {i} walked along the road." for i in range(120)]
        paragraphs = [" ".join(sentences[i:i + 5]) for i in range(0, 120, 5)]
        (books / f"Author_Book{b}_1900.txt").write_text("CHAPTER I.\n\n" + "\n\n".join(paragraphs) + "\n")
    for out in ("a", "b"):
        assert script.main(["--books-dir", str(books), "--output-dir", str(tmp_path / out), "--dev-books", "1",
                            "--train-per-book", "10", "--dev-per-book", "5", "--seed", "3"]) == 0
    assert (tmp_path / "a" / "train.csv").read_bytes() == (tmp_path / "b" / "train.csv").read_bytes()
    train, dev = read_swag_file(tmp_path / "a" / "train.csv"), read_swag_file(tmp_path / "a" / "val.csv")
    assert len(train) == 20 and len(dev) == 5
    assert not {e.video_id for e in train} & {e.video_id for e in dev}  # no book in both splits
    for e in train + dev:
        answer = int(e.fold_ind) - 1  # the true next sentence's position in its book ("CHAPTER I." is 0)
        assert e.endings[e.label] == f"In book {e.video_id[11]} the traveller number {answer} walked along the road."
        numbers = [int(ending.split()[6]) for ending in e.endings]
        assert all(abs(n - answer) > 20 for k, n in enumerate(numbers) if k != e.label)
        assert e.context.endswith(f"number {answer - 1} walked along the road.")
    with pytest.raises(SystemExit):  # never into the repository
        script.main(["--books-dir", str(books), "--output-dir", str(Path(__file__).parent / "tmp_out")])
