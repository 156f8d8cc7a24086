"""Bad input is caught before work starts (issue #25, items 5, 6, 7 and 9): a model asked for a task its
head was not trained for, flag limits, undecodable or empty data, unalignable SQuAD answers, and
`predict` writing over its input or an existing file. Each error is one line naming what is at fault."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.modeling import BertConfig, BertForQuestionAnswering, BertForSequenceClassification
from bertforge.tokenization import BertTokenizer

WORDS = "the a is was of and to in who what where paris france capital city john lives works film good bad".split()


def _save(directory: Path, model_class, **extra) -> Path:
    """A tiny random checkpoint of `model_class` whose config.json carries `extra` (e.g. finetuning_task)."""
    directory.mkdir(parents=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "?"] + WORDS
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    BertTokenizer(directory / "vocab.txt", do_lower_case=True).save_pretrained(directory)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, id2label=extra.pop("id2label", None))
    config.extra.update(extra)
    model_class(config).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad_input_models")
    return {
        "classify": _save(root / "classify", BertForSequenceClassification, finetuning_task="classify",
                          id2label={0: "bad", 1: "good"}),
        "squad": _save(root / "squad", BertForQuestionAnswering, finetuning_task="squad",
                       squad={"max_seq_length": 64, "doc_stride": 16, "max_query_length": 16}),
    }


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line, no traceback
    return err


# ---------------------------------------------------------------------------- 5. a model asked for another task

def test_predict_refuses_a_head_trained_for_another_task(models, capsys):
    code = main(["predict", "--model", str(models["classify"]), "--question", "Who?", "--context", "x"])
    err = _error(capsys)
    assert code == 2
    assert f"{models['classify']} is a classify model, not trained for squad" in err
    assert "qa_outputs.weight" in err


def test_pipelines_refuse_an_untrained_head(models):
    from bertforge.serving.pipelines import pipeline

    with pytest.raises(ValueError, match="is a classify model, not trained for answer: .*qa_outputs"):
        pipeline("answer", model=models["classify"])
    with pytest.raises(ValueError, match="is a squad model, not trained for fill-mask: .*cls.predictions"):
        pipeline("fill-mask", model=models["squad"])
    # A token classifier's weights have the names of a sequence classifier's: the saved class decides.
    with pytest.raises(ValueError, match="is a classify model, not trained for tag: its config.json says "
                                         "BertForSequenceClassification, not BertForTokenClassification"):
        pipeline("tag", model=models["classify"])
        # Hidden states need no head: any checkpoint embeds.
    assert pipeline("embed", model=models["squad"])(["the film"]).shape == (1, 32)


def test_predict_answers_are_strict_json_and_an_empty_context_is_refused(models, capsys):
    assert main(["predict", "--model", str(models["squad"]), "--question", "who lives in paris?",
                 "--context", "john lives in paris ."]) == 0
    answer = json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(f"{name} in JSON"))
    assert set(answer) == {"answer", "start", "end", "probability", "null_odds"}
    assert main(["predict", "--model", str(models["squad"]), "--question", "Who?", "--context", ""]) == 2
    assert "error: --context is empty" in _error(capsys)

    from bertforge.tasks.squad import answer_questions, json_text

    with pytest.raises(ValueError, match="context 1 is empty"):
        answer_questions(models["squad"], ["who?", "who?"], ["john .", "  "])
    assert json_text({"null_odds": float("inf"), "n": [float("nan"), 1.5]}, indent=None) == \
        '{"null_odds": null, "n": [null, 1.5]}'


# ---------------------------------------------------------------------------- 6. limits, before the model loads

@pytest.fixture
def config_only(tmp_path) -> Path:
    """A model directory with config.json alone: a flag error must come from reading that, loading nothing."""
    directory = tmp_path / "config_only"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"max_position_embeddings": 512, "hidden_size": 32}))
    return directory


@pytest.mark.parametrize("flags, message", [
    (["predict", "--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    (["predict", "--max-seq-length", "1000"], "--max-seq-length 1000 exceeds the 512 positions of {model} "
                                              "(max_position_embeddings in its config.json)"),
    (["finetune", "glue", "--task", "sst2", "--data-dir", "d", "--output-dir", "o", "--epochs", "0"],
     "--epochs must be a positive number, got 0"),
    (["finetune", "classify", "--train-file", "t", "--dev-file", "d", "--output-dir", "o", "--lr", "nan"],
     "--lr must be a positive number, got nan"),
    (["finetune", "ner", "--train-file", "t", "--dev-file", "d", "--output-dir", "o", "--eval-batch-size", "-4"],
     "--eval-batch-size must be at least 1, got -4"),
    (["finetune", "squad", "--train-file", "t", "--dev-file", "d", "--output-dir", "o", "--doc-stride", "400"],
     "--doc-stride (400) must be less than --max-seq-length - --max-query-length - 3 = 317"),
    (["finetune", "classify", "--train-file", "t", "--dev-file", "d", "--output-dir", "o", "--warmup-ratio", "1"],
     "--warmup-ratio must be in [0, 1), got 1"),
    (["finetune", "glue", "--task", "sst2", "--data-dir", "d", "--output-dir", "o", "--long-input", "windows",
      "--doc-stride", "128"], "--doc-stride (128) must be less than --max-seq-length (128)"),
])
def test_flag_limits_are_checked_before_anything_loads(flags, message, config_only, capsys):
    assert main(flags + ["--model", str(config_only)]) == 2
    assert f"error: {message.format(model=config_only)}" in _error(capsys)


def test_predict_squad_checks_the_stored_settings_with_the_flags(models, capsys):
    code = main(["predict", "--model", str(models["squad"]), "--question", "who?", "--context", "john .",
                 "--doc-stride", "45"])
    assert code == 2
    assert "--doc-stride (45) must be less than --max-seq-length - --max-query-length - 3 = 45" in _error(capsys)


def test_prepare_pretraining_probability_flag(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b .\n")
    assert main(["prepare-pretraining", "--input", str(corpus), "--vocab", "v", "--output-dir", str(tmp_path / "o"),
                 "--masked-lm-prob", "1.5"]) == 2
    assert "--masked-lm-prob must be in (0, 1), got 1.5" in _error(capsys)


# ---------------------------------------------------------------------------- 7. bad data

LATIN1 = "caf\xe9".encode("latin-1")  # 0xe9: not UTF-8


@pytest.mark.parametrize("name, content, line", [
    ("glue/SST-2/train.tsv", b"sentence\tlabel\ngood film .\t1\nthe " + LATIN1 + b" .\t0\n", 3),
    ("data.csv", b"text,label\ngood,1\n\"a " + LATIN1 + b"\",0\n", 3),
    ("data.jsonl", b'{"text": "good", "label": 1}\n{"text": "' + LATIN1 + b'", "label": 0}\n', 2),
    ("data.txt", b"-DOCSTART- -X- -X- O\n\nJohn NNP B-NP B-PER\n" + LATIN1 + b" NN I-NP O\n", 4),
    ("squad.json", b'{"version": "1.1",\n "data": [{"title": "' + LATIN1 + b'", "paragraphs": []}]}\n', 2),
    ("swag.csv", b",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n"
                 b"0,v,1,s,a,b,gold," + LATIN1 + b",e1,e2,e3,0\n", 2),
])
def test_every_reader_names_file_and_line_of_an_undecodable_byte(name, content, line, tmp_path):
    from bertforge.tasks.choice import read_swag_file
    from bertforge.tasks.classification import read_classify_file
    from bertforge.tasks.glue import read_glue_examples
    from bertforge.tasks.squad import read_squad_file
    from bertforge.tasks.tagging import read_conll

    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    offset = content.index(b"\xe9")
    readers = {".tsv": lambda: read_glue_examples("sst2", tmp_path / "glue", "train"),
               ".csv": lambda: (read_swag_file(path) if name.startswith("swag") else read_classify_file(path)),
               ".jsonl": lambda: read_classify_file(path), ".txt": lambda: read_conll(path),
               ".json": lambda: read_squad_file(path)}
    with pytest.raises(ValueError) as error:
        readers[path.suffix]()
    assert str(error.value) == (f"{path}:{line}: not UTF-8 text (byte 0xe9 at byte offset {offset}); "
                                f"re-save the file as UTF-8")


def test_predict_names_an_undecodable_input_before_loading_the_model(models, tmp_path, capsys):
    data = tmp_path / "in.csv"
    data.write_bytes(b"text\ngood\n" + LATIN1 + b"\n")
    assert main(["predict", "--model", str(models["classify"]), "--input", str(data),
                 "--output", str(tmp_path / "out.tsv")]) == 2
    assert f"error: {data}:3: not UTF-8 text (byte 0xe9 at byte offset 13)" in _error(capsys)
    assert not (tmp_path / "out.tsv").exists()


def test_extract_features_reads_its_input_before_the_model(config_only, tmp_path, capsys):
    data = tmp_path / "in.txt"
    for content, message in ((b"good film\n" + LATIN1 + b" ||| bad\n", f"{data}:2: not UTF-8 text (byte 0xe9"),
                             (b"", f"{data}: no examples (an empty file)")):
        data.write_bytes(content)
        assert main(["extract-features", "--model", str(config_only), "--input-file", str(data),
                     "--output-file", str(tmp_path / "f.jsonl")]) == 2
        assert f"error: {message}" in _error(capsys)


def test_an_empty_glue_file_is_named_before_the_model_loads(config_only, tmp_path, capsys):
    task = tmp_path / "SST-2"
    task.mkdir()
    (task / "train.tsv").write_text("")
    (task / "dev.tsv").write_text("sentence\tlabel\ngood .\t1\n")
    (config_only / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\ngood\n")
    assert main(["finetune", "glue", "--task", "sst2", "--data-dir", str(tmp_path), "--model", str(config_only),
                 "--output-dir", str(tmp_path / "o")]) == 2
    assert f"error: {task / 'train.tsv'}: no examples (an empty train file)" in _error(capsys)


def test_squad_training_data_with_wrong_offsets_is_refused(shared_data, minilm_dir, tmp_path, capsys):
    from bertforge.tasks.squad import read_squad_file

    source = shared_data / "squad" / "v1.1" / "train-v1.1.first11.json"
    root = json.loads(source.read_text(encoding="utf-8"))
    root["data"] = root["data"][:1]
    for paragraph in root["data"][0]["paragraphs"]:
        for qa in paragraph["qas"]:
            for answer in qa["answers"]:
                answer["answer_start"] += 7  # all off by seven characters
    shifted = tmp_path / "shifted.json"
    shifted.write_text(json.dumps(root), encoding="utf-8")
    questions = len(read_squad_file(shifted).examples)
    code = main(["finetune", "squad", "--train-file", str(shifted), "--dev-file", str(shifted), "--model",
                 str(minilm_dir), "--output-dir", str(tmp_path / "o"), "--max-seq-length", "128",
                 "--doc-stride", "32"])
    err = _error(capsys)
    assert code == 2 and not (tmp_path / "o").exists()
    first = root["data"][0]["paragraphs"][0]["qas"][0]["id"]
    assert f"error: {shifted}: {questions} of {questions} answers cannot be aligned with their passage " \
           f"(more than 1%); first: {first}: answer " in err


def test_a_few_unalignable_answers_are_only_skipped():
    from bertforge.tasks.squad import SquadExample, check_alignment

    examples = [SquadExample(str(i), "q", "c", [("c", 0)]) for i in range(200)]
    check_alignment([("7", "moved")], examples, "train.json")  # 0.5 %: skipped with a warning
    with pytest.raises(ValueError, match=r"^train.json: 3 of 200 answers cannot be aligned .* first: 1: moved; 2: "):
        check_alignment([("1", "moved"), ("2", "moved"), ("3", "moved")], examples, "train.json")


def test_prepare_pretraining_counts_replaced_bytes_and_strict_refuses(uncased_vocab, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"The cat sat on the mat.\nIt was a " + LATIN1 + b" cat.\n\n"
                       b"A dog ran home.\nIt \xff\xfe slept.\n")
    out, strict = tmp_path / "out", tmp_path / "strict"
    flags = ["prepare-pretraining", "--input", str(corpus), "--vocab", str(uncased_vocab), "--input-format", "bert",
             "--dupe-factor", "1", "--quiet", "--output-dir"]
    assert main(flags + [str(out)]) == 0
    err = capsys.readouterr().err
    assert f"replaced 3 byte(s) that are not UTF-8 with U+FFFD in 1 file(s) (first: {corpus})" in err
    index = json.loads((out / "index.json").read_text())
    assert index["replaced_bytes"] == {str(corpus): 3} and index["stats"]["replaced_bytes"] == 3

    assert main(flags + [str(strict), "--strict"]) == 2
    offset = corpus.read_bytes().index(b"\xe9")
    assert f"error: {corpus}:2: not UTF-8 text (byte 0xe9 at byte offset {offset})" in _error(capsys)
    assert not strict.exists()


# ---------------------------------------------------------------------------- 9. predict never destroys a file

def test_predict_never_overwrites_its_input_nor_an_existing_file(models, tmp_path, capsys):
    data = tmp_path / "in.csv"
    data.write_text("text\ngood film\nbad film\n")
    original = data.read_bytes()
    predict = ["predict", "--model", str(models["classify"]), "--input", str(data)]
    for output in (data, tmp_path / "." / "in.csv"):
        assert main(predict + ["--output", str(output), "--overwrite"]) == 2
        assert f"error: --output {output} is the input file {data}: a command never overwrites its input" in _error(capsys)
        assert data.read_bytes() == original

    out = tmp_path / "out.tsv"
    out.write_text("keep me\n")
    assert main(predict + ["--output", str(out)]) == 2
    assert f"error: --output: {out} exists; pass --overwrite to replace it" in _error(capsys)
    assert out.read_text() == "keep me\n"
    assert main(predict + ["--output", str(out), "--overwrite"]) == 0
    assert out.read_text().splitlines()[0] == "index\tprediction\tscore"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv", "out.tsv"]  # no temporary left behind


def test_predict_squad_side_files_are_guarded_too(models, tmp_path, capsys):
    data = tmp_path / "questions.json"
    data.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": "john lives in paris .", "qas": [{"id": "q1", "question": "who lives in paris?",
                                                      "answers": []}]}]}]}))
    (tmp_path / "pred.nbest.json").write_text("{}")
    assert main(["predict", "--model", str(models["squad"]), "--input", str(data), "--output",
                 str(tmp_path / "pred.json")]) == 2
    assert f"--output: {tmp_path / 'pred.nbest.json'} exists; pass --overwrite" in _error(capsys)
