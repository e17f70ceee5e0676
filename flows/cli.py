"""The ``eagle3`` command: the user's face over the flows (long stages) and the library (quick commands).

Long stages run as Prefect flows so they show up in the Prefect UI; quick commands (config, status,
preflight, serve) call the library directly and never pay Prefect's import and start-up cost. Each
stage's commands live in ``flows/commands/<stage>.py``: the command functions at module level, and a
``register(app)`` function that adds them (``app.command("name")(function)``, a group's with
``app.add_typer``) in the order ``eagle3 --help`` lists them. ``flows/commands/common.py`` holds
what they share: results on stdout and status on stderr, one ``error: <message>`` line for an
expected failure, and the exit-code table (0 success, 1 the work ran and its verdict is negative, 2
bad usage, config or input).
"""

from __future__ import annotations

import gc
import importlib
import logging
import os

import typer

from flows.commands.common import ErrorHandlingGroup, console_tracebacks_for_bugs_only

COMMAND_MODULES: tuple[str, ...] = (
    "flows.commands.config",
    "flows.commands.dev",
    "flows.commands.run",
    "flows.commands.gate",
    "flows.commands.capture",
    "flows.commands.vocab",
    "flows.commands.train",
    "flows.commands.discover",
    "flows.commands.normalize",
    "flows.commands.regen",
    "flows.commands.serve",
    "flows.commands.push",
)

app = typer.Typer(
    name="eagle3",
    cls=ErrorHandlingGroup,
    help="Grow EAGLE-3 draft training data with the target itself, train the draft, and gate it for SGLang.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
)


@app.callback()
def global_options(
    ctx: typer.Context,
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
) -> None:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    # one INFO line per HTTP request (Prefect's API, the regen servers) drowns the stage logs
    if not verbose:
        logging.getLogger("httpx").setLevel(logging.WARNING)
        # an expected failure: one error line, as below
        ctx.with_resource(console_tracebacks_for_bugs_only())


for _module in COMMAND_MODULES:
    importlib.import_module(_module).register(app)


def main() -> None:
    """The ``eagle3`` console script: the app, whose objects are then frozen out of the garbage collector
    (``gc.freeze``) before the interpreter exits. Its last collections over the heaps of Prefect, pydantic and
    transformers cost each command 0.4-1.0 s after its work was done (measured: the regen command's exit), for
    memory the process hands back anyway; exit handlers (Prefect's log and event flushes) still run."""
    try:
        app()
    finally:
        gc.freeze()


if __name__ == "__main__":
    main()
