"""Online training end to end: the broker, the producers (Ray actors, restarted when they die), the trainer.

``train_online`` is what the train stage runs for ``train.features=online``. The trainer runs as the stored path's
does, in ``python -m eagle3.online`` workers (under torchrun for ``train.nproc > 1``), so a killed trainer is a
killed subprocess whose retry resumes from ``ckpt/latest``; ``train_in_process`` runs it in this process instead
(tests, benchmarks). The run ends with nothing in the store: the broker is asked, then killed.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3.config.pipeline import PipelineConfig
from eagle3.online.plan import OnlinePlan
from eagle3.online.producer import ProducerActor
from eagle3.online.transport import close_broker, connect, get_broker, open_broker

logger = logging.getLogger(__name__)


STATUS_FILE = "online-status.json"


def broker_name(out_dir: Path) -> str:
    return f"broker-{Path(out_dir).name}"


@dataclass
class Producers:
    """The run's producer actors and the thread that restarts their loops when an actor's process dies."""

    config: PipelineConfig
    actors: list[Any]
    slow_s: float = 0.0
    results: dict[int, dict] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._supervise, name="online-producers", daemon=True)
        self._thread.start()

    def _supervise(self) -> None:
        import ray

        runs = {actor.run.remote(self.slow_s): i for i, actor in enumerate(self.actors)}
        while runs and not self._stop.is_set():
            done, _ = ray.wait(list(runs), timeout=1.0)
            for ref in done:
                i = runs.pop(ref)
                try:
                    self.results[i] = ray.get(ref)
                except ray.exceptions.ActorUnavailableError as exc:  # its process died; Ray is restarting it
                    logger.warning("producer p%d is restarting (%s); its loop resumes when it is back", i,
                                   type(exc).__name__)
                    time.sleep(1.0)  # the call retried at once finds it still restarting
                    runs[self.actors[i].run.remote(self.slow_s)] = i
                except ray.exceptions.RayActorError as exc:  # out of restarts (train.online.producer_restarts)
                    self.errors.append(f"producer p{i} died for good: {exc}")
                except ray.exceptions.RayTaskError as exc:
                    self.errors.append(f"producer p{i} failed: {exc}")

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the loops to return (they do once the broker says every batch is taken)."""
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


def start_producers(config: PipelineConfig, regen_dir: Path, world_size: int, name: str, *,
                    slow_s: float = 0.0) -> Producers:
    import ray

    online = config.train.online
    actor = ray.remote(ProducerActor).options(max_restarts=online.producer_restarts, num_cpus=0, max_concurrency=2,
                                              namespace="eagle3-online")
    actors = [actor.remote(config.to_yaml(), str(regen_dir), world_size, name, f"p{i}")
              for i in range(online.producers)]
    producers = Producers(config, actors, slow_s=slow_s)
    producers.start()
    return producers


def open_run(config: PipelineConfig, regen_dir: Path, out_dir: Path, *, world_size: int,
             ray_address: str | None = None) -> tuple[OnlinePlan, str]:
    """Join Ray, plan, and open (or find, on a resumed run) the broker; returns the plan and the broker's name."""
    connect(ray_address)
    plan = OnlinePlan.for_night(config, Path(regen_dir), world_size=world_size)
    name = broker_name(out_dir)
    online = config.train.online
    open_broker(name, total=plan.total_batches, world_size=world_size, max_inflight=online.max_inflight,
                claim_timeout_s=online.claim_timeout_s)
    logger.info("online training: %d batches (%d epochs x %d steps x %d ranks), %d producers, at most %d in the "
                "store (broker %s)", plan.total_batches, plan.epochs, plan.steps_per_epoch, world_size,
                online.producers, online.max_inflight, name)
    return plan, name


class StatusReporter:
    """Every ``every_s`` seconds: the producers' and the trainer's rates, the store's backlog and the ETA, as one log
    line (which a Prefect run shows in its logs) and ``online-status.json`` in the draft directory."""

    def __init__(self, name: str, out_dir: Path, *, every_s: float, max_inflight: int) -> None:
        self.name, self.path, self.every_s, self.max_inflight = name, Path(out_dir) / STATUS_FILE, every_s, max_inflight
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="online-status", daemon=True)

    def __enter__(self) -> StatusReporter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def report(self) -> dict[str, Any]:
        import ray

        from eagle3.rundir.runroot import atomic_write_json

        s = ray.get(get_broker(self.name).status.remote())
        left = s["total"] - s["consumed"]
        eta = left / s["consumed_per_s"] if s["consumed_per_s"] > 0 else None
        s = {k: v for k, v in s.items() if k != "claims"} | {"eta_s": eta}
        atomic_write_json(self.path, s)
        logger.info("online: producers %.2f batches/s %s, trainer %.2f batches/s, store %d/%d batches waiting, "
                    "%d/%d trained, %d duplicates dropped, %d re-captured, ETA %s", s["delivered_per_s"],
                    s["per_producer"], s["consumed_per_s"], s["ready"], self.max_inflight, s["consumed"],
                    s["total"], s["duplicates"], s["reclaimed"], "unknown" if eta is None else f"{eta:.0f} s")
        return s

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.report()
            except Exception as exc:  # a status line must never stop training; say why it is missing
                logger.warning("online status unavailable: %s", exc)


def finish_run(name: str) -> dict[str, Any]:
    """The broker's final status (``ready`` must be 0: nothing left in the store), then the broker closed."""
    import ray

    status = ray.get(get_broker(name).status.remote())
    if status["ready"]:
        left = ray.get(get_broker(name).clear.remote())
        logger.warning("online run ended with %d batches still in the store; dropped", left)
    close_broker(name)
    return status


def train_in_process(config: PipelineConfig, regen_dir: Path, vocab_path: Path, out_dir: Path, *,
                     ray_address: str | None = None, slow_s: float = 0.0, backend: Any = None,
                     on_producers: Callable[[Producers], None] | None = None) -> dict[str, Any]:
    """Online training with the trainer in this process (one rank): tests and benchmarks. ``backend``: an already
    loaded capture backend, which one producer thread of this process uses instead of the producer actors."""
    from eagle3.online.source import OnlineBatchSource
    from eagle3.train.distributed import init_distributed
    from eagle3.train.trainer import load_inputs, train_on_source

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plan, name = open_run(config, regen_dir, out_dir, world_size=1, ray_address=ray_address)
    if backend is None:
        producers = start_producers(config, regen_dir, 1, name, slow_s=slow_s)
    else:
        producers = _producer_thread(config, plan, name, backend)
    if on_producers is not None:
        on_producers(producers)
    try:
        info = init_distributed(config.train.device)
        source = OnlineBatchSource(plan, get_broker(name), rank=info.rank, log_dir=out_dir, stop=producers.failed)
        summary = train_on_source(config, source, load_inputs(config, Path(vocab_path)), out_dir, info)
        producers.join(10.0)  # their counts: they return at their next claim
    finally:
        producers.stop()
        status = finish_run(name)
    return {**summary, "store": status, "producers": dict(producers.results)}


def _producer_thread(config: PipelineConfig, plan: OnlinePlan, name: str, backend: Any) -> Producers:
    """One producer on a thread of this process, over ``backend``."""
    from eagle3.online.producer import produce

    producers = Producers(config, [])

    def run() -> None:
        try:
            producers.results[0] = produce(config, plan, get_broker(name), "p0", backend=backend,
                                           stop=producers._stop.is_set)
        except Exception as exc:  # handed to the trainer through failed(), which stops it waiting
            producers.errors.append(f"producer p0 failed: {exc!r}")
            raise

    producers._thread = threading.Thread(target=run, name="online-producer", daemon=True)
    producers._thread.start()
    return producers


def worker_command(config_yaml: Path, regen_dir: Path, vocab: Path, out_dir: Path, *, address: str,
                   broker: str, nproc: int = 1, master_port: int = 29500) -> list[str]:
    """The trainer workers of an online run: one process, or ``nproc`` ranks under torchrun (as the stored path's
    ``eagle3.train.distributed.worker_command``), each taking its own batches from the broker."""
    worker = ["-m", "eagle3.online", "--config-yaml", str(config_yaml), "--regen", str(regen_dir), "--vocab",
              str(vocab), "--out", str(out_dir), "--ray-address", address, "--broker", broker]
    if nproc == 1:
        return [sys.executable, *worker]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--nnodes=1",
            "--master-addr=127.0.0.1", f"--master-port={master_port}", *worker]
