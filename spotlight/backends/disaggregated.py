"""The disaggregated backend (mode disaggregated, the DigenRL design): generators apart from the trainer.

    devices     the trainer is the driver, on the first core of ``device_cores`` (one thread); each of
                ``disagg.generators`` generator devices is a Ray actor pinned to the next core
                (`spotlight.disagg.runtime.generator_actor`), which also scores its samples
    weights     θ_s is put in the object store once per step and published to the unit queue
                (`spotlight.disagg.runtime.queue`); a generator loads it between tasks
    rollout     step s's batch is cut into units along the generation axis; generators PULL units
                (newest weights the version gate allows) and push scored samples back; the trainer
                assembles groups out of order (`GroupAssembler`) and the loop's update trains each
                complete group as `rollout_stream` yields it (GAP), or all of them in prompt order
                once the batch is in (gap off)
    TAG / BTS   when the trainer has no group to train and units are still unstarted, the bubble
                policy decides from profiled timings how many it draws itself (`trainer_assisted_fragment`:
                training state offloaded and restored, θ_s, same scoring and assembly)
    async       step s+1's units are queued with step s's: a generator that runs out of step s's units
                starts them with θ_s while the trainer still trains step s (at most one version stale)
    explore     (no async) step s+1's prompts are queued as exploration tasks behind step s's units: a
                generator with nothing else to do ranks their candidate seeds with θ_s (stale-seed
                exploration); at step s+1 the explored prompts keep their G most varied seeds

Every sample is logged to run_dir/disagg_samples.jsonl (step, id, version, per-step versions, which
device drew it, reward) so tests and readers can check the staleness bound from the run itself; the
update checks it too (`spotlight.disagg.loop_update`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from typing import Any

import ray
import torch

from spotlight.backends.disaggregated_stream import GroupStream
from spotlight.backends.protocol import TrainerView
from spotlight.components.manifest import write_text_durably
from spotlight.diffusion.sampler import Trajectory
from spotlight.disagg.assisted import trainer_assisted_fragment
from spotlight.disagg.bubble import BubblePolicy, BubbleTimings, QueueState
from spotlight.disagg.groups import AssembledGroup, GroupAssembler
from spotlight.disagg.runtime.generator_actor import GeneratorDevice, unit_scorer, with_strict
from spotlight.disagg.runtime.queue import Task, UnitQueue
from spotlight.disagg.samples import ScoredSample, cut_generation_units
from spotlight.disagg.versions import VersionGate
from spotlight.explore.candidates import exploration_sampling
from spotlight.explore.planner import ExplorePlan
from spotlight.loop.rollout import group_metrics, rollout_plan
from spotlight.loop.seed_choice import Exploration, select_explored
from spotlight.loop.streams import Stream, candidate_seeds, iteration_generator, iteration_prompts
from spotlight.models.generation import prompt_tokens
from spotlight.run_error import RunError
from spotlight.runtime.spot.pools import LocalCluster
from spotlight.runtime.spot.worker import model_weights

__all__ = ["DisaggregatedBackend"]

START_TIMEOUT_S = 120.0

# The queue and generator actors a lent cluster keeps between runs (a benchmark's ladder, a test module's runs),
# by (the cluster's head node id, actor name, core): the next run on that cluster reopens them instead of
# starting processes that import torch and the policy's libraries again, ~5 s of wall and CPU per run here.
# An actor is kept only after its run closed cleanly, and a dead one is replaced.
_IDLE_ACTORS: dict[tuple[str, str, int | None], Any] = {}


class DisaggregatedBackend:
    """Generators and a unit queue on a local Ray cluster (see the module docstring)."""

    def __init__(self, view: TrainerView) -> None:
        config = view.config
        self.view, self.config, self.section = view, config, config.disagg
        self.gate = VersionGate(self.section.async_one_step)
        self.plan = rollout_plan(config)
        self.units = cut_generation_units(config.rollout.prompts_per_iteration, config.rollout.group_size,
                                          self.section.unit_size)
        self.submitted: set[int] = set()  # steps whose units are queued
        self.ahead: list[dict[str, Any]] = []  # results of a later step that arrived early (async)
        # step → the update's conditioning rows, made here: a pipeline policy's prompt ids index this
        # process's embedding cache (a generator's ids were encoded in the generator's), and nft's ask for
        # the CFG-free velocity; a TinyDiT's are the generators' token ids again
        self.update_tokens: dict[int, torch.Tensor] = {}
        self.explored: dict[int, dict[int, torch.Tensor]] = {}  # step → prompt → candidate rewards
        self.profile = {"generator": [], "trainer": [], "train": []}  # seconds per unit
        self.usage: dict[str, float] = {}
        self.log = (view.run_dir / "disagg_samples.jsonl").open("a")
        # A driver already connected to Ray (a benchmark running a ladder of runs) lends its cluster.
        self.cluster = None if ray.is_initialized() else LocalCluster()
        self.lender = ray.get_runtime_context().get_node_id() if self.cluster is None else None
        self.closed, self.clean = False, False
        for key in [key for key in _IDLE_ACTORS if key[0] != self.lender]:  # a lent cluster that has ended
            del _IDLE_ACTORS[key]
        self.cores = [config.device_core(k + 1) for k in range(self.section.generators)]
        try:
            queue_actor = ray.remote(UnitQueue).options(num_cpus=0, max_concurrency=16)
            self.queue = self._actor("queue", None, lambda queue: queue.reopen.remote(self.gate),
                                     lambda: queue_actor.remote(self.gate))
            generator_actor = ray.remote(GeneratorDevice).options(num_cpus=0)
            self.generators = [self._actor(
                f"generator-{k}", core, lambda g, k=k: g.configure.remote(f"generator-{k}", view.model.config,
                                                                          view.reward),
                lambda k=k, core=core: generator_actor.remote(f"generator-{k}", core, view.model.config, view.reward))
                for k, core in enumerate(self.cores)]
            ray.get([g.ready.remote() for g in self.generators], timeout=START_TIMEOUT_S)
            self.serving = [g.serve.remote(self.queue) for g in self.generators]
        except BaseException:
            self._release()
            raise
        self.iteration_started = time.time()
        self.step = -1  # the step in progress (or last done)

    def _actor(self, name: str, core: int | None, reopen: Any, start: Any) -> Any:
        """The lent cluster's idle actor ``name`` on ``core``, reopened for this run (``reopen(actor)``: the
        call's ref), or a new one (``start()``)."""
        actor = _IDLE_ACTORS.pop((self.lender, name, core), None) if self.lender is not None else None
        if actor is not None:
            try:
                ray.get(reopen(actor), timeout=START_TIMEOUT_S)
                return actor
            except ray.exceptions.RayError:  # it died (its node went, say): start another
                ray.kill(actor)
        return start()

    # -- the Backend protocol ---------------------------------------------------------------------
    def start_iteration(self, iteration: int) -> None:
        """θ_s to the object store once, published to the queue: generators load it between tasks."""
        self.iteration_started = time.time()
        self.step = iteration
        self.usage = {"trainer_busy_s": 0.0, "tag_units": 0.0, "wait_s": 0.0}
        ref = ray.put(model_weights(self.view.model))
        ray.get(self.queue.publish.remote(iteration, [ref]))

    def choose_seeds(self, iteration: int, prompts: list[str], budget_s: float) -> Exploration:
        """Random seeds; with ``disagg.explore``, the G most varied of the candidates explored with θ_{s-1}."""
        config = self.config
        seeds = candidate_seeds(config.seed, iteration, len(prompts), config.rollout.group_size)
        if not self.section.explore:
            return Exploration(seeds=seeds)
        ray.get(self.queue.cancel_explore.remote(iteration))
        self._drain(0.0, iteration)
        explored = self.explored.pop(iteration, {})
        metrics = {"explore/explored_prompts": len(explored) / len(prompts)}
        if not explored:
            return Exploration(seeds=seeds, metrics=metrics)
        candidates = candidate_seeds(config.seed, iteration, len(prompts), self.section.explore_candidates)
        rows = sorted(explored)
        chosen = select_explored(torch.stack([explored[p] for p in rows]), candidates[rows], config,
                                 iteration_generator(config.seed, iteration, Stream.SELECTION))
        seeds[rows] = chosen.seeds
        return Exploration(seeds=seeds, metrics={**metrics, **chosen.metrics})

    def rollout(self, iteration: int, prompts: list[str], seeds: torch.Tensor) -> Trajectory:
        raise RunError("mode disaggregated streams groups to the update: the loop calls rollout_stream")

    def rollout_stream(self, iteration: int, prompts: list[str], seeds: torch.Tensor,
                       optimizer: torch.optim.Optimizer) -> GroupStream:
        """Queue step s's units (and s+1's units with async, or s+1's exploration); the groups as they complete."""
        self._submit(iteration, prompts, seeds)
        following = iteration + 1
        if following < self.config.iterations:
            next_prompts = iteration_prompts(self.view.train_prompts, self.config.seed, following, len(prompts))
            if self.section.async_one_step:  # random seeds: what choose_seeds returns for s+1
                self._submit(following, next_prompts, candidate_seeds(
                    self.config.seed, following, len(prompts), self.config.rollout.group_size))
            elif self.section.explore:
                self._submit_exploration(following, next_prompts)
        return GroupStream(self.groups, iteration, prompts, seeds, optimizer)

    def training_started(self, iteration: int, budget_s: float) -> None:
        """Training started with the rollout (GAP): nothing to start here."""

    def training_ended(self, iteration: int) -> dict[str, float]:
        """Device time of the step: trainer and generators busy, over the step's wall time."""
        wall = time.time() - self.iteration_started
        usage = self.usage
        generator_busy = usage.get("generator_busy_s", 0.0)
        return {"time/step_s": wall, "time/wait_s": usage["wait_s"], "disagg/tag_units": usage["tag_units"],
                "usage/trainer": usage["trainer_busy_s"] / wall,
                "usage/generators": generator_busy / (wall * len(self.generators)),
                "disagg/explore_s": usage.get("explore_s", 0.0)}

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs of this backend, as JSON, for the trainer's checkpoint after step s.

        ``steps_done``: s + 1, so a resumed run cuts disagg_samples.jsonl back to the steps its checkpoint
        holds (the steps it redoes are logged once). ``explored``: the candidate rewards of step s+1's prompts
        that generators ranked with θ_s in their idle time (``disagg.explore``); a resumed run no longer has
        θ_s, so they are kept, not explored again. Units of step s+1 already drawn with θ_s
        (``disagg.async_one_step``) are not kept: the resumed run draws them again with θ_{s+1}, within the
        same staleness bound.
        """
        explored = {str(step): {str(p): rewards.tolist() for p, rewards in prompts.items()}
                    for step, prompts in self.explored.items()}
        return {"steps_done": self.step + 1, "explored": explored}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back what `state_dict` wrote (a resumed run) and cut the sample log back to the checkpoint."""
        self.explored = {int(step): {int(p): torch.tensor(rewards) for p, rewards in prompts.items()}
                         for step, prompts in (state.get("explored") or {}).items()}
        steps_done = state.get("steps_done")
        if steps_done is not None:
            self._truncate_log(int(steps_done))

    def _truncate_log(self, steps_done: int) -> None:
        """Keep disagg_samples.jsonl's records of the steps before ``steps_done`` (a torn last line goes too)."""
        path = self.view.run_dir / "disagg_samples.jsonl"
        self.log.close()
        kept = []
        for line in path.read_text().splitlines():
            try:
                if json.loads(line)["step"] < steps_done:
                    kept.append(line + "\n")
            except (json.JSONDecodeError, KeyError):  # the line a kill tore
                continue
        write_text_durably(path, "".join(kept))
        self.log = path.open("a")

    def close(self) -> None:
        """Stop the generators (they finish their task), then the cluster; safe to call twice."""
        if self.closed:
            return
        self.closed = True
        try:
            ray.get(self.queue.close.remote())
            ray.get(self.serving, timeout=60)
            self.clean = True
        finally:
            self._release()

    def _release(self) -> None:
        self.log.close()
        if self.cluster is not None:
            self.cluster.shutdown()
            return
        # a lent cluster stays up: this run's actors wait for the next run on it (after a clean close) or go
        generators = getattr(self, "generators", [])  # none if the start failed
        named = [("queue", None, getattr(self, "queue", None)),
                 *((f"generator-{k}", self.cores[k], g) for k, g in enumerate(generators))]
        for name, core, actor in named:
            if actor is None:
                continue
            if self.clean:
                _IDLE_ACTORS[(self.lender, name, core)] = actor
            else:
                ray.kill(actor)

    # -- the step's groups -----------------------------------------------------------------------
    def groups(self, stream: GroupStream) -> Iterator[AssembledGroup]:
        """Yield step s's complete groups: as they complete (GAP), or in prompt order once all are in."""
        config, step = self.config, stream.step
        assembler = GroupAssembler(len(stream.prompts), config.rollout.group_size, config.train.adv_std,
                                   config.train.adv_clip)
        self.update_tokens = {step: prompt_tokens(self.view.model, stream.prompts,
                                                  guided=config.train.algorithm != "nft")}
        ready: list[AssembledGroup] = []
        released: list[AssembledGroup] = []
        early, self.ahead = [r for r in self.ahead if r["step"] == step], [r for r in self.ahead if r["step"] != step]
        self._take_results(early, step, stream, assembler, ready)
        while not assembler.done:
            if ready and self.section.gap:
                group = ready.pop(0)
                released.append(group)
                started = time.perf_counter()
                yield group  # the loop's update trains it now
                self._trained(time.perf_counter() - started, group)
                continue
            state = self._drain(0.0, step, stream, assembler, ready)
            if ready and self.section.gap:
                continue
            if self.section.tag and self._assist(step, stream, assembler, ready, state):
                continue
            waited = time.perf_counter()
            self._drain(0.5, step, stream, assembler, ready)
            self.usage["wait_s"] += time.perf_counter() - waited
            self._check_generators()
        for group in sorted(ready, key=lambda g: g.prompt_index):  # gap off: the whole batch, in prompt order
            released.append(group)
            started = time.perf_counter()
            yield group
            self._trained(time.perf_counter() - started, group)
        stream.metrics = group_metrics(released)
        self._log(step, stream.samples)

    def _check_generators(self) -> None:
        """A generator whose serve loop ended before the queue closed has failed: say so rather than wait forever."""
        ended, _ = ray.wait(self.serving, num_returns=len(self.serving), timeout=0)
        for ref in ended:
            try:
                ray.get(ref)
            except ray.exceptions.RayError as error:
                raise RunError(f"a generator device failed ({str(error).splitlines()[0]}): see the run's Ray logs; "
                               "rerun, or check the policy and reward load in a fresh process") from error
            raise RunError("a generator device stopped serving before the run ended: rerun")

    def _trained(self, seconds: float, group: AssembledGroup) -> None:
        self.usage["trainer_busy_s"] += seconds
        units_per_group = self.config.rollout.group_size / self.section.unit_size
        self.profile["train"].append(seconds / units_per_group)

    def _drain(self, timeout_s: float, step: int, stream: GroupStream | None = None,
               assembler: GroupAssembler | None = None, ready: list | None = None) -> dict[str, Any]:
        """Take the queue's results (waiting up to ``timeout_s``): this step's samples go to the assembler,
        a later step's wait in ``ahead``, exploration rewards are kept for their step."""
        state = ray.get(self.queue.results.remote(timeout_s))
        for result in state["results"]:
            self._account(result)
        mine = []
        for result in state["results"]:
            if result["kind"] == "explore":
                self.explored.setdefault(result["step"], {})[result["prompt_index"]] = result["rewards"]
            elif result["step"] == step and stream is not None:
                mine.append(result)
            else:
                self.ahead.append(result)
        if stream is not None:
            self._take_results(mine, step, stream, assembler, ready)
        return state

    def _account(self, result: dict[str, Any]) -> None:
        """Generator busy time inside this iteration; the unit time profile BTS reads."""
        busy = max(0.0, result["ended"] - max(result["started"], self.iteration_started))
        self.usage["generator_busy_s"] = self.usage.get("generator_busy_s", 0.0) + busy
        if result["kind"] == "rollout":
            self.profile["generator"].append(result["seconds"])
        else:
            self.usage["explore_s"] = self.usage.get("explore_s", 0.0) + result["seconds"]

    def _take_results(self, results: list[dict[str, Any]], step: int, stream: GroupStream,
                      assembler: GroupAssembler, ready: list[AssembledGroup]) -> None:
        tokens = self.update_tokens.get(step)
        for result in results:
            for sample in result["samples"]:
                if tokens is not None:
                    sample = dataclasses.replace(sample, tokens=tokens[sample.id.prompt_index])
                stream.samples.append(sample)
                ready.extend(assembler.add(sample))

    # -- TAG / BTS -------------------------------------------------------------------------------
    def _assist(self, step: int, stream: GroupStream, assembler: GroupAssembler, ready: list[AssembledGroup],
                state: dict[str, Any]) -> bool:
        """In a bubble: draw as many unstarted units on the trainer as BTS says pay (≥ tag_min_fragments)."""
        left = state["unstarted"].get(step, 0)
        if left == 0:
            return False
        count = max(self._bubble_fragments(left, state), self.section.tag_min_fragments)
        if count == 0:
            return False
        tasks = ray.get(self.queue.take.remote(step, count))
        if not tasks:
            return False
        started = time.perf_counter()
        samples = []
        for task in tasks:  # θ_s mid-batch; training state offloaded and restored around each unit
            payload = task.payload
            score, strict = unit_scorer(self.view.reward, payload["prompts"], self.view.model)
            with torch.no_grad():
                drawn = trainer_assisted_fragment(
                    self.view.model, stream.optimizer, step, step, self.gate, payload["members"],
                    prompt_tokens(self.view.model, payload["prompts"]), payload["seeds"], payload["plan"], score)
            samples.extend(with_strict(drawn, strict))
        seconds = time.perf_counter() - started
        self.profile["trainer"].append(seconds / len(tasks))
        self.usage["trainer_busy_s"] += seconds
        self.usage["tag_units"] += len(tasks)
        self._take_results([{"samples": samples}], step, stream, assembler, ready)
        return True

    def _bubble_fragments(self, left: int, state: dict[str, Any]) -> int:
        """BTS on the profiled timings (0 until a unit has been generated and one trained)."""
        profile = self.profile
        if not profile["generator"] or not profile["train"]:
            return 0
        generator_s = sum(profile["generator"][-8:]) / len(profile["generator"][-8:])
        trainer_s = sum(profile["trainer"][-8:]) / len(profile["trainer"][-8:]) if profile["trainer"] else generator_s
        train_s = max(sum(profile["train"][-8:]) / len(profile["train"][-8:]), 1e-6)
        timings = BubbleTimings(generator_s, trainer_s, train_s, 0.0)  # offload/restore is in trainer_s
        busy = [max(0.0, started + generator_s - state["now"]) for started in state["busy_since"].values()]
        free = tuple(busy + [0.0] * (len(self.generators) - len(busy)))
        policy = BubblePolicy(timings, max_fragments=self.section.tag_max_fragments,
                              min_gain_fraction=self.section.tag_min_gain)
        return policy.fragments_for_trainer(QueueState(left, free))

    # -- queueing --------------------------------------------------------------------------------
    def _submit(self, step: int, prompts: list[str], seeds: torch.Tensor) -> None:
        if step in self.submitted:
            return
        self.submitted.add(step)
        payload = {"prompts": prompts, "seeds": seeds, "plan": self.plan}
        tasks = [Task("rollout", step, unit.index, {**payload, "members": list(unit.members)}) for unit in self.units]
        ray.get(self.queue.submit.remote(tasks))

    def _submit_exploration(self, step: int, prompts: list[str]) -> None:
        section = self.section
        candidates = candidate_seeds(self.config.seed, step, len(prompts), section.explore_candidates)
        plan = exploration_sampling(ExplorePlan(section.explore_candidates, section.explore_steps, "sde"), self.plan)
        tasks = [Task("explore", step, p, {"prompt": prompt, "seeds": candidates[p].tolist(), "plan": plan})
                 for p, prompt in enumerate(prompts)]
        ray.get(self.queue.submit.remote(tasks))

    def _log(self, step: int, samples: list[ScoredSample]) -> None:
        for sample in sorted(samples, key=lambda s: (s.id.prompt_index, s.id.sample_index)):
            self.log.write(json.dumps({
                "step": step, "prompt": sample.id.prompt_index, "sample": sample.id.sample_index,
                "version": sample.id.policy_version, "step_versions": list(sample.step_versions),
                "produced_by": sample.produced_by, "reward": sample.reward}) + "\n")
        self.log.flush()
