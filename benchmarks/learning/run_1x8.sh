#!/usr/bin/env bash
# Issue 37: one seed of vanilla (1 core) and spotlight (1 + 8 spot devices, one core each) to the
# time-to-target target, set-up included, within the device tool's 10 minutes on its 16-core machine
# (the H200 box: its CPU cores do this work, not its GPU). Writes benchmarks/results/time_to_target_1x8.json
# under $OUT (and the runs' logs beside it), merged with the repository's earlier time_to_target_1x8.json
# when there is one, so seeds from several calls fill one table.
#
#   here, once (needs the package index):  bash benchmarks/learning/run_1x8.sh prepare
#       -> .whl/py312-site.tar.xz (~34 MB, git-ignored): what that machine's image lacks (diffusers, ray,
#          pydantic and their dependencies), cp312 wheels unpacked, ray without jars/rllib/serve/data/tune/llm
#   there (device tool):  run(command="SEEDS=0 bash benchmarks/learning/run_1x8.sh", carry=[".whl/py312-site.tar.xz"],
#                             timeout_s=600)
#   here, a short test at 1 + 1 (not a measurement):
#       SPOT_DEVICES=1 CONTROL_CORES=0 PAIR=0 MAX_WALL_S=20 GAIN=0.0 EVAL_SEEDS=2 OUT=/tmp/ttt-1x1 \
#           bash benchmarks/learning/run_1x8.sh
#
# Parameters (environment):
#   MODES          "vanilla spotlight"
#   SEEDS          "0" (several: each mode's seeds; with PAIR, one-core runs go side by side while cores last)
#   SPOT_DEVICES   8: N spot devices behind the trainer, one core each
#   CONTROL_CORES  unset: every core the runs leave goes to Ray's control plane; 0: Ray on the spot cores
#   PAIR           1: vanilla on a core of its own beside spotlight, so both fit the 10 minutes; 0: in turn
#   MAX_WALL_S     240: training seconds per run (a run cut there counts as not reached)
#   GAIN           0.10: target = the base model's validation strict accuracy + GAIN
#   EVAL_SEEDS     10: validation seeds per prompt (80 prompts)
#   MERGE          an earlier JSON (default: the repository's benchmarks/results/time_to_target_1x8.json)
#   OUT            results root (default: the repository; the device tool's $OUT comes back)
#   PYTHON         default .venv/bin/python, else python3
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
BUNDLE="$REPO/.whl/py312-site.tar.xz"
WHEELS=(diffusers==0.42.1 ray==2.60.0 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0
        typing-inspection==0.4.5 typing_extensions==4.16.0 importlib_metadata==10.2.0 zipp==4.1.2
        jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 attrs==26.1.0)

if [[ "${1:-}" == "prepare" ]]; then  # on a machine with the package index: the bundle for the image
    work="$REPO/.whl/py312"
    rm -rf "$work" && mkdir -p "$work/wheels" "$work/site"
    "$REPO/.venv/bin/pip" download -q --only-binary=:all: --no-deps --python-version 3.12 --implementation cp \
        --abi cp312 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$work/wheels" "${WHEELS[@]}"
    for wheel in "$work"/wheels/*.whl; do (cd "$work/site" && unzip -q -o "$wheel"); done
    rm -rf "$work"/site/ray/{jars,rllib,llm,serve,data,tune,workflow}  # Spotlight uses Ray core only
    tar -C "$work/site" -cf - . | xz -6 -T1 > "$BUNDLE"
    rm -rf "$work"
    echo "wrote $BUNDLE ($(du -h "$BUNDLE" | cut -f1)); carry it: carry=[\".whl/py312-site.tar.xz\"]"
    exit 0
fi

started=$(date +%s)
PYTHON="${PYTHON:-$( [[ -x "$REPO/.venv/bin/python" ]] && echo "$REPO/.venv/bin/python" || echo python3)}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # spotlight itself, for the runs and their Ray workers
if ! "$PYTHON" -c "import ray, diffusers, pydantic" 2>/dev/null; then
    if [[ ! -f "$BUNDLE" ]]; then
        echo "run_1x8: $PYTHON lacks ray/diffusers/pydantic and $BUNDLE is missing: run 'bash benchmarks/learning/run_1x8.sh prepare' where pip reaches the index, then carry .whl/py312-site.tar.xz" >&2
        exit 2
    fi
    site="${TMPDIR:-/tmp}/spotlight-site"
    rm -rf "$site" && mkdir -p "$site" && tar -xJf "$BUNDLE" -C "$site"
    export PYTHONPATH="$site:$PYTHONPATH"
    if ! error=$("$PYTHON" -c "import ray, diffusers, pydantic, spotlight" 2>&1); then
        echo "run_1x8: with the bundle, $("$PYTHON" -V 2>&1) still fails to import ($(tail -n 1 <<< "$error")): the bundle holds cp312 wheels of what the device machine's image lacks (diffusers, ray, pydantic and their dependencies); use Python 3.12, or add the missing package's wheel to WHEELS and re-run prepare" >&2
        exit 2
    fi
fi
echo "set-up: $(( $(date +%s) - started )) s; $("$PYTHON" -V 2>&1); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"

results="${OUT:-$REPO}/benchmarks/results"
mkdir -p "$results"
json="$results/time_to_target_1x8.json"
merge="${MERGE:-$REPO/benchmarks/results/time_to_target_1x8.json}"
args=(--modes ${MODES:-vanilla spotlight} --seeds ${SEEDS:-0} --spot-devices "${SPOT_DEVICES:-8}"
      --max-wall-s "${MAX_WALL_S:-240}" --gain "${GAIN:-0.10}" --eval-seeds "${EVAL_SEEDS:-10}"
      --runs-dir runs/time-to-target-1x8 --out "$json")
[[ -n "${CONTROL_CORES:-}" ]] && args+=(--control-cores "$CONTROL_CORES")
[[ "${PAIR:-1}" == "1" ]] && args+=(--pair)
[[ -f "$merge" && "$merge" != "$json" ]] && args+=(--merge "$merge")
[[ -f "$merge" && "$merge" == "$json" ]] && { cp "$json" "$json.before"; args+=(--merge "$json.before"); }
(lscpu 2>/dev/null || true) > "$results/time_to_target_1x8.lscpu.txt"
echo "+ python benchmarks/learning/time_to_target.py ${args[*]}"
set +e  # the logs come back whatever the benchmark's exit
"$PYTHON" benchmarks/learning/time_to_target.py "${args[@]}" 2>&1 | tee "$results/time_to_target_1x8.txt"
rc=${PIPESTATUS[0]}
set -e
mkdir -p "$results/time_to_target_1x8_logs"
cp runs/time-to-target-1x8/*.log "$results/time_to_target_1x8_logs/" 2>/dev/null || true
echo "total: $(( $(date +%s) - started )) s (exit $rc)"
exit "$rc"
