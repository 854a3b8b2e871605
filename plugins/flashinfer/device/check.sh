#!/usr/bin/env bash
# Run THERE, through the device tool, after prepare.sh here:
#     run(command="bash plugins/flashinfer/device/check.sh", carry=["plugins/flashinfer/device/wheels"], timeout_s=600)  # the steps take 515 s at most
# Installs the carried wheels into a folder on PYTHONPATH (the image's python3 and torch), then, each step under its
# own time limit so that a slow FlashInfer JIT build cannot take the others with it, writes to $OUT:
#   env.txt                 GPU, driver, torch, flashinfer versions and whether FLASHINFER / FLASHINFER_MLA can run
#   kit_FLASHINFER.txt      `kernelbay check-backend FLASHINFER --device cuda` (the conformance kit); kit_FLASHINFER_MLA.txt
#   gpu_check.txt           plugins/flashinfer/gpu_check.py: every FlashInfer path against VANILLA, timed against SDPA
# The kernels are compiled on first use (nvcc, MAX_JOBS parallel jobs) into ~/.cache/flashinfer, which a second call
# on the same warm machine reuses. DEVICE=cpu runs the same steps without a GPU (to try the script elsewhere).
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT:-/tmp/kernelbay-device-out}"
DEVICE="${DEVICE:-cuda}"
mkdir -p "$OUT"
site="${KB_SITE:-/tmp/kernelbay-site}"
py="${PYTHON:-python3}"
rm -rf "$site"
"$py" -m pip install --quiet --no-index --no-deps --target "$site" plugins/flashinfer/device/wheels/*.whl || exit 3
export PYTHONPATH="$site" PYTHONUNBUFFERED=1 MAX_JOBS="${MAX_JOBS:-16}"
step() {  # step NAME SECONDS COMMAND...: its output to $OUT/NAME and the log; a timeout or failure is said, not fatal
    local name="$1" limit="$2"; shift 2
    echo "== $name (limit ${limit}s): $*" | tee -a "$OUT/log.txt"
    local start=$SECONDS
    timeout "$limit" "$@" > >(tee "$OUT/$name") 2>&1
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - start))s" | tee -a "$OUT/log.txt"
}
step env.txt 45 bash -c "nvidia-smi -L 2>&1; \"$py\" -c '
import torch, kernelbay
print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"device\", torch.cuda.is_available() and torch.cuda.get_device_name())
try:
    import flashinfer; print(\"flashinfer\", flashinfer.__version__)
except Exception as exc:
    print(\"flashinfer does not import:\", type(exc).__name__, exc)
from kernelbay import resolve
for name in (\"FLASHINFER\", \"FLASHINFER_MLA\"):
    print(name, resolve(\"attention_backend\", name).is_available())
'"
step kit_FLASHINFER.txt 200 "$py" -m kernelbay.cli check-backend FLASHINFER --device "$DEVICE"
step kit_FLASHINFER_MLA.txt 90 "$py" -m kernelbay.cli check-backend FLASHINFER_MLA --device "$DEVICE"
step gpu_check.txt 180 "$py" plugins/flashinfer/gpu_check.py --device "$DEVICE"
ls -la "$OUT"
