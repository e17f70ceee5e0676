"""Server pool: bounded concurrency per server, least-outstanding routing, ejection and readmission.

One pool object is shared by every shard running in the process (``shared_pool``), across threads
and their event loops: the per-server cap (``regen.concurrency_per_server``) bounds what the whole
client sends to a server, however many shards run at once, and a server ejected by one shard is
ejected for all. State sits behind a ``threading.Lock``; a waiter is an ``asyncio.Future`` of its
own loop, woken with ``call_soon_threadsafe``.

Health: ``eject_after_failures`` consecutive failures (5xx, connection errors, timeouts) take a
server out of rotation; every ``readmit_after_s`` one caller probes ``/health`` and readmits it on
200. Work queued behind an ejected server goes to the healthy ones. When every server is out (an
*outage*), ``acquire`` waits without counting a request attempt (spending a retry per probe would
take 24 min to fail a shard with the tiny defaults) and is woken by a readmission; once the outage
has lasted ``no_server_timeout_s`` every waiter, and every later caller while it lasts, gets
``NoServerAvailable`` naming each server and its last error, and the shard fails at once.
``outage()`` describes a running outage (``regen status`` shows "waiting for servers").
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field

import aiohttp

from eagle3.config.regen import RegenConfig

logger = logging.getLogger(__name__)


class NoServerAvailable(RuntimeError):
    """No server has been healthy for ``regen.no_server_timeout_s``; the message names each one and
    its last error."""


@dataclass
class Server:
    url: str
    outstanding: int = 0
    failures: int = 0
    ejected_until: float | None = None
    probing: bool = False
    completed: int = 0
    errors: int = 0
    last_error: str = ""

    @property
    def healthy(self) -> bool:
        return self.ejected_until is None


@dataclass
class _Waiter:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None] = field(repr=False)


class ServerPool:
    """See module docstring. ``outcome``: True = success, False = server failure, None = neutral
    (400, 503)."""

    def __init__(
        self,
        urls: list[str],
        *,
        concurrency: int,
        eject_after: int,
        readmit_after_s: float,
        no_server_timeout_s: float,
    ) -> None:
        if not urls:
            raise ValueError("ServerPool needs at least one server URL (set regen.servers)")
        self.servers = [Server(u.rstrip("/")) for u in urls]
        self.concurrency = concurrency
        self.eject_after = eject_after
        self.readmit_after_s = readmit_after_s
        self.no_server_timeout_s = no_server_timeout_s
        # monotonic start of the running outage (no server healthy)
        self._down_since: float | None = None
        self._down_since_wall = 0.0
        self._lock = threading.Lock()
        self._waiters: list[_Waiter] = []
        self._probe_tasks: set[asyncio.Task[None]] = set()

    @property
    def capacity(self) -> int:
        return self.concurrency * len(self.servers)

    def _pick(self) -> Server | None:
        ready = [s for s in self.servers if s.healthy and s.outstanding < self.concurrency]
        return min(ready, key=lambda s: s.outstanding) if ready else None

    def _due_probes(self, now: float) -> list[Server]:
        due = [
            s
            for s in self.servers
            if not s.healthy and not s.probing and (s.ejected_until or 0) <= now
        ]
        for s in due:
            s.probing = True
        return due

    async def acquire(self, session: aiohttp.ClientSession) -> Server:
        """A server with a free slot (the caller must ``release`` it); waits while all are busy or
        out, and raises ``NoServerAvailable`` once no server has been healthy for
        ``no_server_timeout_s``."""
        while True:
            now = time.monotonic()
            with self._lock:
                probes = self._due_probes(now)
                server = self._pick()
                if server is not None:
                    server.outstanding += 1
                    waiter = None
                else:
                    loop = asyncio.get_running_loop()
                    waiter = _Waiter(loop, loop.create_future())
                    self._waiters.append(waiter)
                down_since, probing = self._down_since, any(s.probing for s in self.servers)
            # in the background: a caller with a server goes on, a waiter is woken on readmission
            for s in probes:
                task = asyncio.ensure_future(self._probe(session, s))
                self._probe_tasks.add(task)
                task.add_done_callback(self._probe_tasks.discard)
            if server is not None:
                return server
            assert waiter is not None
            wait_s = 1.0  # re-check readmission probes at least every second
            if down_since is not None:
                left = down_since + self.no_server_timeout_s - now
                # a probe in flight may still readmit one: wait for its answer
                if left <= 0 and not probing:
                    self._forget(waiter)
                    raise NoServerAvailable(self._expired_message())
                wait_s = min(wait_s, max(left, 0.05))
            try:
                await asyncio.wait_for(waiter.future, timeout=wait_s)
            except asyncio.TimeoutError:
                pass
            finally:
                self._forget(waiter)

    def _forget(self, waiter: _Waiter) -> None:
        with self._lock:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def release(self, server: Server, outcome: bool | None, *, error: str = "") -> None:
        """Return ``server``'s slot with the request's outcome (and its error message, shown when
        all are out)."""
        with self._lock:
            server.outstanding -= 1
            if outcome is True:
                server.failures = 0
                server.completed += 1
            elif outcome is False:
                server.failures += 1
                server.errors += 1
                server.last_error = error or server.last_error
                if server.healthy and server.failures >= self.eject_after:
                    server.ejected_until = time.monotonic() + self.readmit_after_s
                    logger.warning(
                        "ejecting %s after %d consecutive failures (last error: %s); probing again in %.0fs",
                        server.url,
                        server.failures,
                        server.last_error,
                        self.readmit_after_s,
                    )
                    self._note_outage()
            waiters, self._waiters = self._waiters, []
        for w in waiters:
            w.loop.call_soon_threadsafe(_wake, w.future)

    def _note_outage(self) -> None:
        """Start the outage clock when the last healthy server is ejected (called under the
        lock)."""
        if self._down_since is None and not any(s.healthy for s in self.servers):
            self._down_since, self._down_since_wall = time.monotonic(), time.time()
            logger.warning(
                "no regen server is healthy; waiting up to %.0fs (regen.no_server_timeout_s) for one to come back: %s",
                self.no_server_timeout_s,
                self._describe(),
            )

    async def _probe(self, session: aiohttp.ClientSession, server: Server) -> None:
        ok, error = False, ""
        try:
            timeout = aiohttp.ClientTimeout(total=5)
            async with session.get(f"{server.url}/health", timeout=timeout) as resp:
                ok = resp.status == 200
                error = "" if ok else f"health probe: HTTP {resp.status}"
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            error = (
                f"health probe: {type(exc).__name__}: {exc}"
                if str(exc)
                else f"health probe: {type(exc).__name__}"
            )
        except asyncio.CancelledError:  # its shard ended: the next caller probes again
            with self._lock:
                server.probing = False
            raise
        with self._lock:
            server.probing = False
            if ok:
                server.ejected_until, server.failures = None, 0
                if self._down_since is not None:
                    logger.info(
                        "%s is back after %.0fs without a healthy server",
                        server.url,
                        time.monotonic() - self._down_since,
                    )
                self._down_since = None
                logger.info("readmitted %s (health probe ok)", server.url)
            else:
                server.ejected_until = time.monotonic() + self.readmit_after_s
                server.last_error = error
            # ok: take the slot; not ok: a waiter may now give up
            waiters, self._waiters = self._waiters, []
        for w in waiters:
            w.loop.call_soon_threadsafe(_wake, w.future)

    def outage(self) -> dict[str, object] | None:
        """The running outage (no server healthy): since when (wall clock), the timeout, and each
        server's state."""
        with self._lock:
            if self._down_since is None:
                return None
            return {
                "since": self._down_since_wall,
                "timeout_s": self.no_server_timeout_s,
                "servers": self._describe(),
            }

    def _expired_message(self) -> str:
        with self._lock:
            return (
                f"no server healthy for {self.no_server_timeout_s:g}s (regen.no_server_timeout_s): "
                f"{self._describe()}; start the server(s) or point regen.servers at live ones, then re-run the "
                "shard"
            )

    def _describe(self) -> str:
        return ", ".join(
            f"{s.url} ({s.failures} consecutive failures, last error: {s.last_error or 'none'})"
            for s in self.servers
        )

    def stats(self) -> list[dict[str, object]]:
        with self._lock:
            return [
                {"url": s.url, "healthy": s.healthy, "completed": s.completed, "errors": s.errors}
                for s in self.servers
            ]


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


_POOLS: dict[tuple[object, ...], ServerPool] = {}
_POOLS_LOCK = threading.Lock()


def shared_pool(urls: list[str], cfg: RegenConfig) -> ServerPool:
    """The process-wide pool for these servers and ``cfg``'s pool settings (created on first use):
    the shards and the stage's health view share it."""
    key = (
        tuple(u.rstrip("/") for u in urls),
        cfg.concurrency_per_server,
        cfg.eject_after_failures,
        cfg.readmit_after_s,
        cfg.no_server_timeout_s,
    )
    with _POOLS_LOCK:
        if key not in _POOLS:
            _POOLS[key] = ServerPool(
                list(key[0]),
                concurrency=cfg.concurrency_per_server,
                eject_after=cfg.eject_after_failures,
                readmit_after_s=cfg.readmit_after_s,
                no_server_timeout_s=cfg.no_server_timeout_s,
            )
        return _POOLS[key]
