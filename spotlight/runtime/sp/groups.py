"""Start the elastic SP groups of a run (``runtime.sp_degree`` > 1): the controller and one agent per spot node."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from spotlight.models.spec import check_sp_policy
from spotlight.run_error import RunError
from spotlight.runtime.section import RuntimeSection
from spotlight.runtime.sp.elastic import ElasticSP, ElasticSPSettings
from spotlight.runtime.spot.local_nodes import LocalSpotNodes
from spotlight.runtime.spot.pools import PoolError
from spotlight.runtime.spot.worker import model_weights

__all__ = ["start_elastic_sp"]


def start_elastic_sp(section: RuntimeSection, queue: Any, model: Any, ray_cluster: Any, initial: list[str],
                     log_path: Path, clock: Callable[[], float], poll_s: float) -> ElasticSP:
    """The elastic SP controller serving ``queue``, with the agents of the ``initial`` spot nodes up and serving.

    The agents run the policy (a TinyDiT, or a FLUX / Qwen-Image transformer with LoRA) with Ulysses
    attention, so the degree must divide its heads and its token counts (`spotlight.models.spec.check_sp_policy`).
    """
    try:
        check_sp_policy(model.config, section.sp_degree)
    except ValueError as error:
        raise RunError(f"runtime.sp_degree={section.sp_degree}: {error}") from None
    settings = ElasticSPSettings(sp_degrees={model.latent_shape[-1]: section.sp_degree},
                                 devices_per_node=section.sp_degree, min_step_s=section.min_step_s, poll_s=poll_s)
    # Version -1: the start-up weights are no iteration's; the groups serve once start_iteration sets θ_i.
    elastic = ElasticSP(queue, model.config, ray.put(model_weights(model)), LocalSpotNodes(ray_cluster), settings,
                        log_path, clock=clock, weights_version=-1)
    for name in initial:
        elastic.node_joined(name)
    deadline = time.monotonic() + section.node_timeout_s
    while len(elastic.agents) < len(initial):
        elastic.poll_agents()
        if time.monotonic() > deadline:
            raise PoolError(f"spot node agents did not start within {section.node_timeout_s:.0f} s: the machine "
                            "is overloaded; retry, or raise runtime.node_timeout_s")
        time.sleep(0.1)
    return elastic
