"""Entity grouping for token classification: labelled words -> entities with character spans.

Used by the `tag` pipeline's `aggregation="simple"`; it depends on labels and offsets only, not on
the model, so it lives apart from the pipeline.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def _split_label(label: str) -> tuple[str | None, str]:
    """("B", "PER") for "B-PER" (also I-, E-, S-, L-, U- and "_" separators); (None, label) otherwise."""
    if len(label) > 2 and label[1] in "-_" and label[0] in "BIESLU":
        return label[0], label[2:]
    return None, label


def group_entities(text: str, words: Sequence[dict]) -> list[dict]:
    """Merge labelled words into entities: IOB2 (B- starts, I- continues), IOB1 (an I- after another
    type starts a new entity), BIOES/BILOU, or plain labels (neighbours with one label merge).
    "O" words are outside. Each entity: {"entity", "score" (mean over its words), "start", "end",
    "text"}; start/end are character offsets into `text`."""
    entities: list[dict] = []
    current: dict | None = None

    def close():
        nonlocal current
        if current is not None:
            scores = current.pop("_scores")
            current["score"] = float(np.mean(scores))
            current["text"] = text[current["start"]:current["end"]]
            entities.append(current)
        current = None

    for word in words:
        prefix, kind = _split_label(word["label"])
        if word["label"] == "O" or kind == "O":
            close()
            continue
        starts = (current is None or current["entity"] != kind or prefix in ("B", "S", "U")
                  or (prefix is None and current.get("_prefixed")))
        if starts:
            close()
            current = {"entity": kind, "start": word["start"], "end": word["end"], "_scores": [word["score"]]}
        else:
            current["end"] = word["end"]
            current["_scores"].append(word["score"])
        if current is not None:
            current["_prefixed"] = prefix is not None
        if prefix in ("E", "S", "L", "U"):
            close()
    close()
    for entity in entities:
        entity.pop("_prefixed", None)
    return [{k: e[k] for k in ("entity", "score", "start", "end", "text")} for e in entities]


__all__ = ["group_entities"]
