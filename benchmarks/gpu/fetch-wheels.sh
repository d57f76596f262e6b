#!/usr/bin/env bash
# Run HERE (a machine with a package registry), in the repository root, before a GPU session:
# downloads the wheels the GPU image lacks (it has torch 2.11, transformers, click, tqdm, pyyaml,
# safetensors, scipy, matplotlib, imageio, pillow; it lacks diffusers, imageio-ffmpeg,
# pytorch-msssim, importlib_metadata) into .whl/ (git-ignored; about 36 MB), for `carry: [".whl"]`.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl \
    diffusers==0.42.1 imageio-ffmpeg==0.6.0 pytorch-msssim==1.0.0 importlib_metadata==8.7.0 zipp==3.23.0
ls -la .whl
