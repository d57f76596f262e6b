#!/usr/bin/env bash
# Run ON THE GPU MACHINE (device tool), in the repository root, with .whl carried:
#   bash benchmarks/gpu/on-device.sh check            # GPU tests + CUDA parity, eager and compiled (~3 min)
#   bash benchmarks/gpu/on-device.sh ratio [EXTRA]    # sliding, field, landmark interleaved 3 times, 64 chunks: s/chunk ratios
#   bash benchmarks/gpu/on-device.sh bench CACHE [EXTRA]  # one writer at 64,256,512 chunks: peak memory vs N
# EXTRA, e.g. "--compile reduce-overhead --warmup 4 --overlap-decode" or "--budget 6".
# Results go to $OUT (returned by the device tool); copy them into benchmarks/results/.
# Smoke test on a CPU machine: DEVICE=cpu PRESET=tiny CHUNKS=2,3 RATIO_CHUNKS=6 OUT=/tmp/o bash benchmarks/gpu/on-device.sh ratio
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
DEVICE="${DEVICE:-cuda}" PRESET="${PRESET:-mg2-universal}" CHUNKS="${CHUNKS:-64,256,512}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null | tee "$OUT/gpu.txt"
python3 -c "import torch, diffusers, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'diffusers', diffusers.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
case "${1:-check}" in
  check)
    python3 -m pytest -q -m gpu tests 2>&1 | tee "$OUT/gpu-tests.log"
    for args in "" "--rope-precision float32" "--rope-precision float32 --compile default" \
                "--rope-precision float32 --compile reduce-overhead"; do
      for f in tests/data/fixtures tests/data/fixtures/templerun tests/data/fixtures/universal_la4; do
        echo "== $f $args" ; python3 -m worldtrace_cli.parity "$f" --device cuda $args 2>&1 | tail -1
      done
    done 2>&1 | tee "$OUT/parity-cuda.log"
    ;;
  ratio)
    extra="${2:-}"
    stem="speed-$PRESET-ratio-$(echo "$extra" | tr -c 'a-zA-Z0-9\n' '-' | tr -s '-' | sed 's/^-//;s/-$//')"
    python3 -m worldtrace_cli bench speed --preset "$PRESET" --random-weights --device "$DEVICE" \
        --caches sliding,field,landmark --chunks "${RATIO_CHUNKS:-64}" --repeats 3 --warmup 4 $extra \
        -o "$OUT" --name "${stem%-}" 2>&1 | tee "$OUT/${stem%-}.log"
    ;;
  bench)
    cache="${2:?bench needs a writer name}"; extra="${3:-}"
    stem="speed-$PRESET-$(echo "$cache $extra" | tr -c 'a-zA-Z0-9\n' '-' | tr -s '-' | sed 's/-$//')"
    python3 -m worldtrace_cli bench speed --preset "$PRESET" --random-weights --device "$DEVICE" \
        --caches "$cache" --chunks "$CHUNKS" $extra -o "$OUT" --name "$stem" 2>&1 | tee "$OUT/$stem.log"
    ;;
  *) echo "usage: $0 check | ratio [EXTRA_ARGS] | bench CACHE [EXTRA_ARGS]"; exit 2 ;;
esac
