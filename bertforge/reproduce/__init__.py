"""`bertforge reproduce table5|table6|table7`: the paper's §5 ablations in miniature, one command each.

Pre-trains every variant of a table (Table 5: BERT, No NSP, LTR & No NSP, + BiLSTM; Table 6: three or
more sizes; Table 7: BERT with fine-tuning against six frozen-feature strategies) for the same steps on
the same batches, fine-tunes each on downstream tasks built from held-out Shakespeare plays (and
CoNLL-2003 for Table 7) with several seeds, and writes OUT/table.md (mean ± std, the paper's numbers
beside), OUT/results.json and OUT/plots/. Modules: settings.py (the knobs, the rows, the paper's
numbers), downstream.py (the tasks), pretrain.py, finetune.py, heads.py (the LTR model's last-token
pooler, Table 5's BiLSTM head),
report.py, run.py (the order of the stages and resumption).
"""

from .run import check_inputs, run_reproduce
from .settings import PAPER, TABLES, ReproduceSettings, Variant, variants

__all__ = ["PAPER", "TABLES", "ReproduceSettings", "Variant", "check_inputs", "run_reproduce", "variants"]
