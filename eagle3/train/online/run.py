"""Online training end to end: the broker, the producers (Ray actors, restarted when they die), the
trainer.

``online_feed`` is what the train stage's unit holds around its workers for
``train.features=online``. The trainer runs as with stored features, in ``python -m eagle3.train``
workers (under torchrun for ``train.nproc > 1``) that take their batches from the broker, so a
killed trainer is a killed subprocess whose retry resumes from ``ckpt/latest``; ``train_in_process``
runs it in this process instead (tests, benchmarks). The run ends with nothing in the store: the
broker is asked, then killed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3.config.pipeline import PipelineConfig
from eagle3.train.online.plan import OnlinePlan
from eagle3.train.online.producer import ProducerActor
from eagle3.train.online.status import STATUS_FILE, ProducerRecord, online_status, status_line
from eagle3.train.online.transport import (
    close_broker,
    connect,
    get_broker,
    open_broker,
    ray_session,
)
from eagle3.train.workers import Feed

logger = logging.getLogger(__name__)


def broker_name(out_dir: Path) -> str:
    return f"broker-{Path(out_dir).name}"


@dataclass
class Producers:
    """The run's producer actors and the thread that supervises their loops: an actor whose process
    died is restarted by Ray (``train.online.producer_restarts``) and its loop submitted again; a
    loop that raised is retried the same way, up to the same count, unless it raised a ``DataError``
    (the same batch would fail again). ``records`` say, per producer, its state, its restarts and
    the last error with the batch it held (the UI's producer table,
    ``eagle3.train.online.status``)."""

    config: PipelineConfig
    actors: list[Any]
    broker: str = ""
    slow_s: float = 0.0
    results: dict[int, dict] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    records: dict[str, ProducerRecord] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self.records.update({f"p{i}": ProducerRecord() for i in range(len(self.actors))})
        self._thread = threading.Thread(
            target=self._supervise, name="online-producers", daemon=True
        )
        self._thread.start()

    def _submit(self, i: int) -> Any:
        record = self.records[f"p{i}"]
        # a restarting one runs again once its loop registers (status.py)
        if record.state != "restarting":
            record.state = "running"
        return self.actors[i].run.remote(self.slow_s)

    def _supervise(self) -> None:
        import ray

        runs = {self._submit(i): i for i in range(len(self.actors))}
        while runs and not self._stop.is_set():
            done, _ = ray.wait(list(runs), timeout=1.0)
            for ref in done:
                i = runs.pop(ref)
                try:
                    self.results[i] = ray.get(ref)
                    self.records[f"p{i}"].state = "done"
                # its process died; Ray is restarting it
                except ray.exceptions.ActorUnavailableError as exc:
                    self._restart(i, exc, "its process died; Ray restarts it")
                    time.sleep(1.0)  # the call retried at once finds it still restarting
                    runs[self._submit(i)] = i
                # out of restarts (train.online.producer_restarts)
                except ray.exceptions.RayActorError as exc:
                    self._fail(i, exc, f"producer p{i} died for good: {exc}")
                except ray.exceptions.RayTaskError as exc:  # its loop raised: retried like a unit
                    if self._retryable(i, exc):
                        self._restart(i, exc, "its loop raised; retried")
                        runs[self._submit(i)] = i
                    else:
                        self._fail(i, exc, f"producer p{i} failed: {exc}")

    def _held(self, i: int) -> tuple[int | None, bool]:
        """(the batch producer ``i`` holds, claimed and not delivered; whether its current loop had
        started, i.e. registered with the broker since its last restart), asked of the broker."""
        if not self.broker:
            return None, True
        status = get_broker_status(self.broker)
        name = f"p{i}"
        held = min((int(b) for b, p in status.get("claims", {}).items() if p == name), default=None)
        return held, status.get("registrations", {}).get(name, 0) > self.records[name].restarts

    def _restart(self, i: int, exc: BaseException, what: str) -> None:
        """Count a restart of producer ``i``, unless its loop never started again since the last one
        (a call that found the actor still restarting is the same restart)."""
        record = self.records[f"p{i}"]
        held, started = self._held(i)
        if not started:
            logger.info("producer p%d is still restarting (%s)", i, type(exc).__name__)
            return
        record.failed_on(held, exc, state="restarting")
        record.restarts += 1
        logger.warning(
            "producer p%d restart %d (%s): %s", i, record.restarts, what, record.last_error
        )

    def _retryable(self, i: int, exc: BaseException) -> bool:
        from eagle3.errors import DataError

        restarts_left = self.records[f"p{i}"].restarts < self.config.train.online.producer_restarts
        return restarts_left and not isinstance(getattr(exc, "cause", None), DataError)

    def _fail(self, i: int, exc: BaseException, message: str) -> None:
        self.records[f"p{i}"].failed_on(self._held(i)[0], exc, state="failed")
        self.errors.append(message)

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the loops to return (they do once the broker says every
        batch is taken)."""
        thread = getattr(self, "_thread", None)
        if thread is not None:
            thread.join(timeout)

    def failed(self) -> bool:
        return bool(self.errors)

    def stop(self) -> None:
        import ray

        self._stop.set()
        for actor in self.actors:
            ray.kill(actor)


def get_broker_status(name: str) -> dict[str, Any]:
    import ray

    return ray.get(get_broker(name).status.remote())


def start_producers(
    config: PipelineConfig, regen_dir: Path, world_size: int, name: str, *, slow_s: float = 0.0
) -> Producers:
    import ray

    online = config.train.online
    actor = ray.remote(ProducerActor).options(
        max_restarts=online.producer_restarts,
        num_cpus=0,
        max_concurrency=2,
        namespace="eagle3-online",
    )
    actors = [
        actor.remote(config.to_yaml(), str(regen_dir), world_size, name, f"p{i}")
        for i in range(online.producers)
    ]
    producers = Producers(config, actors, broker=name, slow_s=slow_s)
    producers.start()
    return producers


def open_run(
    config: PipelineConfig,
    regen_dir: Path,
    out_dir: Path,
    *,
    world_size: int,
    ray_address: str | None = None,
) -> tuple[OnlinePlan, str]:
    """Join Ray, plan, and open (or find, on a resumed run) the broker; returns the plan and the
    broker's name."""
    connect(ray_address)
    plan = OnlinePlan.for_night(config, Path(regen_dir), world_size=world_size)
    name = broker_name(out_dir)
    online = config.train.online
    open_broker(
        name,
        total=plan.total_batches,
        world_size=world_size,
        max_inflight=online.max_inflight,
        claim_timeout_s=online.claim_timeout_s,
    )
    logger.info(
        "online training: %d batches (%d epochs x %d steps x %d ranks), %d producers, at most %d in the "
        "store (broker %s)",
        plan.total_batches,
        plan.epochs,
        plan.steps_per_epoch,
        world_size,
        online.producers,
        online.max_inflight,
        name,
    )
    return plan, name


class StatusReporter:
    """Every ``every_s`` seconds (``orchestration.progress_every_s``) ``online-status.json`` in the
    draft directory: each producer's state, batches, rate, restarts and last error, the trainer's
    rate, the store's backlog and the ETA (``eagle3.train.online.status``), which the train stage's
    progress and live table read; the same numbers as one log line every ``log_every_s``
    (``monitor.log_every_s``) and at the end."""

    def __init__(
        self,
        name: str,
        out_dir: Path,
        *,
        every_s: float,
        log_every_s: float,
        producers: Producers | None = None,
    ) -> None:
        self.name, self.path, self.every_s, self.log_every_s = (
            name,
            Path(out_dir) / STATUS_FILE,
            every_s,
            log_every_s,
        )
        self.producers = producers
        self._logged = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="online-status", daemon=True)

    def __enter__(self) -> StatusReporter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def report(self, *, log: bool = True) -> dict[str, Any]:
        """Write the status now (and log it when ``log``); returns it."""
        from eagle3.rundir.runroot import atomic_write_json

        records = dict(self.producers.records) if self.producers is not None else {}
        status = online_status(get_broker_status(self.name), records)
        atomic_write_json(self.path, status)
        if log:
            self._logged = time.monotonic()
            logger.info("%s", status_line(status))
        return status

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.report(log=time.monotonic() - self._logged >= self.log_every_s)
            except Exception as exc:  # a status must never stop training; say why it is missing
                logger.warning("online status unavailable: %s", exc)


def status_reporter(
    config: PipelineConfig, name: str, out_dir: Path, producers: Producers
) -> StatusReporter:
    """The run's reporter at the config's periods (``orchestration.progress_every_s``,
    ``monitor.log_every_s``)."""
    return StatusReporter(
        name,
        out_dir,
        every_s=config.orchestration.progress_every_s,
        log_every_s=config.monitor.log_every_s,
        producers=producers,
    )


def finish_run(name: str) -> dict[str, Any]:
    """The broker's final status (``ready`` must be 0: nothing left in the store), then the broker
    closed."""
    import ray

    status = ray.get(get_broker(name).status.remote())
    if status["ready"]:
        left = ray.get(get_broker(name).clear.remote())
        logger.warning("online run ended with %d batches still in the store; dropped", left)
    close_broker(name)
    return status


@contextmanager
def online_feed(config: PipelineConfig, regen_dir: Path, out_dir: Path) -> Iterator[Feed]:
    """The feed of an online train unit (``eagle3.train.workers.Feed``), inside the unit's Ray
    session: the run's broker, its producer actors and the status reporter for the length of the
    block, the workers' arguments naming the broker. On exit the producers are stopped and the
    broker closed; ``detail`` holds the store's final status and ``note`` the producers' errors (for
    a failure's message)."""
    with ray_session(config.orchestration.ray_address):
        address, nproc = config.orchestration.ray_address, config.train.nproc
        _, name = open_run(config, regen_dir, out_dir, world_size=nproc, ray_address=address)
        import ray

        producers = start_producers(config, regen_dir, nproc, name)
        gcs = ray.get_runtime_context().gcs_address
        args = ["--regen", str(regen_dir), "--ray-address", gcs, "--broker", name]
        feed = Feed(args=args, name="online training")
        reporter = status_reporter(config, name, out_dir, producers)
        try:
            with reporter:
                yield feed
            reporter.report()
        finally:
            producers.stop()
            store = finish_run(name)
            feed.note = f"; producers: {producers.errors or 'ok'}"
            feed.detail = {"store": store, "features": "online"}
            counts = ("delivered", "consumed", "duplicates", "reclaimed", "ready")
            logger.info("online store at the end: %s", {k: store[k] for k in counts})


def train_in_process(
    config: PipelineConfig,
    regen_dir: Path,
    vocab_path: Path,
    out_dir: Path,
    *,
    ray_address: str | None = None,
    slow_s: float = 0.0,
    backend: Any = None,
    on_producers: Callable[[Producers], None] | None = None,
) -> dict[str, Any]:
    """Online training with the trainer in this process (one rank): tests and benchmarks.
    ``backend``: an already loaded capture backend, which one producer thread of this process uses
    instead of the producer actors."""
    from eagle3.train.online.source import broker_batches
    from eagle3.train.workers import train_rank

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plan, name = open_run(config, regen_dir, out_dir, world_size=1, ray_address=ray_address)
    if backend is None:
        producers = start_producers(config, regen_dir, 1, name, slow_s=slow_s)
    else:
        producers = _producer_thread(config, plan, name, backend)
    if on_producers is not None:
        on_producers(producers)
    reporter = status_reporter(config, name, out_dir, producers)
    try:
        with reporter:
            batches = broker_batches(config, regen_dir, out_dir, name, stop=producers.failed)
            summary = train_rank(config, Path(vocab_path), out_dir, batches)
            producers.join(10.0)  # their counts: they return at their next claim
        reporter.report()
    finally:
        producers.stop()
        status = finish_run(name)
    return {**summary, "store": status, "producers": dict(producers.results)}


def _producer_thread(
    config: PipelineConfig, plan: OnlinePlan, name: str, backend: Any
) -> Producers:
    """One producer on a thread of this process, over ``backend``."""
    from eagle3.train.online.producer import produce

    producers = Producers(config, [], records={"p0": ProducerRecord(state="running")})

    def run() -> None:
        try:
            producers.results[0] = produce(
                config, plan, get_broker(name), "p0", backend=backend, stop=producers._stop.is_set
            )
            producers.records["p0"].state = "done"
        except Exception as exc:  # handed to the trainer through failed(), which stops it waiting
            producers.records["p0"].failed_on(None, exc, state="failed")
            producers.errors.append(f"producer p0 failed: {exc!r}")
            raise

    producers._thread = threading.Thread(target=run, name="online-producer", daemon=True)
    producers._thread.start()
    return producers
