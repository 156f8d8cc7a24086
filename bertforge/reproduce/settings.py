"""What `bertforge reproduce` is configured by, which variants each table has, and the paper's numbers.

`ReproduceSettings` declares every knob once (the CLI generates its flags from the fields, as for
`pretrain` and `finetune`). `variants(settings)` lists a table's rows: each a `Variant`, what to
pre-train (objective, NSP, architecture) and how to fine-tune (a BiLSTM on top, frozen features).
`PAPER` holds Devlin et al.'s Tables 5, 6 and 7 as printed, shown beside the miniature's numbers.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..modeling.config import PRESETS
from ..tasks.feature_based import FEATURE_STRATEGIES
from ..tasks.glue_data import get_task
from ..training.settings import setting

TABLES = ("table5", "table6", "table7")
CORPORA = ("shakespeare", "shakespeare+books")
# Default sizes of Table 6: #L/#H/#A growing in all three as the paper's rows do, from BERT-Tiny (2/128/2)
# to BERT-Mini (4/256/4): 1x, 2.7x and 4.7x tiny's pre-training step time on this CPU.
DEFAULT_SIZES = "2/128/2,3/192/3,4/256/4"
# The defaults that differ by table: Table 6's larger models get fewer steps and smaller tasks, so that
# each table's default run fits in about 90 minutes on a 2-core CPU.
# Table 7's deeper (6-layer) model does not fine-tune reliably at the smaller models' rate
# (docs/results/reproduce_table7/README.md), so its Fine-tuning row has a lower one; its feature-based rows
# have --feature-lr.
TABLE_DEFAULTS = {"table5": {"config": "tiny", "steps": 2000, "max_train_examples": 1500, "finetune_lr": 1e-3},
                  "table6": {"config": "tiny", "steps": 1000, "max_train_examples": 800, "finetune_lr": 1e-3},
                  "table7": {"config": "6/128/2", "steps": 2000, "max_train_examples": 1500, "finetune_lr": 5e-4}}
_SIZE = re.compile(r"^(\d+)/(\d+)/(\d+)$")


@dataclass
class ReproduceSettings:
    """`bertforge reproduce`'s settings. The defaults are the CPU miniature (see `estimate` in the CLI's help);
    `--steps 20000 --config mini --device cuda` is the larger setting for a GPU (docs/guide/reproduce.md)."""

    output_dir: str | os.PathLike = setting(help="where data, models, table.md, results.json and plots/ go")
    table: str = setting("table5", "which of the paper's tables", choices=TABLES)
    config: str | None = setting(None, "architecture pre-trained in table5/table7: a preset (tiny, mini, small, "
                                 "...), #L/#H/#A, or a config.json (default: table5 tiny = 2/128/2; table7 6/128/2: "
                                 "with 4 layers Sum All Layers would be Sum Last Four)")
    sizes: str = setting(DEFAULT_SIZES, "table6's architectures, #L/#H/#A separated by commas (intermediate 4H)")
    steps: int | None = setting(None, "pre-training steps of every variant, the same batches in the same order "
                                "(default: table5 and table7 2000, table6 1000)")
    seeds: int = setting(3, "fine-tuning seeds per task and variant (mean ± std over them)")
    corpus: str = setting("shakespeare", "pre-training text: the built-in plays, or those and the shared "
                          "public-domain books (../shared/data/pretraining/books)", choices=CORPORA)
    books_dir: str | os.PathLike | None = setting(None, "the books' directory (default: ../shared/data/pretraining/"
                                                  "books from the repository)")
    glue: str = setting("", "GLUE tasks to add as columns of table5/table6, e.g. sst2,mrpc (the training set cut to "
                        "--max-train-examples; the whole dev set)")
    glue_dir: str | os.PathLike | None = setting(None, "GLUE's root (default: ../shared/data/glue from the "
                                                 "repository)")
    conll_dir: str | os.PathLike | None = setting(None, "table7: CoNLL-2003's train.txt and valid.txt (default: "
                                                  "../shared/data/conll2003 from the repository)")
    batch_size: int = setting(32, "pre-training sequences per step")
    pretrain_lr: float = setting(5e-4, "pre-training peak learning rate (10%% warm-up, linear decay)")
    vocab_size: int = setting(8000, "WordPiece vocabulary trained on the pre-training text")
    dupe_factor: int = setting(2, "passes over the text with different masks when preparing instances")
    # Higher than the paper's 2e-5..5e-5 at batch 32: models this small, pre-trained for minutes, learn the
    # token tasks only with a larger rate and more steps.
    finetune_lr: float | None = setting(None, "fine-tuning learning rate of every task and variant (table7: "
                                        "its Fine-tuning row; default: table5 and table6 1e-3, table7 5e-4)")
    finetune_epochs: float = setting(3.0, "fine-tuning epochs")
    finetune_batch_size: int = setting(16, "fine-tuning examples per step (every row)")
    max_train_examples: int | None = setting(None, "training examples per downstream task at most (default: "
                                             "1500; table6 800)")
    max_dev_examples: int = setting(600, "dev examples per downstream task at most (from the held-out plays)")
    # Each continuation example is four sequences: at 1500 examples it took a third of table5's time.
    max_choice_examples: int = setting(500, "training examples of the four-way continuation task at most (each is "
                                       "four sequences; also capped by --max-train-examples)")
    ner_train_sentences: int = setting(2000, "table7: CoNLL-2003 training sentences used (the first N)")
    ner_dev_sentences: int = setting(1000, "table7: CoNLL-2003 dev sentences used (the first N)")
    lstm_hidden: int = setting(128, "table5's BiLSTM and table7's feature-based BiLSTM: units per direction "
                               "(the paper: 768)")
    feature_epochs: float = setting(3.0, "table7: epochs of the feature-based BiLSTM (at --feature-lr, "
                                   "--finetune-batch-size)")
    feature_lr: float = setting(1e-3, "table7: learning rate of the feature-based BiLSTM (trained from scratch on "
                                "frozen features)")
    random_init_row: bool = setting(False, "add a row fine-tuned from random weights (no pre-training): the floor "
                                    "every pre-trained row should clear (about 12 more fine-tuning runs)")
    plays: int | None = setting(None, "pre-train and build training examples from N plays only, spread over the "
                                "genres (toy runs; the held-out plays are always used)")
    seed: int = setting(0, "seed of the data, the pre-training order and weights; fine-tuning seeds are "
                        "seed+1 .. seed+K")
    num_threads: int | None = setting(None, "torch threads")
    device: str | None = setting(None, "cpu, cuda, ... (default: the GPU if there is one)")
    progress: bool = setting(True, "no progress bars")  # the flag is --no-progress

    def __post_init__(self) -> None:
        if self.table not in TABLES:
            raise ValueError(f"unknown table {self.table!r}: choose one of {', '.join(TABLES)}")
        for name, value in TABLE_DEFAULTS[self.table].items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        if self.plays is not None and self.plays < 1:
            raise ValueError(f"--plays must be at least 1, got {self.plays}")
        if self.corpus not in CORPORA:
            raise ValueError(f"--corpus {self.corpus!r}: choose one of {', '.join(CORPORA)}")
        for name in ("steps", "seeds", "batch_size", "vocab_size", "dupe_factor", "finetune_batch_size",
                     "max_train_examples", "max_dev_examples", "max_choice_examples", "ner_train_sentences",
                     "ner_dev_sentences", "lstm_hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        for name in ("pretrain_lr", "finetune_lr", "finetune_epochs", "feature_epochs", "feature_lr"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        parse_sizes(self.sizes)
        if self.config is not None:
            config_size(self.config)  # an #L/#H/#A --config is checked as --config, not as --sizes
        if self.glue_tasks and self.table == "table7":
            raise ValueError("--glue adds sentence-level columns to table5 and table6; table7 is about token tasks")
        if self.table == "table7" and config_layers(self.config) is not None and config_layers(self.config) < 4:
            raise ValueError(f"table7 compares features of the last four layers: --config {self.config} has "
                             f"{config_layers(self.config)}; use one of 4 or more (e.g. 4/128/2)")

    @property
    def glue_tasks(self) -> list[str]:
        """The --glue tasks by their canonical names ("sst2", "mrpc"); ValueError for an unknown one."""
        return [get_task(name).name for name in self.glue.split(",") if name.strip()]

    @property
    def finetune_seeds(self) -> list[int]:
        """The fine-tuning seeds: seed+1 .. seed+K (the same for every row, so rows pair by seed)."""
        return [self.seed + 1 + k for k in range(self.seeds)]


def parse_sizes(text: str, flag: str = "--sizes") -> list[tuple[int, int, int]]:
    """"2/128/2,4/256/4" -> [(2, 128, 2), (4, 256, 4)]: (#L, #H, #A); #H must divide by #A. Errors name
    `flag`, the option the text came from (--sizes, or --config for one size)."""
    sizes = []
    for part in text.split(","):
        match = _SIZE.match(part.strip())
        if not match:
            raise ValueError(f"{flag} {text!r}: each size is #L/#H/#A, e.g. 4/256/4")
        layers, hidden, heads = (int(g) for g in match.groups())
        if min(layers, hidden, heads) < 1 or hidden % heads:
            raise ValueError(f"{flag}: {part.strip()}: #H ({hidden}) must be a multiple of #A ({heads}), all >= 1")
        sizes.append((layers, hidden, heads))
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"{flag} {text!r}: a size is repeated")
    return sizes


def config_size(config: str) -> tuple[int, int, int] | None:
    """(#L, #H, #A) of a preset or an "L/H/A" string; None for a config.json path."""
    if config in PRESETS:
        return PRESETS[config]
    return parse_sizes(config, "--config")[0] if _SIZE.match(config) else None


def config_layers(config: str) -> int | None:
    """The encoder layers `--config` names (read from a config.json); None when it cannot be read."""
    size = config_size(config)
    if size is not None:
        return size[0]
    try:
        return int(json.loads(Path(config).read_text(encoding="utf-8"))["num_hidden_layers"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class Variant:
    """One row of a table. `pretrain` names the pre-trained model it uses (rows may share one: Table 5's
    BiLSTM row fine-tunes the LTR model; Table 7's rows all use BERT's)."""

    name: str  # the row as the paper labels it
    key: str  # its directory name
    pretrain: str  # the key of the pre-training run it fine-tunes
    objective: str = "mlm"
    nsp: bool = True
    size: tuple[int, int, int] | None = None  # Table 6: (#L, #H, #A); otherwise settings.config
    bilstm: bool = False  # a randomly initialised BiLSTM between the encoder and the token classifier
    features: str | None = None  # Table 7: a frozen-feature strategy (None: fine-tuning)
    random_init: bool = False  # no pre-training: the architecture's random weights, saved as the "pre-trained" model


# Table 7's rows: the paper's names for the feature strategies of bertforge.tasks.feature_based.
FEATURE_ROWS = (("Embeddings", "embeddings"), ("Second-to-Last Hidden", "second-to-last"),
                ("Last Hidden", "last"), ("Sum Last Four Hidden", "sum-last-4"),
                ("Concat Last Four Hidden", "concat-last-4"), ("Sum All Layers", "sum-all"))
assert {s for _, s in FEATURE_ROWS} == set(FEATURE_STRATEGIES)


def variants(settings: ReproduceSettings) -> list[Variant]:
    """The rows of `settings.table`, in the paper's order (and the random-weights row last, when asked for)."""
    if settings.table == "table5":
        rows = [Variant("BERT (MLM + NSP)", "bert", "bert"),
                Variant("No NSP", "no-nsp", "no-nsp", nsp=False),
                Variant("LTR & No NSP", "ltr", "ltr", objective="ltr", nsp=False),
                Variant("+ BiLSTM", "ltr-bilstm", "ltr", objective="ltr", nsp=False, bilstm=True)]
    elif settings.table == "table6":
        rows = [Variant(f"L={layers} H={hidden} A={heads}", f"L{layers}-H{hidden}-A{heads}",
                        f"L{layers}-H{hidden}-A{heads}", size=(layers, hidden, heads))
                for layers, hidden, heads in parse_sizes(settings.sizes)]
    else:
        rows = [Variant("Fine-tuning", "finetune", "bert")] + [
            Variant(name, f"features-{strategy}", "bert", features=strategy) for name, strategy in FEATURE_ROWS]
    if settings.random_init_row:  # (Table 6: the first size)
        rows.append(Variant("No pre-training (random init)", "random-init", "random-init", size=rows[0].size,
                            random_init=True))
    return rows


# The paper's numbers (Devlin et al. 2019), dev sets; Table 5 and 6 BERT-Base-sized, Table 7 BERT-Base.
PAPER = {
    "table5": {"columns": ["MNLI-m", "QNLI", "MRPC", "SST-2", "SQuAD F1"],
               "rows": {"bert": [84.4, 88.4, 86.7, 92.7, 88.5], "no-nsp": [83.9, 84.9, 86.5, 92.6, 87.9],
                        "ltr": [82.1, 84.3, 77.5, 92.1, 77.8], "ltr-bilstm": [82.1, 84.1, 75.7, 91.6, 84.9]}},
    "table6": {"columns": ["#L", "#H", "#A", "LM (ppl)", "MNLI-m", "MRPC", "SST-2"],
               "rows": [[3, 768, 12, 5.84, 77.9, 79.8, 88.4], [6, 768, 3, 5.24, 80.6, 82.2, 90.7],
                        [6, 768, 12, 4.68, 81.9, 84.8, 91.3], [12, 768, 12, 3.99, 84.4, 86.7, 92.9],
                        [12, 1024, 16, 3.54, 85.7, 86.9, 93.3], [24, 1024, 16, 3.23, 86.6, 87.8, 93.7]]},
    "table7": {"columns": ["CoNLL-2003 dev F1"],
               "rows": {"finetune": [96.4], "features-embeddings": [91.0], "features-second-to-last": [95.6],
                        "features-last": [94.9], "features-sum-last-4": [95.9], "features-concat-last-4": [96.1],
                        "features-sum-all": [95.5]}},
}
