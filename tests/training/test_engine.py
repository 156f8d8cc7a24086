"""The shared training engine: optimizer groups, schedule, checkpoints, accumulation, divergence."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from synthetic import SyntheticPretrainingData, collate  # noqa: E402

from bertforge.modeling import BertConfig, BertForPreTraining, use_unpadded  # noqa: E402
from bertforge.modeling.bert import Packing  # noqa: E402
from bertforge.modeling.inference import DEFAULT_ROW_BUCKET  # noqa: E402
from bertforge.pretraining.trainer import MaskedLMStep, build_model  # noqa: E402
from bertforge.training import (  # noqa: E402
    NonFiniteLossError, Trainer, TrainingArguments, build_optimizer, latest_checkpoint, linear_schedule,
    load_checkpoint, parameter_groups, save_checkpoint,
)
from bertforge.training import checkpoint as ckpt  # noqa: E402
from bertforge.training.loop import StepPlan, epoch_permutation  # noqa: E402
from bertforge.training.schedule import BudgetWarmupDecay, LinearWarmupDecay, budget_schedule  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny_config(**overrides) -> BertConfig:
    return BertConfig.preset("tiny", vocab_size=128, max_position_embeddings=64, **overrides)


# -- optimizer and schedule ------------------------------------------------------------------------

def test_no_weight_decay_on_layernorm_and_biases():
    model = BertForPreTraining(tiny_config())
    model.bert.pooler.requires_grad_(False)
    decay, no_decay = parameter_groups(model, 0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    not_decayed = {names[id(p)] for p in no_decay["params"]}
    assert not decayed & not_decayed
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert decayed | not_decayed == trainable  # frozen pooler left out, everything else once
    assert "bert.pooler.dense.weight" not in decayed | not_decayed
    for name in not_decayed:
        assert name.endswith("bias") or "LayerNorm" in name, name
    for name in decayed:
        assert not name.endswith("bias") and "LayerNorm" not in name, name
    assert {"cls.predictions.bias", "bert.embeddings.LayerNorm.weight",
            "bert.encoder.layer.0.attention.output.LayerNorm.weight",
            "cls.predictions.transform.LayerNorm.weight"} <= not_decayed
    assert {"bert.embeddings.word_embeddings.weight", "bert.encoder.layer.1.intermediate.dense.weight",
            "cls.seq_relationship.weight"} <= decayed
    optimizer = build_optimizer(model, lr=1e-4)
    assert optimizer.defaults["betas"] == (0.9, 0.999) and optimizer.defaults["eps"] == 1e-6


def test_optimizer_is_torch_adamw_with_berts_groups():
    """build_optimizer is PyTorch's fused AdamW: the same update as its per-tensor form to float32
    rounding, BERT's ε and decay groups, and a state that loads in the per-tensor form (checkpoints)."""
    torch.manual_seed(0)
    reference = BertForPreTraining(tiny_config())
    ours = BertForPreTraining(tiny_config())
    ours.load_state_dict(reference.state_dict())
    optimizers = [torch.optim.AdamW(parameter_groups(reference, 0.01), lr=1e-2, eps=1e-6, foreach=False),
                  build_optimizer(ours, lr=1e-2)]
    assert type(optimizers[1]) is torch.optim.AdamW and optimizers[1].defaults["fused"]
    assert [g["weight_decay"] for g in optimizers[1].param_groups] == [0.01, 0.0]
    for step in range(4):
        grads = [torch.randn_like(p) for p in reference.parameters()]
        for model, optimizer in zip((reference, ours), optimizers):
            for p, g in zip(model.parameters(), grads):
                p.grad = g.clone()
            optimizer.step()
    for (name, a), b in zip(reference.named_parameters(), ours.parameters()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name
    optimizers[0].load_state_dict(optimizers[1].state_dict())


def test_layernorm_found_by_type_whatever_its_name():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    decay, no_decay = parameter_groups(model, 0.1)
    assert [p.shape for p in decay["params"]] == [(4, 4)]
    assert len(no_decay["params"]) == 3  # linear bias, norm weight and bias


def _lrs(scheduler, steps):
    values = []
    for _ in range(steps + 1):
        values.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return values


@pytest.mark.parametrize("warmup", [{"warmup_steps": 2}, {"warmup_ratio": 0.2}])
def test_linear_warmup_then_linear_decay_to_zero(warmup):
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=1.0)
    lrs = _lrs(linear_schedule(optimizer, total_steps=10, **warmup), 10)
    assert lrs[:3] == [0.0, 0.5, 1.0]
    assert lrs[6] == pytest.approx(0.5) and lrs[9] == pytest.approx(0.125) and lrs[10] == 0.0
    with pytest.raises(ValueError, match="not both"):
        linear_schedule(optimizer, 10, warmup_steps=1, warmup_ratio=0.1)


def test_schedule_without_warmup_and_past_the_end():
    schedule = LinearWarmupDecay(total_steps=4)
    assert [schedule(s) for s in range(6)] == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]


def test_budget_schedule_follows_the_share_of_the_budget_spent():
    schedule = BudgetWarmupDecay(warmup_ratio=0.2)
    values = []
    for spent in (0.0, 0.1, 0.2, 0.6, 1.0, 1.5):
        schedule.fraction = spent
        values.append(schedule(step=123))  # the step does not matter once a step warm-up is over
    assert values == pytest.approx([0.0, 0.5, 1.0, 0.5, 0.0, 0.0])
    by_steps = BudgetWarmupDecay(warmup_steps=4)
    by_steps.fraction = 0.5
    assert [by_steps(s) for s in (0, 2, 4)] == [0.0, 0.5, 0.5]
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="not both"):
        budget_schedule(optimizer, warmup_steps=1, warmup_ratio=0.1)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        budget_schedule(optimizer, warmup_ratio=1.0)
    with pytest.raises(ValueError, match="needs max_minutes"):
        TrainingArguments(output_dir="x", budget_schedule=True)


# -- checkpoints -----------------------------------------------------------------------------------

def _state(step: int) -> dict:
    return {"step": step, "model": {"w": torch.full((3,), float(step))}, "rng": [ckpt.rng_state()]}


def test_checkpoints_atomic_latest_pointer_and_keep_last(tmp_path):
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, _state(step), step, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-00000002.pt", "checkpoint-00000003.pt", "latest"]
    assert (tmp_path / "latest").read_text().strip() == "checkpoint-00000003.pt"
    state, path = load_checkpoint(tmp_path)
    assert state["step"] == 3 and path.name == "checkpoint-00000003.pt"
    assert torch.equal(state["model"]["w"], torch.full((3,), 3.0))


def test_crash_during_save_leaves_previous_checkpoint_loadable(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, _state(1), 1)
    real_save = torch.save

    def dies_halfway(obj, file):
        real_save(obj, file)
        file.truncate(file.tell() // 2)  # half the bytes are on disk ...
        raise OSError("No space left on device")  # ... when the writer dies

    monkeypatch.setattr(ckpt.torch, "save", dies_halfway)
    with pytest.raises(OSError, match=r"^no space left on device writing .*checkpoint-00000002\.pt$"):
        save_checkpoint(tmp_path, _state(2), 2)  # one line naming the file (bertforge._files.DiskFullError)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-00000001.pt", "latest"]
    state, path = load_checkpoint(tmp_path)
    assert state["step"] == 1 and path.name == "checkpoint-00000001.pt"


def test_kill_during_save_leaves_a_temporary_that_is_ignored_then_cleaned(tmp_path):
    save_checkpoint(tmp_path, _state(1), 1)
    # A SIGKILL gives the writer no chance to clean up: a partial temporary stays behind.
    stale = tmp_path / ".tmp-checkpoint-00000002.pt.abc123"
    stale.write_bytes(b"PK\x03\x04 half a zip")
    assert load_checkpoint(tmp_path)[0]["step"] == 1
    assert latest_checkpoint(tmp_path).name == "checkpoint-00000001.pt"
    save_checkpoint(tmp_path, _state(2), 2)
    assert not stale.exists()
    assert load_checkpoint(tmp_path)[0]["step"] == 2


def test_corrupt_or_missing_checkpoint_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path)
    bad = tmp_path / "checkpoint-00000007.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="checkpoint-00000007.pt"):
        load_checkpoint(bad)


def test_rng_states_round_trip():
    state = ckpt.rng_state()
    expected = (torch.rand(3), __import__("numpy").random.rand(2).tolist(), __import__("random").random())
    ckpt.set_rng_state(state)
    assert torch.equal(torch.rand(3), expected[0])
    assert __import__("numpy").random.rand(2).tolist() == expected[1]
    assert __import__("random").random() == expected[2]


# -- data order ------------------------------------------------------------------------------------

def test_epoch_permutation_is_seeded_by_seed_and_epoch():
    assert torch.equal(epoch_permutation(50, seed=1, epoch=2), epoch_permutation(50, seed=1, epoch=2))
    assert not torch.equal(epoch_permutation(50, seed=1, epoch=2), epoch_permutation(50, seed=1, epoch=3))
    assert not torch.equal(epoch_permutation(50, seed=1, epoch=2), epoch_permutation(50, seed=2, epoch=2))


@pytest.mark.parametrize("drop_last", [True, False])
def test_processes_read_disjoint_slices_of_each_global_batch(drop_last):
    order = epoch_permutation(43, 0, 0)
    plans = [StepPlan(43, batch_size=8, grad_accum=2, world_size=2, rank=r, drop_last=drop_last) for r in (0, 1)]
    assert plans[0].steps_per_epoch == (2 if drop_last else 3)
    for step in range(plans[0].steps_per_epoch):
        # (an incomplete last step is cut to a multiple of the processes: 42 examples here)
        single = StepPlan(42, 8, 2, 1, 0, drop_last).micro_batches(order, step)
        ranks = [plan.micro_batches(order, step) for plan in plans]
        assert len(ranks[0]) == len(ranks[1]) == len(single)
        for j, micro in enumerate(single):  # each micro-batch split in two halves, in order
            assert ranks[0][j] + ranks[1][j] == micro
    with pytest.raises(ValueError, match="not divisible"):
        StepPlan(43, 5, 1, 2, 0, True)


# -- the loop --------------------------------------------------------------------------------------

def _trainer(tmp_path, name, data, evaluator=None, on_best=None, **overrides) -> Trainer:
    config = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    step = MaskedLMStep()
    args = dict(output_dir=tmp_path / name, batch_size=8, max_steps=4, lr=1e-3, warmup_steps=1, log_every=1,
                progress=False, save_final=False)
    args.update(overrides)
    return Trainer(build_model(config, seed=0, nsp=True), TrainingArguments(**args), data, collate, step,
                   count_fn=step.counts, evaluator=evaluator, on_best=on_best)


def test_gradient_accumulation_equals_the_full_batch(tmp_path):
    data = SyntheticPretrainingData(32)  # masked tokens per sequence vary from 1 to 5
    full = _trainer(tmp_path, "full", data, batch_size=8, grad_accum=1)
    accumulated = _trainer(tmp_path, "accum", data, batch_size=4, grad_accum=2)
    full.train()
    accumulated.train()
    for (name, a), b in zip(full.module.named_parameters(), accumulated.module.parameters()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name
    assert full.last_log["loss"] == pytest.approx(accumulated.last_log["loss"], abs=1e-6)
    # Weighting micro-batches by their masked tokens matters: a plain average of the two halves'
    # mean losses would differ from the mean over the 8 sequences.
    assert full.last_log["mlm_accuracy"] == pytest.approx(accumulated.last_log["mlm_accuracy"])


def test_clipping_inside_the_fused_step_equals_clip_grad_norm(tmp_path):
    """With PyTorch's fused AdamW (the default) the clipping factor is applied in the optimizer's own pass
    over the gradients; the run equals clip_grad_norm_ followed by the unfused AdamW's step."""
    data = SyntheticPretrainingData(32)
    step = MaskedLMStep()
    config = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    trainers = []
    for name, fused in (("fused", True), ("reference", False)):
        args = TrainingArguments(output_dir=tmp_path / name, batch_size=8, max_steps=4, lr=1e-3, warmup_steps=1,
                                 log_every=1, progress=False, save_final=False, max_grad_norm=0.05)
        trainers.append(Trainer(
            build_model(config, seed=0, nsp=True), args, data, collate, step, count_fn=step.counts,
            optimizer_fn=lambda model, fused=fused: torch.optim.AdamW(
                parameter_groups(model, 0.01), lr=1e-3, betas=(0.9, 0.999), eps=1e-6, fused=fused, foreach=False)))
    fused, reference = trainers
    assert getattr(fused.optimizer, "_step_supports_amp_scaling", False)
    for trainer in trainers:
        trainer.train()
    assert fused.last_log["grad_norm"] > 0.05  # the factor was < 1: clipping took effect
    assert getattr(fused.optimizer, "grad_scale", None) is None  # not left for the next step
    for (name, a), b in zip(fused.module.named_parameters(), reference.module.parameters()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name
    assert fused.last_log["loss"] == pytest.approx(reference.last_log["loss"], abs=1e-6)


def test_sparse_embedding_gradients_train_as_the_dense_ones(tmp_path, monkeypatch):
    """On CPU the Trainer takes large embedding tables' gradients as the rows a step touched and adds them
    into a kept buffer (embedding_grads.py): the same run as dense gradients, with clipping, and the
    model's tables are as given once training ends."""
    from bertforge.training import embedding_grads

    monkeypatch.setattr(embedding_grads, "MIN_NUMEL", 0)  # the tiny model's tables are small
    data = SyntheticPretrainingData(32)
    sparse = _trainer(tmp_path, "sparse", data, max_grad_norm=0.05)
    dense = _trainer(tmp_path, "dense", data, max_grad_norm=0.05)
    dense.embedding_grads = None
    assert len(sparse.embedding_grads.modules) == 3  # word (also the tied MLM decoder), position, segment
    assert sparse.embedding_grads.zero_rows_only  # the Trainer's AdamW: only last step's rows are zeroed again
    replaced = []
    densify = sparse.embedding_grads.densify
    monkeypatch.setattr(sparse.embedding_grads, "densify", lambda: replaced.append(densify()) or replaced[-1])
    sparse.train()
    dense.train()
    assert all(len(norms) == 2 for norms in replaced)  # position and segment; the tied table's gradient is dense
    assert not any(m.sparse for m in sparse.module.modules() if isinstance(m, torch.nn.Embedding))
    for (name, a), b in zip(sparse.module.named_parameters(), dense.module.parameters()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name
    assert sparse.last_log["grad_norm"] == pytest.approx(dense.last_log["grad_norm"], rel=1e-5)


def test_keep_last_checkpoints_through_the_trainer(tmp_path):
    trainer = _trainer(tmp_path, "run", SyntheticPretrainingData(32), max_steps=5, save_every=1, keep_last=2,
                       save_final=True)
    result = trainer.train()
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["checkpoint-00000004.pt", "checkpoint-00000005.pt", "latest"]
    assert result.checkpoint.name == "checkpoint-00000005.pt"
    state, _ = load_checkpoint(tmp_path / "run" / "checkpoints")
    assert state["step"] == 5 and state["data_position"] == {"phase": 0, "epoch": 1, "step_in_epoch": 1}
    assert set(state) >= {"model", "optimizer", "scheduler", "rng", "config", "scaler"}


def test_non_finite_loss_names_the_step_and_the_last_good_checkpoint(tmp_path):
    step = MaskedLMStep()
    calls = {"n": 0}

    def diverging(model, batch):
        calls["n"] += 1
        losses, metrics = step(model, batch)
        if calls["n"] >= 5:  # from the 5th step on
            losses["mlm_loss"] = losses["mlm_loss"] * float("nan")
        return losses, metrics

    trainer = _trainer(tmp_path, "run", SyntheticPretrainingData(64), max_steps=8, save_every=3, log_every=10)
    trainer.step_fn = diverging
    with pytest.raises(NonFiniteLossError) as error:
        trainer.train()
    message = str(error.value)
    assert "at step 5" in message and "checkpoint-00000003.pt" in message
    # The diverged model was not saved.
    assert latest_checkpoint(tmp_path / "run" / "checkpoints").name == "checkpoint-00000003.pt"


def test_resume_continues_with_the_exact_next_batch_mid_epoch(tmp_path):
    straight_data, resumed_data = SyntheticPretrainingData(36), SyntheticPretrainingData(36)
    straight = _trainer(tmp_path, "a", straight_data, max_steps=10)  # 4 steps an epoch, 4 examples dropped
    straight.train()
    first = _trainer(tmp_path, "b", resumed_data, max_steps=10, save_final=True)
    first.train(stop_at_step=6)
    assert resumed_data.read == straight_data.read[:6 * 8]
    resumed_data.read.clear()
    second = _trainer(tmp_path, "b", resumed_data, max_steps=10)
    second.train(resume_from=tmp_path / "b" / "checkpoints")
    assert resumed_data.read == straight_data.read[6 * 8:]
    assert straight_data.epochs_seen == [0, 1, 2] and resumed_data.epochs_seen == [0, 1, 1, 2]
    assert len(set(straight_data.read[:32])) == 32  # an epoch reads each example at most once
    assert straight_data.read[:32] != straight_data.read[32:64]  # in a new order each epoch


def test_dataloader_workers_give_the_same_run(tmp_path):
    data = SyntheticPretrainingData(32)
    inline = _trainer(tmp_path, "inline", data, max_steps=3)
    workers = _trainer(tmp_path, "workers", data, max_steps=3, num_workers=2)
    assert inline.train().last_log["loss"] == workers.train().last_log["loss"]


def test_step_fn_loss_and_count_names_must_agree(tmp_path):
    trainer = _trainer(tmp_path, "run", SyntheticPretrainingData(16), max_steps=1)
    trainer.count_fn = lambda batch: {"other": 1.0}
    with pytest.raises(ValueError, match="mlm_loss"):
        trainer.train()


def test_a_single_loss_and_default_count(tmp_path):
    """A fine-tuning-shaped task: one loss tensor, averaged over examples."""
    data = SyntheticPretrainingData(16)

    def step_fn(model, batch):
        out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                    next_sentence_label=batch["next_sentence_label"], masked_lm_positions=batch["masked_lm_positions"])
        correct = (out.seq_relationship_logits.argmax(-1) == batch["next_sentence_label"]).sum()
        return out.nsp_loss, {"accuracy": (correct, len(batch["next_sentence_label"]))}

    trainer = Trainer(BertForPreTraining(tiny_config()), TrainingArguments(
        tmp_path / "run", batch_size=4, max_steps=3, progress=False, save_final=False, log_every=1),
        data, collate, step_fn, eval_dataset=data)
    result = trainer.train()
    assert set(result.last_log) >= {"step", "loss", "accuracy", "lr", "tokens_per_second", "elapsed"}
    assert set(result.eval) == {"eval_loss", "eval_accuracy"}
    assert math.isclose(result.eval["eval_loss"], result.eval["eval_loss"])  # finite


@pytest.fixture
def slow_step(monkeypatch):
    """A masked-LM step that takes 10 s of a fake clock (the loop's time.perf_counter)."""
    import bertforge.training.loop as loop

    clock = {"t": 0.0}
    monkeypatch.setattr(loop.time, "perf_counter", lambda: clock["t"])
    step = MaskedLMStep()

    def take_10_seconds(model, batch):
        clock["t"] += 10.0
        return step(model, batch)

    take_10_seconds.eval = step.eval
    return take_10_seconds


def test_wall_clock_budget_stops_evaluates_and_saves(tmp_path, slow_step):
    """max_minutes: the step that ends past the budget is the last; it logs, evaluates and saves as the
    last step would. A fake clock makes each step take 10 s (a 0.5-minute budget is 3 steps)."""
    data = SyntheticPretrainingData(64)
    trainer = _trainer(tmp_path, "run", data, max_steps=8, max_minutes=0.5, save_final=True, log_every=100)
    trainer.step_fn, trainer.eval_dataset, trainer.eval_fn = slow_step, SyntheticPretrainingData(8), slow_step.eval
    result = trainer.train()
    assert result.step == 3 and result.budget_spent
    assert result.last_log["step"] == 3 and "eval_mlm_loss" in result.eval
    state, _ = load_checkpoint(tmp_path / "run" / "checkpoints")
    assert state["step"] == 3 and state["train_seconds"] == pytest.approx(30.0)
    # A resumed run counts the time already spent: the budget is gone after one more step.
    resumed = _trainer(tmp_path, "run", data, max_steps=8, max_minutes=0.6, save_final=True)
    resumed.step_fn = slow_step
    result = resumed.train(resume_from=tmp_path / "run" / "checkpoints")
    assert result.step == 4 and result.budget_spent


def test_budget_schedule_decays_to_zero_as_the_budget_is_spent(tmp_path, slow_step):
    """budget_schedule: each step's rate follows the time spent before it (a fake clock: 10 s a step, a
    1-minute budget), whatever max_steps says; a resumed run goes on from the time already spent."""
    data = SyntheticPretrainingData(64)
    options = dict(max_steps=1000, max_minutes=1.0, budget_schedule=True, warmup_steps=None, warmup_ratio=0.25,
                   lr=1.0, save_final=True)
    trainer = _trainer(tmp_path, "run", data, **options)
    trainer.step_fn = slow_step
    result = trainer.train(stop_at_step=3)
    assert result.step == 3 and not result.budget_spent
    with pytest.raises(ValueError, match="scheduled over the time budget, this run's over the steps"):
        _trainer(tmp_path, "run", data, **(options | {"budget_schedule": False})).train(
            resume_from=tmp_path / "run" / "checkpoints")
    resumed = _trainer(tmp_path, "run", data, **options)
    resumed.step_fn = slow_step
    result = resumed.train(resume_from=tmp_path / "run" / "checkpoints")
    assert result.step == 6 and result.budget_spent
    logged = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    lrs = [record["lr"] for record in logged if "lr" in record]
    # spent before steps 1-6: 0, 10, 20 | 30, 40, 50 s of 60; warm-up over the first 15 s
    assert lrs == pytest.approx([0.0, 10 / 15, 40 / 45, 30 / 45, 20 / 45, 10 / 45])


@pytest.mark.slow
def test_budget_schedule_under_ddp_follows_the_slowest_process(tmp_path, torchrun):
    """Two processes whose steps take 10 s and 15 s of a fake clock: both step with the rate of the slower
    one's spent budget and stop at the same step (rank 0 alone would stop after step 6)."""
    done = torchrun([str(Path(__file__).parent / "budget_ddp_worker.py"), str(tmp_path)])
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    # rank 1's time spent before steps 1-4: 0, 15, 30, 45 s of 60; warm-up over the first 15 s
    for rank in ranks:
        assert rank["step"] == 4
        assert rank["rates"] == pytest.approx([0.0, 1.0, 2 / 3, 1 / 3])


def test_evaluator_each_epoch_keeps_the_best(tmp_path):
    """Whole-set evaluation at each epoch's end (and every N steps); on_best sees each new best model."""
    data = SyntheticPretrainingData(16)  # 2 steps an epoch at batch 8
    scores = iter([0.5, 0.9, 0.7, 0.8])
    seen = []

    def evaluator(model):
        assert not model.training and not torch.is_grad_enabled()
        return {"accuracy": next(scores)}

    trainer = _trainer(tmp_path, "run", data, max_steps=8, eval_each_epoch=True, best_metric="accuracy",
                       evaluator=evaluator, on_best=lambda model, record: seen.append((record["step"], record["epoch"])))
    result = trainer.train()
    assert seen == [(2, 1.0), (4, 2.0)]
    assert result.best["eval_accuracy"] == 0.9 and result.best["step"] == 4
    evals = [r for r in map(__import__("json").loads, (tmp_path / "run" / "log.jsonl").read_text().splitlines())
             if "eval_accuracy" in r]
    assert [r["is_best"] for r in evals] == [True, True, False, False]
    with pytest.raises(ValueError, match="best_metric"):
        _trainer(tmp_path, "bad", data, best_metric="accuracy")


def test_order_fn_sets_each_epochs_order(tmp_path):
    data = SyntheticPretrainingData(16)
    orders = {}

    def order_fn(seed, epoch):
        orders[epoch] = list(range(16)) if epoch == 0 else list(reversed(range(16)))
        return orders[epoch]

    from bertforge.training import Phase

    step = MaskedLMStep()
    trainer = Trainer(build_model(tiny_config(), seed=0, nsp=True), TrainingArguments(
        tmp_path / "run", batch_size=8, max_steps=4, progress=False, save_final=False),
        collate=collate, step_fn=step, phases=[Phase(data, order_fn=order_fn)], count_fn=step.counts)
    trainer.train()
    assert data.read == list(range(16)) + list(reversed(range(16)))


def test_atomic_files_get_the_usual_permissions(tmp_path):
    """mkstemp's files are 0600; a saved model or checkpoint must be readable as any file `open` makes."""
    import os

    umask = os.umask(0o022)
    try:
        save_checkpoint(tmp_path / "ckpt", _state(1), 1, keep_last=None)
        BertForPreTraining(tiny_config()).save_pretrained(tmp_path / "model")
        (tmp_path / "plain").write_text("x")
    finally:
        os.umask(umask)
    expected = (tmp_path / "plain").stat().st_mode & 0o777
    assert expected == 0o644
    for path in [*(tmp_path / "ckpt").glob("checkpoint-*"), tmp_path / "model" / "model.safetensors"]:
        assert path.stat().st_mode & 0o777 == expected, path


def padded_batch_and_model():
    """8 synthetic instances, 3 of them with 5 padding positions, and a tiny model without dropout."""
    data = SyntheticPretrainingData(8)
    batch = collate([data[i] for i in range(8)])
    batch["attention_mask"][:3, -5:] = 0
    model = build_model(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), seed=0, nsp=True)
    return batch, model


def test_unpadded_pretraining_step_gives_the_padded_losses():
    batch, model = padded_batch_and_model()
    padded, _ = MaskedLMStep()(model, batch)
    unpadded, _ = MaskedLMStep(unpad=True)(model, batch)
    for name in padded:
        assert torch.allclose(padded[name], unpadded[name], atol=1e-5, rtol=0), name


def gradients(model, losses) -> dict[str, torch.Tensor]:
    model.zero_grad()
    sum(losses.values()).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_row_buckets_leave_the_training_losses_and_gradients_unchanged():
    batch, model = padded_batch_and_model()
    assert Packing.from_mask(batch["attention_mask"], row_bucket=16).extra_rows == 15  # 193 real rows -> 208
    exact, _ = MaskedLMStep(unpad=True)(model, batch)
    exact_grads = gradients(model, exact)
    model.bert.unpad_row_bucket = 16
    bucketed, _ = MaskedLMStep(unpad=True)(model, batch)
    for name in exact:
        assert torch.allclose(exact[name], bucketed[name], atol=1e-6, rtol=0), name
    bucketed_grads = gradients(model, bucketed)
    assert exact_grads.keys() == bucketed_grads.keys()
    for name, grad in exact_grads.items():
        assert torch.allclose(grad, bucketed_grads[name], atol=1e-6, rtol=1e-5), name


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_cpu_training_buckets_the_packed_rows(tmp_path, precision):
    """oneDNN caches a kernel per matrix shape on CPU; unpadded batches change shape every step."""
    model = BertForPreTraining(tiny_config())
    Trainer(model, TrainingArguments(tmp_path / "run", batch_size=4, max_steps=1, precision=precision,
                                     progress=False, save_final=False), SyntheticPretrainingData(4), collate,
            MaskedLMStep(unpad=True))
    assert model.bert.unpad_row_bucket == DEFAULT_ROW_BUCKET


def test_the_trainer_prepares_any_module_that_asks_and_knows_no_model_class(tmp_path):
    """Training on CPU calls `prepare_cpu_training` on every submodule that has one (BERT's row buckets live in
    modeling/); a bucket step already chosen is kept, and a model without the hook trains as it is."""
    calls = []

    class Probe(torch.nn.Module):
        def prepare_cpu_training(self):
            calls.append(self)

    model = BertForPreTraining(tiny_config())
    model.probe = Probe()
    model.bert.unpad_row_bucket = 32
    Trainer(model, TrainingArguments(tmp_path / "run", batch_size=4, max_steps=1, progress=False, save_final=False),
            SyntheticPretrainingData(4), collate, MaskedLMStep(unpad=True))
    assert calls == [model.probe] and model.bert.unpad_row_bucket == 32
    for path in (Path(__file__).resolve().parents[2] / "bertforge" / "training").glob("*.py"):
        source = path.read_text(encoding="utf-8")
        assert "BertModel" not in source and "TransformerLayer" not in source, path.name


def test_use_unpadded_switches_every_encoder_in_a_model():
    model = BertForPreTraining(tiny_config())
    assert model.bert.unpad is False
    use_unpadded(model)
    assert model.bert.unpad is True
    use_unpadded(model, False)
    assert model.bert.unpad is False


# -- failed runs and resume -------------------------------------------------------------------------

def _interrupted(tmp_path, name="run", data=None, **overrides) -> Path:
    """A run of 8 steps stopped at step 4, with checkpoints at steps 2 and 4."""
    settings = dict(max_steps=8, save_every=2, keep_last=3)
    settings.update(overrides)
    _trainer(tmp_path, name, data or SyntheticPretrainingData(48), **settings).train(stop_at_step=4)
    return tmp_path / name / "checkpoints"


@pytest.mark.parametrize("flag, change", [("--batch-size 4 here, 8 there", {"batch_size": 4}),
                                          ("--seed 5 here, 0 there", {"seed": 5}),
                                          ("--precision bf16 here, fp32 there", {"precision": "bf16"})])
def test_resume_with_other_settings_is_refused_naming_them(tmp_path, flag, change):
    checkpoints = _interrupted(tmp_path)
    resumed = _trainer(tmp_path, "run", SyntheticPretrainingData(48), max_steps=8, save_every=2, **change)
    with pytest.raises(ValueError) as error:
        resumed.train(resume_from=checkpoints)
    message = str(error.value)
    assert flag in message and "checkpoint-00000004.pt" in message and "\n" not in message
    assert resumed.step == 0  # refused before anything was loaded or trained


def test_resume_with_other_data_is_refused(tmp_path):
    checkpoints = _interrupted(tmp_path)
    resumed = _trainer(tmp_path, "run", SyntheticPretrainingData(40), max_steps=8, save_every=2)
    with pytest.raises(ValueError, match=r"the examples per phase 40 here, 48 there"):
        resumed.train(resume_from=checkpoints)


def test_resume_with_a_new_learning_rate_applies_it_from_the_resumed_step(tmp_path, caplog):
    straight = _trainer(tmp_path, "straight", SyntheticPretrainingData(48), max_steps=8)
    straight.train()
    checkpoints = _interrupted(tmp_path)
    resumed = _trainer(tmp_path, "run", SyntheticPretrainingData(48), max_steps=8, save_every=2, lr=2.5e-4)
    with caplog.at_level("WARNING", logger="bertforge"):
        resumed.train(resume_from=checkpoints)
    assert "--resume with --lr 0.00025 (the checkpoint's run had 0.001): the new rate applies from step 4" \
        in caplog.text
    logged = {r["step"]: r["lr"] for r in map(json.loads, (tmp_path / "run" / "log.jsonl").read_text().splitlines())}
    expected = {r["step"]: r["lr"] for r in map(json.loads, (tmp_path / "straight" / "log.jsonl").read_text()
                                              .splitlines())}
    assert [logged[s] for s in range(1, 5)] == [expected[s] for s in range(1, 5)]  # before: the old rate
    for s in range(5, 9):  # after: the same warm-up and decay, a quarter of the old peak
        assert logged[s] == pytest.approx(expected[s] / 4, rel=1e-9), s
    # The next resume compares against the new rate: the checkpoints now record it.
    assert load_checkpoint(checkpoints)[0]["args"]["lr"] == 2.5e-4


def test_a_truncated_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog):
    checkpoints = _interrupted(tmp_path)
    latest = checkpoints / "checkpoint-00000004.pt"
    latest.write_bytes(latest.read_bytes()[: latest.stat().st_size // 2])  # a copy or a disk cut short
    resumed = _trainer(tmp_path, "run", SyntheticPretrainingData(48), max_steps=8, save_every=2, keep_last=3)
    with caplog.at_level("WARNING", logger="bertforge"):
        result = resumed.train(resume_from=checkpoints)
    assert "the latest checkpoint checkpoint-00000004.pt cannot be read: resuming from" in caplog.text
    assert "checkpoint-00000002.pt, the newest one that can" in caplog.text
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 9))  # steps 3 and 4 trained again, once in the log
    assert result.step == 8
    # A file named on purpose is read or refused, never replaced by another.
    latest.write_bytes(b"cut")
    with pytest.raises(ValueError, match="checkpoint-00000004.pt: cannot read training checkpoint"):
        load_checkpoint(latest)


def test_divergence_names_the_last_checkpoint_before_the_loss_exploded(tmp_path):
    step = MaskedLMStep()
    calls = {"n": 0}

    def exploding(model, batch):  # finite but huge from step 5, not a number from step 8
        calls["n"] += 1
        losses, metrics = step(model, batch)
        if calls["n"] >= 5:
            losses["mlm_loss"] = losses["mlm_loss"] * (1e9 if calls["n"] < 8 else float("nan"))
        return losses, metrics

    trainer = _trainer(tmp_path, "run", SyntheticPretrainingData(64), max_steps=10, save_every=2, keep_last=1,
                       log_every=2)
    trainer.step_fn = exploding
    with pytest.raises(NonFiniteLossError) as error:
        trainer.train()
    message = str(error.value)
    checkpoints = tmp_path / "run" / "checkpoints"
    # Steps 5 and 6 exploded: the checkpoint of step 6 is after the divergence, that of step 4 before it.
    assert "at step 8" in message and f"{checkpoints / 'checkpoint-00000004.pt'} (step 4)" in message
    assert "\n" not in message
    # keep_last=1 did not prune it; `latest` points back at it, the later one is set aside.
    assert latest_checkpoint(checkpoints).name == "checkpoint-00000004.pt"
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "checkpoint-00000004.pt", "diverged-checkpoint-00000006.pt", "latest"]
