#!/usr/bin/env bash
# Run ON THE GPU MACHINE (device tool), in the repository root, with .whl carried.
# A session has 15 device-minutes in all (start included): two calls, in this order (benchmarks/README.md):
#   QUICK_MAX=0 bash benchmarks/gpu/on-device.sh quick  # the runbook in one call, every step time-boxed (<= 7.5 min;
#                                                     # <= 9.3 min with the max-autotune test, which never finished)
#   FAST_EXTRA="--budget 6" bash benchmarks/gpu/on-device.sh fast  # compiled + CUDA graphs + overlapped decode (<= 4.8 min)
#   bash benchmarks/gpu/on-device.sh max              # the max-autotune GPU test alone (MAX_LIMIT s, default 130)
#   bash benchmarks/gpu/on-device.sh text             # Self-Forcing / LongLive fast path: sink and memory writers, and
#                                                     # the diffusers hook's cost at the 1.3B's size (<= 8.5 min)
#   bash benchmarks/gpu/on-device.sh attention        # --attention-stats' cost at full size: off, all queries, 512 (<= 5 min)
#   bash benchmarks/gpu/on-device.sh memory           # issue 45: the memory plan beside measured peaks, LingBot bf16/fp8,
#                                                     # MG2's writers at budget 6 in a fresh process (<= 9.5 min)
#   bash benchmarks/gpu/on-device.sh lingbot-1.3b     # issue 66: the 1.3B's 16 GB run, measured beside its plan (<= 9 min)
#   bash benchmarks/gpu/on-device.sh train all        # instead of fast: GPU-encoded clips + batched DiT training (<= 4.5 min)
#   bash benchmarks/gpu/on-device.sh train precisions # s per batched training step in float32, tf32, bf16 (<= 4.7 min)
# Longer steps, for a session with more device time:
#   bash benchmarks/gpu/on-device.sh check            # GPU tests + CUDA parity, eager and compiled (~3 min)
#   bash benchmarks/gpu/on-device.sh ratio [EXTRA]    # sliding, field, landmark interleaved 3 times, 64 chunks: s/chunk ratios
#   bash benchmarks/gpu/on-device.sh bench CACHE [EXTRA]  # one writer at 64,256,512 chunks: peak memory vs N
#   bash benchmarks/gpu/on-device.sh train encode|dit # loopworld's DiT on the GPU (see the train) case below)
# EXTRA, e.g. "--compile reduce-overhead --warmup 4 --overlap-decode" or "--budget 6".
# Results go to $OUT (returned by the device tool); copy them into benchmarks/results/.
# Smoke test on a CPU machine: DEVICE=cpu PRESET=tiny CHUNKS=2,3 RATIO_CHUNKS=6 OUT=/tmp/o bash benchmarks/gpu/on-device.sh ratio
#   DEVICE=cpu PRESET=tiny OUT=/tmp/o bash benchmarks/gpu/on-device.sh quick
#   DEVICE=cpu PRESET=tiny QUICK_CHUNKS=6 OUT=/tmp/o bash benchmarks/gpu/on-device.sh fast
#   DEVICE=cpu ENCODERS=2 ENCODE_SECONDS=45 TRAIN_BATCH=4 TRAIN_MINUTES=1 OUT=/tmp/o bash benchmarks/gpu/on-device.sh train all
#   (ENCODE_WORKERS=1 instead of ENCODERS=2: one encoder process with a render worker, `train encode --workers`)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
DEVICE="${DEVICE:-cuda}" PRESET="${PRESET:-mg2-universal}" CHUNKS="${CHUNKS:-64,256,512}"
step() {  # step SECONDS CMD...: run CMD time-boxed, say how it ended (a step that hangs cannot eat the session);
  # the == lines go to stderr, so that a step's stdout redirected to a file (bench memory --json > plan.json) is
  # the command's alone (the logs take both: 2>&1)
  local limit=$1; shift; local t0=$SECONDS
  echo "== $* (limit ${limit} s)" >&2; timeout "$limit" "$@"; local rc=$?
  echo "== rc $rc after $((SECONDS - t0)) s$([ $rc = 124 ] && echo ': TIMED OUT')" >&2
}
half() {  # half SRC DST: a float16 copy of a weights file; over 15 MiB as DST-partK-of-N parts (files coming
  # back are limited to 16 MiB; join them here with benchmarks/gpu/weights.py join)
  python3 benchmarks/gpu/weights.py half "$1" "$2"
}
max_autotune() {  # max_autotune SECONDS: the max-autotune GPU test (its compile time is unknown: 60 s were not enough)
  CUDA_LAUNCH_BLOCKING=1 step "$1" python3 -m pytest -q -m gpu tests/test_speed.py -k "max" -p no:cacheprovider \
      -p no:logging -rfE --tb=short 2>&1 | tee -a "$OUT/gpu-tests.log"
}
FIXTURES="tests/data/fixtures tests/data/fixtures/templerun tests/data/fixtures/universal_la4"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null | tee "$OUT/gpu.txt"
python3 -c "import torch, diffusers, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'diffusers', diffusers.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
case "${1:-check}" in
  quick)
    # ~12.7 minutes at most (steps time-boxed, 760 s, + ~20 s of setup; 10.8 min with QUICK_MAX=0: over the tool's
    # 600 s only if steps hang, then the last steps are cut and what finished comes back; typically ~6.5 min; 2026-11-26's third H200
    # session: 4.4 min): GPU tests, CUDA parity (eager on PARITY_FIXTURES, default the universal MG2 fixture and
    # LingBot-World's, never yet on CUDA: MG2's three were within 3e-6 twice; float32 RoPE + CUDA graphs on MG2's), the writers' s/chunk ratios and fps
    # (QUICK_CHUNKS chunks after 4 warm-up chunks, 3 interleaved repeats), then the max-autotune GPU test last
    # (its compiling is the one step whose length is unknown: 60 s were not enough).
    # The GPU tests in three processes: a device-side assert poisons its process's CUDA context, so the
    # compiled/CUDA-graph tests (test_speed.py, synchronous launches so an assert names its kernel) run
    # apart from the writers' and the trainer's. test_schemas.py needs jsonschema, absent there.
    { step 120 python3 -m pytest -q -m "gpu and not slow" tests -p no:cacheprovider -p no:logging -rfE --tb=short \
          --ignore=tests/test_schemas.py --ignore=tests/test_speed.py
      CUDA_LAUNCH_BLOCKING=1 step 90 python3 -m pytest -q -m gpu tests/test_speed.py -k "not max" \
          -p no:cacheprovider -p no:logging -rfE --tb=short; } 2>&1 | tee "$OUT/gpu-tests.log"
    { for f in ${PARITY_FIXTURES:-tests/data/fixtures tests/data/lingbot}; do step 25 python3 -m worldtrace_cli parity "$f" --device "$DEVICE"; done
      step 50 python3 -m worldtrace_cli parity tests/data/fixtures --device "$DEVICE" --rope-precision float32 \
          --compile reduce-overhead; } 2>&1 | grep -E "^==|^max_abs_diff|Error|error" | tee "$OUT/parity-cuda.log"
    step 170 python3 -m worldtrace_cli bench speed --preset "$PRESET" --random-weights --device "$DEVICE" \
        --caches sliding,field,landmark --chunks "${QUICK_CHUNKS:-16}" --repeats 3 --warmup 4 -o "$OUT" \
        --name "speed-$PRESET-ratio-quick" 2>&1 | tee -a "$OUT/speed.log"
    # page-locking 2 GiB: PyTorch's pinned allocator (also configured to register on 8 threads) vs touch +
    # cudaHostRegister, alone and on a second thread beside a launch-bound loop (field's first-run cost; the
    # background-allocation try of 2026-11-26 was worse); then field's first run with PyTorch's pinned allocator
    # configured that way (an environment variable, no code of ours): its cache phase vs the bench above's first repeat
    step 60 python3 benchmarks/gpu/pin_bench.py 2>&1 | tee -a "$OUT/speed.log"
    PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True,pinned_num_register_threads:8 step 90 \
        python3 -m worldtrace_cli bench speed --preset "$PRESET" --random-weights --device "$DEVICE" --caches field \
        --chunks "${QUICK_CHUNKS:-16}" --repeats 1 --warmup 4 -o "$OUT" --name "speed-$PRESET-field-register" \
        2>&1 | tee -a "$OUT/speed.log"
    [ -n "${MEMORY_CHUNKS:-}" ] && step 100 python3 -m worldtrace_cli bench speed --preset "$PRESET" --random-weights \
        --device "$DEVICE" --caches field --chunks "$MEMORY_CHUNKS" --no-decode -o "$OUT" \
        --name "speed-$PRESET-field-memory" 2>&1 | tee -a "$OUT/speed.log"  # one log for both: at most 8 files come back
    if [ "${QUICK_MAX:-1}" = 1 ]; then max_autotune 130; fi
    ;;
  max)
    # The max-autotune GPU test alone (quick's last step; QUICK_MAX=0 leaves it out of quick): MAX_LIMIT seconds.
    max_autotune "${MAX_LIMIT:-130}"
    ;;
  fast)
    # The second call of a session that does not train (~4.8 min at most: 270 s + setup): the product's fast path on full-size
    # MG2, blocks compiled with CUDA graphs (reduce-overhead), decode overlapped on a side stream, the same
    # writers, chunks and repeats as quick's eager ratio (compare the two within one warm machine).
    step 270 python3 -m worldtrace_cli bench speed --preset "$PRESET" --random-weights --device "$DEVICE" \
        --caches sliding,field,landmark --chunks "${QUICK_CHUNKS:-16}" --repeats 3 --warmup 4 \
        --compile reduce-overhead --overlap-decode ${FAST_EXTRA:-} -o "$OUT" --name "speed-$PRESET-ratio-fast" 2>&1 \
        | tee "$OUT/speed-fast.log"  # FAST_EXTRA, e.g. "--budget 6": every writer at one cache size
    ;;
  text)
    # Issue 46 part 6: full-size Self-Forcing (random weights, 480x832) on the fast path; target >= 20 fps with LongLive's
    # sink cache on an H100 (LongLive claims 20.7), memory writers <= 1.05x. Both presets are one network: one load.
    step 280 python3 -m worldtrace_cli bench speed --preset "${TEXT_PRESET:-longlive}" --random-weights --device "$DEVICE" \
        --caches sink,landmark,field,sliding --chunks "${QUICK_CHUNKS:-16}" --repeats 2 --warmup 4 \
        --compile reduce-overhead --overlap-decode -o "$OUT" --name "speed-text-fast" 2>&1 | tee "$OUT/speed-text.log"
    # Issue 65 part 6: the diffusers hook's cost at full size (Wan2.1-T2V-1.3B's shapes, 480x832, bf16, random weights)
    # against the same diffusers loop with a plain sliding window, per writer: wall seconds per chunk, the ratio
    step 200 python3 benchmarks/diffusers_hook_cost.py --device "$DEVICE" --sizes "${HOOK_SIZES:-1.3b}" \
        --writers sliding,field,landmark --chunks "${HOOK_CHUNKS:-6}" --repeats 2 -o "$OUT/diffusers-hook" \
        2>&1 | tail -12 | tee "$OUT/diffusers-hook.log"
    ;;
  attention)
    # Issue 57: what --attention-stats costs at full size (MG2, eager, budget 6): sliding and landmark without it,
    # with every query token, and with a 512-token sample (the same rollouts; the frames are unchanged).
    for stats in off all 512; do
      case "$stats" in off) flags="" ;; all) flags="--attention-stats" ;; *) flags="--attention-stats --attention-queries $stats" ;; esac
      # shellcheck disable=SC2086
      step 100 python3 -m worldtrace_cli bench speed --preset "$PRESET" --random-weights --device "$DEVICE" \
          --caches sliding,landmark --budget 6 --chunks "${QUICK_CHUNKS:-16}" --warmup 4 $flags -o "$OUT" \
          --name "speed-$PRESET-attention-$stats" 2>&1 | tail -3 | tee -a "$OUT/attention.log"
    done
    ;;
  memory)
    # Issue 45's runbook in one call (<= 570 s of steps): the plan (bench memory, no GPU needed) beside the measured
    # peak (bench speed: torch.cuda.max_memory_allocated) for LingBot-World's default sink cache in bf16 and with
    # fp8 weights (eager, 6 chunks after 2 warm-up), and the MG2 writer table at budget 6 in a fresh process
    # (sliding, landmark, field, field-streaming, retrieval, worldkv; 16 chunks after 4 warm-up, 3 repeats:
    # the first repeat is each writer's first run in the process). Then benchmarks/gpu/plan_vs_measured.py.
    for variant in ${LINGBOT_VARIANTS:-text:auto text:fp8}; do  # offload:weights; blocks:fp8 adds ~3 min (host init)
      o="${variant%%:*}" w="${variant##*:}"
      step 60 python3 -m worldtrace_cli bench memory --preset lingbot-fast --random-weights --weights-dtype "$w" \
          --offload "$o" --chunks 8 --json > "$OUT/plan-lingbot-$o-$w.json"
      step 170 python3 -m worldtrace_cli bench speed --preset lingbot-fast --random-weights --device "$DEVICE" \
          --caches sink --chunks 8 --warmup 2 --weights-dtype "$w" --offload "$o" -o "$OUT" \
          --name "speed-lingbot-$o-$w" 2>&1 | tail -3 | tee -a "$OUT/memory.log"
    done
    step 30 python3 -m worldtrace_cli bench memory --preset "$PRESET" --cache field --budget 6 --chunks 20 --json \
        > "$OUT/plan-mg2-field.json"
    step 140 python3 -m worldtrace_cli bench speed --preset "$PRESET" --random-weights --device "$DEVICE" \
        --caches sliding,landmark,field,field-streaming,retrieval,worldkv --budget 6 --chunks 16 --repeats 3 --warmup 4 \
        -o "$OUT" --name "speed-$PRESET-writers-b6" 2>&1 | tail -3 | tee -a "$OUT/memory.log"
    # the allocator's cudaHostRegister path for page-locking (PyTorch's pinned_use_cuda_host_register): field's
    # reserve_seconds (the host store page-locked ahead, timed apart in each row) and first run against the
    # default cudaHostAlloc above; kept only where it measures better (issue 45 part 5)
    PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True,pinned_num_register_threads:8 \
    step 60 python3 -m worldtrace_cli bench speed --preset "$PRESET" --random-weights --device "$DEVICE" \
        --caches sliding,field --budget 6 --chunks 16 --repeats 1 --warmup 4 \
        -o "$OUT" --name "speed-$PRESET-writers-b6-host-register" 2>&1 | tail -3 | tee -a "$OUT/memory.log"
    python3 benchmarks/gpu/plan_vs_measured.py "$OUT" 2>&1 | tee -a "$OUT/memory.log"
    ;;
  lingbot-1.3b)
    # Issue 66 in one call (<= 530 s of steps): LingBot-World v2 1.3B at full size (464x832, random weights, eager) as a
    # 16 GB card runs it. For each LB13_VARIANTS offload:weights, its plan (bench memory, --random-weights: the
    # one-layer random umT5, as the run) beside bench speed's measured peak (torch.cuda.max_memory_allocated from
    # the rollout's start) and s/chunk: text:auto with the default sink and the memory writers (8 chunks after 2
    # warm-up, 2 interleaved repeats: ratios to sliding), blocks:auto (what a checkpoint run takes on 16 GB: umT5-XXL's
    # 11.4 GB visit to the GPU makes its text phase the peak); then what a checkpoint run would choose on 16 GB
    # (the plans of bench memory --offload auto with umT5-XXL) and plan_vs_measured.py. The H200 is not capped at
    # 16 GB: the measured peaks say whether the run stays within it. Back (7 files): gpu.txt, lb13.log,
    # plan-lb13-*.json, speed-lb13-*.json, choice-lb13-16gb.json.
    P="${LB13_PRESET:-lingbot-v2-1.3b}"
    for variant in ${LB13_VARIANTS:-text:auto blocks:auto}; do
      o="${variant%%:*}" w="${variant##*:}" caches=sink repeats=1
      [ "$variant" = text:auto ] && { caches="sink,sliding,field,landmark"; repeats=2; }
      step 60 python3 -m worldtrace_cli bench memory --preset "$P" --random-weights --offload "$o" --weights-dtype "$w" \
          --chunks 8 --json > "$OUT/plan-lb13-$o-$w.json" 2>> "$OUT/lb13.log"
      step "$([ "$variant" = text:auto ] && echo 200 || echo 150)" python3 -m worldtrace_cli bench speed --preset "$P" \
          --random-weights --device "$DEVICE" --caches "$caches" --chunks 8 --warmup 2 --repeats "$repeats" \
          --offload "$o" --weights-dtype "$w" -o "$OUT" --name "speed-lb13-$o-$w" 2>&1 | tail -4 | tee -a "$OUT/lb13.log"
    done
    step 60 python3 -m worldtrace_cli bench memory --preset "$P" --device-gb 16 --offload auto --chunks 64 --json \
        > "$OUT/choice-lb13-16gb.json" 2>> "$OUT/lb13.log"
    rm -f "$OUT"/speed-lb13-*.md  # the JSON has the rows; at most 8 files come back
    python3 benchmarks/gpu/plan_vs_measured.py "$OUT" 2>&1 | tee -a "$OUT/lb13.log"
    ;;
  check)
    python3 -m pytest -q -m gpu tests -p no:logging -rfE --ignore=tests/test_schemas.py 2>&1 | tee "$OUT/gpu-tests.log"
    for args in "" "--rope-precision float32" "--rope-precision float32 --compile default" \
                "--rope-precision float32 --compile reduce-overhead"; do
      for f in tests/data/fixtures tests/data/fixtures/templerun tests/data/fixtures/universal_la4; do
        echo "== $f $args" ; python3 -m worldtrace_cli parity "$f" --device cuda $args 2>&1 | tail -1
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
    # The towers world (issue 47: solid 2x2-cell towers, a heading-tinted sky and a sun; docs/loopworld.md):
    #   ENCODE_ARGS="--world towers" bash benchmarks/gpu/on-device.sh train all
    # TRAIN_ARGS: more `train dit` options for `train all` (e.g. TRAIN_ARGS="--self-context 0.5": context chunks
    # the model's own samples, against the drift benchmarks/results/where-it-fails-2026-11-28/ measured).
    T=train-gpu; mkdir -p "$T"
    [ -f "$T/vae.safetensors" ] || python3 -c "
from safetensors.torch import load_file, save_file
from worldtrace_cli.model.checkpoint import split_bundle
b = 'worldtrace_cli/presets/loopworld.safetensors'
parts = split_bundle(load_file(b), b)
for part in ('vae', 'dit'):
    save_file({k: v.float().contiguous() for k, v in parts[part].items()}, '$T/' + part + '.safetensors')"
    link() {  # encoders' shards into all-data/ under stable names (encoder, shard): the trainer loads each name once
      for f in "$T"/all-data-*/clips-*.safetensors; do
        [ -e "$f" ] || continue
        i="${f#"$T"/all-data-}"; i="${i%%/*}"
        ln -sf "$PWD/$f" "$T/all-data/clips-$(printf %02d "$i")-$(basename "$f" .safetensors | sed 's/clips-//').safetensors"
      done
      if [ ! -f "$T/all-data/late_conditioning.safetensors" ]; then  # any encoder's (they share the VAE)
        for f in "$T"/all-data-*/late_conditioning.safetensors; do [ -f "$f" ] && { cp "$f" "$T/all-data/"; break; }; done
      fi
    }
    encode_while() {  # encode_while LEAD LIMIT LOG: ENCODERS processes render clips on the CPU cores and encode them on
      # the device for LIMIT seconds; returns after LEAD seconds (shard count to LOG), linking their shards into
      # all-data/ every 10 s after (not in a pipeline: the encoders stay this shell's children, for pkill and wait).
      # ENCODE_WORKERS=N instead: ONE encoder process whose N render workers (CPU cores) feed its batched VAE on the
      # device (`train encode --workers N`): one CUDA context beside the trainer's, not ENCODERS time-sliced ones
      local n="${ENCODERS:-12}" workers="" what="${ENCODERS:-12} encoders"
      [ -n "${ENCODE_WORKERS:-}" ] && { n=1; workers="--workers $ENCODE_WORKERS"; what="1 encoder, $ENCODE_WORKERS render workers"; }
      local before one
      before=$(ls "$T"/all-data-1/clips-* 2>/dev/null | wc -l)  # a warm machine keeps earlier calls' shards
      for i in $(seq 1 "$n"); do
        OMP_NUM_THREADS=1 timeout "$2" python3 -m worldtrace_cli \
            train encode --vae "$T/vae.safetensors" -o "$T/all-data-$i" --shards 1000 --seed $((200 + i)) \
            --device "$DEVICE" $workers ${ENCODE_ARGS:-} --no-progress > "$T/all-encode-$i.log" 2>&1 &
        one=$!
      done
      mkdir -p "$T/all-data"; sleep "$1"; link
      if [ -n "${ENCODE_WORKERS:-}" ] && [ "$(ls "$T"/all-data-1/clips-* 2>/dev/null | wc -l)" -le "$before" ]; then
        # no new shard from the one encoder (untried on a GPU before): say why, stop it, then ENCODERS CPU
        # processes (seeds 202 on, their own folders) for FALLBACK_LEAD s more (default 25: a CPU encoder's
        # first shard takes ~20 s), so the session's training call still trains, a little later
        { echo "no new shard after $1 s with ENCODE_WORKERS=$ENCODE_WORKERS; its log ends:"; tail -n 5 "$T/all-encode-1.log"
          echo "falling back to ${ENCODERS:-12} CPU encoders"; } | tee -a "$3"
        kill "$one" 2>/dev/null
        for i in $(seq 2 "$(( ${ENCODERS:-12} + 1 ))"); do
          OMP_NUM_THREADS=1 timeout "$2" python3 -m worldtrace_cli \
              train encode --vae "$T/vae.safetensors" -o "$T/all-data-$i" --shards 1000 --seed $((200 + i)) \
              ${ENCODE_ARGS:-} --device cpu --no-progress > "$T/all-encode-$i.log" 2>&1 &
        done
        what="$what, then ${ENCODERS:-12} CPU encoders"; sleep "${FALLBACK_LEAD:-25}"; link
      fi
      ( while pgrep -f "train encode --vae $T/vae" > /dev/null; do sleep 10; link; done ) > /dev/null 2>&1 &
      echo "$(ls "$T"/all-data/clips-* 2>/dev/null | wc -l) shards of 32 clips after $1 s ($what)" | tee -a "$3"
    }
    case "${2:-dit}" in
      precisions)
        # ~3.7 minutes (at most 4.7): seconds per batched step of each --precision (float32, tf32, bf16), batch TRAIN_BATCH,
        # from TRAIN_INIT (default the shipped DiT; TRAIN_PRESET for a larger DiT). ENCODE_SECONDS of encoding first,
        # then the encoders are STOPPED: 2026-11-26's third H200 session timed the runs beside 12 encoders on the same
        # GPU (each its own CUDA context, time-sliced) and got 6, 2 and 0 steps in 50 s, falling as they warmed up.
        # Each run stops itself after PRECISION_MINUTES of steps (the trainer's --minutes: result.json is written; an
        # outer timeout that kills it leaves none) and logs every step's clock (--log-every 1), so the first step
        # (allocation, kernel selection) is told apart. Back: train-precisions.log, precision-*.json, precision-*.jsonl.
        init="${TRAIN_INIT-$T/dit.safetensors}"
        encode_while "${ENCODE_SECONDS:-45}" 240 "$OUT/train-precisions.log"
        pkill -f "train encode --vae $T/vae"; wait; link
        echo "encoders stopped: $(ls "$T"/all-data/clips-* 2>/dev/null | wc -l) shards" | tee -a "$OUT/train-precisions.log"
        for p in ${PRECISIONS:-float32 tf32 bf16}; do
          rm -rf "$T/precision-$p"  # a fresh run each call (a finished folder would be continued, 0 steps)
          step "${PRECISION_LIMIT:-75}" python3 -m worldtrace_cli train dit --data "$T/all-data" -o "$T/precision-$p" \
              ${init:+--init "$init"} --preset "${TRAIN_PRESET:-loopworld}" --device "$DEVICE" --batched \
              --batch "${TRAIN_BATCH:-512}" --start-share 0.5 --steps 100000 --minutes "${PRECISION_MINUTES:-0.6}" \
              --lr 5e-4 --warmup 50 --save-every 100000 --log-every 1 --no-progress --precision "$p" 2>&1 \
              | tail -n 3 | tee -a "$OUT/train-precisions.log"
          [ -f "$T/precision-$p/result.json" ] && cp "$T/precision-$p/result.json" "$OUT/precision-$p.json"
          [ -f "$T/precision-$p/loss.jsonl" ] && cp "$T/precision-$p/loss.jsonl" "$OUT/precision-$p.jsonl"
        done
        python3 benchmarks/gpu/step_times.py "$OUT"/precision-*.jsonl | tee -a "$OUT/train-precisions.log"
        ;;
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
        half "$T/dit/dit.safetensors" "$OUT/dit-fp16.safetensors"
        cp "$T/dit/loss.jsonl" "$T/dit/settings.json" "$OUT/"
        ;;
      all)
        # ~4.5 minutes at most: ENCODERS processes render clips on the CPU cores and encode them on the
        # GPU, ENCODE_SECONDS before training starts and on while it trains (every 10 s their finished
        # shards are linked into all-data/, which the trainer re-scans), then TRAIN_MINUTES of batched
        # training (--batched --batch TRAIN_BATCH) from the shipped DiT (TRAIN_INIT=FILE: from those weights;
        # TRAIN_INIT= (empty): from random weights,
        # e.g. with TRAIN_PRESET=a preset file with a larger dit: block; a DiT over ~8 M parameters no
        # longer comes back in one 16 MiB float16 file). Back in $OUT: the weights and
        # their moving average in float16, loss.jsonl, settings.json, result.json, train-all.log.
        lead="${ENCODE_SECONDS:-45}"; minutes="${TRAIN_MINUTES:-3}"; init="${TRAIN_INIT-$T/dit.safetensors}"
        if [ -n "${TRAIN_GROW:-}" ]; then  # TRAIN_GROW=1: the shipped DiT grown to TRAIN_PRESET's deeper DiT (train grow)
          init="$T/grown-$(echo "${TRAIN_PRESET:?TRAIN_GROW needs TRAIN_PRESET}" | md5sum | cut -c1-8).safetensors"
          [ -f "$init" ] || python3 -m worldtrace_cli train grow --preset "$TRAIN_PRESET" -o "$init" >> "$OUT/train-all.log" 2>&1 \
              || { echo "train grow failed (see train-all.log)" | tee -a "$OUT/train-all.log"; exit 1; }
        fi
        # one training folder per (preset, init, TRAIN_ARGS): rerunning the same settings continues, other settings start apart
        D="$T/all-dit-$(echo "${TRAIN_PRESET:-loopworld} ${init:-random}${TRAIN_ARGS:+ $TRAIN_ARGS}" | md5sum | cut -c1-8)"
        encode_while "$lead" "$(python3 -c "print(int($lead + 60 * $minutes + 60))")" "$OUT/train-all.log"
        step "${TRAIN_LIMIT:-240}" python3 -m worldtrace_cli train dit --data "$T/all-data" -o "$D" \
            ${init:+--init "$init"} --preset "${TRAIN_PRESET:-loopworld}" --device "$DEVICE" --batched \
            --batch "${TRAIN_BATCH:-512}" --start-share 0.5 --ema 0.999 --steps "${TRAIN_STEPS:-100000}" \
            --lr "${TRAIN_LR:-5e-4}" --warmup 50 --save-every 100 --minutes "$minutes" --no-progress \
            --compile "${TRAIN_COMPILE:-none}" --precision "${TRAIN_PRECISION:-float32}" ${TRAIN_ARGS:-} \
            2>&1 | tail -n 4 | tee -a "$OUT/train-all.log"
        pkill -f "train encode --vae $T/vae"; wait; link
        echo "$(ls "$T"/all-data/clips-* | wc -l) shards of 32 clips encoded in all (the last ones after training)" | tee -a "$OUT/train-all.log"
        # TRAIN_BACK=ema|raw for a DiT over 15 MiB in float16 (e.g. the 3x one of
        # benchmarks/results/loopworld-training/scale-2026-11-26/: 3 parts each, and at most 8 files come back)
        case "${TRAIN_BACK:-both}" in both|raw) half "$D/dit.safetensors" "$OUT/dit-fp16.safetensors" ;; esac
        case "${TRAIN_BACK:-both}" in both|ema) [ -f "$D/dit-ema.safetensors" ] && \
            half "$D/dit-ema.safetensors" "$OUT/dit-ema-fp16.safetensors" ;; esac
        cp "$D/loss.jsonl" "$D/settings.json" "$OUT/"
        [ -f "$D/result.json" ] && cp "$D/result.json" "$OUT/"
        ;;
      *) echo "usage: $0 train encode|dit|all|precisions"; exit 2 ;;
    esac
    ;;
  *) echo "usage: $0 quick | fast | max | check | ratio [EXTRA_ARGS] | bench CACHE [EXTRA_ARGS] | train encode|dit|all|precisions"; exit 2 ;;
esac
