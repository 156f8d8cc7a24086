"""Bad input is caught before work starts (issue #25, items 5, 6, 7 and 9): a model asked for a task its
head was not trained for, flag limits, undecodable or empty data, unalignable SQuAD answers, and
`predict` writing over its input or an existing file. Each error is one line naming what is at fault."""

from __future__ import annotations

import json
import os
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

    from bertforge.tasks.answer import answer_questions
    from bertforge.tasks.squad_postprocess import json_text

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
    from bertforge.tasks.multiple_choice import read_swag_file
    from bertforge.tasks.classify_reader import read_classify_file
    from bertforge.tasks.glue_data import read_glue_examples
    from bertforge.tasks.squad_data import read_squad_file
    from bertforge.tasks.conll import read_conll

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
    from bertforge.tasks.squad_data import read_squad_file

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
    from bertforge.tasks.squad_data import SquadExample, check_alignment

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


# ---------------------------------------------------------------------------- issue 49: outputs (item 5)

def test_predict_writes_through_a_symlink_and_refuses_a_fifo(models, tmp_path, capsys):
    import os

    data = tmp_path / "in.csv"
    data.write_text("text\ngood film\nbad film\n")
    predict = ["predict", "--model", str(models["classify"]), "--input", str(data)]
    target = tmp_path / "kept" / "predictions.tsv"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "out.tsv"
    link.symlink_to(target)
    assert main(predict + ["--output", str(link)]) == 2  # the target exists: --overwrite is still needed
    assert f"--output: {link} exists; pass --overwrite" in _error(capsys)
    assert main(predict + ["--output", str(link), "--overwrite"]) == 0
    assert link.is_symlink() and target.read_text().splitlines()[0] == "index\tprediction\tscore"
    assert sorted(p.name for p in target.parent.iterdir()) == ["predictions.tsv"]

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert main(predict + ["--output", str(fifo), "--overwrite"]) == 2
    assert f"error: --output {fifo} is a FIFO (named pipe), not a regular file: refusing to write" in _error(capsys)
    assert os.path.exists(fifo) and not os.path.isfile(fifo)


def test_vocab_never_replaces_a_file_without_overwrite(tmp_path, capsys):
    import os

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat .\nthe dog sat on the log .\n" * 20)
    out = tmp_path / "vocab.txt"
    out.write_text("keep me\n")
    vocab = ["vocab", "--input", str(corpus), "--vocab-size", "40", "--min-frequency", "1", "--output"]
    assert main(vocab + [str(out)]) == 2
    assert f"bertforge vocab: error: --output: {out} exists; pass --overwrite to replace it" in _error(capsys)
    assert out.read_text() == "keep me\n"
    assert main(vocab + [str(corpus), "--overwrite"]) == 2  # never the input, --overwrite or not
    assert "is the input file" in _error(capsys)
    target = tmp_path / "real_vocab.txt"
    target.write_text("old\n")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    assert main(vocab + [str(link), "--overwrite"]) == 0
    assert link.is_symlink() and target.read_text().startswith("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert main(vocab + [str(fifo), "--overwrite"]) == 2
    assert f"--output {fifo} is a FIFO (named pipe), not a regular file" in _error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "link.txt", "pipe", "real_vocab.txt",
                                                          "vocab.txt"]


def test_other_commands_refuse_an_existing_output_before_loading_anything(config_only, tmp_path, capsys):
    data = tmp_path / "in.txt"
    data.write_text("good film\n")
    existing = tmp_path / "exists.out"
    existing.write_text("keep me\n")
    assert main(["extract-features", "--model", str(config_only), "--input-file", str(data),
                 "--output-file", str(existing)]) == 2
    assert f"error: --output-file: {existing} exists; pass --overwrite to replace it" in _error(capsys)
    assert main(["export-onnx", "--model", str(config_only), "--output", str(existing)]) == 2
    assert f"error: --output: {existing} exists; pass --overwrite to replace it" in _error(capsys)
    converted = tmp_path / "converted"
    converted.mkdir()
    (converted / "config.json").write_text("{}")
    assert main(["convert-tf", str(tmp_path / "ckpt" / "bert_model.ckpt"), str(converted)]) == 2
    assert f"error: output_dir: {converted / 'config.json'} exists; pass --overwrite" in _error(capsys)
    assert existing.read_text() == "keep me\n" and (converted / "config.json").read_text() == "{}"


# ---------------------------------------------------------------------------- issue 49: smaller items (9)

def _classify_files(directory: Path, labels: list[str], count: int = 64) -> tuple[Path, Path]:
    words = ["good film", "bad film", "fine plot", "dull plot"]
    train, dev = directory / "train.csv", directory / "dev.csv"
    rows = [f"{words[i % 4]} {i},{labels[i % len(labels)]}" for i in range(count)]
    train.write_text("text,label\n" + "\n".join(rows) + "\n")
    dev.write_text("text,label\n" + "\n".join(rows[:8]) + "\n")
    return train, dev


def test_a_one_label_training_file_is_refused(config_only, tmp_path, capsys):
    train, dev = _classify_files(tmp_path, ["good"])
    assert main(["finetune", "classify", "--model", str(config_only), "--train-file", str(train), "--dev-file",
                 str(dev), "--output-dir", str(tmp_path / "o")]) == 2
    assert (f"error: {train}: every example has the label 'good': a classifier needs two or more labels"
            in _error(capsys))
    assert not (tmp_path / "o").exists()


def test_reproduce_names_the_flag_of_a_bad_size(tmp_path, capsys):
    assert main(["reproduce", "table5", "--config", "2/65/2", "--output-dir", str(tmp_path / "o")]) == 2
    assert "error: --config: 2/65/2: #H (65) must be a multiple of #A (2)" in _error(capsys)
    assert main(["reproduce", "table6", "--sizes", "2/128/2,2/65/2", "--output-dir", str(tmp_path / "o")]) == 2
    assert "error: --sizes: 2/65/2: #H (65) must be a multiple of #A (2)" in _error(capsys)


def test_ner_refuses_a_dev_tag_never_seen_in_training(config_only, tmp_path, capsys):
    train, dev = tmp_path / "train.txt", tmp_path / "dev.txt"
    train.write_text("John B-PER\nlives O\nin O\nParis B-LOC\n\nMary B-PER\njoined O\nAcme B-ORG\n")
    dev.write_text("-DOCSTART- O\n\nAnna B-PER\nworks O\n\nat O\nAcme B-ORG\nInc I-ORG\n")
    ner = ["finetune", "ner", "--model", str(config_only), "--train-file", str(train), "--dev-file", str(dev),
           "--output-dir", str(tmp_path / "o")]
    assert main(ner) == 2
    assert (f"error: {dev}:8: tag 'I-ORG' never appears in {train} (its tags: O B-LOC B-ORG B-PER): the model "
            "could not predict it" in _error(capsys))
    assert main(ner + ["--max-train-examples", "1"]) == 2  # the sentences kept are what counts
    assert f"error: {dev}:7: tag 'B-ORG' never appears in the first 1 sentences of {train}" in _error(capsys)
    dev.write_text("Acme I-ORG\n")  # IOB1: read as B-ORG, shown as written
    assert main(ner + ["--max-train-examples", "1"]) == 2
    assert f"error: {dev}:1: tag 'I-ORG' (B-ORG in IOB2) never appears" in _error(capsys)


# ---------------------------------------------------------------------------- issue 49: runs (items 6, 7, 8)

def _log_steps(out: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "loss" in r]


def _finetune(models, train, dev, out, *extra) -> list[str]:
    return ["finetune", "classify", "--model", str(models["classify"]), "--train-file", str(train), "--dev-file",
            str(dev), "--output-dir", str(out), "--batch-size", "16", "--log-every", "1", "--no-progress",
            "--lr", "1e-3", "--max-seq-length", "32", *extra]


def test_max_steps_wins_over_the_default_epochs(models, tmp_path, capsys):
    train, dev = _classify_files(tmp_path, ["bad", "good"])  # 64 examples, batch 16: 4 steps an epoch
    assert main(_finetune(models, train, dev, tmp_path / "a", "--max-steps", "20")) == 0
    assert _log_steps(tmp_path / "a") == list(range(1, 21))  # not 12 (3 epochs)
    assert "note" not in capsys.readouterr().err
    # Both given: --max-steps wins, and that is said.
    assert main(_finetune(models, train, dev, tmp_path / "b", "--max-steps", "6", "--epochs", "3")) == 0
    assert _log_steps(tmp_path / "b") == list(range(1, 7))
    assert "note: --max-steps 6 wins over --epochs 3: training runs 6 steps" in capsys.readouterr().err
    assert main(_finetune(models, train, dev, tmp_path / "c", "--epochs", "1")) == 0
    assert _log_steps(tmp_path / "c") == list(range(1, 5))


def test_a_second_run_into_a_held_directory_is_refused_naming_the_first(models, tmp_path, capsys):
    import os
    import subprocess
    import sys

    train, dev = _classify_files(tmp_path, ["bad", "good"], count=16)
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom bertforge._files import own_directory\n"
         "with own_directory(sys.argv[1], 'bertforge fine-tuning (classify)'):\n"
         "    print('holding', flush=True)\n    sys.stdin.read()\n", str(out)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        assert holder.stdout.readline() == "holding\n"
        assert main(_finetune(models, train, dev, out, "--max-steps", "2")) == 2
        assert (f"bertforge finetune: error: {out} is in use by another run (process {holder.pid}: bertforge "
                "fine-tuning (classify)): wait for it to end" in _error(capsys))
        assert sorted(p.name for p in out.iterdir()) == [".bertforge-lock"]  # nothing written by the second
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert main(_finetune(models, train, dev, out, "--max-steps", "2")) == 0  # once the first has ended
    assert not (out / ".bertforge-lock").exists() and not (out / "RUNNING").exists()


def test_a_full_disk_ends_finetune_in_one_line(models, tmp_path, capsys, monkeypatch):
    import bertforge._files as files
    from safetensors import SafetensorError

    def full(tensors, filename, metadata=None):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                              '"No space left on device" })')

    train, dev = _classify_files(tmp_path, ["bad", "good"], count=16)
    out = tmp_path / "out"
    monkeypatch.setattr(files, "save_file", full)
    assert main(_finetune(models, train, dev, out, "--max-steps", "2")) == 1
    err = _error(capsys)
    assert err.startswith(f"bertforge finetune: error: no space left on device writing {out / 'model.safetensors'}; "
                          "what was written before is intact")
    assert "--resume" in err
    assert not (out / "model.safetensors").exists() and not [p for p in out.iterdir() if ".tmp" in p.name]
    assert (out / "RUNNING").exists() and not (out / ".bertforge-lock").exists()  # unfinished, and free


def test_prepare_pretraining_replaces_earlier_instances_only_with_overwrite(uncased_vocab, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat on the mat.\nIt was happy.\n\nA dog ran home.\nIt slept.\n")
    out = tmp_path / "out"
    flags = ["prepare-pretraining", "--input", str(corpus), "--vocab", str(uncased_vocab), "--input-format", "bert",
             "--dupe-factor", "1", "--quiet", "--output-dir", str(out)]
    assert main(flags) == 0
    before = (out / "index.json").read_bytes()
    capsys.readouterr()
    assert main(flags + ["--seed", "7"]) == 2
    assert (f"error: --output-dir {out} holds prepared instances (index.json); pass --overwrite to replace them"
            in _error(capsys))
    assert (out / "index.json").read_bytes() == before
    assert main(flags + ["--seed", "7", "--overwrite"]) == 0
    assert json.loads((out / "index.json").read_text())["seed"] == 7
    assert not (out / ".bertforge-lock").exists()


# ---------------------------------------------------------------------------- issue 61 (5): the machine's limits

def _command(name: str, model: Path, out: Path) -> list[str]:
    """`name`'s command line with its required flags (data that need not exist: the flags are judged first)."""
    return {
        "finetune": ["finetune", "classify", "--train-file", str(out.parent / "t.csv"), "--dev-file",
                     str(out.parent / "d.csv"), "--model", str(model), "--output-dir", str(out)],
        "pretrain": ["pretrain", "--data", str(out.parent / "shards"), "--init-from", str(model),
                     "--output-dir", str(out)],
        "reproduce": ["reproduce", "table5", "--output-dir", str(out)],
        "serve": ["serve", "--model", str(model)],
    }[name]


def _writable(directory: str) -> bool:
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(dir=directory))
    except OSError:
        return False
    return True


LONG_NAME = "x" * 300  # over NAME_MAX (255 bytes) on every common file system


@pytest.mark.parametrize("command", ["finetune", "pretrain", "reproduce", "serve"])
def test_device_and_threads_the_machine_lacks_are_one_line_naming_the_flag(command, config_only, tmp_path, capsys):
    """Issue 61 (5): `--device cuda` without CUDA (was: AttributeError from torch._C) and `--num-threads
    100000` (was: a segfault or "can't start new thread", with a RUNNING marker left) are refused in one
    line, before anything is written."""
    out = tmp_path / "out"
    base = _command(command, config_only, out)
    assert main(base + ["--num-threads", "100000"]) == 2
    error = _error(capsys)
    assert f"bertforge {command}: error: --num-threads 100000 is more than the " in error
    assert "CPU(s) this process may run on" in error
    assert main(base + ["--device", "gpu"]) == 2
    assert "error: --device 'gpu' is not a device: give cpu, cuda or cuda:N" in _error(capsys)
    if not torch.cuda.is_available():
        assert main(base + ["--device", "cuda"]) == 2
        assert f"bertforge {command}: error: --device cuda: " in (error := _error(capsys)) and "--device cpu" in error
    assert not out.exists()


@pytest.mark.parametrize("command", ["finetune", "pretrain", "reproduce", "predict", "extract-features"])
def test_an_output_path_the_file_system_refuses_is_one_line_naming_the_flag(command, config_only, tmp_path, capsys):
    """Issue 61 (5): a 300-byte name in --output-dir, --output or --output-file (was: OSError File name too
    long, after the model loaded) and an output under /sys (was: PermissionError) are refused in one line."""
    data = tmp_path / "in.txt"
    data.write_text("good film\n")
    if command in ("predict", "extract-features"):
        name = "--output" if command == "predict" else "--output-file"
        source = "--input" if command == "predict" else "--input-file"

        def line(out: Path) -> list[str]:
            return [command, "--model", str(config_only), source, str(data), name, str(out)]
    else:
        name = "--output-dir"

        def line(out: Path) -> list[str]:
            return _command(command, config_only, out)
    assert main(line(tmp_path / LONG_NAME / "sub")) == 2
    error = _error(capsys)
    assert f"bertforge {command}: error: {name}: the name 'xxxxxxxx" in error
    assert "(300 bytes)' in it is 300 bytes long, over the file system's limit of 255 bytes per name" in error
    assert not (tmp_path / "sub").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["config_only", "in.txt"]
    read_only = tmp_path / "read_only"  # a place nothing can be created in, as /sys
    if Path("/sys").is_dir() and not _writable("/sys"):
        read_only = Path("/sys")
    else:
        read_only.mkdir(mode=0o500)
        if _writable(str(read_only)):  # root ignores the mode bits
            pytest.skip("no read-only place to write to on this machine")
    assert main(line(read_only / "foo")) == 2
    error = _error(capsys)
    assert f"bertforge {command}: error: {name} {read_only / 'foo'}: cannot write in {read_only} (" in error
    (tmp_path / "file").write_text("")
    assert main(line(tmp_path / "file" / "foo")) == 2
    assert f"error: {name} {tmp_path / 'file' / 'foo'}: {tmp_path / 'file'} is not a directory" in _error(capsys)
