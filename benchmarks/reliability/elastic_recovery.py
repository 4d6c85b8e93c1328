"""Recovery of a broken SP-2 group: the node agent with a warm spare vs a cold restart from a checkpoint.

Same machine, same model, same committed request, one run. A randomly initialised wide TinyDiT
(≥ 100 M parameters) is denoised by an SP group of degree 2 for a few steps; then one member is
SIGKILLed and the clock runs until the FIRST RESUMED DENOISING STEP (from the committed latent and
step) has finished:

(a) agent: the agent sees the member's death (its process sentinel), promotes a warm spare (torch
    already imported) that takes the weights from the node's shared memory, the planner re-forms the
    broken group under a new generation on the agent's TCPStore, and the group takes the step.
    Two ways to take the weights: ``map`` (the runtime's default: the spare's parameters are the
    shared tensors) and ``copy`` (the spare copies them into private memory, as a GPU worker copies
    pinned host weights to its device).
(b) cold: what a relaunch does: the surviving member is torn down too, two new processes start,
    import torch, load the weights from a safetensors checkpoint, form a new process group
    (``tcp://`` on rank 0, a fresh port) and take the step.

Both paths build the model the same way (meta device + assign: no random initialisation), and the
checkpoint was just written, so (b) reads it from the page cache: the cold numbers are a lower
bound of what a relaunch costs. The resumed latents of (a) and (b) must be bit-identical.

Run: nice -n 19 .venv/bin/python benchmarks/reliability/elastic_recovery.py   (~2 min on 2 busy cores)
Writes benchmarks/results/elastic_recovery.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from spotlight.diffusion.noise import initial_latents
from spotlight.diffusion.sampler import SamplingPlan
from spotlight.models.tinydit import TinyDiT, TinyDiTConfig
from spotlight.runtime.queue.request_queue import Request
from spotlight.runtime.sp.agent import NodeAgent
from spotlight.runtime.sp.reconfigure import SPGroup, plan_groups

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import RESULTS, git_commit, machine

# 16 image + 12 prompt tokens: few tokens keep the step itself short, so the clock measures recovery.
CONFIG = TinyDiTConfig(image_size=16, patch_size=4, dim=1024, depth=6, num_heads=8)
PLAN = SamplingPlan(num_steps=8)
REQUEST = Request("bench", "a red circle left of a blue square", 3, PLAN, weights_version=0)
COMMITTED_STEP = 2
SP = {16: 2}


def random_model() -> TinyDiT:
    torch.manual_seed(0)
    model = TinyDiT(CONFIG)
    with torch.no_grad():
        for block in model.blocks:  # non-zero adaLN so every block does real work
            block.modulation[1].weight.normal_(0.0, 0.02)
    return model.eval()


def committed_state(agent: NodeAgent, group: SPGroup) -> torch.Tensor:
    """Denoise the request to COMMITTED_STEP with a healthy group: the (latent, step) a commit stores."""
    latent = initial_latents([REQUEST.seed], CONFIG.latent_shape)[0]
    for step in range(COMMITTED_STEP):
        latent = agent.run_step(group.name, REQUEST, latent, step)
    return latent


def agent_recovery(agent: NodeAgent, group: SPGroup, latent: torch.Tensor) -> tuple[dict[str, float], SPGroup,
                                                                                     torch.Tensor]:
    """Kill member 1 of ``group``, recover with a warm spare; returns (timings, the new group, resumed latent)."""
    victim = int(group.members[1].rpartition("/")[2])
    marks = {}
    started = time.perf_counter()
    agent.kill_device(victim)
    if agent.wait_for_loss(timeout_s=30.0) != [victim]:
        raise RuntimeError(f"the agent did not see device {victim} die: the benchmark killed nothing")
    marks["detected"] = time.perf_counter()
    agent.replace_lost_devices()
    marks["spare_attached"] = time.perf_counter()
    diff = plan_groups({agent.node_id: agent.alive_devices()}, SP, CONFIG.num_heads, previous=[group],
                       cross_node=False)
    agent.dissolve([g.name for g in diff.dissolved])
    agent.form_groups(diff.formed)
    marks["group_formed"] = time.perf_counter()
    resumed = agent.run_step(diff.formed[0].name, REQUEST, latent, COMMITTED_STEP)
    marks["first_step"] = time.perf_counter()
    timings = {name: at - started for name, at in marks.items()}
    return timings, diff.formed[0], resumed


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def spawn_cold_group(checkpoint: Path, latent_path: Path, out: Path) -> list[subprocess.Popen]:
    """Start the two ranks of a cold group; each prints READY and rank 0 prints STEP when the step is done."""
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return [
        subprocess.Popen(
            [sys.executable, __file__, "--cold-rank", str(rank), "--port", str(port), "--checkpoint", str(checkpoint),
             "--latent", str(latent_path), "--out", str(out)],
            stdout=subprocess.PIPE, text=True, env=env,
        )
        for rank in range(2)
    ]


def cold_recovery(checkpoint: Path, latent: torch.Tensor, folder: Path) -> tuple[dict[str, float], torch.Tensor]:
    """A healthy cold group loses rank 1; everything is relaunched. Returns (timings, resumed latent)."""
    latent_path = folder / "committed.pt"
    torch.save(latent, latent_path)
    running = spawn_cold_group(checkpoint, latent_path, folder / "warmup.pt")  # the group that will break
    for process in running:
        process.stdout.readline()  # READY: loaded and grouped
    started = time.perf_counter()
    running[1].kill()
    running[0].kill()  # the usual recovery tears the whole group down
    for process in running:
        process.wait()
    out = folder / "resumed.pt"
    relaunched = spawn_cold_group(checkpoint, latent_path, out)
    marks = {}
    for line in relaunched[0].stdout:
        if line.startswith("READY"):
            marks["group_formed"] = time.perf_counter()
        if line.startswith("STEP"):
            marks["first_step"] = time.perf_counter()
            break
    for process in relaunched:
        process.wait(timeout=120)
    return {name: at - started for name, at in marks.items()}, torch.load(out)


def cold_rank_main(rank: int, port: int, checkpoint: str, latent_path: str, out: str) -> None:
    """One rank of a cold-started group: load the checkpoint, join, take the resumed step."""
    import torch.distributed as dist
    from safetensors.torch import load_file

    from spotlight.models.tinydit_sp import model_on_weights, sequence_parallel_step
    from spotlight.tasks.shapes import tokenize

    torch.set_num_threads(1)
    model = model_on_weights(CONFIG, load_file(checkpoint))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    print("READY", flush=True)
    tokens = tokenize([REQUEST.prompt], CONFIG.max_text_len)
    latent = torch.load(latent_path)[None]
    resumed = sequence_parallel_step(model, dist.group.WORLD, tokens, [REQUEST.seed], PLAN, latent, COMMITTED_STEP)
    if rank == 0:
        torch.save(resumed[0], out)
        print("STEP", flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="recoveries of each kind")
    parser.add_argument("--out", default=str(RESULTS / "elastic_recovery.json"))
    parser.add_argument("--cold-rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    parser.add_argument("--latent", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cold_rank is not None:
        cold_rank_main(args.cold_rank, args.port, args.checkpoint, args.latent, args.out)
        return
    torch.set_num_threads(1)
    from safetensors.torch import save_file

    model = random_model()
    num_params = sum(p.numel() for p in model.parameters())
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    agent_runs: dict[str, list[dict[str, float]]] = {}
    identical = True
    with tempfile.TemporaryDirectory() as scratch:  # /tmp is on disk here, not tmpfs
        folder = Path(scratch)
        checkpoint = folder / "model.safetensors"
        save_file(state, str(checkpoint))
        for mode in ("map", "copy"):
            agent = NodeAgent("bench", num_devices=2, num_spares=args.repeats, copy_weights=mode == "copy")
            load_s = agent.load_weights(CONFIG, state)
            group = plan_groups({"bench": agent.alive_devices()}, SP, CONFIG.num_heads, cross_node=False).formed[0]
            agent.form_groups([group])
            latent = committed_state(agent, group)
            step_started = time.perf_counter()
            healthy = agent.run_step(group.name, REQUEST, latent, COMMITTED_STEP)
            healthy_step_s = time.perf_counter() - step_started
            agent_runs[mode] = []
            for _ in range(args.repeats):
                timings, group, resumed = agent_recovery(agent, group, latent)
                agent_runs[mode].append(timings)
                identical &= torch.equal(resumed, healthy)
            agent.shutdown()
        cold_runs = []
        for _ in range(args.repeats):
            timings, resumed = cold_recovery(checkpoint, latent, folder)
            cold_runs.append(timings)
            identical &= torch.equal(resumed, healthy)

    medians = {mode: statistics.median(run["first_step"] for run in runs) for mode, runs in agent_runs.items()}
    agent_s, cold_s = medians["map"], statistics.median(run["first_step"] for run in cold_runs)
    print(f"TinyDiT {num_params / 1e6:.1f} M parameters ({num_params * 4 / 2**20:.0f} MiB fp32), SP degree 2, "
          f"healthy step {healthy_step_s:.3f} s, agent weight load {load_s:.3f} s")
    print(f"{'recovery to first resumed step':<34} {'median s':>9} {'runs (s)':>30}")
    rows = [("(a) agent, spare maps weights", agent_runs["map"], agent_s),
            ("(a') agent, spare copies weights", agent_runs["copy"], medians["copy"]),
            ("(b) cold restart", cold_runs, cold_s)]
    for name, runs, median in rows:
        listed = ", ".join(f"{run['first_step']:.3f}" for run in runs)
        print(f"{name:<34} {median:>9.3f} {listed:>30}")
    print(f"ratio cold / agent: {cold_s / agent_s:.1f}x (map), {cold_s / medians['copy']:.1f}x (copy); "
          f"resumed latents bit-identical: {identical}; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores")
    payload = {
        "benchmark": "elastic_recovery",
        "commit": git_commit(),
        "machine": machine(),
        "config": {"model": CONFIG.to_dict(), "num_params": num_params, "sp_degree": 2, "plan": vars(PLAN),
                   "committed_step": COMMITTED_STEP, "repeats": args.repeats,
                   "load_average_1min": os.getloadavg()[0]},
        "healthy_step_s": healthy_step_s,
        "agent_weight_load_s": load_s,
        "agent_recovery_s": agent_s,
        "agent_recovery_copy_s": medians["copy"],
        "cold_restart_s": cold_s,
        "ratio": cold_s / agent_s,
        "ratio_copy": cold_s / medians["copy"],
        "agent_runs": agent_runs,
        "cold_runs": cold_runs,
        "resumed_bit_identical": identical,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
