"""What the loop does on the guard's verdict of a dying run: roll back to ``checkpoints/best`` at a lower learning
rate, or stop with the best model as the final one (`spotlight.components.guard` decides; this acts)."""

from __future__ import annotations

import logging
from typing import Any

from spotlight.components.checkpoint import load_model_state
from spotlight.components.guard import GuardVerdict
from spotlight.loop.evaluation import describe_score, validated, validation_score

__all__ = ["act_on_verdict"]

logger = logging.getLogger("spotlight.trainer")


def act_on_verdict(trainer: Any, verdict: GuardVerdict) -> None:
    """A dying run (the guard's verdict): roll back to ``checkpoints/best`` at a lower learning rate, or stop.

    Both put the best validated weights (the EMA's, which ``best`` holds) back into the policy,
    its sampling policy, θ_{i-1} and the EMA: a run that stops because it is dying ends with its
    best model, not the dying one, as its final model, its last checkpoint and what the final
    validation measures (as early stopping restores the best weights). A rollback then goes on at
    the learning rate times ``guard.rollback_lr_factor``, with the optimizer's moments, which were
    built on the dying run, cleared. Either way one line says what happened, when, and where the
    best model is.
    """
    best_dir = trainer.run_dir / "checkpoints" / "best"
    best = max(validated(trainer.history), key=validation_score)
    where = f"the best model ({describe_score(best)} at iteration {best['iteration']}) is {best_dir}"
    trainer.versions.reset_to(load_model_state(best_dir))
    if verdict.action == "stop":
        trainer.stopped = (f"guard: stopped at iteration {verdict.iteration}: {verdict.reason}; {where}, "
                           "and it is also the final model.")
        logger.info(trainer.stopped)  # the terminal gets it once, under the summary table
        return
    optimizer = trainer.optimizer
    for group in optimizer.param_groups:
        group["lr"] *= trainer.config.guard.rollback_lr_factor
    optimizer.state.clear()
    if trainer.ranks is not None:
        trainer.ranks.synchronise()
    trainer.guard.rolled_back()
    logger.warning(f"guard: iteration {verdict.iteration}: {verdict.reason}; rolled back to {best_dir} "
                   f"(iteration {best['iteration']}, {describe_score(best)}) "
                   f"with learning rate {optimizer.param_groups[0]['lr']:.3g}")
