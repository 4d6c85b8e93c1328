#!/usr/bin/env bash
# Set-up for a fresh machine: a virtualenv in .venv with Spotlight and a PyTorch that fits the machine.
# - a torch already in .venv is kept (e.g. a GPU user's own CUDA build);
# - with an NVIDIA driver present, pip's default (CUDA) torch is installed;
# - otherwise the CPU build torch==2.13.0 (SPOTLIGHT_TORCH overrides the requirement).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
if .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "setup: keeping the installed torch $(.venv/bin/python -c 'import torch; print(torch.__version__)')"
elif command -v nvidia-smi >/dev/null 2>&1; then
    .venv/bin/python -m pip install --quiet "${SPOTLIGHT_TORCH:-torch>=2.2}"
else
    .venv/bin/python -m pip install --quiet "${SPOTLIGHT_TORCH:-torch==2.13.0}"
fi
.venv/bin/python -m pip install --quiet -e ".[dev]"
echo "setup: done ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
