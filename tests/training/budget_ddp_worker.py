"""Run under `torchrun --nproc_per_node 2` by test_engine.py: a budget-scheduled run in which rank 1's
steps take longer (a fake clock: 10 s a step on rank 0, 15 s on rank 1). Writes each rank's rates (as
fractions of the peak rate) and last step to OUT/rank{R}.json."""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from synthetic import SyntheticPretrainingData, collate  # noqa: E402

from bertforge.modeling import BertConfig  # noqa: E402
from bertforge.pretraining.trainer import MaskedLMStep, build_model  # noqa: E402
from bertforge.training import Trainer, TrainingArguments  # noqa: E402
from bertforge.training.distributed import setup  # noqa: E402

out = Path(sys.argv[1])
context = setup("cpu")
clock = {"t": 0.0}
time.perf_counter = lambda: clock["t"]  # the loop reads time.perf_counter; collectives do not
rates, step = [], MaskedLMStep()


def slow_step(model, batch):
    rates.append(trainer.scheduler.get_last_lr()[0] / args.lr)
    clock["t"] += 10.0 if context.rank == 0 else 15.0
    return step(model, batch)


args = TrainingArguments(output_dir=out / "run", batch_size=4, max_steps=1000, max_minutes=1.0, budget_schedule=True,
                         warmup_ratio=0.25, lr=1e-3, log_every=1, progress=False, save_final=False)
config = BertConfig.preset("tiny", vocab_size=128, max_position_embeddings=64)
trainer = Trainer(build_model(config, seed=0, nsp=True), args, SyntheticPretrainingData(64), collate, slow_step,
                  count_fn=step.counts, context=context)
result = trainer.train()
(out / f"rank{context.rank}.json").write_text(json.dumps({"step": result.step, "rates": rates}))
context.teardown()
# Leave without the interpreter's shutdown: runs sometimes aborted there ("terminate called without an
# active exception") after both ranks had torn down and written the results above, for a cause not
# established (this worker patches time.perf_counter process-wide). What this test checks is written by now.
os._exit(0)
