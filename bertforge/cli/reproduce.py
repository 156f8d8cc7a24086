"""`bertforge reproduce table5|table6|table7`: the paper's ablations in miniature (bertforge.reproduce)."""

from __future__ import annotations

import argparse

from ..reproduce import TABLES, ReproduceSettings, check_inputs, run_reproduce
from .flags import add_settings_flags, settings_from_args

# The flags, in --help's order: each is the ReproduceSettings field of that name (the table is positional).
FLAGS = ("output_dir", "config", "sizes", "steps", "seeds", "corpus", "books_dir", "glue", "glue_dir", "conll_dir",
         "batch_size", "pretrain_lr", "vocab_size", "dupe_factor", "finetune_lr", "finetune_epochs",
         "finetune_batch_size", "max_train_examples", "max_dev_examples", "max_choice_examples",
         "ner_train_sentences", "ner_dev_sentences", "lstm_hidden", "feature_epochs", "feature_lr", "random_init_row",
         "plays", "seed", "num_threads", "device", "progress")
ESTIMATE = ("Wall time of the defaults on a 2-core CPU: table5 88 min (measured: pre-training BERT and No NSP "
            "11 min each, LTR 24 min, its next-token loss scoring every position; 48 fine-tuning runs 41 min); "
            "table6 68 min (pre-training the three sizes 5, 10 and 19 min; 36 fine-tuning runs 35 min); table7 "
            "33 min (pre-training 14 min; 42 fine-tuning and feature-based runs 19 min). A larger setting for a "
            "GPU: "
            "--config mini --steps 20000 --sizes 4/256/4,4/512/8,8/512/8 --max-train-examples 10000 --corpus "
            "shakespeare+books --glue sst2,mrpc --device cuda. The same command again resumes: finished pre-training "
            "and fine-tuning runs are read back, an interrupted pre-training continues from its last checkpoint.")


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("reproduce", help="the paper's ablations (Tables 5, 6, 7) in miniature",
                            description="Pre-train every variant of one of the paper's §5 tables on the same "
                            "batches, fine-tune each on tasks from held-out text with several seeds, and write "
                            "OUT/table.md, OUT/results.json and OUT/plots/. " + ESTIMATE)
    p.add_argument("table", choices=TABLES, help="table5: pre-training tasks; table6: model size; table7: "
                   "feature-based vs fine-tuning")
    add_settings_flags(p, ReproduceSettings, FLAGS)
    p.set_defaults(func=run, check=check)


def check(args: argparse.Namespace) -> None:
    """The settings and the output directory and data, before any work (one-line errors)."""
    check_inputs(settings_from_args(ReproduceSettings, args))


def run(args: argparse.Namespace) -> None:
    table = run_reproduce(settings_from_args(ReproduceSettings, args))
    print(table.read_text(encoding="utf-8"))
