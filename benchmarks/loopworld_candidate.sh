#!/usr/bin/env bash
# Test new loopworld DiT weights against the shipped ones, here on the CPU (issue 11's fast loop):
#
#   bash benchmarks/loopworld_candidate.sh DIT_WEIGHTS OUT_DIR [VAE_WEIGHTS]
#
# DIT_WEIGHTS: a `train dit` weights file of loopworld's configuration (dit.safetensors, or the
# dit-fp16 / dit-ema-fp16 files `benchmarks/gpu/on-device.sh train all` brings back).
# VAE_WEIGHTS: default the shipped bundle's VAE (what every clip so far was encoded with).
# CANDIDATE_PRESET=FILE (from the repository root, or absolute): the preset YAML whose dit: block the
# weights have (default loopworld's; e.g.
# benchmarks/results/loopworld-training/scale-2026-11-26/loopworld-l.yaml for the 3x DiT).
# Writes into OUT_DIR (about 15 min on 2 cores):
#   loopworld.safetensors, loopworld.yaml  the candidate as a preset (`--preset OUT_DIR/loopworld.yaml`)
#   eval.json, drift.png                   `worldtrace train eval` (memory, drift, actions; 24 clips)
#   sweep/                                 LoopBench subset: aba, abca, look_back x sliding, field, landmark
#                                          x worlds 0-7 x seed 0 (72 runs, two shards side by side), landmark
#                                          at tau 0.1 so every run pairs with the shipped sweep's
#   paired.md                              run-level return-leg GT-PSNR, paired with the shipped sweep
#                                          (benchmarks/results/loopbench-loopworld/report.json)
#   identification.md                      is it this world? the subset's chunks matched against 16 decoy
#                                          worlds, paired run by run with the shipped weights' (the committed
#                                          benchmarks/results/loopworld-identification/shipped-sweep.json)
#   look_back.png                          `worldtrace compare` on look_back, world 7 (the README's picture)
# A candidate worth shipping then needs the whole evidence re-run (benchmarks/README.md, issue 11).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 DIT_WEIGHTS OUT_DIR [VAE_WEIGHTS]" >&2; exit 2; }
dit="$(realpath "$1")"; out="$2"; vae="${3:-}"
cd "$(dirname "$0")/.."
mkdir -p "$out"; out="$(realpath "$out")"
[ -f "$dit" ] || { echo "$0: $1: no such file" >&2; exit 2; }
if [ -z "$vae" ]; then
  vae="$out/vae.safetensors"
  python3 -c "
import sys
from safetensors.torch import load_file, save_file
from worldtrace_cli.model.checkpoint import split_bundle
b = 'worldtrace_cli/presets/loopworld.safetensors'
save_file({k: v.float().contiguous() for k, v in split_bundle(load_file(b), b)['vae'].items()}, sys.argv[1])" "$vae"
fi
worldtrace train export --dit "$dit" --vae "$vae" -o "$out/loopworld.safetensors"
sed -e "s#^bundle: .*#bundle: loopworld.safetensors#" "${CANDIDATE_PRESET:-worldtrace_cli/presets/loopworld.yaml}" \
    > "$out/loopworld.yaml"
mkdir -p "$out/dit"; ln -sf "$dit" "$out/dit/dit.safetensors"
OMP_NUM_THREADS=1 worldtrace train eval "$out/dit" --preset "$out/loopworld.yaml" --vae "$vae" --clips 24 --pictures "$out/drift.png" \
    -o "$out/eval.json" > /dev/null 2> "$out/eval.log" &
OMP_NUM_THREADS=1 worldtrace compare trajectories/look_back.yaml --preset "$out/loopworld.yaml" --world-seed 7 \
    --cache sliding,field,landmark -o "$out/compare" > "$out/compare.log" 2>&1 &
wait
cp "$out/compare/compare.png" "$out/look_back.png" 2>/dev/null || true
for shard in 0/2 1/2; do
  OMP_NUM_THREADS=1 worldtrace loopbench run --preset "$out/loopworld.yaml" \
      --configs aba,abca,trajectories/look_back.yaml --caches sliding,field,landmark --landmark-threshold 0.1 \
      --worlds 0-7 --seeds 0 --shard "$shard" --threads 1 -o "$out/sweep" \
      > "$out/sweep-${shard%/*}.log" 2>&1 &
done
wait
python3 benchmarks/loopworld_summary.py "$out/sweep" --against benchmarks/results/loopbench-loopworld/report.json \
    -o "$out/paired.md" --title "Candidate $(basename "$dit") vs the shipped DiT: return-leg GT-PSNR"
python3 benchmarks/world_identification.py "$out/sweep" \
    --against benchmarks/results/loopworld-identification/shipped-sweep.json \
    --json "$out/identification.json" -o "$out/identification.md" 2> "$out/identification.log"
echo "candidate: $out/paired.md, $out/identification.md, $out/eval.json, $out/drift.png, $out/look_back.png"
