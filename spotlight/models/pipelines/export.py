"""What a user loads a trained diffusers policy back with: diffusers' own LoRA file, or a ``transformer/`` folder.

Spotlight's checkpoints keep the LoRA tensors under peft's keys (``model.safetensors``), which only
Spotlight reads. Beside them every LoRA checkpoint gets ``pytorch_lora_weights.safetensors`` exactly as
the family's ``PipelineClass.save_lora_weights`` writes it: keys with the ``transformer.`` prefix (keys
without it load nothing, diffusers only logs so) and the adapter's peft config as metadata. The
config matters: without it ``load_lora_weights`` infers ``lora_alpha = rank`` and applies the LoRA at
scale 1 instead of alpha / rank. So

    pipe = DiffusionPipeline.from_pretrained(base)
    pipe.load_lora_weights(checkpoint_folder)

gives the trained policy. A fully fine-tuned transformer is written as a ``transformer/`` folder with
``save_pretrained``, which ``from_pretrained(base, transformer=...)`` or a copy of the pipeline folder loads.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from spotlight.models.pipelines.family_config import Family

if TYPE_CHECKING:
    from diffusers.models.modeling_utils import ModelMixin

DIFFUSERS_LORA_FILE = "pytorch_lora_weights.safetensors"  # diffusers' default weight_name for LoRA
TRANSFORMER_FOLDER = "transformer"
# the LoRA loader of each family's pipeline (its save_lora_weights is a classmethod: no pipeline is built)
LORA_LOADERS: dict[Family, str] = {"sd3": "SD3LoraLoaderMixin", "flux": "FluxLoraLoaderMixin",
                                   "qwen-image": "QwenImageLoraLoaderMixin", "wan": "WanLoraLoaderMixin"}


def save_diffusers_lora(transformer: ModelMixin, family: Family, adapter_name: str, directory: str | Path,
                       weight_name: str = DIFFUSERS_LORA_FILE) -> Path:
    """Write ``directory/<weight_name>`` (``pytorch_lora_weights.safetensors``) for ``adapter_name`` of
    ``transformer``; returns its path.

    Written under a temporary name and renamed, so a reader never sees half a file.
    """
    from diffusers.loaders import lora_pipeline
    from peft import get_peft_model_state_dict

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    layers = {name: tensor.detach().cpu().contiguous()
              for name, tensor in get_peft_model_state_dict(transformer, adapter_name=adapter_name).items()}
    adapter_config = transformer.peft_config[adapter_name].to_dict()
    adapter_config["target_modules"] = sorted(adapter_config["target_modules"])  # a set is not JSON
    staging = f".{weight_name}.partial"
    getattr(lora_pipeline, LORA_LOADERS[family]).save_lora_weights(
        directory, transformer_lora_layers=layers, weight_name=staging,
        transformer_lora_adapter_metadata=adapter_config)
    final = directory / weight_name
    os.replace(directory / staging, final)
    return final


def save_transformer_folder(transformer: ModelMixin, directory: str | Path, name: str = TRANSFORMER_FOLDER) -> Path:
    """Write ``directory/<name>/`` (``transformer/``) with ``save_pretrained`` (a fully fine-tuned transformer);
    returns it.

    The folder is written beside its final place and renamed in, so an older one is replaced whole.
    """
    final = Path(directory) / name
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=final.parent))
    try:
        transformer.save_pretrained(str(staging))
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final
