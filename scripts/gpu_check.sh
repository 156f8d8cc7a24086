#!/usr/bin/env bash
# Issue 51's one device call: the CUDA tests (`pytest -m cuda`), then benchmarks/gpu.py, on one H100/H200.
# Everything lands in $OUT (default ./gpu_out): cuda_tests.log, gpu.json (the benchmark's one JSON line),
# gpu.log (its progress), profile.txt (each side's top operators per case), env.txt (GPU, driver, torch).
# Capped at 7.5 minutes (`timeout`: 2 for the tests, 5.5 for the benchmark), each part logging as it goes,
# so that a 15-minute device lease leaves time for a second call.
#
# The device image has torch, transformers, tokenizers, scipy, scikit-learn and pytest, but not seqeval
# (which `import bertforge` needs). Prepare it once here, in the repository root (.whl/ is git-ignored):
#     python -m pip wheel --no-deps seqeval==1.2.2 -w .whl
# then run with `.whl` carried:   bash scripts/gpu_check.sh
# A dry run without a GPU (the tests skip, the benchmark's tiny mode):
#     OUT=/tmp/gpu_out PYTHON=.venv/bin/python BENCH_ARGS="--device cpu --tiny" bash scripts/gpu_check.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
PY="${PYTHON:-python3}"
if ! "$PY" -c "import seqeval" 2>/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/gpu_site .whl/*.whl \
      && export PYTHONPATH="$PYTHONPATH:/tmp/gpu_site"
  else
    echo "gpu_check.sh: seqeval is missing and there is no .whl/ to install it from (see the header)" >&2
    exit 2
  fi
fi
{
  date -u +%FT%TZ
  git rev-parse --short HEAD 2>/dev/null || echo "no git"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda,
    'transformers', transformers.__version__,
    torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device')"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

timeout 120 "$PY" -m pytest -m cuda -q -rs -p no:cacheprovider tests/test_cuda.py \
  tests/modeling/test_inference_paths.py 2>&1 | tee "$OUT/cuda_tests.log"
tests=$?

timeout 330 "$PY" benchmarks/gpu.py --profile "$OUT/profile.txt" ${BENCH_ARGS:-} > "$OUT/gpu.json" 2> >(tee "$OUT/gpu.log" >&2)
bench=$?
echo "cuda tests: exit $tests; benchmark: exit $bench"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
