"""The ``spotlight`` command: pretrain | train | eval (simulate, report and bench come with later parts)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from spotlight.config import ConfigError, PretrainConfig, TrainConfig, load_config

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Spotlight: Flow-GRPO post-training of DiTs.")
console = Console(stderr=True)

ConfigOption = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config; defaults run as they are.")]
ResumeOption = Annotated[bool, typer.Option("--resume", help="Continue the run in run_dir from its last checkpoint.")]
SetOption = Annotated[list[str] | None, typer.Option("--set", "-s", help="Override a field: section.field=value.")]


def _fail(error: Exception) -> None:
    """Print one line naming the cause (the run directory keeps what was written) and exit 2."""
    console.print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


def _known_errors() -> tuple[type[Exception], ...]:
    from spotlight.pipeline import RunError
    from spotlight.rewards.base import RewardError
    from spotlight.rl.checkpoint import CheckpointError

    return (ConfigError, CheckpointError, RewardError, RunError)


def _progress() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=console)


@app.command()
def pretrain(config: ConfigOption = None, set_: SetOption = None) -> None:
    """Pre-train the TinyDiT base model by flow matching on rendered shapes."""
    try:
        cfg = load_config(PretrainConfig, config, set_)
        from spotlight.pretrain import pretrain as run_pretrain

        with _progress() as progress:
            task = progress.add_task("pretrain", total=cfg.steps, status="")
            final = run_pretrain(cfg, on_step=lambda step, loss: progress.update(
                task, completed=step, status=f"loss {loss:.4f}"))
    except _known_errors() as error:
        _fail(error)
    console.print(f"base model written to {final}")


def _summary_table(summary: Any) -> Table:
    table = Table(title=f"spotlight train: {summary.run_dir}")
    for column in ("iteration", "wall s", "val strict acc", "val reward", "rollout reward"):
        table.add_column(column, justify="right")
    rollout_reward = {r["iteration"]: r.get("rollout/reward_mean") for r in summary.history}
    for record in summary.validation:
        reward = rollout_reward.get(record["iteration"])
        table.add_row(str(record["iteration"]), f"{record['time/wall_s']:.0f}", f"{record['val/strict_accuracy']:.3f}",
                      f"{record['val/reward']:.3f}", "-" if reward is None else f"{reward:.3f}")
    return table


@app.command()
def train(
    config: ConfigOption = None,
    set_: SetOption = None,
    resume: ResumeOption = False,
) -> None:
    """Post-train the base model with Flow-GRPO (modes: vanilla, sync-explore, stale-explore)."""
    try:
        cfg = load_config(TrainConfig, config, set_)
        from spotlight.pipeline import Trainer

        trainer = Trainer(cfg, resume=resume)
        with _progress() as progress:
            task = progress.add_task(f"train ({cfg.mode})", total=cfg.iterations, completed=trainer.start_iteration,
                                     status="")

            def show(iteration: int, record: dict[str, Any]) -> None:
                status = f"reward {record.get('rollout/reward_mean', float('nan')):.3f}"
                if "val/strict_accuracy" in record:
                    status += f"  val acc {record['val/strict_accuracy']:.3f}"
                progress.update(task, completed=iteration, status=status)

            summary = trainer.run(show)
    except _known_errors() as error:
        _fail(error)
    Console().print(_summary_table(summary))


@app.command("eval")
def eval_(
    checkpoint: Annotated[Path, typer.Argument(help="A model directory (base model or a run's checkpoint).")],
    seeds_per_prompt: int = 4,
    num_steps: int = 10,
) -> None:
    """Score a checkpoint on the validation split: strict accuracy overall and per kind (ODE, fixed seeds)."""
    try:
        from spotlight.evaluation import evaluate
        from spotlight.rewards.geneval import GenEvalReward
        from spotlight.rl.checkpoint import load_model
        from spotlight.tasks.shapes import train_val_split

        model = load_model(checkpoint)
        result = evaluate(model, train_val_split()[1], GenEvalReward(), seeds_per_prompt, num_steps)
    except _known_errors() as error:
        _fail(error)
    table = Table(title=f"validation: {checkpoint}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in result.metrics().items():
        table.add_row(name, f"{value:.3f}")
    Console().print(table)


def main() -> None:  # pragma: no cover - console entry for `python -m spotlight.cli`
    sys.exit(app())


if __name__ == "__main__":  # pragma: no cover
    main()
