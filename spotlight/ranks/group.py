"""K trainer ranks in one torch.distributed group: the driver is rank 0, Ray actors are ranks 1..K-1.

Why actors holding a process group, not Ray Train's ``TorchTrainer``: Spotlight's driver is the single
controller and already the trainer (it owns the loop, the backend, validation and checkpoints, and in
mode spotlight the Ray cluster of the spot devices). ``TorchTrainer`` would run the training function
in K workers of its own and make the driver a bystander: the loop would have to run inside a worker,
apart from the backend it drives. Here the loop stays in the driver (`Trainer.iteration`, written once)
and the other ranks are remote hands for two calls an iteration:

    rollout   each rank samples and scores its share of the groups with the seeds the loop chose for
              them (`spotlight.ranks.rollout`; rank 0 through the backend, with any spot devices), and
              sets θ_old,i (the sampling policy: its own θ_i, or the trailing copy the driver sends)
    update    each gets the whole scored rollout and runs the same update (`spotlight.rl.rollout_update`)
              on its share of the rows, the gradients meeting in DDP (`spotlight.ranks.data_parallel`)

Rank 0 validates, checkpoints and logs; a DDP checkpoint is the plain policy, so any K' loads it.

DDP: the ranks' weights and optimizer state are the driver's, sent whole at the start, after ``--resume``
and after a guard rollback (`synchronise`), and kept equal by every DDP step since (the same reduced
gradient on every rank). FSDP2 (``trainer.sharding: fsdp``): every rank holds its shards of θ and of
each version, and the driver's `MirroredVersions` runs every call on the versions on all ranks at once
(`spotlight.ranks.mirrored`), checkpoints included (each rank writes its shards).

A rank that dies (its process killed, its device lost) fails the gloo/NCCL collective the others wait
in (the group's timeout bounds it if the transport does not notice) or its Ray call: the run stops with
one line naming the rank, and ``--resume`` continues from the last checkpoint.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import ray
import torch
import torch.distributed as dist

from spotlight.components.manifest import write_text_durably
from spotlight.diffusion.sampler import Trajectory
from spotlight.loop.text_encoders import place_text_encoders
from spotlight.ranks.data_parallel import RankShare, data_parallel
from spotlight.ranks.mirrored import MirroredVersions
from spotlight.ranks.placement import PlacementTimeout, placement_error, process_group_backend, rank_placement
from spotlight.ranks.rollout import (
    concat_outputs,
    concat_trajectories,
    prompt_shares,
    rank_reward,
    sample_share,
    what_the_update_reads,
)
from spotlight.ranks.sharded_versions import ShardedVersions
from spotlight.rewards.base import Reward, RewardOutput
from spotlight.rl.grpo import RolloutBatch
from spotlight.run_error import RunError
from spotlight.runtime.gpus import gpu_layout
from spotlight.runtime.out_of_memory import actor_out_of_memory

__all__ = ["CHECKPOINT_TIMEOUT_S", "COLLECTIVE_TIMEOUT_S", "TrainerRanks", "checkpoint_io"]

logger = logging.getLogger(__name__)

# How long a rank waits in one collective for the others. A dead peer's closed connection fails it at
# once; this bounds the case where the transport does not notice, within the minute a dead rank may take.
COLLECTIVE_TIMEOUT_S = 40.0
# How long the collectives of a checkpoint's shards (writing or reading them, `checkpoint_io`) may wait: a
# rank writing tens of GB of a large model's shards takes minutes, and the others wait for it in DCP's last
# gather; a short timeout there would kill healthy ranks. Failure detection everywhere else stays short.
CHECKPOINT_TIMEOUT_S = 1800.0
# The calls of `TrainerRank` that read or write a checkpoint's shards (their collectives: `checkpoint_io`).
CHECKPOINT_CALLS = ("save_shards", "restore")
# Metrics that are sums over the rows a rank computed (each row weighted by its share of the whole
# minibatch): the run's value is the sum over ranks. The rest (grad norm, sample counts) are global.
SUMMED_METRICS = ("train/loss", "train/kl", "train/policy_loss", "train/clip_fraction", "train/ratio")


def join_group(device: str, address: str, rank: int, world_size: int) -> None:
    """Join the K ranks' process group (`process_group_backend`: NCCL on GPUs, gloo on the CPU)."""
    dist.init_process_group(process_group_backend(device), init_method=address, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))


@contextmanager
def checkpoint_io() -> Iterator[None]:
    """The group's collectives started in the block may wait `CHECKPOINT_TIMEOUT_S`, those after it
    `COLLECTIVE_TIMEOUT_S` again; every rank enters it around the same calls (`CHECKPOINT_CALLS`).

    A collective's timeout is the group's when it is issued (NCCL's watchdog and gloo read it per
    operation), so the group is kept and only its timeout changes, as torchtitan lowers its own after the
    first step (torch's ``_set_pg_timeout``). Outside a process group (one process) it does nothing.
    """
    if not dist.is_initialized():
        yield
        return
    from torch.distributed.distributed_c10d import _set_pg_timeout

    _set_pg_timeout(datetime.timedelta(seconds=CHECKPOINT_TIMEOUT_S))
    try:
        yield
    finally:
        _set_pg_timeout(datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))


class TrainerRank:
    """Rank k ≥ 1 (a Ray actor): the policy, θ_old, the frozen reference and the optimizer: replicas of the driver's
    (DDP), or this rank's shards of them and a whole sampler (FSDP2, `ShardedVersions`, built at `join`).

    ``reward``: the driver's when a caller handed the trainer one; None: built here from the config.
    """

    def __init__(self, config: Any, rank: int, core: int | None, reward: Reward | None = None) -> None:
        from spotlight.cores import pin_process
        from spotlight.loop.base_policy import build_policy
        from spotlight.models.shadow import frozen_base, frozen_copy
        from spotlight.rl.rollout_update import build_optimizer, uses_reference

        pin_process(core, config.num_threads)  # one rank = one device = one core
        torch.manual_seed(config.seed)
        self.config, self.rank = config, rank
        section = config.train
        self.model = build_policy(config)
        # its text encoders placed as rank 0's (`spotlight.loop.text_encoders`): resident, or precompute, whose
        # prompts rank 0 sends with each rollout (`TrainerRanks.rollout`); none moves inside the loop either way
        place_text_encoders(self.model, config, ())
        self.sharded = config.trainer.sharding == "fsdp"
        self.versions: ShardedVersions | None = None  # fsdp: built once the group exists (`join`)
        if not self.sharded:
            self.reference = frozen_base(self.model) if uses_reference(section) else None
            self.previous = frozen_copy(self.model)
            self.optimizer = build_optimizer(self.model, section)
        self.reward = reward if reward is not None else rank_reward(config)
        self.trained: torch.nn.Module | None = None

    def pid(self) -> int:
        return os.getpid()

    def join(self, address: str) -> None:
        from spotlight.rl.rollout_update import build_optimizer

        join_group(self.config.device, address, self.rank, self.config.trainer.devices)
        if not self.sharded:
            self.trained = data_parallel(self.model, self.config.trainer.devices)
            return
        self.versions = ShardedVersions(self.model, self.config.train, self.config.trainer)
        versions = self.versions
        self.trained, self.previous, self.reference = versions.model, versions.previous, versions.reference
        self.optimizer = build_optimizer(self.trained, self.config.train)

    # -- fsdp: the versions' calls, each at the moment rank 0 makes it (`spotlight.ranks.mirrored`) --------
    def versions_call(self, name: str, *args: Any) -> None:
        getattr(self.versions, name)(*args)

    def save_shards(self, staging: Path) -> None:
        with checkpoint_io():
            self.versions.save_shards(staging, self.optimizer)

    def restore(self, checkpoint: Path) -> None:
        from spotlight.components.checkpoint import load_training_state

        with checkpoint_io():
            self.versions.restore(checkpoint, self.optimizer, load_training_state(checkpoint))

    def align_optimizer(self, learning_rates: list[float], cleared: bool) -> None:
        """Rank 0's learning rates, and its cleared moments after a guard rollback (fsdp: each keeps its own)."""
        for group, learning_rate in zip(self.optimizer.param_groups, learning_rates, strict=True):
            group["lr"] = learning_rate
        if cleared:
            self.optimizer.state.clear()

    def synchronise(self, model_state: dict[str, torch.Tensor], optimizer_state: dict[str, Any]) -> None:
        self.model.load_broadcast_state(model_state)
        self.optimizer.load_state_dict(optimizer_state)

    def rollout(self, prompts: list[str], share: slice, seeds: torch.Tensor,
                sampler_state: dict[str, torch.Tensor] | None,
                conditioning: Any = None) -> tuple[Trajectory, RewardOutput, Any] | None:
        """Set θ_old,i and sample and score this rank's ``share`` of the iteration's ``prompts`` with it (seeds:
        the share's (P_r, G)): its samples, rewards and prompt conditioning; None: an empty share.

        ``sampler_state``: the trailing sampling policy's weights (``train.old_policy_decay``); None when
        θ_old,i is θ_i itself, which this rank already holds (every DDP step keeps it equal to rank 0's).
        Only the share's prompts are encoded here: the update conditions on every prompt, and a pipeline's
        prompt ids index each process's own cache of text embeddings, so each rank's embeddings go to rank 0
        with its samples (`prompt_conditioning`) and every rank gets all of them with the update. ``conditioning``:
        the share's embeddings from rank 0, which precomputed every prompt (``model.text_encoders`` precompute).
        """
        self.model.adopt_prompt_conditioning(conditioning)
        if self.versions is not None:  # fsdp: θ_old,i is gathered into the whole sampler after every update
            sampler = self.versions.sampler
        else:
            sampler = self.previous
            sampler.load_broadcast_state(sampler_state if sampler_state is not None else self.model.broadcast_state())
        if share.start == share.stop:
            return None
        samples, rewards = sample_share(sampler, prompts[share], seeds, self.config, self.reward)
        return samples, rewards, self.model.prompt_conditioning(prompts[share])

    def update(self, iteration: int, batch: RolloutBatch, section: Any, conditioning: Any) -> dict[str, float]:
        """One update on this rank, θ_old,i the policy its `rollout` set; ``section``: the loop's training section
        this iteration (as rank 0's); ``conditioning``: every prompt's, gathered by rank 0 (`rollout`)."""
        from spotlight.loop.streams import Stream, iteration_generator
        from spotlight.rl.rollout_update import rollout_update

        self.model.adopt_prompt_conditioning(conditioning)

        generator = iteration_generator(self.config.seed, iteration, Stream.UPDATE)
        share = RankShare(section, self.rank, self.config.trainer.devices)
        return rollout_update(self.trained, self.previous, self.reference, self.optimizer, batch, share, generator)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class TrainerRanks:
    """The driver's side of K trainer ranks: starts ranks 1..K-1, joins as rank 0, runs each update on all.

    On a Ray cluster the backend started (mode spotlight) the ranks go on the driver's node; in a mode
    without Ray this starts a one-node local cluster of its own.
    """

    def __init__(self, config: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 reward: Reward | None = None) -> None:
        """``reward``: a reward object the trainer was handed (sent to every rank); None: each builds the config's."""
        self.config, self.model, self.optimizer = config, model, optimizer
        self.world_size = config.trainer.devices
        self.cluster = None
        self.actors: list[Any] = []
        self.placement: Any = None  # GPU ranks' placement group (`rank_placement`)
        if not ray.is_initialized() and self.world_size > 1:  # (fsdp on one device: a group of one, no Ray)
            from spotlight.runtime.spot.pools import LocalCluster

            cores = [core for core in (config.device_core(0),) if core is not None]
            self.cluster = LocalCluster(node_timeout_s=config.runtime.node_timeout_s, control_cores=cores or None,
                                        gpus=gpu_layout(config.device))  # the head offers every GPU but rank 0's
        try:
            start_s = config.runtime.node_timeout_s
            if self.world_size > 1:
                self._start_ranks(reward, start_s)
            address = rendezvous_address(config.device, self.world_size)
            joined = [actor.join.remote(address) for actor in self.actors]
            join_group(config.device, address, 0, self.world_size)
            self._get(joined, "joining the process group", start_s)
            self.conditioning: Any = None  # every prompt's of the last rollout, for the ranks' update
            self.versions: MirroredVersions | None = None
            if config.trainer.sharding == "fsdp":  # every version sharded; rank 0's too (spotlight/ranks/mirrored.py)
                from spotlight.rl.rollout_update import build_optimizer

                self.versions = MirroredVersions(ShardedVersions(model, config.train, config.trainer), self)
                self.optimizer = build_optimizer(self.versions.model, config.train)
                self.trained = self.versions.model
            else:
                self.trained = data_parallel(model, self.world_size)
        except BaseException:
            self.close()
            raise

    def _start_ranks(self, reward: Reward | None, start_s: float) -> None:
        """Ranks 1..K-1 as Ray actors, one device each; their pids in ``trainer-ranks.json``."""
        config = self.config
        problem = placement_error(config.device, self.world_size, ray.nodes(),
                                  counts_driver_gpu=config.runtime.address is not None)
        if problem is not None:
            raise RunError(problem)
        try:
            self.placement, options = rank_placement(config.device, self.world_size, start_s)
        except PlacementTimeout as error:
            raise RunError(str(error)) from None
        rank_actor = ray.remote(TrainerRank)
        shipped = None if reward is None else shipped_reward(reward, self.world_size)
        self.actors = [rank_actor.options(**options[rank - 1]).remote(config, rank, config.rank_core(rank), shipped)
                       for rank in range(1, self.world_size)]
        # a rank's process imports torch and builds the policy: as slow as a node on a loaded machine
        pids = self._get([actor.pid.remote() for actor in self.actors], "starting", start_s)
        logger.info("trainer ranks 1..%d: pids %s", self.world_size - 1, pids)
        # which process is which rank, for an operator (and the test that kills one)
        write_text_durably(Path(config.run_dir) / "trainer-ranks.json",
                           json.dumps({str(rank): pid for rank, pid in enumerate([os.getpid(), *pids])}))

    def shared(self, value: Any) -> Any:
        """``value`` in the object store, once for ranks 1..K-1; itself in a group of one (no Ray then)."""
        return ray.put(value) if self.actors else value

    def mirror(self, local: Callable[[], Any], method: str, *args: Any) -> Any:
        """``method(*args)`` on ranks 1..K-1 while rank 0 runs ``local()`` (a collective inside finds every rank);
        ``local``'s result. A rank that dies or fails is one line (`RunError`)."""
        what = f"{args[0] if method == 'versions_call' else method.replace('_', ' ')}"
        checkpoint = method in CHECKPOINT_CALLS  # its collectives wait longer, on every rank (`checkpoint_io`)
        timeout_s = (CHECKPOINT_TIMEOUT_S if checkpoint else COLLECTIVE_TIMEOUT_S) + 20.0
        calls = [getattr(actor, method).remote(*args) for actor in self.actors]
        try:
            with checkpoint_io() if checkpoint else nullcontext():
                result = local()
        except torch.OutOfMemoryError:  # rank 0's own: one line naming the knobs (`spotlight.trainer.train`)
            raise
        except (RuntimeError, dist.DistBackendError) as error:  # a collective failed: which rank is gone?
            self._get(calls, what, timeout_s)
            raise RunError(f"trainer rank 0 failed in {what} ({one_line(error)}); resume from the last checkpoint "
                           "with --resume") from None
        self._get(calls, what, timeout_s)
        return result

    def synchronise(self) -> None:
        """Give every rank the driver's weights and optimizer state (at the start, after a resume or a rollback).

        fsdp: the weights are already every rank's (`MirroredVersions`); the learning rates and a cleared
        optimizer state after a rollback are what is left to send.
        """
        if self.versions is not None:
            rates = [group["lr"] for group in self.optimizer.param_groups]
            self._get([actor.align_optimizer.remote(rates, not self.optimizer.state) for actor in self.actors],
                      "synchronising")
            return
        model_state = ray.put(self.model.broadcast_state())
        optimizer_state = ray.put(self.optimizer.state_dict())
        self._get([actor.synchronise.remote(model_state, optimizer_state) for actor in self.actors], "synchronising")

    def rollout(self, iteration: int, prompts: list[str], seeds: torch.Tensor,
                sampler_state: dict[str, torch.Tensor] | None,
                local: Callable[[list[str], torch.Tensor], tuple[Trajectory, RewardOutput]]
                ) -> tuple[Trajectory, RewardOutput]:
        """Every rank samples and scores its share of the (P, G) groups (`prompt_shares`): ranks 1..K-1 remotely,
        rank 0 by ``local(prompts, seeds)``, at the same time; the whole rollout (what the update reads of it,
        `what_the_update_reads`) and its rewards, in prompt order.

        ``sampler_state``: θ_old,i's weights when it trails θ_i (see `TrainerRank.rollout`), else None.
        """
        shares = prompt_shares(len(prompts), self.world_size)
        state_ref = None if sampler_state is None else ray.put(sampler_state)
        # precompute: rank 0 holds every prompt's embeddings, so a rank's share needs no encoder of its own
        precomputed = getattr(getattr(self.model, "prompts", None), "placement", None) == "precomputed"
        calls = [actor.rollout.remote(prompts, share, seeds[share], state_ref,
                                      self.model.prompt_conditioning(prompts[share]) if precomputed else None)
                 for actor, share in zip(self.actors, shares[1:], strict=True)]
        samples, rewards = local(prompts[shares[0]], seeds[shares[0]])
        here = what_the_update_reads(samples, self.config.train.algorithm), rewards
        # the other shares took as long as rank 0's: the wait is for a loaded machine, as a rank's start
        others = [part for part in self._get(calls, f"sampling iteration {iteration + 1}'s rollout",
                                             self.config.runtime.node_timeout_s) if part is not None]
        for _, _, conditioning in others:  # their prompts' embeddings: rank 0 encodes only its own share
            self.model.adopt_prompt_conditioning(conditioning)
        self.conditioning = self.model.prompt_conditioning(prompts) if self.actors else None  # for the update
        parts = [here, *(part[:2] for part in others)]
        return concat_trajectories([part[0] for part in parts]), concat_outputs([part[1] for part in parts])

    def update(self, iteration: int, batch: RolloutBatch,
               local: Callable[[torch.nn.Module, RankShare], dict[str, float]], section: Any) -> dict[str, float]:
        """One update on every rank: ranks 1..K-1 remotely, rank 0 by ``local(trained, share)``; the run's metrics.

        ``section`` is the loop's training section this iteration (the trust term's weight adapts). Every
        rank gets the whole batch: the update's shuffle is over all rows and each computes its share of
        every minibatch (`spotlight.ranks.data_parallel`).
        """
        batch_ref, conditioning = self.shared(batch), self.shared(self.conditioning)
        calls = [actor.update.remote(iteration, batch_ref, section, conditioning) for actor in self.actors]
        try:
            metrics = local(self.trained, RankShare(section, 0, self.world_size))
        except torch.OutOfMemoryError:  # rank 0's own: one line naming the knobs (`spotlight.trainer.train`)
            raise
        except (RuntimeError, dist.DistBackendError) as error:  # a collective failed: which rank is gone?
            self._get(calls, f"running iteration {iteration + 1}'s update")
            raise RunError(f"trainer rank 0: iteration {iteration + 1}'s update failed ({one_line(error)}); "
                           "resume from the last checkpoint with --resume") from None
        others = self._get(calls, f"running iteration {iteration + 1}'s update")
        for name in SUMMED_METRICS:
            if name in metrics:
                metrics[name] += sum(other[name] for other in others)
        return metrics

    def _get(self, calls: list[Any], what: str, timeout_s: float = COLLECTIVE_TIMEOUT_S + 20.0) -> list[Any]:
        """The calls' results; a rank that died, failed or did not answer in ``timeout_s`` is one line (`RunError`)."""
        if not calls:  # a group of one: no Ray call (ray.get would start a Ray instance of its own)
            return []
        try:
            return ray.get(calls, timeout=timeout_s)
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError) as error:
            rank = next((k + 1 for k, call in enumerate(calls) if not _succeeded(call)), "?")
            out_of_memory = actor_out_of_memory(error, f"trainer rank {rank} of {self.world_size} while {what}")
            if out_of_memory is not None:  # the driver's one out-of-memory line (`spotlight.trainer.train`)
                raise out_of_memory from None
            cause = (f"failed to start ({init_failure(error)})" if getattr(error, "actor_init_failed", False) else
                     "died" if isinstance(error, ray.exceptions.RayActorError) else
                     f"did not answer in {timeout_s:.0f} s (a loaded machine: raise runtime.node_timeout_s)"
                     if isinstance(error, ray.exceptions.GetTimeoutError) else f"failed ({init_failure(error)})")
            raise RunError(f"trainer rank {rank} of {self.world_size} {cause} while {what}; the run stops: "
                           "resume from the last checkpoint with --resume (a lost device: lower trainer.devices)") \
                from None

    def close(self) -> None:
        """Stop ranks 1..K-1 and leave the group (and stop the local cluster this started)."""
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
        if self.placement is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.placement)
            self.placement = None
        if dist.is_initialized():
            dist.destroy_process_group()
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None


def _succeeded(call: Any) -> bool:
    ready, _ = ray.wait([call], timeout=0)
    if not ready:
        return False
    try:
        ray.get(call, timeout=0)
        return True
    except Exception:  # noqa: BLE001 (any failure marks the rank)
        return False


def by_value(reward: Reward) -> Reward:
    """``reward``, its classes from outside Spotlight marked to be pickled by value: a reward a test or script
    defined in a module the ranks' processes cannot import (not installed, not on their path) still reaches them."""
    from ray import cloudpickle

    for value in (reward, *vars(reward).values()) if hasattr(reward, "__dict__") else (reward,):
        module = sys.modules.get(type(value).__module__)
        if module is not None and module.__name__.split(".")[0] not in ("spotlight", "builtins", "torch"):
            cloudpickle.register_pickle_by_value(module)
    return reward


def shipped_reward(reward: Reward, world_size: int) -> Any:
    """The trainer's reward in the object store for ranks 1..K-1; one line when it cannot be pickled (a lock)."""
    try:
        return ray.put(by_value(reward))
    except Exception as error:  # noqa: BLE001 (pickling raises TypeError, PicklingError, AttributeError, ...)
        raise RunError(f"trainer ranks 1..{world_size - 1} cannot receive the reward object handed to the trainer "
                       f"({one_line(error)}): name the reward in reward.name instead (each rank builds its own), or "
                       "set trainer.devices 1") from None


def init_failure(error: BaseException) -> str:
    """The last line of the exception a rank's call or constructor raised (Ray wraps it in its traceback)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return one_line(Exception(lines[-1] if lines else error))


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= 160 else text[:157] + "..."


def rendezvous_address(device: str, world_size: int) -> str:
    """Where the ranks meet: the loopback on the CPU (every rank on this node) or for a group of one, the driver
    node's address on GPUs (the ranks' placement group may span nodes)."""
    local = process_group_backend(device) == "gloo" or world_size == 1
    host = "127.0.0.1" if local else ray.util.get_node_ip_address()
    return f"tcp://{host}:{free_port(host)}"


def free_port(host: str = "127.0.0.1") -> int:
    """A free TCP port on ``host`` for the group's rendezvous."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
