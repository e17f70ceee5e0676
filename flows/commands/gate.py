"""``eagle3 launch-sglang``, ``eagle3 preflight`` (quick, library only) and ``eagle3 gate`` (runs the gate flow)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from flows.commands.common import (
    EXIT_FAILED,
    EXIT_INCONCLUSIVE,
    CliError,
    ConfigOption,
    RecipeOption,
    SetOption,
    console,
    prefect_api,
    resolve_config,
    results,
    stopping,
)

# eagle3.gate.preflight imports torch: 9 s that every `eagle3` command would pay at start-up
if TYPE_CHECKING:
    from eagle3.config.pipeline import PipelineConfig
    from eagle3.gate.preflight import Check

DraftOption = typer.Option(
    None, "--draft", "-d", help="Draft export dir (config.json + model.safetensors)."
)
EngineOption = typer.Option(
    "sglang",
    "--engine",
    help="sglang (SGLang: on GPUs, or this CPU's runtime when "
    "server.device=cpu) or reference (the project's server).",
)


def _default_draft(root: Path) -> Path | None:
    from eagle3.registry import Registry

    champion = Registry(root).champion()
    return Path(champion.draft_dir) if champion else None


def launch_sglang(
    arm: str = typer.Option(..., "--arm", help="baseline or eagle3."),
    draft: Path | None = DraftOption,
    engine: str = EngineOption,
    run: bool = typer.Option(
        False, "--run/--print", help="Start the server and wait (default: print the command)."
    ),
    port: int | None = typer.Option(None, help="Port (default: server.port; 0 picks a free one)."),
    recipe: str = RecipeOption,
    config: Path | None = ConfigOption,
    set_: list[str] | None = SetOption,
) -> None:
    """Print (or run) the launch command of one arm, generated from config for the pinned SGLang."""
    from eagle3.serve.launch import LaunchError
    from eagle3.serve.launch_commands import build_launch, check_engine

    cfg = resolve_config(recipe, config, set_)
    if run:
        check_engine(cfg, engine)
    if arm == "eagle3" and draft is None:
        draft = _default_draft(cfg.root_path)
    try:
        command = build_launch(cfg, arm, engine=engine, draft=draft, port=port)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if not run:
        typer.echo(command.shell())
        return
    try:
        # Ctrl-C or `kill` stops the server, then exits 130 / 143
        with stopping(resumable=False), command.server() as server:
            console.print(
                f"{arm} arm healthy at {server.url} (log {server.log_path}); Ctrl-C stops it"
            )
            code = server.wait()
    except LaunchError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    raise typer.Exit(code)


def preflight(
    draft: Path = typer.Option(..., "--draft", "-d", help="Draft export dir to check."),
    features: Path | None = typer.Option(
        None, help="Capture stage dir (features/<fp>) whose footer names the layers."
    ),
    url: str | None = typer.Option(
        None, help="A live speculative server: also run the runtime checks against it."
    ),
    baseline_url: str | None = typer.Option(
        None, help="With --url, its baseline: probe that --url samples as gate.sampling does."
    ),
    smoke_prompts: int = typer.Option(4, help="Prompts in the runtime smoke run."),
    min_accept: float = typer.Option(
        1.5, help="Smoke accept length below this fails (a broken aux path gives ~1)."
    ),
    recipe: str = RecipeOption,
    config: Path | None = ConfigOption,
    set_: list[str] | None = SetOption,
) -> None:
    """Static checks of a draft and both launch commands; with --features, an offline acceptance smoke on a few
    captured rows (CPU); with --url, runtime checks too. Exit 1 on any failure."""
    from eagle3.gate import preflight as pf
    from eagle3.serve.launch_commands import build_launch

    cfg = resolve_config(recipe, config, set_)
    port = cfg.server.port or 30000
    checks = pf.run_static(
        cfg,
        draft,
        baseline=build_launch(cfg, "baseline", engine="sglang", port=port),
        spec=build_launch(cfg, "eagle3", engine="sglang", draft=draft, port=port),
        features_dir=features,
    )
    if features is not None and not pf.failed(checks):
        with console.status("offline acceptance smoke (CPU)"):
            checks += pf.run_offline(cfg, draft, features)
    if url:
        checks += _runtime(cfg, url, draft, smoke_prompts, min_accept, baseline_url)
    for check in checks:
        colour = "green" if check.ok else "red"
        results.print(
            f"[{colour}]{'PASS' if check.ok else 'FAIL'}[/{colour}] {check.name}: {check.message}"
        )
    failed = pf.failed(checks)
    if failed:
        raise CliError(f"{len(failed)} of {len(checks)} preflight checks failed", code=EXIT_FAILED)


def _runtime(
    cfg: PipelineConfig, url: str, draft: Path, n: int, min_accept: float, baseline_url: str | None
) -> list[Check]:
    from eagle3.gate.preflight_runtime import run_runtime
    from eagle3.gate.release import gate_prompts

    prompts = gate_prompts(cfg, per_set=max(1, n))[:n]
    ids = [list(p.input_ids) for p in prompts]
    with console.status(f"runtime preflight against {url}"):
        checks = run_runtime(url, ids, export_dir=draft, min_accept=min_accept)
    if baseline_url:  # before a sampled gate: does the speculative server honour sampling?
        from eagle3.gate.sampling_probe import check_sampling

        sampled = [p.params() for p in cfg.gate.sampling.values() if not p.greedy]
        with console.status(f"sampling probe against {url} and {baseline_url}"):
            checks += [check_sampling(url, baseline_url, ids, params) for params in sampled]
    return checks


def gate(
    draft: list[Path] = typer.Option(
        ..., "--draft", "-d", help="Candidate draft export dir (repeat to compare)."
    ),
    baseline_url: str | None = typer.Option(
        None, help="Running baseline server (with --spec-url)."
    ),
    spec_url: str | None = typer.Option(
        None, help="Running speculative server (with --baseline-url)."
    ),
    champion_url: str | None = typer.Option(
        None, help="Running server of the champion draft (URL mode)."
    ),
    features: Path | None = typer.Option(None, help="Capture stage dir for the layer-id check."),
    promote: bool = typer.Option(
        True, "--promote/--no-promote", help="Promote the best passing draft."
    ),
    force: bool = typer.Option(False, help="Measure again even if this exact gate already ran."),
    recipe: str = RecipeOption,
    config: Path | None = ConfigOption,
    set_: list[str] | None = SetOption,
) -> None:
    """Benchmark drafts against the baseline (and the champion) in interleaved rounds; PASS promotes (exit 0), FAIL
    exits 1, INCONCLUSIVE (noise or a failed sanity check: measure again on a quieter machine) exits 3."""
    launches = () if baseline_url else ("gate",)  # the arms are launched on server.engine
    cfg = resolve_config(recipe, config, set_, stages=launches)
    with (
        prefect_api(meanwhile=lambda: importlib.import_module("flows.gate")),
        console.status("running the gate (see the Prefect UI for progress)"),
    ):
        from flows.gate import gate_flow

        result = gate_flow(
            cfg,
            [str(d) for d in draft],
            baseline_url=baseline_url,
            spec_url=spec_url,
            champion_url=champion_url,
            features_dir=str(features) if features else None,
            promote=promote,
            force=force,
        )
    typer.echo(Path(result.markdown).read_text())
    typer.echo(f"report: {result.out_dir}")
    if result.verdict == "inconclusive":
        raise CliError(
            f"the gate was inconclusive, nothing promoted (report: {result.out_dir})",
            code=EXIT_INCONCLUSIVE,
        )
    if not result.passed:
        raise CliError(f"the gate passed no draft (report: {result.out_dir})", code=EXIT_FAILED)


def register(app: typer.Typer) -> None:
    app.command("launch-sglang")(launch_sglang)
    app.command("preflight")(preflight)
    app.command("gate")(gate)
