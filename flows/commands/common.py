"""Pieces every command module shares: the two consoles, the recipe options, config loading, the error style and
the exit-code table.

Streams: a command's result (a table, a report, the path it produced) goes to stdout, so it can be piped; progress,
plans and status lines go to stderr (``console``).

Every command that runs a flow does so inside :func:`prefect_api`, the one Prefect start-up policy: the server
``PREFECT_API_URL`` names when one is configured (reused, nothing started), else a temporary local API server that
this command starts, waits for up to ``PREFECT_STARTUP_TIMEOUT_S`` (a busy 2-core machine needs more than Prefect's
own 20 s) and stops on exit, and that dies with the command even on ``kill -9``
(``eagle3.runtime.procs.die_with_parent``,
as the reference server and the training workers do).
The server runs in a process group of its own, so a Ctrl-C or a SIGTERM to the command's group
leaves it up until the flow runs are marked Crashed; if it dies anyway (an OOM kill), the command
ends at once with one line naming the cause and the command that resumes, instead of minutes of
Prefect's client retries against a server that will not come back.

:func:`prefect_api` also makes the command stoppable (``stopping``): SIGINT or SIGTERM, to the
process or its group, stops the run (``eagle3.runtime.stop``: no new unit, no promotion after the
signal, every child process gone) and exits 130 or 143 within ``EXIT_WITHIN_S``, with one line
saying how to resume.

A command that runs a long flow shows a progress bar (:func:`watch_progress`) polled from a library status function
that reads the stage's files, so the flow needs no hook for it and the bar matches ``<stage> status`` output and the
Prefect artifacts (one ``eagle3.stage.Progress``: percent, this run's rate, a human ETA).

Exit codes, the same for every command:

* ``0``: success.
* ``1`` (``EXIT_FAILED``): the work ran and its verdict is negative, or it could not finish (the gate refused the
  draft, regen shards failed, preflight checks failed, a server or the Hub did not answer).
* ``2`` (``EXIT_USAGE``): bad usage, config or input (a ``ConfigError``, a missing or unfinished input directory,
  a file that is not what it should be: an ``eagle3.errors.DataError`` such as an empty, cut-short, UTF-16 or
  not-JSON source, or a feature shard that differs from its manifest). A data error inside a stage fails its unit
  without Prefect retries; the stage then fails with ``eagle3.stage.UnitsDamaged``, a ``DataError`` too (exit
  ``2``, whatever the other units did), whose line ends with that unit's message.
* ``eagle3 serve`` (argparse, like SGLang's launcher): ``2`` for a bad flag, a missing ``--model`` directory or a
  port already in use; one line either way.
* ``3`` (``EXIT_INCONCLUSIVE``): ``eagle3 gate`` could not tell, noise or a failed sanity check; nothing promoted.
* ``130`` / ``143``: stopped by SIGINT (Ctrl-C) / SIGTERM; the same command resumes.

An expected failure prints one ``error: <message>`` line on stderr and no traceback (``--verbose`` logs it):
commands raise ``CliError`` (or let the library's input and config errors propagate) and ``ErrorHandlingGroup``,
the root command's class, turns them into that line and the code. Anything else is a bug and keeps its traceback.
A command that runs a flow reads the flow's failure back from its state (``flow_result``), so the same table
applies; and Prefect's log records of an expected failure (a unit's data error, the stage's ``UnitsFailed``) keep
their tracebacks for the Prefect UI but print without them on the console (``console_tracebacks_for_bugs_only``).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.core import TyperGroup

from eagle3.config.pipeline import PipelineConfig
from eagle3.recipes import resolve
from eagle3.runtime.procs import die_with_parent, free_port
from eagle3.serve.launch import is_healthy
from eagle3.stage import Progress as StageProgress
from eagle3.stage import RateWindow

logger = logging.getLogger(__name__)

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INCONCLUSIVE = 3

# The longest a stopped command takes to exit (Ctrl-C, SIGTERM): its children get SIGTERM at once
# and SIGKILL after ``eagle3.runtime.stop.CHILD_GRACE_S``; past this, or on a second Ctrl-C, every
# descendant is SIGKILLed and the command exits at once (what the pipeline writes survives kill -9).
EXIT_WITHIN_S = 30.0

# Seconds a temporary Prefect API server may take to answer
# (``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS``, when set, wins): Prefect's own 20 s default
# fails stage commands on a busy machine.
PREFECT_STARTUP_TIMEOUT_S = 120

console = Console(stderr=True)  # progress and status
results = Console(soft_wrap=True)  # never wrapped or cut, so `| grep` sees whole lines

RecipeOption = typer.Option(
    "tiny", "--recipe", "-r", help="Named recipe (tiny, llama3_8b, kimi_k2_5)."
)
ConfigOption = typer.Option(None, "--config", "-c", help="A YAML config file instead of a recipe.")
SetOption = typer.Option(
    None, "--set", "-s", help="Override a config value: --set train.lr=2e-4 (repeatable)."
)
JsonOption = typer.Option(False, "--json", help="Print JSON (for scripts).")


class CliError(Exception):
    """An expected failure: printed as one ``error:`` line, then the command exits with ``code``."""

    def __init__(self, message: str, *, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


# The exit-code table of the library's expected exceptions: (module, class name, exit code), checked
# in order.
EXPECTED_ERRORS: tuple[tuple[str, str, int], ...] = (
    ("eagle3.config.base", "ConfigError", EXIT_USAGE),
    # includes eagle3.rundir.layout.StageInputError: a missing input dir
    ("builtins", "FileNotFoundError", EXIT_USAGE),
    # an unknown dataset adapter in the config's sources
    ("eagle3.data.catalog", "CatalogError", EXIT_USAGE),
    ("eagle3.regen.plan", "RegenInputError", EXIT_USAGE),
    ("eagle3.data.hub", "HubError", EXIT_FAILED),
    # server.engine=sglang without its runtime
    ("eagle3.serve.launch_commands", "EngineUnavailable", EXIT_USAGE),
    ("eagle3.serve.launch", "LaunchError", EXIT_FAILED),
    # damaged or unusable input data: the message names file and fix
    ("eagle3.errors", "DataError", EXIT_USAGE),
    # units failed: the message ends with their errors
    ("eagle3.stage", "UnitsFailed", EXIT_FAILED),
    # no server answered (a unit's error: its stage fails)
    ("eagle3.regen.shard", "ShardFailed", EXIT_FAILED),
    # a pinned wheel absent, unreachable or altered; no gguf package, or a conversion that differs
    ("eagle3.worlds.packaged", "PackagedFileError", EXIT_USAGE),
    ("eagle3.worlds.gguf_target", "GGUFError", EXIT_USAGE),
    ("eagle3.errors", "Stopped", EXIT_FAILED),  # a stopped unit (the command exits 130 / 143)
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
        # click's own Exit/UsageError are not in the table and pass through unchanged
        except Exception as exc:
            code = exit_code_for(exc)
            if code is None:
                raise
            logger.debug("expected failure, exit %d", code, exc_info=True)
            typer.echo(f"{click.style('error:', fg='red')} {exc}", err=True)
            raise typer.Exit(code) from None


class _WithoutExpectedTracebacks(logging.Formatter):
    """A console handler's formatter that prints a record whose exception is an expected failure (the exit-code
    table) without its traceback, and every other record as ``inner`` does."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, Exception) and exit_code_for(error) is not None:
            # the record's other handlers (Prefect's API: the UI) keep the traceback
            record = copy.copy(record)
            record.exc_info, record.exc_text = None, None
        return self.inner.format(record)


@contextmanager
def console_tracebacks_for_bugs_only() -> Iterator[None]:
    """For the block, the root logger's handlers (the console: a command's own, or Prefect's) print an expected
    failure's record without its traceback: Prefect logs a failed task or flow run with its exception's traceback
    (a unit's ``DataError``, a stage's ``UnitsFailed``: two to four of them above the one ``error:`` line of a
    damaged shard). Its other handlers, Prefect's API among them, keep the record whole; a bug keeps its traceback
    everywhere."""
    handlers = [
        h
        for h in logging.getLogger().handlers
        if not isinstance(h.formatter, _WithoutExpectedTracebacks)
    ]
    saved = [handler.formatter for handler in handlers]
    for handler in handlers:
        handler.setFormatter(_WithoutExpectedTracebacks(handler.formatter))
    try:
        yield
    finally:
        for handler, formatter in zip(handlers, saved, strict=True):
            handler.setFormatter(formatter)  # type: ignore[arg-type]


def flow_result(state: Any) -> Any:
    """The result of a flow run a command ran (``return_state=True``), or its failure as the command's: the
    exception the flow raised when it is an expected one (its exit code and one line, e.g. ``UnitsDamaged``: 2),
    else the state's name and message (exit 1; a bug's traceback is in the flow's log above)."""
    if state.is_completed():
        return state.result()
    raised = state.result(raise_on_failure=False)
    if isinstance(raised, Exception) and exit_code_for(raised) is not None:
        raise raised
    raise CliError(f"{state.name}: {state.message}", code=EXIT_FAILED)


@contextmanager
def bad_input(*kinds: type[Exception]) -> Iterator[None]:
    """Count these exceptions as bad input (exit 2) inside the block: e.g. the ``ValueError`` a library function
    raises for a malformed shard or checkpoint, which elsewhere would be a bug."""
    try:
        yield
    except kinds as exc:
        raise CliError(str(exc)) from exc


def resolve_config(
    recipe: str, config: Path | None, overrides: list[str] | None, *, stages: Sequence[str] = ()
) -> PipelineConfig:
    """The config of ``--config`` (a YAML file) or else ``--recipe``, with the ``--set`` overrides.
    ``stages``: the stages the command runs, whose packages are checked now
    (``eagle3.requirements``): a missing extra exits 2 in one line before anything starts."""
    resolved = resolve(config if config is not None else recipe, overrides)
    if stages:
        from eagle3.requirements import check_requirements

        check_requirements(resolved, stages)
    return resolved


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


# A stage's progress now (``eagle3.stage.Progress``) and extra text for the bar (loss, accept
# length), or None while the stage has nothing to report yet.
Poll = Callable[[], tuple[StageProgress, str] | None]


@contextmanager
def spinner(text: str) -> Iterator[None]:
    """A transient spinner with the elapsed time on stderr while a quick step with no progress of its own runs."""
    with Progress(
        SpinnerColumn(), TextColumn(text), TimeElapsedColumn(), console=console, transient=True
    ) as bar:
        bar.add_task(text, total=None)
        yield


@contextmanager
def watch_progress(
    label: str, poll: Poll, *, every_s: float = 2.0, window_s: float = 300.0
) -> Iterator[None]:
    """A progress bar on stderr for the block: a thread calls ``poll`` every ``every_s`` seconds (and once more when
    the block exits, so the last count shows) and draws the percent bar, done / total, this run's rate over the last
    ``window_s`` seconds, the extra text and a human ETA (the same ``Progress`` the Prefect artifacts show).
    Prefect's console log lines go through the same console meanwhile, so they print above the bar."""
    stop, rates = threading.Event(), RateWindow(window_s)

    def draw() -> None:
        with Progress(
            TextColumn(label), BarColumn(), TextColumn("{task.fields[line]}"), console=console
        ) as bar:
            task = bar.add_task(label, total=None, line="")
            while True:
                stopping = stop.wait(every_s)
                polled = poll()
                if polled is not None:
                    progress, extra = rates.observe(polled[0]), polled[1]
                    line = " - ".join(part for part in (progress.describe(), extra) if part)
                    bar.update(
                        task, completed=progress.done, total=max(progress.total, 1), line=line
                    )
                if stopping:
                    return

    watcher = threading.Thread(target=draw, name=f"{label}-progress", daemon=True)
    with prefect_logs_on(console):
        watcher.start()
        try:
            yield
        finally:
            stop.set()
            watcher.join()


@contextmanager
def prefect_logs_on(target: Console) -> Iterator[None]:
    """Print Prefect's console log lines through ``target`` for the block: a rich bar on the same console then
    draws them above itself instead of being cut by them (Prefect's handler owns another console on stderr)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [
        logging.getLogger(),
        *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger)),
    ]
    handlers = {
        id(h): h for lg in loggers for h in lg.handlers if isinstance(h, PrefectConsoleHandler)
    }
    saved = {key: handler.console for key, handler in handlers.items()}
    for handler in handlers.values():
        handler.console = target
    try:
        yield
    finally:
        for key, handler in handlers.items():
            handler.console = saved[key]


@contextmanager
def prefect_api(*, meanwhile: Callable[[], object] | None = None) -> Iterator[None]:
    """Run the block against a Prefect API: the configured ``PREFECT_API_URL`` (a local server the user keeps
    running, reused), else a temporary server started for the block that never outlives this process.

    ``meanwhile`` (e.g. importing the flow's modules) runs while a temporary server starts: the two largest fixed
    costs of a command overlap instead of adding up.

    On a temporary server flow runs send no heartbeats unless ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` is set.
    Heartbeats let a long-lived server's zombie automation mark a dead run Crashed (``deployments/automations.py``);
    a temporary server dies with the command, so no one is there to miss them. Yet Prefect sends them by default
    (every 180 s), and every flow run's end then waits for its heartbeat thread's 1 s sleep to end
    (``prefect.flow_engine._send_heartbeats``): 7 of a no-op night's ~20 s, over its ten flow runs."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        get_current_settings,
        temporary_settings,
    )

    with stopping():
        if PREFECT_API_URL.value():
            if meanwhile is not None:
                meanwhile()
            yield
            return
        updates: dict[Any, Any] = {}
        if "heartbeat_frequency" not in get_current_settings().flows.model_fields_set:
            updates[PREFECT_FLOWS_HEARTBEAT_FREQUENCY] = None
        with _temporary_server(meanwhile) as api_url:
            updates[PREFECT_API_URL] = api_url
            with temporary_settings(updates):
                yield


def resume_command() -> str:
    """The command line this process runs, as a user types it again to resume."""
    return shlex.join(["eagle3", *sys.argv[1:]])


@contextmanager
def stopping(*, resumable: bool = True) -> Iterator[None]:
    """SIGINT or SIGTERM stops the block (``eagle3.runtime.stop``); once the flow runs are marked
    Crashed and the block has unwound, what is left of the command's descendants is reaped and the
    command exits ``128 + signal`` with one line saying how long the stop took and how to resume.
    The exit is certain within ``EXIT_WITHIN_S``."""
    from eagle3.runtime.stop import reap, stop_on_signals, stop_requested

    with stop_on_signals(exit_within_s=EXIT_WITHIN_S):
        try:
            yield
        except BaseException:
            request = stop_requested()
            if request is None:
                raise
            left = reap()
            took = time.monotonic() - request.at
            line = f"stopped by {request.reason} in {took:.1f} s"
            line += f" (also ended: {', '.join(left)})" if left else ""
            if resumable:
                line += (
                    ": no unit started and nothing was promoted after the signal. Finished "
                    f"work is kept; the same command resumes: {resume_command()}"
                )
            console.print(line, soft_wrap=True)
            raise typer.Exit(request.exit_code) from None


@contextmanager
def _temporary_server(meanwhile: Callable[[], object] | None) -> Iterator[str]:
    """Prefect's ephemeral API server (the app and environment Prefect's own ephemeral mode uses, over the same
    database), as a child of this process that dies with it; yields its API URL."""
    import prefect
    from prefect.settings import get_current_settings

    port = free_port()
    env = {
        **os.environ,
        **get_current_settings().to_environment_variables(exclude_unset=True),
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
    }
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "--app-dir",
        str(prefect.__module_path__.parent),
        "--factory",
        "prefect.server.api.server:create_app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "error",
        "--lifespan",
        "on",
    ]
    timeout_s = float(
        os.environ.get(
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", PREFECT_STARTUP_TIMEOUT_S
        )
    )
    api_url = f"http://127.0.0.1:{port}/api"
    console.print(
        f"prefect: starting a temporary API server on {api_url} (set PREFECT_API_URL to reuse one)"
    )
    server = subprocess.Popen(command, env=env, preexec_fn=die_with_parent, start_new_session=True)
    watching = threading.Event()
    try:
        deadline = time.monotonic() + timeout_s
        if meanwhile is not None:
            meanwhile()
        while not is_healthy(api_url, timeout_s=5):
            if server.poll() is not None:
                raise CliError(
                    f"Prefect's temporary API server exited with code {server.returncode} before it "
                    "answered; set PREFECT_API_URL to a running server",
                    code=EXIT_FAILED,
                )
            if time.monotonic() > deadline:
                raise CliError(
                    f"Prefect's temporary API server did not answer within {timeout_s:.0f} s; raise "
                    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS or set PREFECT_API_URL to a "
                    "running server",
                    code=EXIT_FAILED,
                )
            time.sleep(0.2)
        watching.set()
        watch = threading.Thread(target=_exit_if_lost, args=(server, watching), daemon=True)
        watch.start()
        yield api_url
    finally:
        watching.clear()
        _drain_to(server)
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _exit_if_lost(server: subprocess.Popen[bytes], watching: threading.Event) -> None:
    """While ``watching`` is set, check every half second that the temporary API server is up; if it
    died (an OOM kill, a ``kill``), stop the run, reap its processes and exit 1 with one line naming
    the cause and the command that resumes: every flow and task run would otherwise retry each call
    against it for minutes (``PREFECT_CLIENT_MAX_RETRIES``) before crashing."""
    from eagle3.runtime.stop import reap, request_stop

    while watching.is_set() and server.poll() is None:
        time.sleep(0.5)
    if not watching.is_set():
        return  # the command is stopping it itself
    code = server.returncode
    cause = f"exited with code {code}"
    if code < 0:
        cause = f"was killed by {signal.Signals(-code).name}"
        cause += " (out of memory, or kill -9)" if -code == signal.SIGKILL else ""
    request_stop("the loss of Prefect's temporary API server")
    reap()
    console.print(
        f"[red]error:[/red] Prefect's temporary API server (pid {server.pid}) {cause}, and the run "
        "cannot record its progress without it: stopped. Finished work is kept; the same command "
        f"resumes: {resume_command()}",
        soft_wrap=True,
    )
    os._exit(EXIT_FAILED)


def _drain_to(server: subprocess.Popen[bytes]) -> None:
    """Send the logs and events Prefect still holds while the server is up (else they fail after it stops)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    if server.poll() is None:
        APILogWorker.drain_all(timeout=10)
        EventsWorker.drain_all(timeout=10)
