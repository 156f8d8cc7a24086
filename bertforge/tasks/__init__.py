"""Fine-tuning and feature extraction, grouped by task family; `registry` declares every family once.

Families (canonical name: modules, each family's main module named after it): classify (`classify`,
with `classify_reader`, `classify_features`, GLUE's `glue_data` and `glue`), multi-label (`multi_label`,
`multi_label_reader`), multiple-choice (`multiple_choice`), answer (`answer`, with `squad_data` and
`squad_postprocess`), tag (`tag` by fine-tuning, `feature_based` on frozen features, both on `conll`),
embed (`embed`). Shared by all: `arrays` (padding, softmax) and
`windows` (long inputs as overlapping windows). Nothing here imports `bertforge.serving` or the CLI.

Each name has one home, the module that defines it; import it from there. "features" means model
inputs (Google's InputFeatures: `convert_examples_to_features` in each family's module).

Public aliases, the only ones (names users imported before they moved):
  * `classification`, `choice`, `squad`, `tagging` -> `classify`, `multiple_choice`, `answer`, `tag` (the
    families' modules before they took the families' names): one-line modules that put the new module
    object in their place, so old imports and monkeypatches reach the same module.
  * `bertforge.tasks.features` -> `bertforge.tasks.embed` (the embed family's module, renamed so that
    "features" keeps one meaning): the same module object, so `from bertforge.tasks.features import
    extract_features` keeps working.
"""

import sys

from . import embed

sys.modules[f"{__name__}.features"] = embed
features = embed
