"""Where one GRPO update moves the policy: trained steps (the signal) vs untrained steps (collateral).

From the shipped base model, one rollout (8 train prompts x 8 seeds, the default plan) is scored,
then ONE update is taken by each optimizer on a fresh copy, training the default early steps. For
every sample it measures the change of the per-dimension log-prob of its recorded transitions:
on the trained steps split by the sign of the advantage (what the update should raise and lower),
and on the untrained steps (what it should leave alone). It explains why RL is slow here: AdamW
steps every weight by about the learning rate, whatever its gradient's signal.

    python benchmarks/learning/rl_update_direction.py      (~1 min on one core)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from spotlight.components.checkpoint import load_model
from spotlight.config import TrainConfig, load_config
from spotlight.loop.rollout import rollout
from spotlight.loop.streams import candidate_seeds, iteration_prompts
from spotlight.rewards.geneval.reward import GenEvalReward
from spotlight.rl.grpo import choose_train_timesteps, grpo_update, step_log_prob_and_mean
from spotlight.tasks.shapes import train_val_split
from spotlight.trainer import build_optimizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import RESULTS, git_commit, machine

SETTINGS = {"adamw lr 1e-4": ("adamw", 1e-4), "adamw lr 1e-5": ("adamw", 1e-5),
            "sgd lr 1.0": ("sgd", 1.0), "sgd lr 0.1": ("sgd", 0.1)}


def log_prob_change(model, batch, steps: list[int]) -> torch.Tensor:
    """(B,) summed change of the recorded transitions' log-probs over ``steps`` under ``model``."""
    rows = torch.arange(batch.advantages.shape[0])
    with torch.no_grad():
        return torch.stack([step_log_prob_and_mean(model, batch, rows, s)[0] - batch.log_probs[:, s]
                            for s in steps], 1).sum(1)


def main() -> None:
    torch.set_num_threads(1)
    started = time.perf_counter()
    base: TrainConfig = load_config(TrainConfig, None, ["mode=vanilla", "rollout.prompts_per_iteration=8",
                                                       "train.kl_beta=0"])
    model = load_model(base.base_checkpoint).float()
    train_prompts, _ = train_val_split()
    prompts = iteration_prompts(train_prompts, 0, 0, 8)
    scored = rollout(model, prompts, candidate_seeds(0, 0, 8, base.rollout.group_size), base,
                     GenEvalReward(base.reward.strict_weight))
    batch, advantages = scored.batch, scored.batch.advantages
    num_steps = batch.log_probs.shape[1]
    trained = choose_train_timesteps(num_steps, base.train.timestep_fraction, torch.Generator(),
                                     base.train.timestep_selection)
    untrained = [s for s in range(num_steps) if s not in trained]
    results = {}
    print(f"trained steps {trained}, untrained {untrained}; mean log-prob change per dimension")
    print(f"{'optimizer':<16}{'corr(change, A)':>16}{'A > 0':>12}{'A < 0':>12}{'untrained':>12}{'ratio':>8}")
    for name, (optimizer, lr) in SETTINGS.items():
        section = base.train.model_copy(update={"optimizer": optimizer, "learning_rate": lr})
        policy = load_model(base.base_checkpoint).float()
        grpo_update(policy, None, build_optimizer(policy, section), batch, section, torch.Generator().manual_seed(0))
        change, collateral = log_prob_change(policy, batch, trained), log_prob_change(policy, batch, untrained)
        signal = float(change[advantages > 0].mean() - change[advantages < 0].mean()) / 2
        row = {"corr_with_advantage": float(torch.corrcoef(torch.stack([change, advantages]))[0, 1]),
               "trained_positive": float(change[advantages > 0].mean()),
               "trained_negative": float(change[advantages < 0].mean()),
               "untrained": float(collateral.mean()),
               "collateral_over_signal": abs(float(collateral.mean())) / max(abs(signal), 1e-30)}
        results[name] = row
        print(f"{name:<16}{row['corr_with_advantage']:>16.3f}{row['trained_positive']:>12.2e}"
              f"{row['trained_negative']:>12.2e}{row['untrained']:>12.2e}{row['collateral_over_signal']:>8.2f}")
    payload = {"benchmark": "rl_update_direction", "commit": git_commit(), "machine": machine(),
               "trained_steps": trained, "settings": results, "wall_s": time.perf_counter() - started}
    out = RESULTS / "rl_update_direction.json"
    Path(out).write_text(json.dumps(payload, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
