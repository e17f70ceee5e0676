"""Fixtures of the e2e tests: a real Prefect server per module and a process worker (see ``e2e_support``)."""

from e2e_support import prefect_server, process_worker

__all__ = ["prefect_server", "process_worker"]
