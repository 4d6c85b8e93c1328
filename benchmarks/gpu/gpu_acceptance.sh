#!/usr/bin/env bash
# Issue 42's acceptance run on one lent H200, in one command, under 8 minutes, one JSON under $OUT:
#
#   bash benchmarks/gpu/gpu_wheels.sh                        # once, on a machine with PyPI: .whl/py312-site.tar.xz
#   OUT=/some/folder bash benchmarks/gpu/gpu_acceptance.sh   # on the GPU machine (carry .whl/py312-site.tar.xz)
#
# Steps, cheapest first, each under its own timeout (a step that fails or hangs is recorded and the next
# one runs), each recorded in $OUT/gpu_acceptance.json as soon as it ends (benchmarks/gpu/acceptance_record.py:
# exit status, seconds, the step's own JSON, its log's tail); logs in $OUT/logs/:
#
#   smoke       benchmarks/gpu/gpu_smoke.py: tiny SD3, FLUX and Qwen-Image pipelines, 2 LoRA iterations each, bf16
#   fsdp        gpu_smoke.py --finetune full --sharding fsdp: FSDP2 on one NCCL rank, bf16 whole weights
#   spotlight   `spotlight train` in mode spotlight on cuda: the trainer and one spot device (Ray) on this GPU
#   sd35m       benchmarks/gpu/gpu_throughput.py: the SD3.5-M OCR recipe's iteration (published architecture,
#               published-depth text encoders, the recipe's prompts and OCR reward), >= 3 timed, beside
#               diffusers' own pipe() on the same folder, prompts and steps
#   qwen-image  the same for the Qwen-Image recipe (20.4 B transformer, Qwen2.5-VL-7B text encoder); it gets
#               the time left before the 8 minutes, and its iterations stop where the next would not fit
#
# Without CUDA it exits 1 with one line and writes nothing. The machine's Python must have torch and
# transformers (the H200 image does); diffusers, pydantic, ray and the OCR reward's packages come from
# benchmarks/gpu/gpu_wheels.sh's tarballs in $WHEELS (default .whl/) when they do not import.
# Knobs: OUT (default benchmarks/results/acceptance), TOTAL_S (480), WHEELS, PYTHON, SD35M_ARGS, QWEN_ARGS,
# SPOTLIGHT_COMMIT (recorded when the tree is not a git checkout).
set -uo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_acceptance: no CUDA device here ($PYTHON: torch.cuda.is_available() is not True); run it on the GPU machine"
    exit 1
fi
STARTED=$(date +%s)
TOTAL_S=${TOTAL_S:-480}
OUT=${OUT:-benchmarks/results/acceptance}
WHEELS=${WHEELS:-.whl}
SD35M_ARGS=${SD35M_ARGS:---prompts 1}
QWEN_ARGS=${QWEN_ARGS:---prompts 1 --set rollout.group_size=8 --reference-repeats 1}
RECORD="$OUT/gpu_acceptance.json"
mkdir -p "$OUT/logs"
rm -f "$RECORD"
export SPOTLIGHT_COMMIT=${SPOTLIGHT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}

if ! "$PYTHON" -c "import diffusers, pydantic, ray, rapidocr_onnxruntime" 2>/dev/null; then
    # each tarball whole, or in the parts gpu_wheels.sh split it into (carried in more than one device call)
    SITE=$(mktemp -d)
    unpacked=""
    for tarball in "$WHEELS"/py312-site.tar.xz "$WHEELS"/py312-ocr.tar.xz; do
        if [ -f "$tarball" ]; then
            tar -xJf "$tarball" -C "$SITE" && unpacked="$unpacked $(basename "$tarball")"
        elif compgen -G "$tarball.part-*" >/dev/null; then
            cat "$tarball".part-* | tar -xJ -C "$SITE" && unpacked="$unpacked $(basename "$tarball") (parts)"
        fi
    done
    export PYTHONPATH="$SITE:${PYTHONPATH:-}"
    if ! "$PYTHON" -c "import diffusers, pydantic, ray, rapidocr_onnxruntime" 2>"$OUT/logs/setup.log"; then
        echo "gpu_acceptance: $PYTHON cannot import diffusers, pydantic, ray and rapidocr_onnxruntime (unpacked from" \
             "$WHEELS:${unpacked:- nothing}): run benchmarks/gpu/gpu_wheels.sh and carry its $WHEELS/py312-*" \
             "files (WHEELS=folder)" | tee -a "$OUT/logs/setup.log"
        rm -rf "$SITE"
        exit 2
    fi
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
"$PYTHON" -c "import diffusers, pydantic, ray, torch; print('torch', torch.__version__, 'diffusers', diffusers.__version__,
'ray', ray.__version__, torch.cuda.get_device_name(0))" 2>&1 | tee "$OUT/logs/setup.log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/logs/setup.log" 2>&1 || true

# Pipeline folders (~58 GB for Qwen-Image with its 7 B text encoder, in bf16; one at a time) in RAM when
# /dev/shm has room: the H200 machine's disk is 64 GiB in all.
if [ "$(df --output=avail -BG /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)" -ge 62 ] 2>/dev/null; then
    WORK=/dev/shm/gpu-acceptance
else
    WORK=${TMPDIR:-/tmp}/gpu-acceptance
fi
mkdir -p "$WORK"
trap 'rm -rf "$WORK" ${SITE:+"$SITE"}' EXIT
df -h /dev/shm "$WORK" >> "$OUT/logs/setup.log" 2>&1 || true
"$PYTHON" benchmarks/gpu/acceptance_record.py "$RECORD" setup 0 "$(( $(date +%s) - STARTED ))" 0 "$OUT/logs/setup.log"

left() { echo $(( TOTAL_S - ($(date +%s) - STARTED) )); }

# step NAME TIMEOUT_S COMMAND...: run under `timeout`, then record it with the JSON files in $STEP_JSON
step() {
    local name=$1 limit=$2
    shift 2
    local remaining
    remaining=$(left)
    if [ "$remaining" -lt 20 ]; then
        echo "gpu_acceptance: $name: skipped, ${remaining} s left of ${TOTAL_S}" > "$OUT/logs/$name.log"
        "$PYTHON" benchmarks/gpu/acceptance_record.py "$RECORD" "$name" 125 0 0 "$OUT/logs/$name.log"
        return
    fi
    if [ "$limit" -gt "$remaining" ]; then limit=$remaining; fi
    local began=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
    local rc=$?
    # shellcheck disable=SC2086
    "$PYTHON" benchmarks/gpu/acceptance_record.py "$RECORD" "$name" "$rc" "$(( $(date +%s) - began ))" "$limit" \
        "$OUT/logs/$name.log" ${STEP_JSON:-}
}

STEP_JSON="$OUT/gpu_smoke.json" \
    step smoke 75 "$PYTHON" benchmarks/gpu/gpu_smoke.py --out "$OUT/gpu_smoke.json"
STEP_JSON="$OUT/gpu_smoke_fsdp.json" \
    step fsdp 50 "$PYTHON" benchmarks/gpu/gpu_smoke.py --families sd3 --finetune full --sharding fsdp \
    --out "$OUT/gpu_smoke_fsdp.json"
STEP_JSON="$WORK/spotlight-run/summary.json" \
    step spotlight 75 "$PYTHON" -m spotlight train -s mode=spotlight -s device=cuda -s iterations=3 \
    -s runtime.num_spot_devices=1 -s runtime.max_wall_s=45 -s eval.every=1000 -s checkpoint_every=1000 \
    -s run_dir="$WORK/spotlight-run"
# shellcheck disable=SC2086
STEP_JSON="$OUT/gpu_throughput_sd35m.json" \
    step sd35m 165 "$PYTHON" benchmarks/gpu/gpu_throughput.py --model sd35m --work-dir "$WORK" \
    --out "$OUT/gpu_throughput_sd35m.json" --time-budget-s 150 $SD35M_ARGS
QWEN_S=$(( $(left) - 10 ))
# shellcheck disable=SC2086
STEP_JSON="$OUT/gpu_throughput_qwen_image.json" \
    step qwen-image "$QWEN_S" "$PYTHON" benchmarks/gpu/gpu_throughput.py --model qwen-image --work-dir "$WORK" \
    --out "$OUT/gpu_throughput_qwen_image.json" --time-budget-s $(( QWEN_S - 15 )) $QWEN_ARGS

"$PYTHON" -c "import json, sys; d = json.load(open(sys.argv[1])); print('gpu_acceptance:', 'passed' if d['passed']
else 'FAILED', {k: ('ok' if v['ok'] else 'exit %s' % v['rc']) for k, v in d['steps'].items()}, sys.argv[1])" "$RECORD"
"$PYTHON" -c "import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))['passed'] else 3)" "$RECORD"
