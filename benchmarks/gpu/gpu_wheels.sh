#!/usr/bin/env bash
# Prepare, on a machine that reaches PyPI, the packages the lent H200 image lacks, as one tarball to carry:
#
#   bash benchmarks/gpu/gpu_wheels.sh     # -> .whl/py312-site.tar.xz and .whl/py312-ocr.tar.xz* (.whl/ is git-ignored)
#
# The H200 image has Python 3.12 with torch, transformers, peft, accelerate, safetensors, typer, rich, numpy,
# Pillow and PyYAML, and reaches no package registry. Spotlight also needs diffusers, pydantic (and its small
# dependencies), ray (and jsonschema's), and the recipes' OCR reward needs rapidocr-onnxruntime, onnxruntime
# and OpenCV (headless). This script downloads their cp312 manylinux wheels from PyPI (no dependencies
# resolved: the list below is the whole set, pinned to the versions the project is tested with), installs
# them into .whl/site with `pip install --no-index --no-deps --target` for Python 3.12, deletes the parts of
# ray that Spotlight never imports (its Java jars, RLlib, LLM, Serve, Data, Tune and Workflow libraries: 149 MB
# left of ray), and packs two tarballs with xz: Spotlight's packages (py312-site.tar.xz) and the OCR reward's
# (py312-ocr.tar.xz; OpenCV's libraries make it the larger). One over 60 MiB is split into 60 MiB parts
# (NAME.part-aa, -ab, ...), since the device tool carries at most 64 MiB a call. benchmarks/gpu/gpu_acceptance.sh
# (and gpu_run.sh for py312-site.tar.xz) unpack them and put them first on PYTHONPATH.
#
# ORT_GPU=1 takes onnxruntime-gpu (CUDA provider: the OCR reward's detector and recogniser on the GPU) instead
# of onnxruntime; its wheel is ~250 MB, too large for a 64 MiB carry, so the default is the CPU build, whose
# sessions the OCR reward spreads over a pool of the machine's cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${DEST:-.whl}
PYTHON=${PYTHON:-.venv/bin/python}
ONNXRUNTIME=onnxruntime==1.32.0
if [ -n "${ORT_GPU:-}" ]; then ONNXRUNTIME=onnxruntime-gpu==1.32.0; fi
PACKAGES=(
    diffusers==0.42.1
    pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
    typing_extensions==4.16.0 importlib_metadata==9.1.0 zipp==4.1.2
    ray==2.60.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
    rapidocr-onnxruntime==1.4.4 "$ONNXRUNTIME" flatbuffers==25.12.19 opencv-python-headless==5.0.0.93
    pyclipper==1.4.0 shapely==2.2.0 six==1.17.0
)
TARGET=(--only-binary=:all: --no-deps --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
        --platform any)

SPOTLIGHT_PACKAGES=(diffusers pydantic pydantic_core annotated_types typing_inspection typing_extensions
                    importlib_metadata zipp ray jsonschema jsonschema_specifications referencing rpds rpds_py)
rm -rf "$DEST/wheels" "$DEST/site" "$DEST"/py312-*.tar.xz*
mkdir -p "$DEST/wheels"
"$PYTHON" -m pip download --quiet --dest "$DEST/wheels" "${TARGET[@]}" "${PACKAGES[@]}"
"$PYTHON" -m pip install --quiet --no-index --find-links "$DEST/wheels" --target "$DEST/site" --no-compile \
    "${TARGET[@]}" "${PACKAGES[@]}"
# what Spotlight never imports from ray (spotlight uses ray core: actors, placement groups, the object store)
rm -rf "$DEST"/site/ray/{jars,rllib,llm,serve,data,tune,workflow} "$DEST/site/bin"
du -sh "$DEST/site"
# two tarballs: Spotlight's packages, and the OCR reward's (rapidocr's ONNX weights, onnxruntime, OpenCV)
mkdir -p "$DEST/site-spotlight" "$DEST/site-ocr"
is_spotlights() {  # a package folder, module file or dist-info of SPOTLIGHT_PACKAGES
    local package
    for package in "${SPOTLIGHT_PACKAGES[@]}"; do
        if [[ $1 == "$package" || $1 == "$package"-* || $1 == "$package".* ]]; then return 0; fi
    done
    return 1
}
for entry in "$DEST"/site/*; do
    if is_spotlights "$(basename "$entry")"; then mv "$entry" "$DEST/site-spotlight/"; else mv "$entry" "$DEST/site-ocr/"; fi
done
XZ_OPT="-6 -T0" tar -C "$DEST/site-spotlight" -cJf "$DEST/py312-site.tar.xz" .
XZ_OPT="-6 -T0" tar -C "$DEST/site-ocr" -cJf "$DEST/py312-ocr.tar.xz" .
rm -rf "$DEST/site" "$DEST/site-spotlight" "$DEST/site-ocr"
# the device tool carries at most 64 MiB a call: a larger tarball goes in 60 MiB parts (gpu_acceptance.sh joins them)
for tarball in "$DEST"/py312-*.tar.xz; do
    if [ "$(stat -c %s "$tarball")" -gt $(( 60 * 1024 * 1024 )) ]; then
        split -b 60M "$tarball" "$tarball.part-" && rm "$tarball"
    fi
done
ls -l "$DEST"/py312-*
