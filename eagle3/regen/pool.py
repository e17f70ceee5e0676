"""Server pool: bounded concurrency per server, least-outstanding routing, ejection and readmission.

One pool object is shared by every shard running in the process (``shared_pool``), across threads and their
event loops: the per-server cap (``regen.concurrency_per_server``) bounds what the whole client sends to a server,
however many shards run at once, and a server ejected by one shard is ejected for all. State sits behind a
``threading.Lock``; a waiter is an ``asyncio.Future`` of its own loop, woken with ``call_soon_threadsafe``.

Health: ``eject_after_failures`` consecutive failures (5xx, connection errors, timeouts) take a server out of
rotation; after ``readmit_after_s`` one request probes ``/health`` and readmits it on 200. When every server is
out, ``acquire`` waits for the earliest readmission probe and raises ``NoServerAvailable`` if it fails, so the
caller counts an attempt and backs off instead of waiting forever.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field

import aiohttp

logger = logging.getLogger(__name__)


class NoServerAvailable(RuntimeError):
    """Every server is out of rotation and the readmission probe failed."""


@dataclass
class Server:
    url: str
    outstanding: int = 0
    failures: int = 0
    ejected_until: float | None = None
    probing: bool = False
    completed: int = 0
    errors: int = 0

    @property
    def healthy(self) -> bool:
        return self.ejected_until is None


@dataclass
class _Waiter:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None] = field(repr=False)


class ServerPool:
    """See module docstring. ``outcome``: True = success, False = server failure, None = neutral (400, 503)."""

    def __init__(self, urls: list[str], *, concurrency: int, eject_after: int, readmit_after_s: float) -> None:
        if not urls:
            raise ValueError("ServerPool needs at least one server URL (set regen.servers)")
        self.servers = [Server(u.rstrip("/")) for u in urls]
        self.concurrency = concurrency
        self.eject_after = eject_after
        self.readmit_after_s = readmit_after_s
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
        due = [s for s in self.servers if not s.healthy and not s.probing and (s.ejected_until or 0) <= now]
        for s in due:
            s.probing = True
        return due

    async def acquire(self, session: aiohttp.ClientSession) -> Server:
        while True:
            now = time.monotonic()
            with self._lock:
                probes = self._due_probes(now)
                server = self._pick()
                if server is not None:
                    server.outstanding += 1
                all_out = not any(s.healthy for s in self.servers)
                next_due = min((s.ejected_until or now) for s in self.servers) if all_out else now
                waiter = None
                if server is None and not all_out:
                    loop = asyncio.get_running_loop()
                    waiter = _Waiter(loop, loop.create_future())
                    self._waiters.append(waiter)
            for s in probes:
                if all_out and server is None:
                    await self._probe(session, s)
                else:
                    task = asyncio.ensure_future(self._probe(session, s))
                    self._probe_tasks.add(task)
                    task.add_done_callback(self._probe_tasks.discard)
            if server is not None:
                return server
            if waiter is not None:
                try:
                    await asyncio.wait_for(waiter.future, timeout=1.0)  # re-check readmissions each second
                except asyncio.TimeoutError:
                    self._forget(waiter)
                continue
            if probes:  # every server was out and the probes just run: readmitted or still out
                if any(s.healthy for s in self.servers):
                    continue
                raise NoServerAvailable(f"all {len(self.servers)} servers are out of rotation: " + self._describe())
            await asyncio.sleep(max(0.05, next_due - time.monotonic()))  # another caller may be probing

    def _forget(self, waiter: _Waiter) -> None:
        with self._lock:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def release(self, server: Server, outcome: bool | None) -> None:
        with self._lock:
            server.outstanding -= 1
            if outcome is True:
                server.failures = 0
                server.completed += 1
            elif outcome is False:
                server.failures += 1
                server.errors += 1
                if server.healthy and server.failures >= self.eject_after:
                    server.ejected_until = time.monotonic() + self.readmit_after_s
                    logger.warning(
                        "ejecting %s after %d consecutive failures; probing again in %.0fs",
                        server.url,
                        server.failures,
                        self.readmit_after_s,
                    )
            waiters, self._waiters = self._waiters, []
        for w in waiters:
            w.loop.call_soon_threadsafe(_wake, w.future)

    async def _probe(self, session: aiohttp.ClientSession, server: Server) -> None:
        ok = False
        try:
            timeout = aiohttp.ClientTimeout(total=5)
            async with session.get(f"{server.url}/health", timeout=timeout) as resp:
                ok = resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            ok = False
        with self._lock:
            server.probing = False
            if ok:
                server.ejected_until, server.failures = None, 0
                logger.info("readmitted %s (health probe ok)", server.url)
            else:
                server.ejected_until = time.monotonic() + self.readmit_after_s
            waiters, self._waiters = (self._waiters, []) if ok else ([], self._waiters)
        for w in waiters:
            w.loop.call_soon_threadsafe(_wake, w.future)

    def _describe(self) -> str:
        return ", ".join(f"{s.url} ({s.failures} consecutive failures)" for s in self.servers)

    def stats(self) -> list[dict[str, object]]:
        with self._lock:
            return [
                {"url": s.url, "healthy": s.healthy, "completed": s.completed, "errors": s.errors} for s in self.servers
            ]


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


_POOLS: dict[tuple[object, ...], ServerPool] = {}
_POOLS_LOCK = threading.Lock()


def shared_pool(urls: list[str], *, concurrency: int, eject_after: int, readmit_after_s: float) -> ServerPool:
    """The process-wide pool for these servers and settings (created on first use)."""
    key = (tuple(u.rstrip("/") for u in urls), concurrency, eject_after, readmit_after_s)
    with _POOLS_LOCK:
        if key not in _POOLS:
            _POOLS[key] = ServerPool(
                list(key[0]), concurrency=concurrency, eject_after=eject_after, readmit_after_s=readmit_after_s
            )
        return _POOLS[key]
