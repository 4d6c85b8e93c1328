#!/usr/bin/env bash
# The one script to run on a lent GPU machine: benchmarks/gpu/gpu_throughput.py per model, results under $OUT.
#
#   MODELS="sd35m" bash benchmarks/gpu/gpu_run.sh                  # ~2-3 min on one H100/H200 (set-up included)
#   MODELS="qwen-image" bash benchmarks/gpu/gpu_run.sh             # the 20.4 B transformer: budget ~8 min
#   bash benchmarks/gpu/gpu_run.sh --iterations 5 --set train.micro_batch_size=16   # extra arguments go to every model
#   MODELS="" FSDP=1 bash benchmarks/gpu/gpu_run.sh                # only the FSDP2 path on NCCL in bf16 (~1 min):
#                                                              # gpu_smoke.py --finetune full --sharding fsdp
#
# The lent H200 image has torch, transformers, peft, safetensors, typer and rich, but not diffusers, ray,
# pydantic (and their small dependencies) or the recipes' OCR reward (rapidocr, onnxruntime, OpenCV), and
# reaches no package registry. So when they do not import, they come from benchmarks/gpu/gpu_wheels.sh's tarballs
# carried in the tree (SITE_TAR, default .whl/py312-site.tar.xz, and OCR_TAR beside it, whole or in parts;
# `.whl/` is git-ignored, so name them in the device call's carry list; benchmarks/README.md). The repository
# itself is put first on PYTHONPATH (no install). For issue 42's whole acceptance run: benchmarks/gpu/gpu_acceptance.sh.
#
# Writes $OUT/gpu_throughput.json (one entry per model), a log per model and nvidia-smi's view of the device;
# without $OUT, benchmarks/results/.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-benchmarks/results}
MODELS=${MODELS-sd35m}  # (MODELS="": no model, e.g. with FSDP=1)
SITE_TAR=${SITE_TAR:-.whl/py312-site.tar.xz}
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
mkdir -p "$OUT"

if ! "$PYTHON" -c "import diffusers, pydantic" 2>/dev/null; then
    if [ ! -f "$SITE_TAR" ]; then
        echo "gpu_run.sh: $PYTHON cannot import diffusers/pydantic and $SITE_TAR is missing: carry the tarball" \
             "(SITE_TAR=path; benchmarks/gpu/gpu_wheels.sh makes it) or install diffusers 0.42.1 and pydantic 2" >&2
        exit 2
    fi
    SITE_ROOT=$(mktemp -d)
    tar -xJf "$SITE_TAR" -C "$SITE_ROOT"
    PACKAGES=""
    for candidate in "$SITE_ROOT" "$SITE_ROOT"/*; do  # the packages at the tarball's top, or one folder down
        if [ -d "$candidate/pydantic" ]; then PACKAGES=$candidate; break; fi
    done
    if [ -z "$PACKAGES" ]; then
        echo "gpu_run.sh: $SITE_TAR holds no pydantic/ at its top or one folder down: repack it" >&2
        exit 2
    fi
    export PYTHONPATH="$PACKAGES:${PYTHONPATH:-}"
fi
# the recipes' OCR reward (rapidocr, onnxruntime, OpenCV): gpu_wheels.sh's second tarball, whole or in parts
OCR_TAR=${OCR_TAR:-$(dirname "$SITE_TAR")/py312-ocr.tar.xz}
if ! "$PYTHON" -c "import rapidocr_onnxruntime" 2>/dev/null; then
    OCR_ROOT=$(mktemp -d)
    if [ -f "$OCR_TAR" ]; then
        tar -xJf "$OCR_TAR" -C "$OCR_ROOT"
    elif compgen -G "$OCR_TAR.part-*" >/dev/null; then
        cat "$OCR_TAR".part-* | tar -xJ -C "$OCR_ROOT"
    else
        echo "gpu_run.sh: no $OCR_TAR: the recipes' OCR reward cannot import; pass --set reward.name=<another>" >&2
    fi
    export PYTHONPATH="$OCR_ROOT:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
"$PYTHON" -c "import diffusers, pydantic, torch; print('torch', torch.__version__, 'diffusers', diffusers.__version__)"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/nvidia-smi.txt"
else
    echo "gpu_run.sh: no nvidia-smi: no GPU here (gpu_throughput.py exits 2 without CUDA; --small runs on the CPU)"
fi

# The random pipeline folder (41 GB for Qwen-Image in bf16) goes to RAM when /dev/shm has room, else to disk.
if [ "$(df --output=avail -BG /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)" -ge 50 ] 2>/dev/null; then
    WORK=/dev/shm/gpu-throughput
else
    WORK=${TMPDIR:-/tmp}/gpu-throughput
fi
for model in $MODELS; do
    "$PYTHON" benchmarks/gpu/gpu_throughput.py --model "$model" --work-dir "$WORK" --out "$OUT/gpu_throughput.json" "$@" \
        2>&1 | tee "$OUT/gpu_throughput_$model.log"
    rm -rf "${WORK:?}/$model"  # free the room for the next model
done

if [ -n "${FSDP:-}" ]; then  # the FSDP2 loop on this GPU: a process group of one (NCCL), bf16 whole weights
    "$PYTHON" benchmarks/gpu/gpu_smoke.py --families sd3 --finetune full --sharding fsdp --out "$OUT/gpu_smoke_fsdp.json" \
        2>&1 | tee "$OUT/gpu_smoke_fsdp.log"
fi
