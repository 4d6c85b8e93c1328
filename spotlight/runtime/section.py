"""The ``runtime:`` config section: where the pools run, which trace preempts them, what devices cost."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from spotlight.explore.planner_section import PlannerSection
from spotlight.modes import Mode
from spotlight.schema import Section

__all__ = ["PricesSection", "RuntimeSection"]


class PricesSection(Section):
    """Device prices: per-GPU-hour prices of ``instance`` from spotlight/market/prices.yaml, unless given."""

    instance: str = "p5.48xlarge"
    on_demand_per_gpu_hour: float | None = Field(None, ge=0)
    spot_per_gpu_hour: float | None = Field(None, ge=0)


class RuntimeSection(Section):
    """The Ray runtime of ``spotlight train`` (modes spot-rollout and spotlight; the others with use_ray).

    ``address``: None starts a local cluster of logical nodes on this machine (one on-demand head,
    ``num_spot_devices`` spot nodes of one single-threaded device each); ``auto`` attaches to the
    running cluster this driver is on (see docs/runtime.md). ``trace``: a spot trace file (a name
    in the trace folder or a path), clipped to the spot nodes and replayed ``time_scale`` times
    faster (1/60: an hour of cloud time per minute), notices ``grace_s`` before each removal; None
    runs without preemptions. ``max_wall_s``: stop after the iteration that passes this much wall
    time (with a final validation and checkpoint), so the default run fits its time; None runs all
    iterations. ``planner``: the exploration planner when ``explore.planner`` is null; its grid is
    finer in N than the single-process default so that the chosen plan fills the training time.
    ``explore_wait_s``: after training, how long to wait for unfinished exploration (spot nodes
    all gone) before its prompts fall back to random seeds. ``complete_rounds``: every exploration
    round runs whole, so a run's numbers do not depend on when spot devices come and go: the round's
    plan is the planner's single arm (required) whatever the number of spot devices up, and at the
    round's close the on-demand device serves what is left through the queue beside the spot devices
    (bit-identical results, `spotlight.runtime.spot.worker.worker_loop`); for reproducible runs under
    preemptions (`benchmarks/reliability/chaos.py`), at the cost of exploration on the critical path when spot
    devices are short. ``min_step_s``: a spot device's exploration
    pass takes at least this long, to emulate a slower accelerator in tests and demos (0: CPU speed);
    with ``sp_degree`` > 1, each SP denoising step does. ``sp_degree``: 1 runs one single-process
    device per spot node; k > 1 serves exploration with elastic SP groups of degree k instead (each
    spot node's agent keeps k device processes, `spotlight.runtime.sp.elastic`), re-formed after
    each preemption and logged to run_dir/reconfigurations.jsonl; the rollout then runs on the
    on-demand device only. It must divide the model's attention heads (local cluster only).
    ``stop_grace_s``: after SIGTERM or SIGINT, the time within which the run saves a checkpoint and
    stops its Ray processes (a scheduler's grace before its SIGKILL: Kubernetes' default is 30 s); an
    iteration that would not end in time is abandoned (`spotlight.components.stop_signals`).
    ``cloud``, ``metadata_url``, ``watch_interval_s`` (attached clusters only): every spot node runs
    a preemption watcher (`spotlight.runtime.spot.watchers`) that polls that cloud's metadata service
    (``auto``: detected on each node; ``none``: no watcher) at its own address, or at
    ``metadata_url`` (``{node_id}`` is replaced by the node's Ray id) every ``watch_interval_s``.
    """

    address: str | None = None
    use_ray: bool = False
    num_spot_devices: int = Field(1, ge=0)
    trace: str | None = "aws-p3-bamboo.csv"
    time_scale: float = Field(1 / 60, gt=0)
    grace_s: float = Field(2.0, ge=0)
    max_wall_s: float | None = Field(900.0, gt=0)
    stop_grace_s: float = Field(25.0, gt=0)
    lease_timeout_s: float = Field(10.0, gt=0)
    # compact the queue's write-ahead log at each checkpoint to the work in flight (false: keep every record,
    # an audit trail of every request that grows with the run, as benchmarks/reliability/chaos.py reads)
    compact_queue_log: bool = True
    worker_capacity: int = Field(32, ge=1)
    forward_batch: int = Field(16, ge=1)
    min_step_s: float = Field(0.0, ge=0)
    explore_wait_s: float = Field(15.0, ge=0)
    complete_rounds: bool = False
    node_timeout_s: float = Field(120.0, gt=0)
    sp_degree: int = Field(1, ge=1)
    cloud: Literal["auto", "aws", "gcp", "azure", "none"] = "auto"
    metadata_url: str | None = None
    watch_interval_s: float = Field(1.0, gt=0)
    prices: PricesSection = PricesSection()
    planner: PlannerSection = PlannerSection(
        num_candidates=(8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128),
        num_steps=(4, 7, 10),
    )

    def runs_on_ray(self, mode: Mode) -> bool:
        """Whether a run of ``mode`` goes on this runtime: always for spot-rollout / spotlight, else with use_ray."""
        return mode.on_ray or self.use_ray
