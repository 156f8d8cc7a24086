"""Pre-training on real prepared text: exact resume, DDP, the ablations, precision, the CLI."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.modeling import BertConfig, BertForPreTraining
from bertforge.pretraining import prepare_pretraining
from bertforge.pretraining.trainer import (
    PretrainingArguments, next_token_labels, run_pretraining, unmasked_input_ids,
)
from bertforge.tokenization import train_vocab, vocab_fingerprint

REPO = Path(__file__).resolve().parents[2]
BOOK = REPO.parent / "shared" / "data" / "pretraining" / "books" / "Carroll_Alice_1865.txt"
VOCAB_SIZE = 1500


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Alice in Wonderland as 64-token instances (and 128-token ones for a second phase)."""
    if not BOOK.is_file():
        pytest.skip(f"shared data not found: {BOOK}")
    root = tmp_path_factory.mktemp("pretraining")
    vocab = root / "vocab.txt"
    train_vocab([BOOK], vocab_size=VOCAB_SIZE, output=vocab, show_progress=False)
    for name, length in (("p64", 64), ("p128", 128)):
        prepare_pretraining([BOOK], vocab, root / name, max_seq_length=length, max_predictions_per_seq=length // 6,
                            dupe_factor=1, progress=False)
    return root


def tiny_json(root: Path, dropout: float) -> Path:
    path = root / f"tiny-dropout{dropout}.json"
    BertConfig.preset("tiny", vocab_size=VOCAB_SIZE, hidden_dropout_prob=dropout,
                      attention_probs_dropout_prob=dropout).save_pretrained(root / f"cfg{dropout}")
    path.write_text((root / f"cfg{dropout}" / "config.json").read_text())
    return path


def args_for(corpus: Path, out: Path, **overrides) -> PretrainingArguments:
    values = dict(data=corpus / "p64", vocab=corpus / "vocab.txt", output_dir=out, config="tiny", batch_size=8,
                  lr=1e-3, warmup_steps=5, max_steps=20, log_every=1, save_every=0, progress=False)
    values.update(overrides)
    return PretrainingArguments(**values)


def mean(log: list[dict], key: str) -> float:
    return sum(r[key] for r in log) / len(log)


def train_log(out: Path) -> list[dict]:
    return [r for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "loss" in r]


def test_exact_resume_with_dropout(corpus, tmp_path):
    straight = tmp_path / "straight"
    run_pretraining(args_for(corpus, straight, max_steps=100))
    interrupted = tmp_path / "interrupted"
    run_pretraining(args_for(corpus, interrupted, max_steps=100, save_every=50), stop_at_step=50)
    assert not (interrupted / "final").exists()
    # A fresh run picks up the checkpoint: model, AdamW moments, schedule, data position, RNGs.
    run_pretraining(args_for(corpus, interrupted, max_steps=100, save_every=50, resume=True))
    a, b = train_log(straight), train_log(interrupted)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 101))
    for x, y in zip(a, b):
        for key in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "lr"):
            assert abs(x[key] - y[key]) <= 1e-6, (x["step"], key, x[key], y[key])
    # Dropout was on: without the restored RNG state the losses after step 50 would differ.
    assert BertConfig.from_pretrained(straight / "final").hidden_dropout_prob == 0.1
    # The loss goes down on real text.
    assert mean(a[-10:], "mlm_loss") < mean(a[:10], "mlm_loss") - 1.0
    assert set(a[0]) >= {"step", "loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "lr",
                         "tokens_per_second", "elapsed"}
    final = BertForPreTraining.from_pretrained(straight / "final")
    assert sorted(p.name for p in (straight / "final").iterdir()) == [
        "config.json", "model.safetensors", "tokenizer_config.json", "vocab.txt"]
    assert final.load_report.newly_initialized == []


def test_an_interrupted_run_is_unfinished_and_resumes_only_on_its_own_data(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    run_pretraining(args_for(corpus, out, save_every=5), stop_at_step=5)
    assert (out / "RUNNING").is_file() and not (out / "final").exists()
    # Other data (or another seed) is refused by name; the run is left as it was.
    with pytest.raises(ValueError, match=r"--resume: .*--data [0-9a-f]{64} here, [0-9a-f]{64} there") as error:
        run_pretraining(args_for(corpus, out, save_every=5, resume=True, data=corpus / "p128"))
    assert "\n" not in str(error.value)
    command = ["pretrain", "--data", str(corpus / "p64"), "--vocab", str(corpus / "vocab.txt"), "--config", "tiny",
               "--output-dir", str(out), "--batch-size", "8", "--max-steps", "20", "--lr", "1e-3", "--warmup-steps",
               "5", "--save-every", "5", "--no-progress", "--resume"]
    assert main(command + ["--seed", "3"]) == 2
    assert capsys.readouterr().err.count("--seed 3 here, 0 there") == 1
    assert main(command) == 0
    assert not (out / "RUNNING").exists()
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "final", "log.jsonl"]
    assert sorted(p.name for p in (out / "final").iterdir()) == [
        "config.json", "model.safetensors", "tokenizer_config.json", "vocab.txt"]


def _cli_args(corpus: Path, config: Path, out: Path, *extra: str) -> list[str]:
    return ["pretrain", "--data", str(corpus / "p64"), "--vocab", str(corpus / "vocab.txt"), "--config", str(config),
            "--output-dir", str(out), "--batch-size", "8", "--grad-accum", "2", "--max-steps", "6", "--lr", "1e-3",
            "--warmup-steps", "2", "--log-every", "1", "--save-every", "3", "--no-progress", *extra]


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_two_processes_match_one_with_the_same_global_batch(corpus, tmp_path, sharding, torchrun):
    config = tiny_json(tmp_path, dropout=0.0)  # the processes' dropout masks could not match one process's
    assert main(_cli_args(corpus, config, tmp_path / "single")) == 0
    extra = ["--fsdp"] if sharding == "fsdp" else []
    done = torchrun(["-m", "bertforge", *_cli_args(corpus, config, tmp_path / "multi", *extra)])
    assert done.returncode == 0, done.stderr[-3000:]
    single, multi = train_log(tmp_path / "single"), train_log(tmp_path / "multi")
    assert len(single) == len(multi) == 6
    for x, y in zip(single, multi):
        for key in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "grad_norm"):
            assert abs(x[key] - y[key]) <= 1e-4, (x["step"], key, x[key], y[key])
    a = BertForPreTraining.from_pretrained(tmp_path / "single" / "final")
    b = BertForPreTraining.from_pretrained(tmp_path / "multi" / "final")
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.allclose(p, q, atol=1e-4), name


def test_mlm_only(corpus, tmp_path):
    out = tmp_path / "no-nsp"
    run_pretraining(args_for(corpus, out, nsp=False, max_steps=30))
    log = train_log(out)
    assert all("nsp_loss" not in r and "nsp_accuracy" not in r for r in log)
    assert all(r["loss"] == r["mlm_loss"] for r in log)
    assert mean(log[-5:], "mlm_loss") < mean(log[:5], "mlm_loss") - 0.5


def test_left_to_right_lm(corpus, tmp_path):
    out = tmp_path / "ltr"
    run_pretraining(args_for(corpus, out, objective="ltr", max_steps=30))
    log = train_log(out)
    assert BertConfig.from_pretrained(out / "final").is_causal
    assert set(log[0]) >= {"lm_loss", "lm_accuracy"} and "nsp_loss" not in log[0] and "mlm_loss" not in log[0]
    # Untrained, the next token is a guess among the whole vocabulary.
    assert abs(log[0]["loss"] - math.log(VOCAB_SIZE)) < 0.3
    assert mean(log[-5:], "loss") < mean(log[:5], "loss") - 0.5


def test_ltr_labels_are_the_next_unmasked_token():
    batch = {
        "input_ids": torch.tensor([[2, 10, 4, 12, 3, 0], [2, 4, 21, 3, 22, 3]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]),
        "masked_lm_positions": torch.tensor([[2, 0], [1, 4]]),
        "masked_lm_labels": torch.tensor([[11, -100], [20, 99]]),
    }
    ids = unmasked_input_ids(batch)
    assert ids.tolist() == [[2, 10, 11, 12, 3, 0], [2, 20, 21, 3, 99, 3]]
    labels = next_token_labels(ids, batch["attention_mask"])
    assert labels.tolist() == [[10, 11, 12, 3, -100, -100], [20, 21, 3, 99, 3, -100]]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_on_cpu(corpus, tmp_path, precision):
    out = tmp_path / precision
    run_pretraining(args_for(corpus, out, precision=precision, max_steps=8))
    log = train_log(out)
    assert all(math.isfinite(r["loss"]) for r in log)
    assert mean(log[-3:], "mlm_loss") < mean(log[:3], "mlm_loss")
    if precision == "fp16":
        assert "loss_scale" in log[-1]


def test_second_phase_continues_model_optimizer_and_schedule(corpus, tmp_path):
    out = tmp_path / "two-phase"
    run_pretraining(args_for(corpus, out, max_steps=12, phase2_data=corpus / "p128", phase2_steps=4,
                             warmup_steps=2, eval_data=corpus / "p64", save_every=6))
    log = train_log(out)
    assert [r["phase"] for r in log] == [1] * 8 + [2] * 4
    lrs = [r["lr"] for r in log]  # one linear decay over both phases: no restart of the warm-up
    assert lrs[8] == pytest.approx(lrs[7] - (lrs[6] - lrs[7]))
    state = torch.load(out / "checkpoints" / "checkpoint-00000012.pt", weights_only=True)
    assert state["data_position"]["phase"] == 1
    evaluation = [r for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "eval_mlm_loss" in r]
    assert len(evaluation) == 1 and evaluation[0]["step"] == 12
    assert evaluation[0]["eval_perplexity"] == pytest.approx(math.exp(evaluation[0]["eval_mlm_loss"]))
    assert set(evaluation[0]) >= {"eval_mlm_loss", "eval_perplexity", "eval_mlm_accuracy", "eval_nsp_accuracy"}


def test_cli_plot_writes_pngs(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["pretrain", "--data", str(corpus / "p64"), "--vocab", str(corpus / "vocab.txt"), "--config", "tiny",
                 "--output-dir", str(out), "--batch-size", "8", "--max-steps", "6", "--log-every", "2",
                 "--eval-data", str(corpus / "p64"), "--eval-every", "3", "--no-progress"]) == 0
    assert main(["plot", str(out)]) == 0
    pngs = sorted(p.name for p in (out / "plots").iterdir())
    assert pngs == ["accuracy.png", "loss.png", "lr.png", "perplexity.png", "throughput.png"]
    for name in pngs:
        assert (out / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_refuses_to_overwrite_a_run_and_reports_bad_input(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    common = ["--vocab", str(corpus / "vocab.txt"), "--output-dir", str(out), "--max-steps", "2", "--no-progress"]
    assert main(["pretrain", "--data", str(corpus / "p64"), "--config", "tiny", *common]) == 0
    assert main(["pretrain", "--data", str(corpus / "p64"), "--config", "tiny", *common]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main(["pretrain", "--data", str(tmp_path / "missing"), "--config", "tiny", *common]) == 2
    assert "missing" in capsys.readouterr().err
    other = tmp_path / "other.json"
    BertConfig.preset("tiny").save_pretrained(tmp_path / "o")  # 30522 tokens: not the data's vocabulary
    other.write_text((tmp_path / "o" / "config.json").read_text())
    assert main(["pretrain", "--data", str(corpus / "p64"), "--config", str(other), *common[:2],
                 "--output-dir", str(tmp_path / "x")]) == 2
    assert "vocab_size is 30522" in capsys.readouterr().err
    # Resuming a finished run is a no-op that keeps the log.
    lines = (out / "log.jsonl").read_text()
    assert main(["pretrain", "--data", str(corpus / "p64"), "--config", "tiny", *common, "--resume"]) == 0
    assert (out / "log.jsonl").read_text() == lines


def test_prepared_data_is_all_pretrain_needs(corpus, tmp_path, capsys):
    # The user guide's road (docs/guide/pretrain.md): prepare-pretraining, then pretrain --data with no --vocab.
    data = corpus / "p64"
    assert (data / "vocab.txt").read_bytes() == (corpus / "vocab.txt").read_bytes()
    assert json.loads((data / "tokenizer_config.json").read_text())["do_lower_case"] is True
    index = json.loads((data / "index.json").read_text())
    assert index["vocab_hash"] == vocab_fingerprint(corpus / "vocab.txt") == vocab_fingerprint(data)
    out = tmp_path / "run"
    assert main(["pretrain", "--data", str(data), "--config", "tiny", "--output-dir", str(out),
                 "--batch-size", "4", "--max-steps", "2", "--no-progress"]) == 0
    assert (out / "final" / "vocab.txt").read_text() == (data / "vocab.txt").read_text()


def test_pretrain_refuses_a_vocab_that_is_not_the_datas(corpus, tmp_path, capsys):
    lines = (corpus / "vocab.txt").read_text().splitlines()
    lines[10], lines[11] = lines[11], lines[10]  # same size, two ids swapped
    other = tmp_path / "other-vocab.txt"
    other.write_text("\n".join(lines) + "\n")
    data = corpus / "p64"
    assert main(["pretrain", "--data", str(data), "--vocab", str(other), "--config", "tiny",
                 "--output-dir", str(tmp_path / "run"), "--max-steps", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == (f"bertforge pretrain: error: --vocab {other} (fingerprint {vocab_fingerprint(other)}) is not the "
                   f"vocabulary {data} was prepared with ({data / 'vocab.txt'}, fingerprint "
                   f"{vocab_fingerprint(data)}): leave --vocab out, or prepare the data again with it\n")
    assert not (tmp_path / "run").exists()


def test_data_prepared_without_its_vocab_still_trains_with_vocab(corpus, tmp_path, capsys):
    old = tmp_path / "old-data"  # as prepare-pretraining wrote it before it copied the vocabulary
    shutil.copytree(corpus / "p64", old)
    (old / "vocab.txt").unlink()
    (old / "tokenizer_config.json").unlink()
    common = ["--config", "tiny", "--max-steps", "1", "--batch-size", "4", "--no-progress"]
    assert main(["pretrain", "--data", str(old), "--output-dir", str(tmp_path / "a"), *common]) == 2
    assert capsys.readouterr().err == (f"bertforge pretrain: error: vocabulary not found: {old / 'vocab.txt'}; pass "
                                       "--vocab, the vocab.txt the data was prepared with\n")
    assert main(["pretrain", "--data", str(old), "--vocab", str(corpus / "vocab.txt"),
                 "--output-dir", str(tmp_path / "b"), *common]) == 0
    assert (tmp_path / "b" / "final" / "vocab.txt").is_file()


def test_a_full_disk_ends_pretrain_in_one_line_and_the_run_resumes(corpus, tmp_path, capsys, monkeypatch):
    # Issue 49, item 8: was 38 lines of traceback ending in torch's "[enforce fail at inline_container.cc]".
    import errno

    out = tmp_path / "run"
    command = ["pretrain", "--data", str(corpus / "p64"), "--vocab", str(corpus / "vocab.txt"), "--config", "tiny",
               "--output-dir", str(out), "--max-steps", "10", "--save-every", "5", "--batch-size", "8",
               "--no-progress"]
    real_save, calls = torch.save, []

    def fills_the_disk(obj, file):  # the second checkpoint (step 10) meets a full disk, as torch.save does
        calls.append(1)
        if len(calls) == 1:
            return real_save(obj, file)
        file.write(b"PK\x03\x04")
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0") from None

    monkeypatch.setattr(torch, "save", fills_the_disk)
    assert main(command) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"bertforge pretrain: error: no space left on device writing "
                          f"{out / 'checkpoints' / 'checkpoint-00000010.pt'}; what was written before is intact")
    monkeypatch.undo()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["checkpoint-00000005.pt", "latest"]
    assert (out / "RUNNING").exists() and not (out / "final").exists() and not (out / ".bertforge-lock").exists()
    assert main(command + ["--resume"]) == 0
    assert [r["step"] for r in train_log(out)][-1] == 10 and (out / "final" / "model.safetensors").is_file()


def test_max_steps_wins_over_epochs_in_pretrain(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    instances = json.loads((corpus / "p64" / "index.json").read_text())["num_instances"]
    steps = instances // 64 + 3  # more than one epoch of batch 64
    assert main(["pretrain", "--data", str(corpus / "p64"), "--vocab", str(corpus / "vocab.txt"), "--config", "tiny",
                 "--output-dir", str(out), "--max-steps", str(steps), "--epochs", "1", "--batch-size", "64",
                 "--save-every", "1000", "--log-every", "1", "--no-progress"]) == 0
    assert f"note: --max-steps {steps} wins over --epochs 1: training runs {steps} steps" in capsys.readouterr().err
    assert [r["step"] for r in train_log(out)] == list(range(1, steps + 1))
