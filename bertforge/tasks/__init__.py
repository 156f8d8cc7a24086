"""Fine-tuning and feature extraction, grouped by task family; `registry` declares every family once.

Families (canonical name: modules): classify (`classification`, with `classify_reader`,
`classify_features`, GLUE's `glue_data` and `glue`), multiple-choice (`choice`), answer (`squad`, with
`squad_data` and `squad_postprocess`), tag (`tagging` by fine-tuning, `feature_based` on frozen
features, both on `conll`), embed (`features`). Shared by all: `arrays` (padding, softmax) and
`windows` (long inputs as overlapping windows). Nothing here imports `bertforge.serving` or the CLI.
"""
