"""``eagle3 regen`` (the regen flow), ``eagle3 regen status`` and ``eagle3 retry-shards``.

``regen status`` reads only the stage's files (journals, shard footers, plan.json), so it works from another
terminal while a 50-hour job runs. ``retry-shards --failed`` reruns the shards listed in ``failed_shards.json``
with the config saved in the stage's ``config.yaml`` (``--set`` can point it at other servers).
"""

from __future__ import annotations

from pathlib import Path

import typer

from eagle3.config.pipeline import PipelineConfig
from eagle3.stage import Progress, StageResult
from flows.commands.common import (
    ConfigOption,
    JsonOption,
    Poll,
    RecipeOption,
    SetOption,
    console,
    flow_result,
    prefect_api,
    print_json,
    resolve_config,
    watch_progress,
)

RunOption = typer.Option(..., "--run", help="A regen stage dir (<root>/regen/<fp>).")


def _regen_poll(regen_dir: Path, shard_ids: list[int] | None) -> Poll:
    """``regen_status`` of this run's shards for :func:`watch_progress`."""
    from eagle3.regen.status import regen_status
    from eagle3.rundir.layout import StageInputError

    def poll() -> tuple[Progress, str] | None:
        try:
            status = regen_status(regen_dir, shard_ids=shard_ids)
        except StageInputError:
            return None  # the flow has not written plan.json yet
        return (
            status.progress,
            f"failed shards {status.failed_shards}" if status.failed_shards else "",
        )

    return poll


def _warm_up(config: PipelineConfig) -> None:
    """Import the flow and load the target's tokenizer (cached per process: the shards reuse it) while Prefect's
    temporary server starts, instead of after it. A tokenizer that fails to load is left to the first shard, which
    reports it the way a stage reports errors."""
    import importlib
    from contextlib import suppress

    from eagle3.target_io import load_tokenizer

    importlib.import_module("flows.regen")
    with suppress(Exception):  # a warm-up only: the shard raises the same error in its place
        load_tokenizer(config.target)


def run_flow(
    config: PipelineConfig, shard_ids: list[int] | None, prompts: Path | None
) -> StageResult:
    """Run the regen flow with a CLI progress bar; exit 1 when shards failed."""
    from eagle3.lineage import Lineage
    from eagle3.regen.plan import regen_dir_for
    from eagle3.rundir.layout import REGEN_INPUT

    prompts_dir = Lineage(config).input(REGEN_INPUT, prompts)
    with (
        prefect_api(meanwhile=lambda: _warm_up(config)),
        watch_progress("regen", _regen_poll(regen_dir_for(config, prompts_dir), shard_ids)),
    ):
        from flows.regen import regen_flow

        state = regen_flow(
            config, shard_ids=shard_ids, prompts_dir=str(prompts_dir), return_state=True
        )
    result = flow_result(state)  # failed shards: their list and the re-trigger command
    typer.echo(f"regen stage: {result.out_dir} (done: {result.done})")
    return result


def _status(
    run: Path | None = typer.Option(
        None, "--run", help="A regen stage dir (default: the one this config names)."
    ),
    as_json: bool = JsonOption,
    recipe: str = RecipeOption,
    config: Path | None = ConfigOption,
    set_: list[str] | None = SetOption,
) -> None:
    """Progress, throughput and ETA of a regen stage, from its journals and shard files."""
    from eagle3.lineage import Lineage
    from eagle3.regen.status import regen_status

    status = regen_status(run or Lineage(resolve_config(recipe, config, set_)).input("regen"))
    if as_json:
        print_json(status.to_dict())
        return
    typer.echo(
        f"{status.regen_dir}\n{status.progress.describe()}, {status.tokens:,} tokens\nshards (this run's): "
        f"{status.shards_done}/{status.shards_total} done, running {status.shards_running}, failed "
        f"{status.failed_shards}, finished {status.finished}"
        + (f"\n{status.waiting_for_servers}" if status.waiting_for_servers else "")
    )


def regen(
    ctx: typer.Context,
    recipe: str = RecipeOption,
    config: Path | None = ConfigOption,
    set_: list[str] | None = SetOption,
    prompts: Path | None = typer.Option(
        None, "--prompts", help="Prompts stage dir (default: this config's)."
    ),
    shard: list[int] | None = typer.Option(
        None, "--shard", help="Only these shard ids (repeatable)."
    ),
) -> None:
    """Run the regen flow (without a subcommand)."""
    if ctx.invoked_subcommand is None:
        cfg = resolve_config(recipe, config, set_, stages=("regen",))
        run_flow(cfg, list(shard) if shard else None, prompts)


def retry_shards(
    run: Path = RunOption,
    failed: bool = typer.Option(False, "--failed", help="Rerun the shards in failed_shards.json."),
    shard: list[int] | None = typer.Option(
        None, "--shard", help="Rerun these shard ids (repeatable)."
    ),
    set_: list[str] | None = SetOption,
) -> None:
    """Rerun failed (or given) regen shards with the stage's saved config."""
    from eagle3.recipes import resolve
    from eagle3.regen.plan import read_plan
    from eagle3.rundir.layout import CONFIG_FILE, PLAN_FILE, find_input, read_failed_shards

    regen_dir = find_input(
        run.parent.parent,
        "regen",
        None,
        explicit=run,
        option="--run",
        produce="eagle3 regen",
        marker=PLAN_FILE,
    )
    ids = list(shard or [])
    if failed:
        ids += read_failed_shards(regen_dir)
    if not ids:
        console.print("nothing to retry (no failed shards; pass --failed or --shard N)")
        return
    prompts = read_plan(regen_dir).prompts_dir
    run_flow(resolve(regen_dir / CONFIG_FILE, list(set_ or [])), sorted(set(ids)), prompts)


def register(app: typer.Typer) -> None:
    group = typer.Typer(
        help="Regenerate the prompts with the target (the regen flow).", invoke_without_command=True
    )
    group.callback()(regen)
    group.command("status")(_status)
    app.add_typer(group, name="regen")
    app.command("retry-shards")(retry_shards)
