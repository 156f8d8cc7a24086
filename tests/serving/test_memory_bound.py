"""Inference memory stays bounded on varied traffic: after a warm-up that has seen every bucket, batches
of new sizes and lengths make oneDNN build no new kernel and the process's memory does not grow.

oneDNN (the bf16 and int8 matmuls, bf16 attention blocks, the float32 GELU on CPU) builds and keeps a
kernel per tensor shape, and a server meets a new shape nearly every batch; before the shapes were
bucketed (every dtype) and the pooler's input made contiguous, each new batch here built kernels
(58 in 80 batches in fp32, 60 in bf16, 7 in int8) and bf16's memory grew by ~34 MB.
"""

from __future__ import annotations

import copy
import ctypes
import os
import random
import re

import pytest
import torch

from bertforge.modeling import BertForSequenceClassification
from bertforge.modeling.bert import bucket_size
from bertforge.modeling.inference import DEFAULT_ROW_BUCKET, cpu_has_bf16
from bertforge.serving.pipelines import ClassifyPipeline, Feature
from bertforge.tokenization import BertTokenizer

MAX_TOKENS = 32  # per text
MAX_BATCH = 4
GROWTH_MB = 10.0


def resident_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def features(lengths: list[int], rng: random.Random) -> list[Feature]:
    """Texts of the given token counts ([CLS] ... [SEP]) with random word ids."""
    return [Feature(i, [101, *(rng.randrange(1000, 30000) for _ in range(n - 2)), 102], [0] * n)
            for i, n in enumerate(lengths)]


def split(total: int) -> list[int]:
    """Token counts of at most MAX_TOKENS, each >= 2, that add up to `total`."""
    lengths = [MAX_TOKENS] * (total // MAX_TOKENS)
    if total % MAX_TOKENS:
        lengths.append(total % MAX_TOKENS)
    if lengths[-1] < 2:
        lengths[-1] += 1
        lengths[0] -= 1
    return lengths


@pytest.fixture(scope="module")
def classifier(minilm_dir) -> BertForSequenceClassification:
    """all-MiniLM-L6-v2 with a (new) two-label head, float32; each test converts a copy."""
    return BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2).eval()


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="resident memory is read from /proc")
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "int8"])
def test_new_batch_shapes_build_no_kernels_and_keep_memory_flat(minilm_dir, classifier, capfd, dtype):
    if dtype == "bf16" and not cpu_has_bf16():
        pytest.skip("this CPU has no native bfloat16 matmul")
    torch.set_num_threads(1)
    pipe = ClassifyPipeline(copy.deepcopy(classifier), tokenizer=BertTokenizer.from_pretrained(minilm_dir), dtype=dtype)
    rng = random.Random(0)
    # Warm-up: one batch per bucket of packed rows and one per bucket of example lengths.
    for rows in sorted({bucket_size(t, DEFAULT_ROW_BUCKET) for t in range(2, MAX_BATCH * MAX_TOKENS + 1)}):
        pipe.run(features(split(rows), rng), MAX_BATCH)
    for length in sorted({bucket_size(n, DEFAULT_ROW_BUCKET) for n in range(2, MAX_TOKENS + 1)}):
        pipe.run(features([length] * 2 + [2], rng), MAX_BATCH)
    capfd.readouterr()
    before = resident_mb()
    with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON_CREATION):
        for _ in range(40):  # new batch sizes, lengths and padded lengths nearly every time
            lengths = [rng.randint(2, MAX_TOKENS) for _ in range(rng.randint(1, MAX_BATCH))]
            pipe.run(features(lengths, rng), MAX_BATCH)
    ctypes.CDLL(None).fflush(None)  # oneDNN prints through C stdio
    growth = resident_mb() - before
    built = re.findall(r"create:cache_miss.*", capfd.readouterr().out)
    assert not built, f"{len(built)} oneDNN kernels built after warm-up, e.g. {built[0][:300]}"
    assert growth <= GROWTH_MB, f"resident memory grew by {growth:.1f} MB after warm-up"
