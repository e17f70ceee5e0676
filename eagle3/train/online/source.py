"""The trainer's side of online training: a ``BatchSource`` (``eagle3.train.trainer``) over the
store.

Its position is ``(epoch, step)`` like the stored loader's, saved in every checkpoint; a resumed
rank ``seek``s the broker there, so the batches it had taken since that checkpoint are captured
again and nothing before it is. It asks for one batch at a time, its next; every batch passes
``check_message`` before it trains. The sample ids of each batch handed out are appended to
``trained-rank<r>.jsonl`` in the draft directory, cut back to the checkpoint's position on resume:
the log lists exactly what the final weights trained on (the kill tests count it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from eagle3.capture.encoding import column_codecs
from eagle3.config.pipeline import PipelineConfig
from eagle3.train.continual import Start
from eagle3.train.distributed import DistInfo
from eagle3.train.online.batch import check_message, collate
from eagle3.train.online.plan import OnlinePlan
from eagle3.train.online.transport import connect, get_broker, take
from eagle3.train.workers import Batches

LOG_NAME = "trained-rank{rank}.jsonl"


class OnlineBatchSource:
    """Batches of ``plan`` for ``rank``, taken from ``broker`` in order (module docstring)."""

    def __init__(
        self,
        plan: OnlinePlan,
        broker: Any,
        *,
        rank: int,
        log_dir: Path | None = None,
        hidden_dtype: torch.dtype | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> None:
        config = plan.config
        capture = config.capture
        self.plan, self.broker, self.rank, self.stop = plan, broker, rank, stop
        self.codecs = column_codecs(
            capture.encoding, capture.dtype, config.target.hidden_size, topk=capture.topk
        )
        self.hidden_dtype, self.max_seq_len = hidden_dtype, config.train.max_seq_len
        self.epoch, self.step = 0, 0
        self._fp = plan.fingerprint()
        self._last: tuple = ()
        self._positioned = False
        self.log = Path(log_dir) / LOG_NAME.format(rank=rank) if log_dir is not None else None

    def __len__(self) -> int:
        return self.plan.steps_per_epoch

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        # a fresh start (no checkpoint): what a killed earlier attempt took is redone
        if not self._positioned:
            self._seek()
        while self.step < len(self):
            index = self.plan.index(self.epoch, self.step, self.rank)
            key = self.plan.key(index)
            _, message = take(self.broker, self.rank, index, stop=self.stop)
            states = check_message(
                message, key=key, features_fp=self.plan.features_fp, codecs=self.codecs
            )
            batch = collate(
                message,
                states,
                codecs=self.codecs,
                hidden_dtype=self.hidden_dtype,
                max_seq_len=self.max_seq_len,
            )
            del message, states  # the store's object is freed once the batch is built
            self._last = key
            self._record(key)
            self.step += 1
            yield batch
        self.epoch, self.step = self.epoch + 1, 0

    def _record(self, key: tuple) -> None:
        if self.log is None:
            return
        with self.log.open("a") as f:
            f.write(json.dumps({"epoch": key[0], "step": key[1], "samples": list(key[3])}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def origin(self) -> str:
        if not self._last:
            return "no batch yet"
        epoch, step, rank, ids = self._last
        return f"online batch epoch {epoch} step {step} rank {rank}: samples {list(ids)}"

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "step": self.step, "plan_fingerprint": self._fp}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state``'s position: the broker re-opens what this rank took since, the log is
        cut back."""
        if state.get("plan_fingerprint") not in (None, self._fp):
            raise ValueError(
                "the checkpoint's loader state is for another online plan (regen shards, seed, batch "
                f"size, ranks, features): resume with the same config, or start a new run: {state}"
            )
        self.epoch, self.step = int(state["epoch"]), int(state["step"])
        if self.step >= len(self):
            self.epoch, self.step = self.epoch + 1, 0
        self._seek()

    def _seek(self) -> None:
        import ray

        ray.get(
            self.broker.seek.remote(self.rank, self.plan.index(self.epoch, self.step, self.rank))
        )
        self._positioned = True
        if self.log is not None and self.log.exists():
            position = (self.epoch, self.step)
            keep = [
                line
                for line in self.log.read_text().splitlines()
                if (json.loads(line)["epoch"], json.loads(line)["step"]) < position
            ]
            tmp = self.log.with_suffix(".tmp")
            tmp.write_text("".join(f"{line}\n" for line in keep))
            os.replace(tmp, self.log)


def broker_batches(
    config: PipelineConfig,
    regen_dir: Path,
    log_dir: Path,
    broker: str,
    *,
    ray_address: str | None = None,
    stop: Callable[[], bool] | None = None,
) -> Batches:
    """Each rank's batches of the online plan over ``regen_dir`` (planned for the group's world
    size), taken from the run's ``broker`` (Ray at ``ray_address`` is joined now); ``stop`` ends a
    wait when the producers failed."""
    connect(ray_address)

    def source(info: DistInfo, start: Start) -> OnlineBatchSource:
        plan = OnlinePlan.for_night(config, Path(regen_dir), world_size=info.world_size)
        store = get_broker(broker)
        return OnlineBatchSource(plan, store, rank=info.rank, log_dir=log_dir, stop=stop)

    return source
