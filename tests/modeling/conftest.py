"""Fixtures for the modeling tests, on top of tests/conftest.py (`shared_data`, `minilm_dir`).

The GLUE data is read in place from the shared, read-only `../shared/data` (see its PROVENANCE.md);
a test that needs it is skipped only where that directory is absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def read_tsv(path: Path) -> list[list[str]]:
    """GLUE's TSVs: tab-separated, one header line, no quoting (MRPC's text has bare `"`)."""
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    return [line.split("\t") for line in lines[1:] if line.strip()]


@pytest.fixture(scope="session")
def glue_dir(shared_data) -> Path:
    directory = shared_data / "glue"
    if not directory.is_dir():
        pytest.skip(f"GLUE data not found at {directory}")
    return directory


@pytest.fixture(scope="session")
def glue_sentence_pairs(glue_dir) -> list[tuple[str, str]]:
    """All of MRPC dev (408 pairs), then the first 96 RTE dev pairs (longer; 13 exceed 128 tokens).

    In file order: lengths are not sorted, so every batch of 32 mixes lengths and has padding.
    """
    pairs = [(row[3], row[4]) for row in read_tsv(glue_dir / "MRPC" / "dev.tsv")]
    pairs += [(row[1], row[2]) for row in read_tsv(glue_dir / "RTE" / "dev.tsv")[:96]]
    return pairs


@pytest.fixture(scope="session")
def minilm_tokenizer(minilm_dir):
    from bertforge.tokenization import BertTokenizer

    return BertTokenizer.from_pretrained(minilm_dir)
