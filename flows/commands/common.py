"""Pieces every command module shares: the two consoles, the recipe options, config loading, the error style and
the exit-code table.

Streams: a command's result (a table, a report, the path it produced) goes to stdout, so it can be piped; progress,
plans and status lines go to stderr (``console``).

A command that runs a long flow shows a progress bar (:func:`watch_progress`) polled from a library status function
that reads the stage's files, so the flow needs no hook for it and the bar matches ``<stage> status`` output.

Exit codes, the same for every command:

* ``0``: success.
* ``1`` (``EXIT_FAILED``): the work ran and its verdict is negative, or it could not finish (the gate refused the
  draft, regen shards failed, preflight checks failed, a server or the Hub did not answer).
* ``2`` (``EXIT_USAGE``): bad usage, config or input (a ``ConfigError``, a missing or unfinished input directory,
  a file that is not what it should be).
* ``3`` (``EXIT_INCONCLUSIVE``): ``eagle3 gate`` could not tell, noise or a failed sanity check; nothing promoted.

An expected failure prints one ``error: <message>`` line on stderr and no traceback (``--verbose`` logs it):
commands raise ``CliError`` (or let the library's input and config errors propagate) and ``ErrorHandlingGroup``,
the root command's class, turns them into that line and the code. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from typer.core import TyperGroup

from eagle3.config import PipelineConfig
from eagle3.recipes import resolve

logger = logging.getLogger(__name__)

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INCONCLUSIVE = 3

console = Console(stderr=True)  # progress and status
results = Console(soft_wrap=True)  # never wrapped or cut, so `| grep` sees whole lines

RecipeOption = typer.Option("tiny", "--recipe", "-r", help="Named recipe (tiny, llama3_8b, kimi_k2_5).")
ConfigOption = typer.Option(None, "--config", "-c", help="A YAML config file instead of a recipe.")
SetOption = typer.Option(None, "--set", "-s", help="Override a config value: --set train.lr=2e-4 (repeatable).")
JsonOption = typer.Option(False, "--json", help="Print JSON (for scripts).")


class CliError(Exception):
    """An expected failure: printed as one ``error:`` line, then the command exits with ``code``."""

    def __init__(self, message: str, *, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


# The exit-code table of the library's expected exceptions: (module, class name, exit code), checked in order.
EXPECTED_ERRORS: tuple[tuple[str, str, int], ...] = (
    ("eagle3.config", "ConfigError", EXIT_USAGE),
    ("builtins", "FileNotFoundError", EXIT_USAGE),  # includes eagle3.layout.StageInputError: a missing input dir
    ("eagle3.data.catalog", "CatalogError", EXIT_USAGE),  # an unknown dataset adapter in the config's sources
    ("eagle3.regen.plan", "RegenInputError", EXIT_USAGE),
    ("eagle3.data.hub", "HubError", EXIT_FAILED),
    ("eagle3.serve.launch", "LaunchError", EXIT_FAILED),
)


def exit_code_for(exc: Exception) -> int | None:
    """The exit code of an expected failure; None for anything else (a bug, which keeps its traceback).

    Only modules already loaded are looked at: an exception can only come from a module that was imported, and
    importing, say, the capture stage (torch) would make a typo in ``--set`` take seconds to report."""
    if isinstance(exc, CliError):
        return exc.code
    for module, name, code in EXPECTED_ERRORS:
        loaded = sys.modules.get(module)
        if loaded is not None and isinstance(exc, getattr(loaded, name)):
            return code
    return None


class ErrorHandlingGroup(TyperGroup):
    """The root command: every subcommand runs inside it, so this is the one place expected errors are reported."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:  # click's own Exit/UsageError are not in the table and pass through unchanged
            code = exit_code_for(exc)
            if code is None:
                raise
            logger.debug("expected failure, exit %d", code, exc_info=True)
            typer.echo(f"{click.style('error:', fg='red')} {exc}", err=True)
            raise typer.Exit(code) from None


@contextmanager
def bad_input(*kinds: type[Exception]) -> Iterator[None]:
    """Count these exceptions as bad input (exit 2) inside the block: e.g. the ``ValueError`` a library function
    raises for a malformed shard or checkpoint, which elsewhere would be a bug."""
    try:
        yield
    except kinds as exc:
        raise CliError(str(exc)) from exc


def resolve_config(recipe: str, config: Path | None, overrides: list[str] | None) -> PipelineConfig:
    """The config of ``--config`` (a YAML file) or else ``--recipe``, with the ``--set`` overrides."""
    return resolve(config if config is not None else recipe, overrides)


def print_table(title: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """A result table on stdout: a rich table on a terminal, tab-separated lines (a header, then one row per line,
    nothing cut) when piped, so ``| grep`` and ``| cut -f1`` see every value whole."""
    if sys.stdout.isatty():
        results.print(rich_table(title, rows))
        return
    for line in ([list(rows[0])] if rows else []) + [list(row.values()) for row in rows]:
        typer.echo("\t".join(str(v) for v in line))


def rich_table(title: str, rows: Sequence[Mapping[str, Any]]) -> Table:
    """Rows of one shape as a rich table, a column per key (also for tables shown as status on stderr)."""
    table = Table(title=title)
    for key in rows[0] if rows else []:
        table.add_column(str(key))
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    return table


def print_json(data: Any) -> None:
    """A result as indented JSON on stdout (the ``--json`` form of a command)."""
    typer.echo(json.dumps(data, indent=2))


# (done, total, extra text shown after the count), or None while the stage has nothing to report yet.
Poll = Callable[[], tuple[int, int, str] | None]


@contextmanager
def watch_progress(label: str, poll: Poll, *, every_s: float = 2.0) -> Iterator[None]:
    """A progress bar on stderr for the block: a thread calls ``poll`` every ``every_s`` seconds (and once more when
    the block exits, so the last count shows) and draws done / total, the extra text and an ETA."""
    stop = threading.Event()

    def draw() -> None:
        columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[extra]}"),
                   TimeRemainingColumn())
        with Progress(*columns, console=console) as bar:
            task = bar.add_task(label, total=None, extra="")
            while True:
                stopping = stop.wait(every_s)
                polled = poll()
                if polled is not None:
                    done, total, extra = polled
                    bar.update(task, completed=done, total=total, extra=extra)
                if stopping:
                    return

    watcher = threading.Thread(target=draw, name=f"{label}-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
