"""The ``spotlight`` command: pretrain | train | eval | simulate | plan | report | serve-reward.

Every failure ends in one line (`spotlight.errors`): `SpotlightGroup` wraps every command, so a
command body just raises; ``spotlight --debug`` adds the traceback.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn, TextIO

import typer
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.core import TyperGroup

from spotlight import errors
from spotlight.cli_help import APP_HELP, FAMILY_HELP, MODES_HELP, TASK_HELP, TRAIN_DEFAULT_RUN, TRAIN_HELP
from spotlight.components.progress_line import AboveTheLine, ProgressLine, ProgressState
from spotlight.components.run_log import RUN_LOG_NAME, log_to, output_to_log
from spotlight.config import PretrainConfig, TrainConfig, load_config
from spotlight.modes import Mode

console = Console(stderr=True)


@dataclass
class CommandState:
    """What the failure handler needs to know about the command that ran (``ctx.obj``)."""

    debug: bool = False
    run_log: Path | None = None  # the run's log once the command knows its run directory


class SpotlightGroup(TyperGroup):
    """The command group with the top-level failure handler (see `spotlight.errors`)."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException):  # exits and usage errors: typer prints them
            raise
        except KeyboardInterrupt:
            console.print("[bold red]error:[/] interrupted; the run directory keeps what was written",
                          highlight=False, soft_wrap=True)
            raise typer.Exit(errors.EXIT_INTERRUPTED) from None
        except Exception as error:  # the one place where every other failure becomes one line
            stopped = errors.stopped_by_signal(error)  # SIGTERM / SIGINT: what was saved, how to continue
            if stopped is not None:
                console.print(escape(stopped[0]), highlight=False, soft_wrap=True)
                raise typer.Exit(stopped[1]) from None
            state = ctx.obj if isinstance(ctx.obj, CommandState) else CommandState()
            if state.debug:
                traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
            if errors.is_known(error):
                _fail(error)
            log = errors.write_traceback(error, errors.crash_log_path(state.run_log), sys.argv[1:])
            console.print(f"[bold red]error:[/] unexpected {type(error).__name__}: {escape(errors.one_line(error))}; "
                          f"the traceback is in {log} (spotlight --debug prints it); please report it",
                          highlight=False, soft_wrap=True)
            raise typer.Exit(errors.EXIT_UNEXPECTED) from None


app = typer.Typer(cls=SpotlightGroup, add_completion=False, no_args_is_help=True, help=APP_HELP)


@app.callback(help=APP_HELP)  # help texts name the code's own lists (cli_help.py)
def _options(ctx: typer.Context, debug: Annotated[bool, typer.Option(
        "--debug", help="On an unexpected error, print the traceback too (it is always in the log file).")] = False,
) -> None:
    """Options of every command; keeps what the failure handler needs in ``ctx.obj``."""
    ctx.obj = CommandState(debug=debug)


ConfigOption = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config; defaults run as they are.")]
ResumeOption = Annotated[bool, typer.Option("--resume", help="Continue the run in run_dir from its last checkpoint.")]
SetOption = Annotated[list[str] | None, typer.Option("--set", "-s", help="Override a field: section.field=value.")]


def _fail(error: Exception) -> NoReturn:
    """Print one line naming the cause (the run directory keeps what was written) and exit 2."""
    console.print(f"[bold red]error:[/] {escape(errors.one_line(error))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=errors.EXIT_KNOWN)


def _progress(terminal: TextIO | None = None) -> Progress:
    shown = console if terminal is None else Console(file=terminal)
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=shown)


@app.command()
def pretrain(config: ConfigOption = None, set_: SetOption = None) -> None:
    """Pre-train the TinyDiT base model by flow matching on rendered shapes."""
    cfg = load_config(PretrainConfig, config, set_)
    from spotlight.loop.pretrain import pretrain as run_pretrain

    with _progress() as progress:
        task = progress.add_task("pretrain", total=cfg.steps, status="")
        final = run_pretrain(cfg, on_step=lambda step, loss: progress.update(
            task, completed=step, status=f"loss {loss:.4f}"))
    console.print(f"base model written to {final}")


def _train_progress(terminal: TextIO, state: ProgressState) -> Live:
    """The progress line of ``spotlight train`` (spotlight/components/progress_line.py), redrawn every second on
    ``terminal``.

    Rich's live display would replace sys.stdout and sys.stderr by proxies that print above the line,
    but only on a real terminal: Ray's driver-side prints (node-death dumps, "marked dead" notices) then
    reached the screen on a TTY while a pipe sent them to the run's log. The redirection is off, so
    they go to descriptors 1 and 2, which `output_to_log` points at RUN_DIR/spotlight.log.
    """
    return Live(ProgressLine(state), console=Console(file=terminal), refresh_per_second=1,
                redirect_stdout=False, redirect_stderr=False)


def _stop_line(line: Live) -> None:
    """Stop the progress line and end its line, so what follows (a stop's line, an error) starts one of its own
    (rich ends it on a terminal only)."""
    started = line.is_started
    line.stop()
    if started and not line.console.is_terminal:
        line.console.file.write("\n")


def _summary_table(summary: Any) -> Table:
    """Validations of the run: the score that picks the best model first (strict accuracy only where the
    reward defines one; a reward without a strict flag has no strict column, its mean reward is the score)."""
    from spotlight.loop.evaluation import score_is_strict

    strict = all(score_is_strict(record) for record in summary.validation)
    table = Table(title=f"spotlight train: {summary.run_dir}")
    columns = ("iteration", "wall s", "val strict acc", "val reward", "rollout reward") if strict else \
        ("iteration", "wall s", "val mean reward", "rollout reward")
    for column in columns:
        table.add_column(column, justify="right")
    rollout_reward = {r["iteration"]: r.get("rollout/reward_mean") for r in summary.history}
    for record in summary.validation:
        reward = rollout_reward.get(record["iteration"])
        scores = [f"{record['val/strict_accuracy']:.3f}"] if strict else []
        table.add_row(str(record["iteration"]), f"{record['time/wall_s']:.0f}", *scores, f"{record['val/reward']:.3f}",
                      "-" if reward is None else f"{reward:.3f}")
    return table


@app.command(help=f"{TRAIN_HELP}\n\n{TRAIN_DEFAULT_RUN}")
def train(
    ctx: typer.Context,
    config: ConfigOption = None,
    set_: SetOption = None,
    resume: ResumeOption = False,
    address: Annotated[str | None, typer.Option(
        help="Attach to a running Ray cluster ('auto'); default: a local cluster of logical nodes.")] = None,
) -> None:
    """Post-train the base model (the help text is written from the code's lists: cli_help.TRAIN_HELP)."""
    cfg = load_config(TrainConfig, config, [*(set_ or []), *([f"runtime.address={address}"] if address else [])])
    from spotlight.loop.text_encoders import plan_text_encoders
    from spotlight.models.pipelines.memory_estimate import (
        cuda_memory_bytes,
        run_memory_estimate,
        with_estimated_micro_batch,
    )

    estimate = run_memory_estimate(cfg)  # a pipeline folder's needs, read before any weight loads
    if estimate is not None and cfg.device != "cpu":  # where memory runs out; on the CPU it goes to the log
        device_bytes = cuda_memory_bytes(cfg.device)
        print(estimate.summary(device_bytes))
        # where the text encoders live, at the micro-batch the run will take (its log says it too); without a
        # GPU the run stops at its one error line
        encoders = None if device_bytes is None else plan_text_encoders(with_estimated_micro_batch(cfg), device_bytes)
        if encoders is not None:
            print(encoders.line)
    from spotlight.components.run_dir import ensure_run_dir

    run_log = ensure_run_dir(Path(cfg.run_dir)) / RUN_LOG_NAME  # a run_dir that cannot be used: one line
    from spotlight.trainer import train as run_train  # torch and the loop (seconds): after the cheap checks

    if isinstance(ctx.obj, CommandState):
        ctx.obj.run_log = run_log
    with ExitStack() as stack:
        # Descriptors 1 and 2 go to the log in every mode: Ray's node-death dumps, and the warnings and progress
        # bars that transformers, diffusers and tokenizers print while a pipeline folder loads; progress and
        # Spotlight's own warnings go to the terminal.
        terminal = stack.enter_context(output_to_log(run_log))
        state = ProgressState(label=str(cfg.mode), total=cfg.iterations, max_wall_s=cfg.runtime.max_wall_s)
        line = _train_progress(terminal, state)
        # Spotlight's warnings print above the progress line, through the console that draws it.
        stack.enter_context(log_to(run_log, AboveTheLine(line.console)))
        stack.callback(_stop_line, line)
        if estimate is not None and cfg.device == "cpu":
            logging.getLogger(__name__).info(estimate.summary(None))

        def show(iteration: int, record: dict[str, Any]) -> None:
            state.update(iteration, record, time.monotonic())
            if not line.is_started:  # shown from the first record on, so a run that cannot start prints only its error
                line.start()
            line.refresh()

        summary = run_train(cfg, resume=resume, on_iteration=show)
        if line.is_started and summary.history:  # a run stopped by runtime.max_wall_s ends at its last iteration
            state.total = summary.history[-1]["iteration"]
            line.refresh()
    Console().print(_summary_table(summary))
    _print_outcome(summary)
    _runtime_summary(summary.run_dir)
    _write_run_report(summary.run_dir)


def _print_outcome(summary: Any) -> None:
    """The best validation (what checkpoints/best holds) beside the final one, and the guard's stop line if any.

    A run can pass its peak; the best model is what a user ships, so the summary always names it.
    """
    from spotlight.trainer import describe_score

    best, final = summary.best, (summary.validation[-1] if summary.validation else None)
    if best is not None and final is not None:
        print(f"best: {describe_score(best)} at iteration {best['iteration']} "
              f"({summary.run_dir / 'checkpoints' / 'best'}); final: {describe_score(final)} at iteration "
              f"{final['iteration']}")
    if summary.stopped:
        print(summary.stopped)
    invalid = int(sum(record.get("rollout/invalid_samples", 0) for record in summary.history))
    if invalid:  # dropped from training: said once, with where the reasons are
        print(f"invalid samples: {invalid} over the run (the reward could not score them; left out of training); "
              f"the reasons are in {summary.run_dir / RUN_LOG_NAME}")


# What the utilisation totals divide by (spotlight/runtime/spot/usage.py, run_totals).
RUNTIME_LABELS = {"util/on_demand": "util/on_demand (busy / held)", "util/spot": "util/spot (busy / held)",
                  "util/spot_held_fraction": "spot held / run", "util/spot_held_s": "spot held device-s",
                  "util/spot_busy_s": "spot busy device-s",
                  # what the spot devices did with their held time (fractions summing to 1)
                  "util/spot_rollout": "  spot: rollout share", "util/spot_explore": "  spot: exploring",
                  "util/spot_eval": "  spot: validation share", "util/spot_weights": "  spot: loading weights",
                  "util/spot_starting": "  spot: starting", "util/spot_idle": "  spot: waiting for work"}


def _runtime_summary(run_dir: Path) -> None:
    """Print the Ray runtime's totals (summary.json), when the run had one."""
    import json

    path = run_dir / "summary.json"
    if not path.is_file():
        return
    totals = json.loads(path.read_text())
    table = Table(title=f"runtime ({totals['mode']})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in totals.items():
        if isinstance(value, float | int) and not isinstance(value, bool):
            table.add_row(RUNTIME_LABELS.get(name, name), f"{value:.4g}")
    Console().print(table)


def _write_run_report(run_dir: Path) -> None:
    """Write run_dir/report.html with the report writer, if this install has one."""
    try:
        from spotlight.report.html import write_report
    except ImportError:
        return
    out = write_report([run_dir], run_dir / "report.html")
    console.print(f"report written to {out}")


@app.command("eval")
def eval_(
    checkpoint: Annotated[Path, typer.Argument(help="A model directory (base model or a run's checkpoint).")],
    seeds_per_prompt: int = 4,
    num_steps: int = 10,
) -> None:
    """Score a checkpoint on its task's validation split: strict accuracy overall and per kind (ODE, fixed seeds)."""
    from spotlight.components.checkpoint import load_model
    from spotlight.loop.evaluation import evaluate
    from spotlight.task_presets import task_of

    model = load_model(checkpoint)
    task = task_of(model)
    result = evaluate(model, task.split()[1], task.make_reward(0.0), seeds_per_prompt, num_steps)
    table = Table(title=f"validation: {checkpoint}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in result.metrics().items():
        table.add_row(name, f"{value:.3f}")
    Console().print(table)


# stale-explore is spotlight's seeds without its devices: a measurement of staleness, not a cluster to simulate;
# disaggregated has its own simulated ladder (benchmarks/runtime/disaggregated.py --simulate)
ALL_SIM_MODES = ",".join(mode for mode in Mode if not mode.single_process_only and mode is not Mode.DISAGGREGATED)


def _parse_modes(modes: str) -> list[Mode]:
    """The modes of a comma-separated list; an unknown name is a one-line error naming the known ones."""
    try:
        return [Mode(name.strip()) for name in modes.split(",")]
    except ValueError as error:
        _fail(ValueError(f"--modes: {error}; pick from {', '.join(Mode)}"))


@app.command()
def simulate(
    config: ConfigOption = None,
    set_: SetOption = None,
    modes: Annotated[str, typer.Option(help=f"Comma-separated modes to compare, from {MODES_HELP}.")] = ALL_SIM_MODES,
    out: Annotated[Path | None, typer.Option(help="Write every mode's summary and timeline as JSON.")] = None,
) -> None:
    """Simulate the loop at cluster scale: time, dollars and utilisation to target for each mode.

    With -s model.pretrained=FOLDER the workload is the folder's (FLOPs counted from its configs, see
    `spotlight plan`); otherwise the config's typed workload section."""
    import json

    from spotlight.plan_config import PlanConfig
    from spotlight.sim.planning.folder_sim import simulation
    from spotlight.sim.simulator import simulate as run_simulation

    try:
        base, work, _ = simulation(load_config(PlanConfig, config, set_))
        if work is not None:
            console.print(f"workload from {work.folder}: {work.forward_flops / 1e12:.3g} TFLOP per forward, "
                          f"{work.update_flops_per_sample / 1e12:.3g} TFLOP of update per sample")
        results = {mode: run_simulation(base.model_copy(update={"mode": mode})) for mode in _parse_modes(modes)}
    except ValueError as error:  # the simulator's checks of its inputs: one line each
        _fail(error)
    table = Table(title="spotlight simulate")
    for column in ("mode", "iters", "hours", "dollars", "on-demand util", "spot util"):
        table.add_column(column, justify="right")
    for mode, result in results.items():
        summary = result.summary()
        table.add_row(mode, str(summary["iterations_to_target"]), f"{summary['time_to_target_h']:.2f}",
                      f"{summary['dollars_to_target']:.0f}", f"{summary['utilisation']['on_demand']:.2f}",
                      f"{summary['utilisation']['spot']:.2f}")
    Console().print(table)
    if out is not None:
        payload = {mode: {"summary": r.summary(), "timeline": r.timeline_dicts()} for mode, r in results.items()}
        out.write_text(json.dumps(payload, indent=2, default=float))
        console.print(f"wrote {out}")


@app.command()
def plan(
    deadline_hours: Annotated[float, typer.Argument(help="Time to target that the mix must meet.")],
    config: ConfigOption = None,
    set_: SetOption = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the plan as JSON on stdout, for tools.")] = False,
) -> None:
    """Price a run before renting it: seconds per iteration, memory per GPU, the cheapest cluster for a deadline.

    The workload comes from -s model.pretrained=FOLDER (a pipeline folder, weights optional, or a shipped
    config: sd3.5-medium, qwen-image) with the training fields (rollout.*, train.*) and plan.gpu."""
    import json

    from spotlight.plan_config import PlanConfig
    from spotlight.sim.planning.plan_report import make_plan
    from spotlight.sim.planning.plan_text import print_plan

    try:
        report = make_plan(load_config(PlanConfig, config, set_), deadline_hours)
    except ValueError as error:  # the folder's, the profile's, the fit's and the simulator's checks: one line each
        _fail(error)
    if report.with_exploration is None:
        _fail(RuntimeError(f"no mix meets {deadline_hours:g} h (the fastest reaches the target in "
                           f"{report.fastest_h:.2f} h): raise the deadline or add device options"))
    if json_:
        sys.stdout.write(json.dumps(report.to_json(), indent=1, default=str) + "\n")
    else:
        print_plan(report, Console())


@app.command()
def report(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run directories to compare (each with metrics.jsonl).")],
    out: Annotated[Path | None, typer.Option(help="HTML file; default RUN_DIR/report.html for one run, "
                                                  "else ./report.html.")] = None,
) -> None:
    """Write one self-contained HTML page comparing runs: accuracy vs time and cost, utilisation, planner, τ."""
    from spotlight.report.html import write_report

    default = run_dirs[0] / "report.html" if len(run_dirs) == 1 else Path("report.html")
    path = write_report(run_dirs, out or default)
    console.print(f"wrote {path}")


@app.command("serve-reward")
def serve_reward(
    config: ConfigOption = None,
    set_: SetOption = None,
    task: Annotated[str, typer.Option(help=f"Without -c: whose toy reward to serve, {TASK_HELP}.")] = "ocr",
    device: Annotated[str | None, typer.Option(help="Where the reward's models run (cpu, cuda:1); "
                                                     "default: reward.device.")] = None,
    host: Annotated[str, typer.Option(help="Address to bind; the service has no authentication.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (0 picks a free one).")] = 8765,
    max_batch: Annotated[int, typer.Option(help="Most samples scored in one call of the reward.")] = 256,
    max_wait_ms: Annotated[float, typer.Option(help="How long a request waits for others to join its batch.")] = 10,
    max_image_side: Annotated[int, typer.Option(help="Largest image side accepted (-c rewards take any size).")] = 2048,
) -> None:
    """Serve a reward over HTTP (POST /score, GET /health) for HTTPReward clients (reward.name: http).

    With -c, the reward the config's reward: section names (built-in, composite or pkg.module:function)
    at any image size; without, the toy task's reward at its task's image size.
    """
    from spotlight.cli_serve import served_reward
    from spotlight.rewards.server.server import RewardServer, ServerLimits

    cfg = load_config(TrainConfig, config, set_) if config is not None or set_ else None
    served = served_reward(cfg, task, device)  # a bad model folder or function: one line
    try:
        server = RewardServer(served.reward, host, port, max_batch, max_wait_ms / 1000,
                              image_size=served.image_size, limits=ServerLimits(max_image_side=max_image_side))
    except (ValueError, OSError) as error:
        _fail(RuntimeError(f"cannot serve on {host}:{port} ({error}); pick another --port or a known --task"))
    console.print(f"serving {served.description} at {server.url} (Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@app.command("make-tiny-pipeline")
def make_tiny_pipeline(
    ctx: typer.Context,
    family: Annotated[str, typer.Argument(help=f"{FAMILY_HELP}.")],
    folder: Annotated[Path, typer.Argument(help="Where to save it (created; must be empty or absent).")],
    seed: Annotated[int, typer.Option(help="Every random weight is drawn from this seed.")] = 0,
) -> None:
    """Save a tiny random diffusers pipeline folder (real classes, a few layers) for model.pretrained, no download."""
    from spotlight.models.pipelines.tiny import TINY_PIPELINES, save_tiny_pipeline

    if family not in TINY_PIPELINES:
        _fail(ValueError(f"unknown family {family!r}: use one of {', '.join(TINY_PIPELINES)}"))
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        _fail(ValueError(f"{folder} exists and is not an empty folder: pass a new folder"))
    # What transformers and diffusers print while the pipeline is built and saved (processor notices,
    # "Writing model shards" bars) goes to a log in the temporary folder, which an error names.
    log = errors.crash_log_path(None)
    if isinstance(ctx.obj, CommandState):
        ctx.obj.run_log = log
    with output_to_log(log), log_to(log):
        save_tiny_pipeline(family, folder, seed)  # type: ignore[arg-type]
    console.print(f"wrote a tiny {family} pipeline to {folder} (spotlight train -s model.pretrained={folder})")


def main() -> None:
    """The ``spotlight`` command (the console script, ``python -m spotlight`` and ``python -m spotlight.cli``).

    The process ends once the command is done, without the interpreter's finalization
    (`spotlight.components.process_exit`: 1-3 s of wall after every command otherwise).
    """
    from spotlight.components.process_exit import exit_after

    exit_after(lambda: app(prog_name="spotlight"))


if __name__ == "__main__":
    main()
