#!/usr/bin/env bash
# Run HERE (a machine with a package registry), in the repository root, before a GPU session:
# downloads the wheels the GPU image lacks (it has torch 2.11, transformers, click, tqdm, pyyaml,
# safetensors, scipy, matplotlib, imageio, pillow; it lacks diffusers, imageio-ffmpeg,
# pytorch-msssim, importlib_metadata, accelerate and psutil for --offload blocks) into .whl/ (git-ignored; about 6.5 MB), for `carry: [".whl"]`.
# What travels to the GPU machine is limited to 64 MiB (tracked files ~56 MB + carried paths), so
# imageio-ffmpeg's wheel is slimmed to its Python code (its bundled 80 MB ffmpeg binary removed; the
# on-device steps write no MP4: importing it is all they need; an MP4 there would need IMAGEIO_FFMPEG_EXE).
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl \
    diffusers==0.42.1 imageio-ffmpeg==0.6.0 pytorch-msssim==1.0.0 importlib_metadata==8.7.0 zipp==3.23.0 \
    accelerate==1.15.0 psutil==7.2.2
python3 - .whl/imageio_ffmpeg-0.6.0-*.whl <<'PY'
import os, sys, zipfile
src = sys.argv[1]; tmp = src + ".slim"
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
    for info in zin.infolist():
        if "/binaries/ffmpeg-" in info.filename:
            continue
        data = zin.read(info)
        if info.filename.endswith("RECORD"):
            data = b"".join(l for l in data.splitlines(True) if b"/binaries/ffmpeg-" not in l)
        zout.writestr(info, data)
os.replace(tmp, src)
PY
ls -la .whl
# what travels: tracked files, untracked files git does not ignore, and the carried .whl/
tracked=$( (git ls-files -z; git ls-files -z -o --exclude-standard) | du -cb --files0-from=- | tail -1 | cut -f1)
wheels=$(du -sb .whl | cut -f1)
echo "tracked and untracked-not-ignored files $tracked bytes + .whl $wheels bytes = $((tracked + wheels)) of the 67108864 (64 MiB) a device call may carry"
[ $((tracked + wheels)) -le 67108864 ] || { echo "$0: too large for the device tool: carry less or untrack large files" >&2; exit 1; }
