"""Reading result files written before the harness, so that their figures render unchanged until rerun.

A pre-harness script wrote its own JSON shape and recorded no commit, date or memory size; when its file was
adapted, a `provenance` block was added to it (machine, commit, date, the command that made it, and where
those facts were taken from), which `header` turns into the schema's provenance. The scripts also wrote
rates (sequences per second) rounded to 0.01 rather than seconds: `side_from_rates` takes each repeat's
seconds back from its rate, and `ratio_text` writes a ratio at the precision such a file can carry; a script
that kept every repeat's seconds is read by `side_from_seconds`.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence

from .harness import SCHEMA


def header(name: str, rerun: str, provenances: Sequence[Mapping[str, Any]], versions: Mapping[str, str],
           load_average: float | None) -> dict[str, Any]:
    """The schema's top-level fields for a result adapted from pre-harness files (one `provenance` block each):
    their machine (which must be one), their commits and dates (each once), `rerun` as the command, and the
    commands they were run with in the caption's note."""
    machines = [block["machine"] for block in provenances]
    if any(machine != machines[0] for machine in machines):
        raise ValueError(f"{name}: the pre-harness files were run on different machines: {machines}")

    def once(key: str) -> str:
        return ", ".join(dict.fromkeys(block[key] for block in provenances))

    commands = "; ".join(f"`{command}`" for command in dict.fromkeys(block["command"] for block in provenances))
    return {
        "schema": SCHEMA, "benchmark": name, "quick": False, "machine": machines[0], "versions": dict(versions),
        "commit": {"hash": once("commit"), "dirty": None}, "date": once("date"), "command": rerun,
        "note": f"run before the harness as {commands}", "load_average_1min": load_average, "unit": "seconds",
    }


def side_from_rates(work: float, rates: Sequence[float], median_rate: float) -> dict[str, Any]:
    """One side's timing in the schema from a pre-harness file's rates: `work` units (sequences) per call,
    every repeat's rate, and the median rate it recorded (the median of the unrounded rates, so the median
    seconds are taken from it, not from the rounded repeats)."""
    seconds = [work / rate for rate in rates]
    return {"repeats": seconds, "median": work / median_rate, "min": min(seconds), "max": max(seconds)}


def side_from_seconds(seconds: Sequence[float]) -> dict[str, Any]:
    """One side's timing in the schema from a pre-harness file's seconds per repeat (its median, as the harness
    takes it); such a file recorded no CPU time."""
    return {"repeats": list(seconds), "median": statistics.median(seconds), "min": min(seconds), "max": max(seconds)}


def ratio_text(case: Mapping[str, Any], numerator: str, denominator: str, digits: int) -> str:
    """`numerator`'s rate over `denominator`'s (the inverse ratio of their median seconds) at `digits` decimals.

    A pre-harness file's rates are rounded to 0.01, too coarse for a third decimal on small rates (7.79 / 5.68);
    its script's own ratio of the unrounded medians, at 3 decimals, is kept in `facts["ratios"]` and is then
    the figure at 3 decimals. At 2 it is not used: rounding a 3-decimal figure again is a double rounding
    (1.555 → 1.55 where the rates give 1.5552 → 1.56), and the rates settle the second decimal."""
    recorded = case["facts"].get("ratios", {}).get(f"{numerator}/{denominator}")
    if recorded is not None and digits == 3:
        return f"{recorded:.{digits}f}"
    sides = case["sides"]
    return f"{sides[denominator]['median'] / sides[numerator]['median']:.{digits}f}"
