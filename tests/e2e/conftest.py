"""Fixtures of the e2e tests: a PostgreSQL-backed Prefect server per module and a process worker
(``e2e_support``).

The server runs on PostgreSQL like a cluster's (README): ``infra/prefect-server.sh`` in its
``local`` mode starts Debian's PostgreSQL itself. One cluster serves the session (initdb once, about
a second), each module gets its own database, so modules never see each other's runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_support import (
    REPO,
    PrefectServer,
    base_env,
    free_port,
    launch_prefect_server,
    process_worker,
    stop,
)

__all__ = ["PostgresCluster", "pg_cluster", "prefect_server", "process_worker"]


@dataclass
class PostgresCluster:
    """The environment that points ``infra/prefect-server.sh`` at the session's local PostgreSQL
    cluster."""

    env: dict[str, str]

    def server_env(self, database: str) -> dict[str, str]:
        return self.env | {"EAGLE3_PREFECT_DB": "local", "EAGLE3_PG_DB": database}


def _pg_script(verb: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    args = ["bash", str(REPO / "infra" / "prefect-server.sh"), verb]
    return subprocess.run(args, env=base_env(**env), capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster]:
    """Debian's PostgreSQL on a free loopback port, in a directory the ``postgres`` user can reach
    when we are root (pytest's own tmp dirs are private to root)."""
    if not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")):
        pytest.skip(
            "no PostgreSQL: install it (infra/dev.sh test does: apt-get install postgresql)"
        )
    directory = Path(tempfile.mkdtemp(prefix="eagle3-pg-"))
    os.chmod(directory, 0o711)
    env = {"EAGLE3_PG_DIR": str(directory / "cluster"), "EAGLE3_PG_PORT": str(free_port())}
    done = _pg_script("postgres", env)
    assert done.returncode == 0, done.stderr[-3000:]
    yield PostgresCluster(env)
    _pg_script("stop-postgres", env)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def prefect_server(
    pg_cluster: PostgresCluster,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[PrefectServer]:
    """A real Prefect server (API + UI) on PostgreSQL for one test module, with its own database."""
    database = "prefect_" + request.module.__name__.rsplit(".", 1)[-1].lower()
    home = tmp_path_factory.mktemp("prefect-home")
    server = launch_prefect_server(home, free_port(), **pg_cluster.server_env(database))
    yield server
    if server.proc is not None:
        stop(server.proc)
