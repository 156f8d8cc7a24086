"""bertforge's fine-tuning step vs the peer's `Trainer`, on the same weights and the same batches, dropout off.

Loads all-MiniLM-L6-v2 into bertforge's GLUE task model and transformers'
`AutoModelForSequenceClassification` (the peer's head copied into ours), then takes N optimizer steps on
the first N × 32 training examples in file order: bertforge's `Trainer.train_step` (its AdamW groups,
clipping and schedule) against the peer's `Trainer.create_optimizer_and_scheduler` with PyTorch's
clipping, as `Trainer.training_step` does. Reports the first batch's loss and gradients, the largest
parameter difference after the steps, and the std of each side's freshly drawn classifier weights.

    python benchmarks/finetune_step_parity.py --model DIR --data-dir ../shared/data/glue --task mrpc --lr 5e-5 --steps 20
    python benchmarks/finetune_step_parity.py --quick     # seconds: the test, backs no figure

`--quick`: a tiny random checkpoint (MiniLM's vocabulary) and a toy MRPC of Shakespeare's speeches in a
temporary directory, 2 steps.

Prints ONE JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _common import quick_checkpoint, quick_glue  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="the checkpoint both sides start from (required unless --quick)")
    parser.add_argument("--data-dir", help="the GLUE root (required unless --quick)")
    parser.add_argument("--task", default="mrpc")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="a tiny random checkpoint and a toy MRPC, 2 steps")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.quick:
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="finetune-step-parity-")))
            args.model = str(quick_checkpoint(scratch / "model"))
            args.data_dir, args.task, args.steps = str(quick_glue(scratch / "glue", "MRPC", rows=64)), "mrpc", 2
        elif not (args.model and args.data_dir):
            parser.error("--model and --data-dir are required (or --quick)")
        run(args)


def run(args: argparse.Namespace) -> None:
    import torch
    import transformers
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from bertforge.tasks.glue import glue_task
    from bertforge.tasks.glue_data import get_task, read_glue_examples
    from bertforge.training import Phase, Trainer, TrainingArguments

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    spec = get_task(args.task)
    task = glue_task(spec, args.data_dir, args.model)
    examples = read_glue_examples(spec, args.data_dir, "train")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    label_map = {label: i for i, label in enumerate(spec.label_list)}

    init_std = {"bertforge": [], "transformers": []}  # the new head as each side draws it, 5 seeds
    for seed in range(5):
        torch.manual_seed(seed)
        init_std["bertforge"].append(task.build_model().classifier.weight.std().item())
        transformers.set_seed(seed)
        init_std["transformers"].append(AutoModelForSequenceClassification.from_pretrained(
            args.model, num_labels=spec.num_labels).classifier.weight.std().item())

    torch.manual_seed(0)
    ours = task.build_model()
    for module in ours.modules():  # dropout off on both sides: the same batches must give the same steps
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if hasattr(module, "dropout_p"):
            module.dropout_p = 0.0
    peer = AutoModelForSequenceClassification.from_pretrained(
        args.model, num_labels=spec.num_labels, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    peer.classifier.load_state_dict(ours.classifier.state_dict())
    ours.train()
    peer.train()

    training = TrainingArguments(output_dir="/tmp/finetune_step_parity", batch_size=32, epochs=3, lr=args.lr,
                                 weight_decay=0.01, warmup_ratio=0.1, max_grad_norm=1.0, drop_last=False,
                                 progress=False, num_threads=args.threads)
    trainer = Trainer(ours, training, collate=task.collate, step_fn=task.step_fn,
                      phases=[Phase(task.train_features)], count_fn=task.count_fn)
    peer_trainer = transformers.Trainer(model=peer, args=transformers.TrainingArguments(
        output_dir="/tmp/finetune_step_parity_peer", per_device_train_batch_size=32, learning_rate=args.lr,
        num_train_epochs=3, warmup_steps=0.1, weight_decay=0.01, adam_epsilon=1e-6, max_grad_norm=1.0,
        lr_scheduler_type="linear", report_to="none", use_cpu=True))
    peer_trainer.create_optimizer_and_scheduler(num_training_steps=trainer.total_steps)
    peer_params = dict(peer.named_parameters())

    first, steps = {}, []
    for step in range(args.steps):
        rows = range(32 * step, 32 * step + 32)
        batch = [examples[i] for i in rows]
        encoded = tokenizer([e.text_a for e in batch], [e.text_b for e in batch] if batch[0].text_b else None,
                            truncation=True, max_length=128, padding=True, return_token_type_ids=True,
                            return_tensors="pt")
        loss = peer(**encoded, labels=torch.tensor([label_map[e.label] for e in batch])).loss
        loss.backward()
        if step == 0:  # ours' gradients of the same batch, before any update (a separate backward pass)
            features = task.collate([task.train_features[i] for i in rows])
            ours_loss, _ = task.step_fn(ours, features)
            ours_loss = ours_loss if torch.is_tensor(ours_loss) else sum(ours_loss.values())
            ours_loss.backward()
            # the key biases' true gradient is 0 (softmax ignores a shift shared by all keys): rounding only
            rel = max((p.grad - peer_params[n].grad).abs().max().item() / peer_params[n].grad.abs().max().item()
                      for n, p in ours.named_parameters() if not n.endswith("key.bias"))
            first = {"loss_bertforge": ours_loss.item(), "loss_transformers": loss.item(), "max_rel_grad_diff": rel}
            ours.zero_grad(set_to_none=True)
        torch.nn.utils.clip_grad_norm_(peer.parameters(), 1.0)
        peer_trainer.optimizer.step()
        peer_trainer.lr_scheduler.step()
        peer_trainer.optimizer.zero_grad()
        trainer.train_step([task.collate([task.train_features[i] for i in rows])])
        if (step + 1) % 5 == 0 or step + 1 == args.steps:
            diff = max((p.detach() - peer_params[n].detach()).abs().max().item() for n, p in ours.named_parameters())
            steps.append({"step": step + 1, "max_param_diff": diff, "lr_used": trainer.last_lr})
    print(json.dumps({"benchmark": "finetune_step_parity", **({"quick": True} if args.quick else {}),
                      "task": spec.name, "lr": args.lr,
                      "transformers_version": transformers.__version__, "first_batch": first, "steps": steps,
                      "classifier_init_std": init_std}))


if __name__ == "__main__":
    main()
