"""A capture producer: claims the epoch's batches in order, captures them, puts them in the store.

``produce`` is the loop of one producer (one capture replica: an ``hf`` target, or one SGLang engine
with its TP ranks behind the ``sglang`` backend); ``ProducerActor`` runs it as a Ray actor, which
``eagle3.train.online.run`` restarts when its process dies. A producer never writes a feature shard:
each batch lives only in the object store, from its delivery until a trainer rank takes it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagle3.capture.encoding import column_codecs
from eagle3.config.pipeline import PipelineConfig
from eagle3.train.feature_reader import open_features, read_row_group
from eagle3.train.online.batch import Stored, make_message, states_of
from eagle3.train.online.broker import DONE, WAIT
from eagle3.train.online.plan import OnlinePlan
from eagle3.train.online.transport import deliver

logger = logging.getLogger(__name__)


def produce(
    config: PipelineConfig,
    plan: OnlinePlan,
    broker: Any,
    producer: str,
    *,
    backend: Any = None,
    stop: Callable[[], bool] | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> dict[str, int]:
    """Capture and deliver batches until the broker says every batch is delivered; returns
    counts."""
    import ray

    if backend is None:
        from eagle3.capture.shard import shared_backend

        backend = shared_backend(config)
    capture = config.capture
    codecs = column_codecs(
        capture.encoding, capture.dtype, config.target.hidden_size, topk=capture.topk
    )
    released = ray.get(broker.register.remote(producer))
    if released:
        logger.info(
            "producer %s restarted: %d batches it had claimed are open again", producer, released
        )
    counts = {
        "delivered": 0,
        "duplicates": 0,
        "tokens": 0,
        "samples_captured": 0,
        "samples_read": 0,
    }
    while stop is None or not stop():
        index = ray.get(broker.claim.remote(producer, 1.0))
        if index == DONE:
            break
        if index == WAIT:
            continue
        if on_batch is not None:
            on_batch(index)
        samples = plan.samples(index)
        message = make_message(
            plan.key(index),
            plan.features_fp,
            samples,
            _states(backend, samples, plan.stored_rows(index), codecs),
            codecs=codecs,
            backend=backend,
            hidden_size=config.target.hidden_size,
        )
        fresh = deliver(broker, producer, index, plan.key(index), message)
        counts["delivered" if fresh else "duplicates"] += 1
        counts["tokens"] += sum(len(s.input_ids) for s in samples)
        read = sum(where is not None for where in plan.stored_rows(index))
        counts["samples_read"] += read
        counts["samples_captured"] += len(samples) - read
    return counts


def _states(backend: Any, samples: list, stored: list, codecs: tuple) -> list:
    """Each sample's states: read from its stored feature shard (earlier stored nights), else
    captured now."""
    capture = [s for s, where in zip(samples, stored, strict=True) if where is None]
    captured = iter(states_of(backend, capture) if capture else [])
    files: dict[tuple[Path, int], Any] = {}
    out = []
    for where in stored:
        if where is None:
            out.append(next(captured))
            continue
        path, row_group, row = where
        if (path, row_group) not in files:
            files[(path, row_group)] = read_row_group(open_features(path), row_group, codecs)
        decoded = files[(path, row_group)]
        out.append(Stored(decoded.aux[row], decoded.last[row]))
    return out


class ProducerActor:
    """``produce`` in a Ray actor (``run.py`` wraps it with ``ray.remote``): loads its backend
    once."""

    def __init__(
        self, config_yaml: str, regen_dir: str, world_size: int, broker_name: str, producer: str
    ) -> None:
        import torch
        import yaml

        from eagle3.train.online.transport import get_broker

        # the YAML text, not a path: the actor may run on another node
        self.config = PipelineConfig.model_validate(yaml.safe_load(config_yaml))
        torch.set_num_threads(max(1, int(os.environ.get("EAGLE3_PRODUCER_THREADS", "1"))))
        self.plan = OnlinePlan.for_night(self.config, regen_dir, world_size=world_size)
        self.broker = get_broker(broker_name)
        self.producer = producer
        self.started = time.time()

    def pid(self) -> int:
        return os.getpid()

    def run(self, slow_s: float = 0.0) -> dict[str, int]:
        """The produce loop; ``slow_s`` sleeps before each batch (tests that kill a producer
        mid-batch)."""
        return produce(
            self.config,
            self.plan,
            self.broker,
            self.producer,
            on_batch=(lambda _: time.sleep(slow_s)) if slow_s else None,
        )
