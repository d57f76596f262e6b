#!/usr/bin/env bash
# Run ON THE GPU MACHINE (device tool), in the repository root, with .whl carried:
#   bash benchmarks/gpu/on-device.sh check            # GPU tests + CUDA parity, eager and compiled (~3 min)
#   bash benchmarks/gpu/on-device.sh ratio [EXTRA]    # sliding, field, landmark interleaved 3 times, 64 chunks: s/chunk ratios
#   bash benchmarks/gpu/on-device.sh bench CACHE [EXTRA]  # one writer at 64,256,512 chunks: peak memory vs N
#   bash benchmarks/gpu/on-device.sh train encode|dit # loopworld's DiT on the GPU (see the train) case below)
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
  train)
    # loopworld's DiT trained on the GPU from the shipped weights (issue 11), in calls of < 10 min:
    #   bash benchmarks/gpu/on-device.sh train encode   # clips on the CPU cores (ENCODERS x SHARDS shards)
    #   bash benchmarks/gpu/on-device.sh train dit      # TRAIN_MINUTES more; rerun to continue (state in train-gpu/)
    # train-gpu/ is git-ignored (kept between calls while the machine stays warm); dit.safetensors and
    # loss.jsonl come back in $OUT. Then here: worldtrace train export --dit ... and a LoopBench subset.
    T=train-gpu; mkdir -p "$T"
    [ -f "$T/vae.safetensors" ] || python3 -c "
from safetensors.torch import load_file, save_file
from worldtrace_cli.model.checkpoint import split_bundle
b = 'worldtrace_cli/presets/loopworld.safetensors'
parts = split_bundle(load_file(b), b)
for part in ('vae', 'dit'):
    save_file({k: v.float().contiguous() for k, v in parts[part].items()}, '$T/' + part + '.safetensors')"
    case "${2:-dit}" in
      encode)
        for i in $(seq 1 "${ENCODERS:-12}"); do
          OMP_NUM_THREADS=1 python3 -m worldtrace_cli train encode --vae "$T/vae.safetensors" -o "$T/data-$i" \
              --shards "${SHARDS:-4}" --seed $((100 + i)) ${ENCODE_ARGS:-} --no-progress > "$T/encode-$i.log" 2>&1 &
        done; wait
        mkdir -p "$T/data"; n=0
        cp "$T/data-1/late_conditioning.safetensors" "$T/data/"
        for f in "$T"/data-*/clips-*.safetensors; do ln -sf "$PWD/$f" "$T/data/$(printf clips-%05d.safetensors $n)"; n=$((n + 1)); done
        echo "$n shards in $T/data" | tee "$OUT/train-encode.log"
        ;;
      dit)
        python3 -m worldtrace_cli train dit --data "$T/data" -o "$T/dit" --init "$T/dit.safetensors" --preset "${TRAIN_PRESET:-loopworld}" \
            --device "$DEVICE" --start-share 0.5 --ema 0.999 --steps "${TRAIN_STEPS:-30000}" --lr 5e-4 --warmup 50 \
            --minutes "${TRAIN_MINUTES:-8}" --no-progress 2>&1 | tail -3 | tee "$OUT/train-dit.log"
        cp "$T/dit/dit.safetensors" "$T/dit/loss.jsonl" "$T/dit/settings.json" "$OUT/"
        ;;
      *) echo "usage: $0 train encode|dit"; exit 2 ;;
    esac
    ;;
  *) echo "usage: $0 check | ratio [EXTRA_ARGS] | bench CACHE [EXTRA_ARGS] | train encode|dit"; exit 2 ;;
esac
