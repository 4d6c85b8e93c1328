"""The Ray backend: one iteration's sampling spread over the on-demand device and the spot devices.

    start      θ_i goes to every spot device once, through the object store
    seeds      spotlight: chosen by the round that explored P_i with θ_{i-1} during iteration i-1's
               training; sync-explore: a round explores P_i with θ_i now (on the critical path);
               vanilla / spot-rollout: random
    rollout    P_i's groups in fixed parts, one per device (on-demand and spot), each sampled by an idle spot
               device holding θ_i or else by the on-demand device; a part lost to a preemption is redone there
    training   spotlight: AT THE SAME TIME, and from the rollout on (θ_i is on the devices already: the
               round opens once their parts are out), a round explores P_{i+1} with θ_i through the queue,
               under the planner's budget (the last round's lead before training and the last training
               time), plus a re-score of a few of P_i's candidates with θ_i for the staleness monitor
               (Kendall τ of stale vs fresh rankings); a round drained before training ends gets more
               candidates per prompt, the queue kept ahead of the devices (`ray_top_up`)
    validate   the evaluated weights go to every spot device, and validation's chunks are shared between
               the trainer and them (`spotlight.backends.ray_share`); the next start hands out θ_{i+1}

The pools, the queue, the trace and the bill are `spotlight.runtime.spot.cluster.SpotCluster`'s; this
module decides what they run: which requests a round holds, and how its results become seeds.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from typing import Any

import numpy as np
import ray
import torch

from spotlight.backends.protocol import TrainerView
from spotlight.backends.ray_share import SampleShare, sample_shared
from spotlight.backends.ray_state import (
    Explored,
    PendingMonitor,
    explored_from_state,
    explored_state,
    monitor_from_state,
    monitor_state,
)
from spotlight.backends.ray_top_up import RoundTopUp, candidate_id, keep_complete_top_ups
from spotlight.diffusion.sampler import SamplingPlan, Trajectory
from spotlight.explore.candidates import exploration_sampling, score_latents
from spotlight.explore.planner import Decision, round_budget
from spotlight.loop.evaluation import validation_chunks
from spotlight.loop.rollout import group_requests, rollout_plan
from spotlight.loop.seed_choice import Exploration, select_explored
from spotlight.loop.streams import Stream, candidate_seeds, iteration_generator, iteration_prompts
from spotlight.models.generation import generate, images_of
from spotlight.models.loop_model import LoopModel
from spotlight.modes import Mode
from spotlight.run_error import RunError
from spotlight.runtime.queue.remote import RemoteQueue
from spotlight.runtime.queue.request_queue import Request
from spotlight.runtime.queue.rounds import Round, results_in_order
from spotlight.runtime.spot.cluster import ON_DEMAND, SpotCluster
from spotlight.runtime.spot.device import ComputeClock
from spotlight.runtime.spot.usage import IterationMarks, iteration_usage
from spotlight.runtime.spot.worker import model_from_weights, model_weights, worker_loop

__all__ = ["RayBackend"]


class RayBackend:
    """Sampling on the device pools (see the module docstring); implements `Backend`."""

    def __init__(self, view: TrainerView) -> None:
        config = view.config
        self.view, self.config, self.mode = view, config, config.mode
        torch.set_num_threads(1)  # the on-demand device is one thread, like every device here
        # Validation and checkpoints run between iterations; these clocks tell how much of it was model compute.
        self.eval_clocks = [ComputeClock(model) for model in {id(m): m for m in (view.model, view.eval_model)}.values()]
        self.eval_compute_mark = 0.0
        self.marks = IterationMarks()
        self.explored: Explored | None = None
        self.monitor_round: PendingMonitor | None = None  # rides along in the next round (spotlight)
        self.round_monitor: PendingMonitor | None = None  # the one riding in the open round
        self.round_metrics: dict[str, float] = {}  # the planner's, when no round opened beside training
        self.validations = 0  # each validation's weights go out under a version of their own (< 0)
        self.top_up: RoundTopUp | None = None  # more candidates for the round beside training, while it runs
        self.budget_s = 0.0  # the last training time (the trainer's budget), as choose_seeds was given it
        self.lead_s = 0.0  # the last round's time before training started: it hides behind that too
        self.explore_mark = 0.0  # when this iteration's round opened (or tried to)
        if config.runtime.complete_rounds and view.planner is not None and len(view.planner.arms) != 1:
            raise RunError(f"runtime.complete_rounds needs one planner arm (got {len(view.planner.arms)}): set "
                           "explore.planner's num_candidates and num_steps to one value each")
        self.cluster = SpotCluster(config.runtime, config.mode, view.model, view.run_dir,
                                   core_of=lambda k: config.device_core(k + 1),
                                   control_cores=config.control_plane_cores())

    def start_iteration(self, iteration: int) -> None:
        """Bill validation since the last iteration; hand θ_i to every spot device (and SP group)."""
        cluster, view = self.cluster, self.view
        previous_end = self.marks.ended
        self.marks = IterationMarks(previous_end=previous_end, started=cluster.now())
        compute_mark = sum(clock.seconds for clock in self.eval_clocks)
        if self.marks.started > previous_end:  # validation and checkpointing since the last iteration
            cluster.ledger.busy(ON_DEMAND, previous_end, self.marks.started, "eval",
                                compute_s=min(self.marks.started - previous_end, compute_mark - self.eval_compute_mark))
        weights_ref = ray.put(model_weights(view.model))  # θ_i: one object, every spot device maps it
        with cluster.lock:
            cluster.pool.set_weights(iteration, weights_ref)
        elastic = cluster.elastic
        if elastic is not None:  # a sample must not mix two policies: the groups finish first
            if not cluster.wait(lambda: not elastic.serving, timeout_s=elastic.settings.agent_call_s):
                raise RunError("the SP groups did not stop serving after the last round: a spot node hangs")
            with cluster.lock:
                elastic.set_weights(weights_ref, iteration)
        # ~10 ms: then they help. A device still on the last round's cancelled leases learns of them at its next
        # heartbeat and takes θ_i then: it is worth waiting for, as its rollout part would be sampled here instead.
        settled_by = cluster.now() + 2 * cluster.pool.settings.heartbeat_s
        cluster.wait(lambda: not cluster.pool.devices(state="loading") and (
            not cluster.pool.devices(state="busy") or cluster.now() > settled_by), timeout_s=10.0)

    def choose_seeds(self, iteration: int, prompts: list[str], budget_s: float) -> Exploration:
        """Random seeds, or those of the round that explored P_i (now with θ_i, or during the last training)."""
        config, metrics = self.config, {}
        self.budget_s = budget_s  # the round opened during this rollout hides behind the training it times
        random_seeds = candidate_seeds(config.seed, iteration, len(prompts), config.rollout.group_size)
        if self.mode is Mode.SYNC_EXPLORE:
            metrics.update(self._open_round(iteration, iteration, budget_s))
            waited = self.cluster.now()
            if self.cluster.round is not None:  # None: no plan fits (or no spot device): random seeds
                self._close_round()
            metrics["time/explore_s"] = self.cluster.now() - waited
        explored, self.explored = self.explored, None
        if explored is None or explored.round.target != iteration:
            return Exploration(seeds=random_seeds, metrics=metrics)
        chosen = explored.exploration
        chosen.metrics = {**metrics, **explored.round.plan_metrics, **chosen.metrics}
        chosen.plan = explored.round.plan
        return chosen

    def rollout(self, iteration: int, prompts: list[str], seeds: torch.Tensor) -> Trajectory:
        """Sample the groups on the on-demand device and the idle spot devices holding θ_i, one part each.

        The parts are fixed by the config, not by who is idle: one per device that could help (the
        on-demand device and ``num_spot_devices``), whole groups each. A part no idle device takes is
        sampled here, alone, so every part is the same batch whoever samples it and whenever: a batch of
        other rows changes a row's float bits (the matmuls block differently), and which devices are idle
        when a rollout starts depends on timing, so a run and its resumed copy would drift. A part whose
        device is lost is redone here.
        """
        cluster, plan = self.cluster, rollout_plan(self.config)
        self.marks.rollout_started = cluster.now()
        with cluster.lock:
            spot = cluster.num_spot if cluster.attached is None else max(cluster.num_spot, len(cluster.pool.devices()))
            num_parts = min(len(prompts), 1 + spot) if self.mode.rents_spot else 1  # attached: the nodes it has
            parts = np.array_split(np.arange(len(prompts)), num_parts)
            requests = [group_requests([prompts[p] for p in part], seeds[part]) for part in parts]
            helpers = cluster.pool.devices(version=iteration, state="idle") if num_parts > 1 else []
            helpers = helpers[:num_parts - 1]
            for device, (part_prompts, part_seeds) in zip(helpers, requests[1:], strict=False):
                cluster.pool.call(device, "rollout", "sample", part_prompts, part_seeds, plan, iteration)
        early = self.mode is Mode.SPOTLIGHT and self._planner_knows_cost()
        if early:  # the devices explore once their parts are in, while the trainer samples its own
            self._explore_next(iteration)
        started = cluster.now()
        trajectories: dict[int, Trajectory | None] = {0: self._sample_here(requests[0])}
        if self.view.planner is not None:  # a measured cost for the first round (then ignored)
            self.view.planner.observe_prior((cluster.now() - started) / (len(requests[0][0]) * plan.num_steps))
        for k in range(1 + len(helpers), num_parts):  # the parts no device was idle for
            trajectories[k] = self._sample_here(requests[k])
        index = {device: k + 1 for k, device in enumerate(helpers)}

        def collected() -> bool:
            for result in [r for r in cluster.finished if r.phase == "rollout"]:
                cluster.finished.remove(result)
                trajectories[index[result.device_id]] = (None if result.call is None or result.call.result is None
                                                         else Trajectory(*result.call.result, start_step=0))
            return len(trajectories) == num_parts

        cluster.wait(collected)
        for k, trajectory in trajectories.items():
            if trajectory is None:  # its device was preempted (or held other weights): redo the part here
                trajectories[k] = self._sample_here(requests[k])
        ordered = [trajectories[k] for k in range(num_parts)]
        self.marks.rollout_ended = cluster.now()  # sampled; scoring is billed to the rollout too
        if self.mode is Mode.SPOTLIGHT and not early:  # the first round: sized by the trainer's sampling cost
            self._explore_next(iteration)
        return Trajectory(torch.cat([t.latents for t in ordered]), torch.cat([t.log_probs for t in ordered]), 0)

    def training_started(self, iteration: int, budget_s: float) -> None:
        """Bill the scoring (the round beside training opened during the rollout, `_explore_next`)."""
        cluster = self.cluster
        scored_at = cluster.now()
        cluster.ledger.busy(ON_DEMAND, self.marks.rollout_ended, scored_at, "rollout")
        self.lead_s = scored_at - self.explore_mark
        self.marks.rollout_ended = scored_at

    def _planner_knows_cost(self) -> bool:
        """Whether the planner can size a round without the trainer's sampling time of this rollout."""
        planner = self.view.planner
        return planner is not None and math.isfinite(planner.cost_per_candidate_step(planner.arms[0]))

    def _explore_next(self, iteration: int) -> None:
        """Spotlight: open the round exploring P_{i+1} with θ_i during the rollout, not at training start.

        θ_i is on the devices already, so they explore while the trainer samples its part of the rollout
        (once the planner knows the cost; the first round waits for the trainer's sampling to size it) and
        scores it, then while it trains: opened at training start, the devices waited all that out. The
        planner's budget is what the round hides behind: the last round's lead before training, and the last
        training time. It chooses before it has seen this rollout's reward variance, which it learns one
        round later than at training start. An open round is topped up until training ends; if no device was
        up, the round opens when one comes up (`_open_late`).
        """
        cluster = self.cluster
        self.round_metrics = {}
        self.explore_mark = cluster.now()
        if iteration + 1 >= self.config.iterations:
            return
        budget_s = self.budget_s + self.lead_s
        self.round_metrics = self._open_round(iteration + 1, iteration, budget_s)
        with cluster.lock:
            if cluster.elastic is not None or self.config.runtime.complete_rounds:
                return
            if cluster.round is not None:  # the devices keep exploring P_{i+1} until training ends
                cluster.feed = self.top_up.feed
            elif self.round_metrics.get("planner/spot_devices") == 0:  # none was up: open it when one is
                opened_at = cluster.now()
                cluster.feed = lambda: self._open_late(iteration, budget_s - (cluster.now() - opened_at))

    def _open_late(self, iteration: int, budget_s: float) -> None:
        """Controller thread, under the cluster lock: a spot device holding θ_i came up while θ_i trains and no
        round is open (none was up when training started): open the round exploring P_{i+1} now, sized to what
        is left of the budget, and top it up from then on. One try: if nothing fits, the devices wait."""
        cluster = self.cluster
        if not cluster.pool.devices(version=iteration, state="idle"):
            return
        cluster.feed = None
        if budget_s <= 0:
            return
        self.round_metrics = {**self._open_round(iteration + 1, iteration, budget_s), "explore/opened_late": 1.0}
        if cluster.round is not None:
            cluster.feed = self.top_up.feed

    def training_ended(self, iteration: int) -> dict[str, float]:
        """Bill the training; in spotlight mode, wait for the round; this iteration's usage and cost."""
        cluster, marks = self.cluster, self.marks
        marks.train_ended = cluster.now()
        cluster.ledger.busy(ON_DEMAND, marks.rollout_ended, marks.train_ended, "train",
                            compute_s=marks.train_ended - marks.rollout_ended)
        topped_up = False
        with cluster.lock:  # no late round, no block after the update; the planned candidates were done before
            cluster.feed = None  # the first block
            if self.top_up is not None:
                self.top_up.open = False
                topped_up = self.top_up.blocks > 0
        if self.mode is Mode.SPOTLIGHT and cluster.round is not None:
            self._close_round(wait=not topped_up)
        self.top_up = None
        marks.ended = cluster.now()
        self.eval_compute_mark = sum(clock.seconds for clock in self.eval_clocks)
        with cluster.lock:
            explorers = cluster.explorers()
        return {**self.round_metrics, **iteration_usage(cluster.ledger, cluster.events, marks, explorers)}

    def validation_samples(self, model: LoopModel, prompts: list[str], seeds: list[int],
                           plan: SamplingPlan) -> torch.Tensor:
        """Validation's final latents, its chunks shared between the trainer and the spot devices.

        The evaluated weights go to every spot device under a version of their own, negative so it is
        never an iteration's (the next `start_iteration` hands out θ_{i+1} again). The trainer samples
        chunks from the front while the controller thread feeds the devices chunks from the back
        (`SampleShare`); a chunk a device lost comes back to the trainer. Each chunk is a pure
        function of (weights, its rows, plan), so the latents are the same bits however they were shared.
        """
        cluster = self.cluster
        self.validations += 1
        version = -1 - self.validations  # -1 is a device's before it holds any weights
        chunks = [(prompts[rows], seeds[rows]) for rows in validation_chunks(len(prompts))]
        with cluster.lock:
            helpers = self.mode.rents_spot and bool(cluster.pool.devices())
        if not helpers or len(chunks) < 2:
            return torch.cat([generate(model, *chunk, plan, record=False).final for chunk in chunks])
        weights_ref = ray.put(model_weights(model))
        with cluster.lock:
            cluster.pool.set_weights(version, weights_ref)
            share = SampleShare(cluster.pool, cluster.finished, version, plan, chunks, "eval", False)

        def here(chunk: tuple[list[str], list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
            trajectory = generate(model, *chunk, plan, record=False)
            return trajectory.latents, trajectory.log_probs

        latents = torch.cat([latents[:, -1] for latents, _ in sample_shared(cluster, share, here)])
        cluster.events.write(cluster.now(), "validation_shared", chunks=len(chunks), on_spot=share.on_devices,
                             returned=share.returned)
        return latents

    def close(self) -> None:
        self.cluster.close()

    def state_dict(self) -> dict[str, Any]:
        """What the next iteration needs of this backend, as JSON, for the trainer's checkpoint (spotlight mode).

        At a checkpoint no round is open (it closed when training ended); what is in flight is its
        outcome: the seeds it chose for the next iteration, and the prompts the staleness monitor
        re-scores in the next round. Both come from requests done with θ_i, which a resumed run no
        longer has, so they are kept rather than requested again; nothing is ever explored twice.
        The queue's write-ahead log is compacted now too (`DurableQueue.compact`; ``runtime.compact_queue_log``):
        with no round open it shrinks to the counters, so it stays bounded by the work in flight however long the run.
        """
        if self.config.runtime.compact_queue_log:
            ray.get(self.cluster.queue.compact.remote())
        return {"explored": None if self.explored is None else explored_state(self.explored),
                "monitor": None if self.monitor_round is None else monitor_state(self.monitor_round)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back what `state_dict` wrote (a resumed run; {} from a checkpoint without it: nothing in flight)."""
        explored, monitor = state.get("explored"), state.get("monitor")
        self.explored = None if explored is None else explored_from_state(explored)
        self.monitor_round = None if monitor is None else monitor_from_state(monitor)

    def _sample_here(self, request: tuple[list[str], list[int]]) -> Trajectory:
        """Sample a part on the on-demand device (the driver), billed as rollout compute."""
        started = self.cluster.now()
        trajectory = generate(self.view.model, *request, rollout_plan(self.config))
        ended = self.cluster.now()
        self.cluster.ledger.busy(ON_DEMAND, started, ended, "rollout", compute_s=ended - started)
        return trajectory

    # -- exploration rounds -------------------------------------------------------------------------
    def _open_round(self, target: int, version: int, budget_s: float) -> dict[str, float]:
        """Queue the candidates of ``target``'s prompts for the devices holding θ_version, as the planner says.

        Returns the planner's metrics when nothing fits (no round opens), else {} (they come with the seeds).
        """
        config, view, cluster = self.config, self.view, self.cluster
        prompts = iteration_prompts(view.train_prompts, config.seed, target, config.rollout.prompts_per_iteration)
        with cluster.lock:
            devices = cluster.ready_explorers()
        monitor = self.monitor_round if self.mode is Mode.SPOTLIGHT else None
        budget = round_budget(view.planner, budget_s, devices,
                              None if monitor is None else (monitor.plan, len(monitor.prompts)))
        if config.runtime.complete_rounds:  # the one arm, whatever is up now: the round runs whole anyway
            decision = Decision(view.planner.arms[0], math.nan, (view.planner.arms[0],), {})
        else:
            decision = view.planner.choose(budget, num_devices=devices, num_prompts=len(prompts))
        plan_metrics = {"planner/budget_s": budget_s, "planner/predicted_s": decision.predicted_time_s,
                        "planner/feasible_arms": float(len(decision.feasible_arms)), "planner/spot_devices": devices,
                        "planner/round_budget_s": budget,
                        "planner/unfaithful_depths": float(len(decision.unfaithful_steps))}
        if decision.plan is None:
            self.monitor_round = None
            return plan_metrics
        plan = decision.plan
        plan_metrics.update({"planner/num_candidates": float(plan.num_candidates),
                             "planner/num_steps": float(plan.num_steps)})
        # candidate_seeds' stream, kept drawing for the candidates a top-up adds (ray_top_up)
        seed_stream = iteration_generator(config.seed, target, Stream.SEEDS)
        candidates = torch.randint(0, 2**62, (len(prompts), plan.num_candidates), generator=seed_stream)
        rollout_sampling = rollout_plan(config)
        sampling = exploration_sampling(plan, rollout_sampling)
        requests = [Request(candidate_id(target, p, c), prompt, int(candidates[p, c]), sampling,
                            weights_version=version)
                    for p, prompt in enumerate(prompts) for c in range(plan.num_candidates)]
        own_ids = [r.request_id for r in requests]
        if monitor is not None:
            monitor_sampling = exploration_sampling(monitor.plan, rollout_sampling)
            monitor.ids = [f"m{monitor.target}-{p}-{c}" for p in range(len(monitor.prompts))
                           for c in range(monitor.candidates.shape[1])]
            requests += [Request(rid, monitor.prompts[p], int(monitor.candidates[p, c]), monitor_sampling,
                                 weights_version=version)
                         for rid, (p, c) in zip(monitor.ids, np.ndindex(*monitor.candidates.shape), strict=True)]
        ray.get(cluster.queue.submit.remote(requests))
        round_ = Round(target, version, plan, prompts, candidates, own_ids,
                       extra_ids=[] if monitor is None else monitor.ids,
                       extra_steps=0 if monitor is None else monitor.plan.num_steps,
                       opened_at=cluster.now(), plan_metrics=plan_metrics)
        self.round_monitor = monitor
        # the trainer scores every candidate after the update: no more than the planner's largest arm would have
        limit = max(arm.num_candidates for arm in view.planner.arms)
        self.top_up = RoundTopUp.sized(lambda more: ray.get(cluster.queue.submit.remote(more)),
                                       lambda: ray.get(cluster.queue.remaining.remote(version)), round_, seed_stream,
                                       sampling, config.runtime.forward_batch, limit,
                                       held=max(1, devices) * config.runtime.worker_capacity)
        with cluster.lock:
            cluster.round = round_
        return {}

    def _close_round(self, wait: bool = True) -> None:
        """Wait for the open round (cancelling what is left after runtime.explore_wait_s), score and select.

        ``wait`` False: a topped-up round, whose own requests are done; what is left of its blocks is
        cancelled at once (`keep_complete_top_ups` drops the unfinished ones).
        """
        config, view, cluster = self.config, self.view, self.cluster
        round_, monitor = cluster.round, self.round_monitor
        if config.runtime.complete_rounds:  # nothing of the round is left once this returns
            self._serve_round_here(round_.version)
            with cluster.lock:
                round_.drained = True
        drained = cluster.wait(lambda: round_.drained, config.runtime.explore_wait_s if wait else 0.0)
        closed_at = cluster.now()
        with cluster.lock:
            cluster.round = None
        planned = round_.plan.num_candidates
        if not drained or round_.candidates.shape[1] > planned:  # a top-up's blocks may still be queued
            ray.get(cluster.queue.cancel.remote(round_.all_ids))
        results = ray.get(cluster.queue.results_of.remote(round_.all_ids))  # then freed: a lost answer loses nothing
        cluster.queue.forget.remote(round_.all_ids)
        keep_complete_top_ups(round_, results)
        latents = results_in_order(results, round_.ids, view.model.latent_shape)
        rewards = score_latents(latents, round_.prompts, view.reward, lambda z: images_of(view.model, z))
        missing = torch.tensor([rid not in results for rid in round_.ids]).reshape(rewards.shape)
        rewards[missing] = math.nan
        exploration = select_explored(rewards, round_.candidates, config,
                                      iteration_generator(config.seed, round_.target, Stream.SELECTION))
        trips = round_.pull_trips_s
        exploration.metrics.update({
            "explore/missed_fraction": float(missing.float().mean()),
            "queue/pull_round_trip_ms": 1e3 * float(np.mean(trips)) if trips else math.nan,
            "queue/pulls": float(len(trips)),
        })
        if trips:
            cluster.events.write(cluster.now(), "pull_round_trip", mean_s=float(np.mean(trips)), pulls=len(trips))
        finished = int((~missing).sum())
        device_s, share, scored = round_.device_s, round_.own_share(), rewards.numel()
        if self.top_up is not None and self.top_up.blocks:  # the planned part's: the blocks' calls did not end
            device_s, share, scored = self.top_up.planned_device_s, self.top_up.planned_share, planned * len(rewards)
        if device_s > 0 and not missing.any():
            view.planner.observe_cost(round_.plan, device_s * share, scored, round_.plan.num_steps)
        elif finished and not config.runtime.complete_rounds:
            # Cut at the wait: the planned devices' time over the finished candidates bounds the cost from
            # above (unfinished ones used some of it), so the next round is sized smaller, not calibrated again.
            devices = max(1.0, round_.plan_metrics.get("planner/spot_devices", 1.0))
            view.planner.observe_cost(round_.plan, (closed_at - round_.opened_at) * devices * round_.own_share(),
                                      finished, round_.plan.num_steps)
        if monitor is not None:
            exploration.metrics.update(self._staleness(monitor, results))
        exploration.metrics["explore/extra_candidates"] = float(round_.candidates.shape[1] - round_.plan.num_candidates)
        self.explored = Explored(round_, exploration)
        if self.mode is Mode.SPOTLIGHT:
            m = config.explore.monitored_prompts(round_.target, len(round_.prompts))  # re-scored next round
            n = round_.plan.num_candidates  # the planned candidates: a top-up's are not re-scored
            stale_seeds = exploration.seeds[:m] if round_.candidates.shape[1] == n else select_explored(
                rewards[:m, :n], round_.candidates[:m, :n], config,
                iteration_generator(config.seed, round_.target, Stream.SELECTION)).seeds
            self.monitor_round = None if m == 0 else PendingMonitor(
                round_.target, round_.plan, round_.prompts[:m], round_.candidates[:m, :n], rewards[:m, :n],
                stale_seeds, ids=[])

    def _serve_round_here(self, version: int) -> None:
        """The on-demand device serves the open round's requests for θ_version until none is left.

        It pulls through the queue beside the spot devices, with their worker loop and forward batch,
        so a request's result is the same bits whichever device ran it, and a request a lost spot
        device still leases comes back to it when the lease expires.
        """
        cluster = self.cluster
        with cluster.lock:
            weights = cluster.pool.weights
        if weights is None or weights[0] != version:
            raise RunError(f"exploration round for weights version {version} outlived them: a bug, please report it")
        model = model_from_weights(self.view.model.config, ray.get(weights[1]))
        settings = dataclasses.replace(cluster.pool.settings, min_step_s=0.0)  # spot devices' batching, CPU speed
        started = cluster.now()
        report = worker_loop(RemoteQueue(cluster.queue), ON_DEMAND, model, settings, threading.Event(), version)
        ended = cluster.now()
        cluster.ledger.busy(ON_DEMAND, started, ended, "explore", compute_s=ended - started)
        cluster.events.write(ended, "round_served_on_demand", version=version, completed=report.completed)

    def _staleness(self, monitor: PendingMonitor, results: dict[str, torch.Tensor]) -> dict[str, float]:
        """Kendall τ of the monitor prompts' candidate rankings under θ_{i-1} (stale) and θ_i (fresh)."""
        if any(rid not in results for rid in monitor.ids):
            return {}
        config, view = self.config, self.view
        latents = results_in_order(results, monitor.ids, view.model.latent_shape)
        fresh_rewards = score_latents(latents, monitor.prompts, view.reward, lambda z: images_of(view.model, z))
        fresh = select_explored(fresh_rewards, monitor.candidates, config,
                                iteration_generator(config.seed, monitor.target, Stream.SELECTION))
        entry = view.monitor.record(monitor.target, monitor.stale_rewards, fresh_rewards, monitor.stale_seeds,
                                    fresh.seeds)
        return {"staleness/kendall_tau": entry.tau, "staleness/selection_overlap": entry.overlap,
                "staleness/iteration": float(monitor.target + 1)}
