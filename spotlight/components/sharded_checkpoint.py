"""The sharded half of an FSDP2 run's checkpoint: every rank's shards through `torch.distributed.checkpoint`.

A ``trainer.sharding: fsdp`` checkpoint is the usual checkpoint directory (`spotlight.components.checkpoint`:
``model.safetensors``, ``model.json`` and the consolidated ``transformer/`` that diffusers'
``from_pretrained`` loads, written by rank 0 from the gathered θ, plus the loop's state) with one more
folder, ``dcp/``: θ, θ_old,i (``previous``), the EMA, a trailing θ_old (``sampler``) and the optimizer's
moments, each rank writing its own shards, and one ``.metadata`` that maps them to the whole tensors.
No rank ever holds the whole training state.

DCP reshards on load, so the same folder resumes on any K': K' ranks each read their new chunks; one
process (K' = 1, no process group) reads whole tensors into a plain policy. The keys are the policy's
``shard_root`` state-dict names (its ``broadcast_state`` keys), and the optimizer's state is keyed by
parameter name (`get_optimizer_state_dict`), not by position, so it survives the change of K.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

__all__ = ["DCP_FOLDER", "checkpointed_versions", "is_sharded", "load_optimizer_whole", "load_shards", "save_shards",
           "versions_state"]

DCP_FOLDER = "dcp"


def checkpointed_versions(model: Any, previous: Any, ema: Any | None, trailing: Any | None) -> dict[str, Any]:
    """The versions a checkpoint keeps, by the names it keeps them under: θ as ``model``, θ_old,i as ``previous``,
    and the EMA and a trailing θ_old (``sampler``) where the run has them."""
    named = {"model": model, "previous": previous, "ema": ema, "sampler": trailing}
    return {name: policy for name, policy in named.items() if policy is not None}


def versions_state(versions: dict[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The state a sharded checkpoint holds, as live tensors (DTensor shards under FSDP2, whole tensors in one
    process): ``versions`` names the policies (model, previous, and ema and sampler where the run keeps them).
    What `save_shards` writes and `load_shards` loads into."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state: dict[str, Any] = {name: policy.shard_root.state_dict() for name, policy in versions.items()}
    state["optimizer"] = get_optimizer_state_dict(versions["model"].shard_root, optimizer)
    return state


def is_sharded(checkpoint: Path) -> bool:
    """Whether ``checkpoint`` keeps its training state in ``dcp/`` (written by K ranks under FSDP2)."""
    return (Path(checkpoint) / DCP_FOLDER / ".metadata").is_file()


def save_shards(checkpoint: Path, state: dict[str, Any]) -> None:
    """Write this rank's part of ``state`` into ``checkpoint/dcp`` (a collective: every rank calls it)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(state, checkpoint_id=Path(checkpoint) / DCP_FOLDER)


def load_shards(checkpoint: Path, versions: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
    """Load ``checkpoint/dcp`` into ``versions`` (named as for `versions_state`) and ``optimizer``, resharded to
    this K (a collective on K ranks; one process reads whole tensors alone)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    state = versions_state(versions, optimizer)
    dcp.load(state, checkpoint_id=Path(checkpoint) / DCP_FOLDER)
    for name, policy in versions.items():
        policy.shard_root.load_state_dict(state[name])
    set_optimizer_state_dict(versions["model"].shard_root, optimizer, state["optimizer"])


def load_optimizer_whole(model: Any, optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """A one-process optimizer state (keyed by position, as ``Optimizer.state_dict`` writes it) into ``optimizer``
    over ``model``'s sharded parameters: each rank keeps its chunks of every moment (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = [name for name, _ in model.shard_root.named_parameters()]
    if not saved.get("state"):
        return  # a checkpoint written before the first step: nothing to restore
    by_name = {"state": {names[index]: value for index, value in saved["state"].items()},
               "param_groups": [{**group, "params": [names[index] for index in group["params"]]}
                                for group in saved["param_groups"]]}
    set_optimizer_state_dict(model.shard_root, optimizer, by_name, options=StateDictOptions(full_state_dict=True))
