"""The `bertforge` command: sub-commands that wrap the foundation, and its error handling."""

import json
import sys
from pathlib import Path

import pytest

from bertforge import BertForPreTraining
from bertforge.cli import main
from bertforge import quickstart
from bertforge.quickstart import run_quickstart

FIXTURE = Path(__file__).parent / "fixtures" / "tf_bert_tiny"


def test_convert_tf(tmp_path, capsys):
    out = tmp_path / "converted"
    assert main(["convert-tf", str(FIXTURE / "bert_model.ckpt"), str(out)]) == 0
    assert "converted" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"}
    model = BertForPreTraining.from_pretrained(out)
    assert model.load_report.newly_initialized == []
    assert json.loads((out / "config.json").read_text())["hidden_size"] == model.config.hidden_size


def test_convert_tf_missing_checkpoint(tmp_path, capsys):
    assert main(["convert-tf", str(tmp_path / "nothing" / "bert_model.ckpt"), str(tmp_path / "out")]) == 2
    assert "nothing" in capsys.readouterr().err


@pytest.mark.slow
def test_quickstart_pipeline_learns(tmp_path, capsys, monkeypatch, minilm_dir):
    # The real pipeline, shortened: the held-out masked-LM loss must fall from its first evaluation, and the
    # pre-trained model is scored beside the frequency baseline and the random-init model; the real
    # checkpoint's comparison on a few passages, one seed.
    monkeypatch.setattr(quickstart, "REAL_TRAIN_EXAMPLES", 48)
    monkeypatch.setattr(quickstart, "REAL_MAX_SEQ_LENGTH", 32)
    run_quickstart(tmp_path, vocab_size=3000, max_steps=60, batch_size=16, genre_epochs=1, genre_max_examples=256,
                   cloze_size=50, real_model=minilm_dir, real_seeds=(3,))
    captured = capsys.readouterr()
    printed = captured.out
    # The plays' long verse sentences are summarised in one line, not warned about play by play.
    assert "verse sentences over 256 tokens" in printed and "over twice --max-seq-length" not in captured.err
    for stage in ("corpus:", "vocab:", "instances:", "pre-training:", "plots:", "held-out masked-LM accuracy",
                  "fill-mask", "cloze:", "features:", "fine-tuning:"):
        assert stage in printed
    report = json.loads((tmp_path / "report.json").read_text())
    genre = report["genre"]
    assert 0.3 < genre["majority_class"] < 0.5  # three genres, one held-out play each
    assert set(genre) == {"majority_class", "pre-trained", "random init"}
    assert (tmp_path / "genre_pre_trained" / "eval_results.json").is_file()
    assert report["held_out_last_eval"]["eval_mlm_loss"] < report["held_out_first_eval"]["eval_mlm_loss"]
    assert (tmp_path / "pretrain" / "final" / "model.safetensors").is_file()
    assert (tmp_path / "features.jsonl").read_text().count("\n") == 2
    real = report["genre_real_checkpoint"]
    assert (real["layers"], real["hidden_size"], real["train_examples"], real["seeds"]) == (6, 384, 48, [3])
    assert all(0 <= a <= 1 for a in real["pre-trained"] + real["random init"]) and len(real["random init"]) == 1
    assert f"the same task from a real checkpoint ({minilm_dir}; L=6, H=384)" in printed
    assert not (tmp_path / "real_checkpoint" / "random_init_seed3").exists()  # the random weights are not kept

    mlm = report["held_out_mlm_accuracy"]
    assert mlm["masked_tokens"] > 1000
    for name in ("pre-trained", "most frequent token", "random init"):
        assert 0 <= mlm[name]["accuracy"] <= mlm[name]["top5"] <= 1
    # The most frequent training token is punctuation or a function word, and alone it gets some masks right;
    # 60 steps already beat a model that never trained (near 1 / vocabulary size).
    assert 0.01 < mlm["most frequent token"]["accuracy"] < 0.2
    assert mlm["random init"]["accuracy"] < 0.01 < mlm["pre-trained"]["accuracy"]
    assert len(mlm["most_frequent_tokens"]) == 5
    # The pre-trained model's figure is the trainer's own held-out evaluation, recomputed (in fp32, the
    # trainer's under the run's autocast: the same to rounding).
    assert mlm["pre-trained"]["accuracy"] == pytest.approx(report["held_out_last_eval"]["eval_mlm_accuracy"],
                                                           abs=0.01)

    cloze = report["cloze"]
    assert cloze["items"] == 50 and 500 < cloze["candidates"] < 3000
    for name in ("pre-trained", "frequency", "random init"):
        assert 0 <= cloze[name]["top1_hit_rate"] <= cloze[name]["top5_hit_rate"] <= 1
        assert cloze[name]["median_rank"] >= 1
    # The frequency baseline proposes content words only, never "the" or a comma.
    assert all(word.isalpha() and word not in ("the", "and") for word in cloze["frequency_top5"])
    # Each fill-mask prompt's answer is a whole token; the ranks are within the vocabulary.
    assert report["fill_mask"]
    for prompt in report["fill_mask"]:
        assert "[MASK]" in prompt["line"] and len(prompt["top5"]) == 5
        for key in ("rank_pre_trained", "rank_random_init", "rank_frequency"):
            assert 1 <= prompt[key] <= cloze["candidates"]


def test_quickstart_refuses_a_missing_real_checkpoint_before_any_work(tmp_path):
    with pytest.raises(Exception, match="nowhere"):
        run_quickstart(tmp_path / "out", real_model=tmp_path / "nowhere")
    assert not (tmp_path / "out").exists()


def test_quickstart_passage_sample_is_fixed_and_mixes_the_genres():
    from bertforge.corpus import shakespeare_plays
    from bertforge.quickstart import genre_passages, sample_passages

    train, _ = genre_passages(shakespeare_plays())
    sample = sample_passages(train, 300)
    assert [e.guid for e in sample] == [e.guid for e in sample_passages(train, 300)]
    assert len(sample) == 300 and {e.label for e in sample} == {"comedy", "history", "tragedy"}
    assert {e.label for e in train[:300]} != {"comedy", "history", "tragedy"}  # why a prefix would not do
    assert sample_passages(train, None) is train


def test_quickstart_cloze_items_are_fixed_and_whole_words(tmp_path):
    # The cloze set depends on the held-out plays and the vocabulary only: the same items every run, each with
    # one content word masked in place of its own single token.
    from bertforge.corpus import shakespeare_plays
    from bertforge.quickstart import HELD_OUT, cloze_items, is_content_word, write_corpus
    from bertforge.tokenization import BertTokenizer, train_vocab

    train_files, _ = write_corpus(tmp_path / "corpus")
    train_vocab(train_files, vocab_size=3000, lowercase=True, output=tmp_path / "vocab.txt", show_progress=False)
    tokenizer = BertTokenizer(tmp_path / "vocab.txt", do_lower_case=True)
    held_out = [p for p in shakespeare_plays() if p.title in HELD_OUT]
    items = cloze_items(held_out, tokenizer, size=40)
    assert items == cloze_items(held_out, tokenizer, size=40)
    assert len(items) == 40
    vocab = {i: t for t, i in tokenizer.vocab.items()}
    for ids, position, answer in items:
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        assert ids.count(tokenizer.mask_token_id) == 1 and ids[position] == tokenizer.mask_token_id
        assert is_content_word(vocab[answer]) and not vocab[ids[position + 1]].startswith("##")
    assert not is_content_word("the") and not is_content_word(",") and is_content_word("crown")


def test_serve_without_the_serve_extra_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    # starlette made unimportable (None in sys.modules), the server module forgotten so it is imported again.
    monkeypatch.setitem(sys.modules, "starlette", None)
    monkeypatch.delitem(sys.modules, "bertforge.serving.server", raising=False)
    assert main(["serve", "--model", str(tmp_path)]) == 2
    assert capsys.readouterr().err == ("bertforge serve: error: starlette is not installed: "
                                       "pip install 'bertforge[serve]' (starlette and uvicorn)\n")


# -- the flags generated from the settings' fields (bertforge.cli.flags, bertforge.training.settings) --------

def _parse(*argv: str):
    from bertforge.cli import build_parser

    return build_parser().parse_args(list(argv))


FINETUNE_GLUE = ("finetune", "glue", "--task", "mrpc", "--data-dir", "d", "--model", "m", "--output-dir", "o")


def test_finetune_flags_default_to_the_recipe_the_settings_declare():
    from bertforge.cli.flags import settings_from_args
    from bertforge.training.finetune import FinetuneArguments

    assert settings_from_args(FinetuneArguments, _parse(*FINETUNE_GLUE)) == FinetuneArguments(output_dir="o")
    # A task's recipe changes only the defaults it names (multiple choice: batch 16).
    choice = _parse("finetune", "multiple-choice", "--train-file", "t", "--dev-file", "d", "--model", "m",
                    "--output-dir", "o")
    assert settings_from_args(FinetuneArguments, choice) == FinetuneArguments(output_dir="o", batch_size=16)


def test_finetune_flags_reach_their_fields():
    from bertforge.cli.flags import settings_from_args
    from bertforge.training.finetune import FinetuneArguments

    args = _parse(*FINETUNE_GLUE, "--lr", "3e-5", "--grad-accum", "2", "--precision", "bf16", "--no-unpad",
                  "--group-by-length", "--resume", "--no-progress", "--max-grad-norm", "0", "--seed", "7")
    settings = settings_from_args(FinetuneArguments, args)
    assert (settings.lr, settings.grad_accum, settings.precision, settings.unpad, settings.group_by_length,
            settings.resume, settings.progress, settings.max_grad_norm, settings.seed) == \
        (3e-5, 2, "bf16", False, True, True, False, 0.0, 7)


def test_pretrain_flags_default_to_the_fields_and_keep_their_spellings():
    from bertforge.cli.flags import settings_from_args
    from bertforge.pretraining.trainer import PretrainingArguments

    base = ("pretrain", "--data", "data", "--output-dir", "o")
    assert settings_from_args(PretrainingArguments, _parse(*base)) == PretrainingArguments(data="data", output_dir="o")
    args = settings_from_args(PretrainingArguments, _parse(*base, "--no-nsp", "--no-unpad", "--resume", "--fsdp"))
    assert (args.nsp, args.unpad, args.resume, args.fsdp) == (False, False, True, True)
    assert settings_from_args(PretrainingArguments, _parse(*base, "--resume", "ckpt")).resume == "ckpt"
    assert settings_from_args(PretrainingArguments, _parse(*base, "--unpad")).unpad is True


def test_generated_flags_follow_the_field_types_and_choices():
    import argparse

    import pytest

    from bertforge.cli.flags import add_settings_flags
    from bertforge.training.settings import RunSettings

    parser = argparse.ArgumentParser()
    add_settings_flags(parser, RunSettings, ("output_dir", "batch_size", "lr", "precision", "progress", "fsdp",
                                             "unpad"), defaults={"lr": 5e-5})
    args = parser.parse_args(["--output-dir", "o", "--batch-size", "8"])
    assert (args.output_dir, args.batch_size, args.lr, args.precision, args.progress, args.fsdp, args.unpad) == \
        ("o", 8, 5e-5, "fp32", True, False, None)  # unpad: None is "the field's default"
    with pytest.raises(SystemExit):  # a required field is a required flag
        parser.parse_args([])
    with pytest.raises(SystemExit):  # choices come from the field
        parser.parse_args(["--output-dir", "o", "--precision", "fp8"])
    with pytest.raises(SystemExit):  # and the type
        parser.parse_args(["--output-dir", "o", "--batch-size", "many"])


def test_every_generated_flag_has_help():
    import argparse
    import dataclasses

    from bertforge.cli import build_parser

    def walk(parser):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from walk(sub)
            else:
                yield parser.prog, action

    from bertforge.pretraining.trainer import PretrainingArguments
    from bertforge.training.finetune import FinetuneArguments

    settings = {f.name for cls in (PretrainingArguments, FinetuneArguments) for f in dataclasses.fields(cls)}
    missing = [(prog, action.option_strings) for prog, action in walk(build_parser()) if action.dest in settings
               and not action.help and (prog == "bertforge pretrain" or prog.startswith("bertforge finetune "))]
    assert missing == []


def test_each_training_setting_is_declared_once():
    # A subclass of the settings may change a shared setting's default or wording only through `override`,
    # which keeps the declaration (help, flag) in bertforge/training/settings.py.
    import ast
    import dataclasses
    import inspect

    from bertforge.pretraining.trainer import PretrainingArguments
    from bertforge.training.finetune import FinetuneArguments
    from bertforge.training.settings import RunSettings, TrainingArguments, TrainingSettings

    shared = {f.name for f in dataclasses.fields(RunSettings)}
    for cls in (PretrainingArguments, FinetuneArguments, TrainingArguments):
        assert issubclass(cls, TrainingSettings)
        tree = ast.parse(inspect.getsource(cls))
        for node in ast.walk(tree):
            if isinstance(node, ast.AnnAssign) and node.target.id in shared:
                call = node.value
                assert isinstance(call, ast.Call) and getattr(call.func, "id", None) == "override", \
                    f"{cls.__name__}.{node.target.id} declared again instead of overridden"
    fields = {f.name: f for f in dataclasses.fields(FinetuneArguments)}
    assert fields["lr"].default == 2e-5 and fields["lr"].metadata["help"] == "peak learning rate"


def test_the_settings_reach_the_engine_unchanged():
    import dataclasses

    from bertforge.training.finetune import FinetuneArguments
    from bertforge.training.settings import TrainingArguments, TrainingSettings

    settings = FinetuneArguments(output_dir="o", warmup_steps=5, num_workers=2, fsdp=True, max_minutes=1.0,
                                 budget_schedule=True, keep_last=4)
    engine = settings.training_arguments(drop_last=False, lr=1e-3)
    assert isinstance(engine, TrainingArguments)
    for field in dataclasses.fields(TrainingSettings):
        expected = 1e-3 if field.name == "lr" else getattr(settings, field.name)
        assert getattr(engine, field.name) == expected, field.name
    assert engine.drop_last is False


def test_task_names_the_task_in_every_command():
    serve = _parse("serve", "--model", "m", "--task", "classify,tag", "--task", "embed")
    assert serve.task == ["classify,tag", "embed"]
    assert _parse("export-onnx", "--model", "m", "--output", "x.onnx", "--task", "tag").task == "tag"
    assert _parse("predict", "--model", "m", "--task", "mrpc").task == "mrpc"
    assert _parse(*FINETUNE_GLUE).task == "mrpc"


def test_the_task_family_comes_from_the_flag_or_the_model(tmp_path):
    from bertforge.cli._common import task_family

    (tmp_path / "config.json").write_text(json.dumps({"finetuning_task": "ner"}))
    assert task_family(None, str(tmp_path)) == "tag"
    assert task_family("squad_v2", str(tmp_path)) == "answer"
    assert task_family("mrpc", str(tmp_path)) == "classify"  # a GLUE task
    assert task_family("multiple-choice", str(tmp_path)) == "multiple-choice"
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.json").write_text(json.dumps({"hidden_size": 8}))
    assert task_family(None, str(tmp_path / "bare")) is None  # neither a head nor a finetuning_task says


def test_cli_imports_at_module_top_except_optional_extras():
    import ast

    import bertforge.cli

    for path in Path(bertforge.cli.__file__).parent.glob("*.py"):
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    if isinstance(inner, (ast.Import, ast.ImportFrom)):
                        assert lines[inner.lineno - 1].rstrip().endswith("# optional extra"), \
                            f"{path.name}:{inner.lineno} imports inside a function"
