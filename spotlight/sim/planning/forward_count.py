"""What a transformer count holds (`ForwardCount`), and the check that a folder's transformer is one Spotlight counts.

Shared by the two ways of counting, from the config (`spotlight.sim.planning.forward_flops`, through
`spotlight.sim.planning.analytic`) and on the meta device (`spotlight.sim.planning.meta_flops`, the
reference), so that neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from spotlight.models.pipelines.family_config import TRANSFORMER_CLASSES
from spotlight.models.pipelines.folder import PipelineFolder, PipelineFolderError

__all__ = ["ForwardCount", "LoraShape", "UnknownTransformerError", "check_transformer_class"]

LoraShape = tuple[int, tuple[str, ...]]  # (rank, target module names)


class UnknownTransformerError(PipelineFolderError):
    """A folder whose transformer class Spotlight does not know; the message names the known ones."""


@dataclass(frozen=True)
class ForwardCount:
    """One transformer forward of ``batch`` samples.

    flops: FLOPs of the whole forward (torch's counter: 2 per multiply-add), LoRA's adapters included
    when counted with one; image_tokens and text_tokens: per sample; parameters: the transformer's
    own parameter count; lora_parameters: the adapters' (0 without); lora_inputs and lora_weights: the
    targeted Linears' input features by stream and their weights' elements, as
    `spotlight.models.pipelines.memory_estimate.ModelSizes` takes them; train_flops: forward and
    backward of the same batch with gradients for what is trained (the adapters with LoRA, every
    weight without), None unless asked for.
    """

    flops: float
    batch: int
    image_tokens: int
    text_tokens: int
    parameters: int
    lora_parameters: int
    train_flops: float | None = None
    lora_inputs: tuple[int, int, int] = (0, 0, 0)
    lora_weights: int = 0

    @property
    def flops_per_sample(self) -> float:
        return self.flops / self.batch


def check_transformer_class(folder: PipelineFolder) -> None:
    """UnknownTransformerError unless model_index.json (and transformer/config.json's ``_class_name``, where
    present) name the family's transformer class, the one diffusers would build and Spotlight counts."""
    library, name = folder.class_name("transformer")
    expected = TRANSFORMER_CLASSES[folder.family]
    stored = folder.transformer.get("_class_name")  # not required; where present, a cross-check
    named = {"model_index.json": name if library == "diffusers" else f"{library}.{name}",
             "transformer/config.json": stored or expected}
    for source, class_name in named.items():
        if class_name != expected:
            known = ", ".join(f"{cls} ({family})" for family, cls in TRANSFORMER_CLASSES.items())
            raise UnknownTransformerError(
                f"{folder.path}/{source} names {class_name} as the transformer, which Spotlight cannot count or train "
                f"for a {folder.family} pipeline: use a folder whose transformer is one of {known}")
