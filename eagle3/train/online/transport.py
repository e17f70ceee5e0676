"""Ray as the online transport: the broker as a named detached actor, batches as objects in Ray's
object store.

Why Ray and not the Mooncake store (BENCHMARKS.md, "Online training"): the
``mooncake-transfer-engine`` 0.3.13.post1 wheel links ``libcuda.so.1``, ``libcudart.so.12`` and
``libibverbs.so.1`` and does not import on a CPU host, while Ray is already the pipeline's runner.
The object store is shared memory on a node (a batch is read without a copy) and moves objects
between nodes itself.

Ownership is what makes "kill -9 of a producer" safe: an object is freed when its owner dies, so the
broker puts the batches a producer hands it (``Broker.deliver``): a delivered batch survives its
producer. (Ray 2.56 removed ``ray.put(..., _owner=)``, which would have saved that hop: one more
copy of each batch, measured in the report.) The broker is detached (it outlives a killed trainer)
and is killed by ``close_broker`` at the run's end.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from eagle3.train.online.broker import Broker

logger = logging.getLogger(__name__)

NAMESPACE = "eagle3-online"


def connect(address: str | None) -> None:
    """Join the Ray cluster at ``address`` (``auto``: the local one), once per process. The process
    keeps its own SIGTERM handler: a Ray driver replaces it with ``sys.exit(15)``, which would skip
    what the pipeline's handlers do on SIGTERM (regen flushes its journals and exits 128 + 15,
    Prefect cancels its run)."""
    import ray

    if ray.is_initialized():
        return
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        if address:
            ray.init(
                address=address,
                namespace=NAMESPACE,
                log_to_driver=False,
                include_dashboard=False,
                configure_logging=False,
            )
        else:
            ray.init(
                namespace=NAMESPACE,
                log_to_driver=False,
                include_dashboard=False,
                configure_logging=False,
                num_cpus=4,
                object_store_memory=256 * 2**20,
            )
    finally:
        if sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, sigterm)


@contextmanager
def ray_session(address: str | None) -> Iterator[None]:
    """Ray for the length of a block (an online train unit): joins ``address``, or starts a local
    cluster, and shuts down at the end what this block started. A local cluster must not outlive the
    block: Ray ties its GCS and raylet to the *thread* that started them (``PR_SET_PDEATHSIG``, per
    thread on Linux), so when a Prefect task thread ends they are SIGKILLed, the process still
    believes it is connected, and Ray's client ends the process 60 s later with exit 1 (a tiny
    online night did, after a PASSing gate)."""
    import ray

    started = not ray.is_initialized()
    connect(address)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def open_broker(name: str, **kwargs: Any) -> Any:
    """The run's broker actor ``name`` (created with ``kwargs`` if it does not exist yet)."""
    import ray

    actor = ray.remote(Broker).options(
        name=name,
        namespace=NAMESPACE,
        lifetime="detached",
        max_concurrency=64,
        get_if_exists=True,
        num_cpus=0,
    )
    return actor.remote(**kwargs)


def get_broker(name: str) -> Any:
    import ray

    return ray.get_actor(name, namespace=NAMESPACE)


def close_broker(name: str) -> None:
    import ray

    try:
        ray.kill(ray.get_actor(name, namespace=NAMESPACE))
    except ValueError:  # not there: nothing to close
        return


def deliver(broker: Any, producer: str, index: int, key: Any, message: dict[str, Any]) -> bool:
    """Hand ``message`` to the broker, which stores it (and owns it); False: a duplicate,
    dropped."""
    import ray

    return ray.get(broker.deliver.remote(producer, index, key, message))


def take(
    broker: Any, rank: int, index: int, *, poll_s: float = 1.0, stop: Any = None
) -> tuple[Any, dict]:
    """Batch ``index`` for ``rank``: waits (polling the broker, so ``stop()`` is seen) until it is
    delivered."""
    import ray

    waited = 0.0
    while True:
        started = time.monotonic()
        entry = ray.get(broker.take.remote(rank, index, poll_s))
        if entry is not None:
            key, (ref,) = entry
            return key, ray.get(ref)
        waited += time.monotonic() - started
        if stop is not None and stop():
            raise RuntimeError(f"online batch {index}: producers stopped before delivering it")
        if waited > 60 and int(waited) % 60 < poll_s:
            logger.warning(
                "rank %d waited %.0f s for online batch %d: %s",
                rank,
                waited,
                index,
                ray.get(broker.status.remote()),
            )
