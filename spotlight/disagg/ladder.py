"""A discrete-event model of the throughput ladder: colocated, disaggregated, then + GAP, + TSP, + TAG/BTS,
+ one-step asynchrony, and Spotlight exploration on spot generators.

Colocated (the veRL-Omni baseline): all N devices generate the batch, score it, swap the rollout
state for the training state, and train. Disaggregated: N_g generator devices draw units (cut along
the generation axis by `cut_generation_units`), a reward pool scores each unit after
``reward_latency_s``, and N_t = N - N_g trainer devices train; weights are published to the
generators after each step. The rungs switch on, cumulatively:

- split alone: the trainer starts when the whole batch is scored, generators wait for the new weights;
- GAP: the trainer trains every complete group as soon as it is free (one optimizer step per batch);
- TSP: training passes pack timesteps (`StepCosts.train_sample_s`);
- TAG/BTS: at each bubble `BubblePolicy` (the runtime's policy, on the model's timings) decides how
  many unstarted units the trainer draws; TAG takes them from the end of the batch, whose groups
  would otherwise be ready last;
- async: generators may start batch b with θ_{b-1} (`VersionGate`), so generation of batch b
  overlaps the update of batch b-1.

Two side rungs: ``GAP + async`` (no TSP, no TAG), the combination the independent reproduction
measured; and ``coarse TAG``, in place of the + TAG/BTS rung, where the trainer generates a whole
round (one unit per trainer device) at the start of every step whether or not it pays: what the
reproduction's coarse TAG did, as far as "generated a whole extra round" says (inferred).

The trainer is data parallel over training passes (one timestep of one sample, or one TSP pack): a
chunk of p passes takes ceil(p / N_t) pass times, so a chunk with fewer passes than trainer devices
leaves some idle (GAP's cost: it trains small chunks; TSP's larger passes make it a little worse).
Every disaggregated rung is simulated at every split N_g and reports its best. Throughput is measured
over the batches after the warm-up (steady state).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from spotlight.disagg.bubble import BubblePolicy, BubbleTimings, QueueState
from spotlight.disagg.ladder_config import LadderConfig
from spotlight.disagg.ladder_costs import StepCosts, step_costs
from spotlight.disagg.samples import cut_generation_units
from spotlight.disagg.versions import VersionGate


@dataclass(frozen=True)
class Rung:
    """One configuration of the ladder."""

    name: str
    gap: bool = False
    tsp: bool = False
    tag: str = "off"  # off | bts | coarse
    async_one_step: bool = False


RUNGS = (
    Rung("disaggregated"),
    Rung("+ GAP", gap=True),
    Rung("+ TSP", gap=True, tsp=True),
    Rung("+ TAG/BTS", gap=True, tsp=True, tag="bts"),
    Rung("+ async", gap=True, tsp=True, tag="bts", async_one_step=True),
)
SIDE_RUNGS = (
    Rung("GAP + async (side)", gap=True, async_one_step=True),
    Rung("coarse TAG (side)", gap=True, tsp=True, tag="coarse"),
)


@dataclass(frozen=True)
class RungResult:
    """A rung at its best split: samples/s in steady state, the split, and where the time went."""

    name: str
    samples_per_s: float
    step_s: float
    generator_devices: int
    trainer_devices: int
    generator_utilisation: float
    trainer_utilisation: float
    tag_units_per_step: float


def colocated(config: LadderConfig, model: str, devices: int, sampling_steps: int, fraction: float) -> RungResult:
    """Generate, score, swap and train on the same ``devices``, one phase after the other (closed form)."""
    costs = step_costs(config.models[model], config.hardware, config.costs, sampling_steps, fraction, devices)
    batch = config.batch.prompts * config.batch.group_size
    per_device = math.ceil(batch / devices)
    generate = per_device * costs.generate_sample_s / config.costs.colocated_generation_efficiency
    train = costs.train_chunk_s(batch, devices, tsp=False, max_pack=config.costs.tsp_max_pack)
    step = (generate + per_device * config.costs.colocated_reward_device_s + costs.offload_restore_s + train
            + costs.commit_s)
    return RungResult("colocated", batch / step, step, devices, devices, generate / step, train / step, 0.0)


def overlap_ceiling(config: LadderConfig, model: str, devices: int, sampling_steps: int, fraction: float) -> float:
    """(gen + train) / max(gen, train) with both phases timed on all ``devices``."""
    costs = step_costs(config.models[model], config.hardware, config.costs, sampling_steps, fraction, devices)
    generate = costs.generate_sample_s
    train = costs.train_sample_s(tsp=False, max_pack=config.costs.tsp_max_pack)
    return (generate + train) / max(generate, train)


class _Run:
    """One disaggregated run of ``num_batches`` batches at a fixed split."""

    def __init__(self, config: LadderConfig, costs: StepCosts, rung: Rung, generators: int, trainers: int) -> None:
        self.config, self.costs, self.rung = config, costs, rung
        self.generators, self.trainers = generators, trainers
        batch = config.batch
        self.units = cut_generation_units(batch.prompts, batch.group_size, batch.unit_size)
        self.unit_s = batch.unit_size * costs.generate_sample_s
        self.sample_train_s = costs.train_sample_s(rung.tsp, config.costs.tsp_max_pack)
        self.gate = VersionGate(async_one_step=rung.async_one_step)
        # BTS's training time per unit is profiled: the previous batch's training time over its units
        # (before the first batch, the even share of a unit over the trainer devices)
        self.profiled_train_unit_s = batch.unit_size * self.sample_train_s / trainers
        self.train_s_in_batch = 0.0
        self.groups_of_unit = [{p for p, _ in unit.members} for unit in self.units]
        self.units_of_group = {p: [u.index for u in self.units if p in self.groups_of_unit[u.index]]
                               for p in range(batch.prompts)}
        self.generator_free = [0.0] * generators
        self.trainer_free = 0.0
        self.published = {0: 0.0}
        self.commits: list[float] = []
        self.generator_busy = self.trainer_busy = 0.0
        self.tag_units = 0

    def run(self) -> None:
        for batch in range(self.config.batch.num_batches):
            self._batch(batch)

    def _train_chunk(self, start: float, samples: int) -> None:
        duration = self.costs.train_chunk_s(samples, self.trainers, self.rung.tsp, self.config.costs.tsp_max_pack)
        self.train_s_in_batch += duration
        self.trainer_busy += samples * self.sample_train_s / self.trainers
        self.trainer_free = start + duration

    def _batch(self, b: int) -> None:
        gate = self.published[max(b - self.gate.max_lag, 0)]
        unstarted = deque(self.units)
        ready: dict[int, float] = {}  # unit -> scored time
        trained: set[int] = set()
        declined_at = None
        coarse_round = self.rung.tag == "coarse"
        group_size = self.config.batch.group_size
        while len(trained) < self.config.batch.prompts:
            gen_t = max(min(self.generator_free), gate) if unstarted else math.inf
            known = {p: max(ready[u] for u in units) for p, units in self.units_of_group.items()
                     if p not in trained and all(u in ready for u in units)}
            if self.rung.gap:
                next_ready = min(known.values(), default=math.inf)
            else:
                next_ready = max(known.values()) if len(known) == self.config.batch.prompts else math.inf
            tf = self.trainer_free
            train_t = max(tf, next_ready)
            # the trainer holds θ_b from its last commit on, so TAG may start before the publish reaches the generators
            bubble = self.rung.tag == "bts" and unstarted and next_ready > tf and declined_at != tf
            bubble = bubble or (coarse_round and bool(unstarted))
            tag_t = tf if bubble else math.inf
            now = min(gen_t, train_t, tag_t)
            if now == math.inf:
                raise RuntimeError("the ladder simulation stalled: no generator, trainer or TAG event is possible")
            if gen_t == now:
                unit = unstarted.popleft()
                device = self.generator_free.index(min(self.generator_free))
                done = gen_t + self.unit_s
                self.generator_free[device] = done
                self.generator_busy += self.unit_s
                ready[unit.index] = done + self.config.costs.reward_latency_s
            elif tag_t == now:
                k = self._tag_fragments(tf, gate, unstarted)
                coarse_round = False
                if k == 0:
                    declined_at = tf
                    continue
                end = tf + self.costs.offload_restore_s + math.ceil(k / self.trainers) * self.unit_s * \
                    self.config.costs.tag_slowdown
                for _ in range(k):
                    ready[unstarted.pop().index] = end + self.config.costs.reward_latency_s
                self.tag_units += k
                self.trainer_free = end
            else:
                if self.rung.gap:
                    chunk = [p for p, t in known.items() if t <= train_t]
                else:
                    chunk = list(known)
                trained.update(chunk)
                self._train_chunk(train_t, len(chunk) * group_size)
        self.profiled_train_unit_s = self.train_s_in_batch / len(self.units)
        self.train_s_in_batch = 0.0
        commit = self.trainer_free + self.costs.commit_s
        self.trainer_free = commit
        self.commits.append(commit)
        self.published[b + 1] = commit + self.costs.publish_s

    def _tag_fragments(self, now: float, gate: float, unstarted: deque) -> int:
        if self.rung.tag == "coarse":
            return min(len(unstarted), self.trainers)
        costs, config = self.costs, self.config
        policy = BubblePolicy(BubbleTimings(
            fragment_on_generator_s=self.unit_s, fragment_on_trainer_s=self.unit_s * config.costs.tag_slowdown,
            train_fragment_s=self.profiled_train_unit_s, offload_restore_s=costs.offload_restore_s,
            trainer_parallel=self.trainers),
            max_fragments=config.bts_max_rounds * self.trainers, min_gain_fraction=config.bts_min_gain)
        free_in = tuple(max(free - now, 0.0) for free in self.generator_free)
        return policy.fragments_for_trainer(QueueState(len(unstarted), free_in, max(gate - now, 0.0)))

    def result(self) -> RungResult:
        warm = self.config.batch.warmup_batches
        steps = len(self.commits) - warm
        span = self.commits[-1] - self.commits[warm - 1]
        batch = self.config.batch.prompts * self.config.batch.group_size
        total = self.commits[-1]
        return RungResult(self.rung.name, steps * batch / span, span / steps, self.generators, self.trainers,
                          self.generator_busy / (self.generators * total), self.trainer_busy / total,
                          self.tag_units / len(self.commits))


def at_split(config: LadderConfig, rung: Rung, model: str, devices: int, sampling_steps: int, fraction: float,
             generators: int) -> RungResult:
    """``rung`` with ``generators`` of the ``devices`` generating and the rest training."""
    if not 1 <= generators < devices:
        raise ValueError(f"a split needs ≥ 1 generator and ≥ 1 trainer device (got {generators} of {devices})")
    costs = step_costs(config.models[model], config.hardware, config.costs, sampling_steps, fraction,
                       devices - generators)
    run = _Run(config, costs, rung, generators, devices - generators)
    run.run()
    return run.result()


def disaggregated(config: LadderConfig, rung: Rung, model: str, devices: int, sampling_steps: int,
                  fraction: float) -> RungResult:
    """``rung`` at its best split of ``devices`` into generators and trainers (every split, or every
    devices // 16-th on larger clusters)."""
    if devices < 2:
        raise ValueError(f"disaggregation needs ≥ 2 devices, one per pool (got {devices})")
    stride = max(1, devices // 16)
    results = [at_split(config, rung, model, devices, sampling_steps, fraction, generators)
               for generators in range(stride, devices, stride)]
    return max(results, key=lambda result: result.samples_per_s)


@dataclass(frozen=True)
class SpotlightRung:
    """Exploration for batch i+1 on spot generators during step i: the step is the async rung's; what
    fits in its shadow is ``candidates_per_prompt`` cheap candidates per prompt."""

    step_s: float
    spot_devices: int
    candidates_per_prompt: float
    fits: bool


def spotlight_rung(config: LadderConfig, best: RungResult, model: str, devices: int, sampling_steps: int,
                   fraction: float) -> SpotlightRung:
    """How much exploration the spot generators finish while the async rung's step runs."""
    costs = step_costs(config.models[model], config.hardware, config.costs, sampling_steps, fraction, devices)
    spot = round(config.exploration.spot_devices_per_device * devices)
    candidate_s = config.exploration.explore_steps / sampling_steps * costs.generate_sample_s
    candidates = spot * best.step_s / (config.batch.prompts * candidate_s)
    return SpotlightRung(best.step_s, spot, candidates, candidates >= config.exploration.candidates_per_prompt)


def ladder(config: LadderConfig, model: str, devices: int, sampling_steps: int, fraction: float) -> dict:
    """Every rung of one setting, with ratios to colocated and to the split-alone rung, and the overlap ceiling."""
    base = colocated(config, model, devices, sampling_steps, fraction)
    rungs = [base] + [disaggregated(config, rung, model, devices, sampling_steps, fraction)
                      for rung in (*RUNGS, *SIDE_RUNGS)]
    split = rungs[1]
    asynchronous = next(r for r in rungs if r.name == "+ async")
    costs = step_costs(config.models[model], config.hardware, config.costs, sampling_steps, fraction, devices)
    batch = config.batch.prompts * config.batch.group_size
    perfect_step = batch * (costs.generate_sample_s + costs.train_sample_s(False, 1)) / devices
    return {
        "setting": {"model": model, "devices": devices, "sampling_steps": sampling_steps, "trained_fraction": fraction},
        "overlap_ceiling": overlap_ceiling(config, model, devices, sampling_steps, fraction),
        # every device busy all the time at the ideal split, no TSP: what overlap alone can give over the split
        "perfect_overlap_vs_split": split.step_s / perfect_step,
        "rungs": [{**r.__dict__, "vs_colocated": r.samples_per_s / base.samples_per_s,
                   "vs_disaggregated": r.samples_per_s / split.samples_per_s} for r in rungs],
        "spotlight": spotlight_rung(config, asynchronous, model, devices, sampling_steps, fraction).__dict__,
    }
