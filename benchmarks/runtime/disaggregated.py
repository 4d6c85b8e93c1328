"""Disaggregated diffusion RL (issue 16): the simulated ladder at DigenRL's settings, and TSP timed here.

``--simulate``: for every setting of ``configs/simulate-digenrl.yaml`` (Qwen-Image-20B and FLUX-12B
class models, 16 and 32 H100s, 20 and 40 sampling steps, 40% and 60% of timesteps trained), the
samples/s of colocated, disaggregated, + GAP, + TSP, + TAG/BTS, + one-step asynchrony (and a coarse
TAG side rung), their ratios to colocated and to the split alone, the overlap ceiling, and Spotlight
exploration on spot generators in the shadow of a step; then DigenRL's reported 1.56-2.10x and the
independent reproduction beside them, and the colocated overhead each reported ratio would imply
under this cost model. Writes benchmarks/results/disaggregated_sim.json.

``--measure``: the ladder measured on this machine, each rung a real ``spotlight train`` run through
the one loop, pinned one device per core (2 cores: the trainer on core 0, the second device on core 1):

    colocated        mode spot-rollout: both devices sample the batch (split by prompt), then the trainer
                     core trains it while the second core idles (the loop has no data-parallel update, so
                     colocated training uses one of the two devices; ``ideal_colocated`` adds the figure a
                     perfect 2-way data-parallel update would give: rollout time + train time / 2)
    disaggregated    mode disaggregated, gap/tsp/tag/async off: one generator device samples and scores the
                     whole batch, then the trainer device trains it group by group (the one-shot fallback)
    + GAP            groups trained as they complete while the generator samples the rest
    + TSP            a group's trained timesteps packed into one forward/backward
    + TAG/BTS        the trainer draws unstarted units in its bubbles when the bubble policy says it pays
    + async          the generator starts step s+1's units with θ_s while the trainer trains step s

samples/s over the iterations after the first (each iteration's wall time, validation excluded),
device utilisation per rung, ratios to colocated, spread over ``--repeats``, and the overlap ceiling
(gen + train) / max(gen, train) from the disaggregated rung's measured generator and trainer busy time.
With ``--explore``: disaggregated (+GAP +TSP) against the same plus Spotlight's stale-seed exploration
in the generator's idle time (group reward std, time per step). Writes
benchmarks/results/disaggregated_measured.json.

``--tsp-timing``: one group's NFT forward/backward on a TinyDiT, one pass per timestep vs all
timesteps packed into one pass (one pinned core, one thread); the gradients are compared too.
Writes benchmarks/results/disaggregated_tsp.json.

    python benchmarks/runtime/disaggregated.py --simulate [--config configs/simulate-digenrl.yaml]
    nice -n 19 python benchmarks/runtime/disaggregated.py --tsp-timing
    python benchmarks/runtime/disaggregated.py --measure --repeats 3 [--explore]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from spotlight.config import load_config
from spotlight.disagg.group_loss import NftGroupLoss, keyed_forward_noise
from spotlight.disagg.groups import AssembledGroup
from spotlight.disagg.ladder import ladder
from spotlight.disagg.ladder_config import LadderConfig
from spotlight.disagg.samples import GenerationId, ScoredSample
from spotlight.models.tinydit import TinyDiT, TinyDiTConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import REPO, RESULTS, git_commit, machine

# What is published (issue 16): DigenRL over veRL-Omni on 16-32 GPUs; an independent reproduction
# on Wan2.1-1.3B (its baseline not stated: read here as the rung below).
DIGENRL_REPORTED = {"vs_colocated": [1.56, 2.10]}
REPRODUCTION = {"tsp": [1.07, 1.11], "gap_plus_async": [1.36, 1.44], "coarse_tag": 0.68}


def simulate(config_path: Path) -> dict:
    config = load_config(LadderConfig, config_path)
    grid = config.grid
    settings = []
    started = time.perf_counter()
    for model, devices, steps, fraction in itertools.product(grid.models, grid.devices, grid.sampling_steps,
                                                             grid.trained_fraction):
        result = ladder(config, model, devices, steps, fraction)
        rungs = {r["name"]: r for r in result["rungs"]}
        best = max(result["rungs"][1:], key=lambda r: r["samples_per_s"])
        colocated_step = rungs["colocated"]["step_s"]
        # the colocated step that would give DigenRL's ratio against this setting's best disaggregated rung
        result["implied_colocated_overhead_share"] = [
            1 - colocated_step / (ratio * best["step_s"]) for ratio in DIGENRL_REPORTED["vs_colocated"]]
        result["best_rung"] = best["name"]
        settings.append(result)
        print_setting(result)
    return {"settings": settings, "seconds": time.perf_counter() - started, "config": config.model_dump(),
            "config_path": str(config_path), "digenrl_reported": DIGENRL_REPORTED, "reproduction": REPRODUCTION}


def print_setting(result: dict) -> None:
    s = result["setting"]
    print(f"\n{s['model']}, {s['devices']} H100, {s['sampling_steps']} steps, {s['trained_fraction']:.0%} trained;"
          f" overlap ceiling {result['overlap_ceiling']:.2f}; perfect overlap over the split alone "
          f"{result['perfect_overlap_vs_split']:.2f}")
    print(f"  {'rung':24s} {'samples/s':>9s} {'step s':>7s} {'gen/train dev':>13s} {'gen util':>8s} "
          f"{'train util':>10s} {'TAG units':>9s} {'x coloc':>7s} {'x split':>7s}")
    for r in result["rungs"]:
        print(f"  {r['name']:24s} {r['samples_per_s']:9.3f} {r['step_s']:7.1f} "
              f"{r['generator_devices']:>6d}/{r['trainer_devices']:<6d} {r['generator_utilisation']:8.2f} "
              f"{r['trainer_utilisation']:10.2f} {r['tag_units_per_step']:9.1f} {r['vs_colocated']:7.2f} "
              f"{r['vs_disaggregated']:7.2f}")
    spot = result["spotlight"]
    low, high = result["implied_colocated_overhead_share"]
    print(f"  + Spotlight exploration: {spot['spot_devices']} spot devices explore "
          f"{spot['candidates_per_prompt']:.0f} candidates/prompt per {spot['step_s']:.0f} s step "
          f"({'fits' if spot['fits'] else 'does not fit'}); DigenRL's 1.56-2.10x would need the colocated "
          f"baseline to lose {low:.0%}-{high:.0%} of its step to what disaggregation removes")


def synthetic_group(config: TinyDiTConfig, group_size: int) -> AssembledGroup:
    generator = torch.Generator().manual_seed(0)
    samples = tuple(ScoredSample(
        id=GenerationId(0, j, 0), latents=torch.randn(2, *config.latent_shape, generator=generator),
        log_probs=torch.zeros(1),
        tokens=torch.randint(1, config.vocab_size, (config.max_text_len,), generator=generator),
        reward=float(j)) for j in range(group_size))
    return AssembledGroup(0, samples, torch.linspace(-1.5, 1.5, group_size))


def time_passes(model: TinyDiT, loss: NftGroupLoss, group: AssembledGroup,
                repeats: int) -> tuple[float, float, list]:
    """Median CPU seconds (this thread) and wall seconds of one group's forwards/backwards, and the gradient.

    CPU time is the figure compared: on a shared machine a niced process waits for the core, which
    wall time counts and CPU time does not (one thread, so no parallel work hides in it).
    """
    cpu, wall = [], []
    for attempt in range(repeats + 2):
        model.zero_grad(set_to_none=True)
        started_cpu, started_wall = time.thread_time(), time.perf_counter()
        for index in range(loss.num_pieces(group)):
            loss.piece(model, group, index).loss_sum.backward()
        if attempt >= 2:  # two warm-ups
            cpu.append(time.thread_time() - started_cpu)
            wall.append(time.perf_counter() - started_wall)
    return statistics.median(cpu), statistics.median(wall), [p.grad.clone() for p in model.parameters()]


def tsp_timing(repeats: int, out: Path, provenance: dict) -> dict:
    """Time every (group size, timesteps) row; the JSON is rewritten after each row, so a stopped run keeps
    what it measured."""
    os.sched_setaffinity(0, {0})
    torch.set_num_threads(1)
    config = TinyDiTConfig()
    torch.manual_seed(0)
    model, old = TinyDiT(config), TinyDiT(config)
    rows = []
    for group_size, timesteps in itertools.product((4, 8), (2, 4, 8)):
        group = synthetic_group(config, group_size)

        def noise(sample_id, t=timesteps):
            return keyed_forward_noise(0, 0, sample_id, t, config.latent_shape)

        timed = {}
        for pack in (False, True):
            loss = NftGroupLoss({0: old}, noise, 1.0, 2.0, timesteps, pack_timesteps=pack)
            timed[pack] = time_passes(model, loss, group, repeats)
        difference = max(float((a - b).abs().max()) for a, b in zip(timed[False][2], timed[True][2], strict=True))
        row = {"group_size": group_size, "timesteps": timesteps, "per_timestep_cpu_s": timed[False][0],
               "packed_cpu_s": timed[True][0], "speedup_cpu": timed[False][0] / timed[True][0],
               "per_timestep_wall_s": timed[False][1], "packed_wall_s": timed[True][1],
               "max_abs_gradient_difference": difference}
        rows.append(row)
        out.write_text(json.dumps({**provenance, **tsp_summary(config, repeats, rows)}, indent=2))
        print(f"  group {group_size}, {timesteps} timesteps: per-timestep {row['per_timestep_cpu_s'] * 1e3:7.1f} ms, "
              f"packed {row['packed_cpu_s'] * 1e3:7.1f} ms CPU, x{row['speedup_cpu']:.2f}  "
              f"(wall {row['per_timestep_wall_s'] * 1e3:.0f} / {row['packed_wall_s'] * 1e3:.0f} ms; "
              f"max |grad diff| {difference:.1e})", flush=True)
    return tsp_summary(config, repeats, rows)


def tsp_summary(config: TinyDiTConfig, repeats: int, rows: list[dict]) -> dict:
    return {"model": config.to_dict(), "repeats": repeats, "threads": 1, "core": 0, "rows": rows,
            "load_average": os.getloadavg()}


# The measured ladder's workload: the shapes task, its TinyDiT base, 8 prompts x 8 samples, NFT with one
# optimizer step per batch (what GAP requires; the colocated rung takes the same one step); units of 4
# generations (16 per batch, 2 per group: smaller units cost more per sample on a CPU core).
MEASURE_BASE = ["iterations=6", "eval.every=1000", "eval.seeds_per_prompt=1", "eval.num_steps=2",
                "eval.raw_model=false", "checkpoint_every=1000", "runtime.max_wall_s=null",
                "rollout.prompts_per_iteration=8", "rollout.group_size=8", "train.num_epochs=1",
                "train.num_minibatches=1", "train.old_policy_decay=0",
                "train.nft_kl_beta=0", "device_cores=[0,1]"]
DISAGG = ["mode=disaggregated", "disagg.unit_size=4"]
RUNGS = {
    "colocated": ["mode=spot-rollout", "runtime.num_spot_devices=1", "runtime.trace=null"],
    "disaggregated": [*DISAGG, "disagg.gap=false", "disagg.tsp=false"],
    "+ GAP": [*DISAGG, "disagg.tsp=false"],
    "+ TSP": [*DISAGG],
    "+ TAG/BTS": [*DISAGG, "disagg.tag=true"],
    "+ async": [*DISAGG, "disagg.tag=true", "disagg.async_one_step=true"],
}
EXPLORE_RUNGS = {"disaggregated (+GAP +TSP)": [*DISAGG], "+ stale-seed exploration": [*DISAGG, "disagg.explore=true"]}


def run_rung(name: str, overrides: list[str], seed: int, run_dir: Path) -> dict:
    """One rung: a `spotlight train` run; its steady-state samples/s, utilisation and per-step figures."""
    from spotlight.config import TrainConfig
    from spotlight.runtime.spot.pools import LocalCluster
    from spotlight.trainer import train

    config = load_config(TrainConfig, None, [*MEASURE_BASE, *overrides, f"seed={seed}", f"run_dir={run_dir}"])
    disaggregated = config.mode == "disaggregated"
    cluster = LocalCluster() if disaggregated else None  # started before the run's clock, as spot-rollout's is
    try:
        history = train(config).history
    finally:
        if cluster is not None:
            cluster.shutdown()
    records = [r for r in history if r["iteration"] >= 1]
    steps = [b["time/wall_s"] - a["time/wall_s"] for a, b in zip(records, records[1:], strict=False)]
    measured = records[1:]  # the first iteration is a warm-up (and has nothing to run ahead of, async)
    batch = config.rollout.prompts_per_iteration * config.rollout.group_size

    def mean(key: str) -> float:
        values = [r[key] for r in measured if key in r]
        return statistics.fmean(values) if values else float("nan")

    result = {"rung": name, "seed": seed, "samples_per_s": batch * len(steps) / sum(steps),
              "step_s": statistics.fmean(steps), "train_s": mean("time/train_s"),
              "group_reward_std": mean("rollout/group_reward_std"), "reward_mean": mean("rollout/reward_mean")}
    if disaggregated:
        result.update({"trainer_utilisation": mean("usage/trainer"),
                       "second_device_utilisation": mean("usage/generators"),
                       "generator_busy_s": statistics.fmean(r["usage/generators"] * r["time/step_s"] for r in measured),
                       "trainer_busy_s": statistics.fmean(r["usage/trainer"] * r["time/step_s"] for r in measured),
                       "tag_units_per_step": mean("disagg/tag_units"), "wait_s": mean("time/wait_s"),
                       "stale_fraction": mean("disagg/stale_fraction"),
                       "explored_prompts": mean("explore/explored_prompts")})
    else:
        rollout_s = mean("time/rollout_s")
        result.update({"trainer_utilisation": mean("util/on_demand"), "second_device_utilisation": mean("util/spot"),
                       "rollout_s": rollout_s,
                       "ideal_colocated_samples_per_s": batch / (rollout_s + mean("time/train_s") / 2)})
    print(f"  {name:28s} seed {seed}: {result['samples_per_s']:6.2f} samples/s, step {result['step_s']:.2f} s, "
          f"util trainer {result['trainer_utilisation']:.2f} / second {result['second_device_utilisation']:.2f}, "
          f"group reward std {result['group_reward_std']:.3f}", flush=True)
    return result


def spread(values: list[float]) -> dict | None:
    """Mean, range and standard deviation over repeats (None where a rung has no finite value, e.g. no exploration)."""
    values = [value for value in values if math.isfinite(value)]
    if not values:
        return None
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "stdev": statistics.stdev(values) if len(values) > 1 else 0.0, "values": values}


def measure(repeats: int, explore: bool, out: Path, provenance: dict) -> dict:
    """Every rung ``repeats`` times (rungs interleaved within a repeat, so drift hits all alike); the JSON is
    rewritten after each run."""
    import tempfile

    rungs = EXPLORE_RUNGS if explore else RUNGS
    runs: list[dict] = []
    root = Path(tempfile.mkdtemp(prefix="disagg-measure-"))
    for repeat in range(repeats):
        for index, (name, overrides) in enumerate(rungs.items()):
            runs.append(run_rung(name, overrides, repeat, root / f"r{repeat}-{index}"))
            out.write_text(json.dumps({**provenance, **measure_summary(rungs, runs, explore)}, indent=2))
    return measure_summary(rungs, runs, explore)


def measure_summary(rungs: dict, runs: list[dict], explore: bool) -> dict:
    table = {}
    first = next(iter(rungs))
    for name in rungs:
        mine = [r for r in runs if r["rung"] == name]
        if not mine:
            continue
        base = {r["seed"]: r["samples_per_s"] for r in runs if r["rung"] == first}
        ratios = [r["samples_per_s"] / base[r["seed"]] for r in mine if r["seed"] in base]
        keys = [k for k, v in mine[0].items() if isinstance(v, float) and k != "seed"]
        table[name] = {**{k: spread([r[k] for r in mine]) for k in keys}, f"vs_{'first' if explore else 'colocated'}":
                       spread(ratios) if ratios else None}
    summary = {"workload": MEASURE_BASE, "rungs": {name: rungs[name] for name in rungs}, "table": table, "runs": runs,
               "load_average": os.getloadavg()}
    split = table.get("disaggregated")
    if split is not None:
        gen, train = split["generator_busy_s"]["mean"], split["trainer_busy_s"]["mean"]
        summary["overlap_ceiling"] = {"generation_s": gen, "training_s": train,
                                      "ceiling": (gen + train) / max(gen, train)}
    return summary


def print_measured(summary: dict, explore: bool) -> None:
    key = "vs_first" if explore else "vs_colocated"
    print(f"\n  {'rung':28s} {'samples/s':>16s} {'x ' + ('first' if explore else 'colocated'):>16s} "
          f"{'util trainer':>12s} {'util 2nd':>8s} {'step s':>7s} {'group std':>9s}")
    for name, row in summary["table"].items():
        ratio = row[key]
        print(f"  {name:28s} {row['samples_per_s']['mean']:7.2f} ({row['samples_per_s']['min']:.2f}-"
              f"{row['samples_per_s']['max']:.2f}) {ratio['mean']:6.2f} ({ratio['min']:.2f}-{ratio['max']:.2f}) "
              f"{row['trainer_utilisation']['mean']:12.2f} {row['second_device_utilisation']['mean']:8.2f} "
              f"{row['step_s']['mean']:7.2f} {row['group_reward_std']['mean']:9.3f}")
    if "overlap_ceiling" in summary:
        c = summary["overlap_ceiling"]
        print(f"  overlap ceiling (gen + train) / max(gen, train) = ({c['generation_s']:.2f} + {c['training_s']:.2f}) "
              f"/ max = {c['ceiling']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulate", action="store_true")
    parser.add_argument("--tsp-timing", action="store_true")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "simulate-digenrl.yaml")
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--explore", action="store_true", help="with --measure: disaggregated vs + exploration")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if not (args.simulate or args.tsp_timing or args.measure):
        parser.error("choose --simulate, --tsp-timing and/or --measure")
    provenance = {"commit": git_commit(), "machine": machine()}
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.simulate:
        out = RESULTS / "disaggregated_sim.json"
        out.write_text(json.dumps({**provenance, **simulate(args.config)}, indent=2))
        print(f"\nwrote {out}")
    if args.tsp_timing:
        print("TSP: NFT forward/backward of one group on a TinyDiT (default size), one core")
        out = RESULTS / "disaggregated_tsp.json"
        out.write_text(json.dumps({**provenance, **tsp_timing(args.repeats, out, provenance)}, indent=2))
        print(f"wrote {out}")
    if args.measure:
        name = "disaggregated_measured_explore.json" if args.explore else "disaggregated_measured.json"
        out = RESULTS / name
        summary = measure(args.repeats, args.explore, out, provenance)
        out.write_text(json.dumps({**provenance, **summary}, indent=2))
        print_measured(summary, args.explore)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
