#!/usr/bin/env bash
# Run HERE (a machine with PyPI), before a device call: fills plugins/flashinfer/device/wheels/ (git-ignored, ~23 MB)
# with what the GPU machine's image lacks for the FlashInfer checks, for its Python (3.12 by default):
# flashinfer-python (JIT build, no precompiled cache: 0.7.x's 101 MB wheel would not travel) and the two compiled
# packages it imports (apache-tvm-ffi, nvidia-cudnn-frontend), importlib-metadata (the core's), and wheels of this
# repository's kernelbay, kernelbay-engine, kernelbay-torch and kernelbay-flashinfer. The image already holds torch,
# transformers, packaging, pluggy, numpy, ninja, nvidia-ml-py, einops, click, tabulate, requests and tqdm.
#     plugins/flashinfer/device/prepare.sh [PYTHON_VERSION]      # e.g. 3.11 to try check.sh on this machine
set -euo pipefail
cd "$(dirname "$0")/../../.."
py_version="${1:-3.12}"
out=plugins/flashinfer/device/wheels
pip=".venv/bin/pip"
rm -rf "$out" && mkdir -p "$out"
"$pip" download --no-deps --only-binary=:all: -d "$out" --python-version "$py_version" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    "flashinfer-python==0.6.1" "apache-tvm-ffi>=0.1.6,<0.2,!=0.1.8,!=0.1.8.post0" "nvidia-cudnn-frontend>=1.13.0" \
    "importlib-metadata==$(.venv/bin/python -c 'import importlib_metadata as m; print(m.version("importlib-metadata"))')"
"$pip" wheel --no-deps -w "$out" . plugins/engine plugins/torch plugins/flashinfer
du -sh "$out" && ls "$out"
