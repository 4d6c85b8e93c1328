"""What a simulation is asked: the cluster, the loop's shape, the planner, the workload and the mode.

Plain validated sections (`spotlight.schema.Section`): a bad value fails at load naming its field.
The engine that runs them is `spotlight.sim.simulator`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from spotlight.explore.planner_section import PlannerSection
from spotlight.modes import Mode
from spotlight.schema import Section
from spotlight.sim.convergence import ConvergenceSection, SignalSection
from spotlight.sim.workload import WorkloadSection

__all__ = ["SIMULATED_MODES", "ClusterSection", "LoopSection", "SimConfig", "not_simulated"]

# The modes the simulator runs, in the order its reports list them. stale-explore is not one: it is
# spotlight's seeds without its devices, a one-process measurement of staleness alone.
SIMULATED_MODES: tuple[Mode, ...] = (Mode.VANILLA, Mode.SPOT_ROLLOUT, Mode.SYNC_EXPLORE, Mode.SPOTLIGHT)


def not_simulated(mode: Mode) -> str:
    """The one-line error for a mode the simulator does not run."""
    return (f"mode {mode} is not simulated (it runs in one process, without a cluster to simulate); "
            f"use one of {', '.join(SIMULATED_MODES)}")


class ClusterSection(Section):
    """The devices, their prices and their preemptions.

    trace: a path, or the name of a trace shipped in the package (`traces.find_trace`). Its live
    count is mapped onto `spot_devices` (count · spot_devices / the trace's peak, rounded down) and
    its times multiplied by `trace_time_scale`. notice_s: warning before a preemption (AWS gives
    120 s, GCP 30 s; 0 = none). recovery: `elastic` (agents re-form SP groups in
    `elastic_reconfigure_s`, sub-second) or `cold` (restart the pool's processes, `cold_restart_s`:
    process start, imports, loading 40 GB of weights from storage, a new process group — minutes;
    the default 120 s is an assumption until the runtime's recovery benchmark measures it).
    """

    on_demand_devices: int = Field(32, ge=1)
    spot_devices: int = Field(32, ge=0)
    on_demand_instance: str = "p5.48xlarge"
    spot_instance: str = "p5.48xlarge"
    price_overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)
    trace: str = "aws-p3-bamboo.csv"
    trace_time_scale: float = Field(1.0, gt=0)
    notice_s: float = Field(120.0, ge=0)
    recovery: Literal["elastic", "cold"] = "elastic"
    elastic_reconfigure_s: float = Field(0.5, ge=0)
    cold_restart_s: float = Field(120.0, ge=0)


class LoopSection(Section):
    """The GRPO loop's shape: P prompts × G samples per iteration, and when to stop.

    explore_wait_s (spotlight): how long the trainer waits, after training, for an exploration
    round that has not finished, before cancelling the rest (the runtime's `runtime.explore_wait_s`,
    default 15 s there); 0 cuts exploration off when training ends. initial_budget_s: the planner's
    budget for the first round, before any update has been timed (the runtime's
    `explore.initial_budget_s`); None: the training time. Later rounds get the previous update's
    time, as in the runtime. monitor_prompts (spotlight): the staleness monitor's re-score, as the
    runtime's `explore.monitor_prompts` (4 there; 0 = none): each round also re-scores that many of
    the previous round's prompts with its plan, after its own candidates, and the planner's budget
    is reduced by its predicted time (`round_budget`).
    """

    prompts_per_iteration: int = Field(32, ge=1)
    group_size: int = Field(16, ge=2)
    max_iterations: int = Field(1000, ge=1)
    stop_at_target: bool = True
    explore_wait_s: float = Field(0.0, ge=0)
    initial_budget_s: float | None = Field(None, gt=0)
    monitor_prompts: int = Field(0, ge=0)


class SimConfig(Section):
    """Everything `simulate` needs; the defaults simulate Qwen-Image at 1280² on 32 + 32 H100s."""

    mode: Mode = Mode.SPOTLIGHT
    seed: int = 0
    cluster: ClusterSection = ClusterSection()
    workload: WorkloadSection = WorkloadSection()
    loop: LoopSection = LoopSection()
    planner: PlannerSection = PlannerSection(num_candidates=(16, 32, 64, 128))
    signal: SignalSection = SignalSection()
    convergence: ConvergenceSection = ConvergenceSection()

    @field_validator("mode")
    @classmethod
    def _simulated(cls, mode: Mode) -> Mode:
        if mode not in SIMULATED_MODES:
            raise ValueError(not_simulated(mode))
        return mode

    @model_validator(mode="after")
    def _candidates_cover_group(self) -> SimConfig:
        smallest = min(self.planner.num_candidates)
        if smallest < self.loop.group_size:
            raise ValueError(
                f"planner.num_candidates must all be >= loop.group_size ({smallest} < {self.loop.group_size}); "
                "drop the smaller values or lower the group size"
            )
        return self
