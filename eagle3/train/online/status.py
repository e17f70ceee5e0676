"""What a person watching an online run reads: each producer's state, batches, rate, restarts and
last error, the trainer's rate, the store's backlog and the ETA.

``online_status`` joins the broker's counters (``Broker.status``: deliveries per producer, claims,
what a restarted producer released, batches and samples the trainer took) with the supervisor's
record of each producer (``ProducerRecord``: its state, how often it was restarted, and why, naming
the batch it held). The run writes the result to ``online-status.json`` in the draft directory
(``eagle3.train.online.run.StatusReporter``, every ``orchestration.progress_every_s``); the train
stage reads it back for its progress note and its live producer table (``TrainStage.progress``,
``live_tables`` of an online run), which the Prefect tasks only publish. Nothing here talks to
Prefect or Ray.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.stage import LiveTable, human_duration

STATUS_FILE = "online-status.json"
ERROR_CHARS = 240  # a producer's last error in the table: its first line, cut


@dataclass
class ProducerRecord:
    """The supervisor's view of one producer: ``starting``, ``running``, ``restarting``, ``done`` or
    ``failed``."""

    state: str = "starting"
    restarts: int = 0
    last_error: str = ""

    def failed_on(self, batch: int | None, exc: BaseException, *, state: str) -> None:
        """Record an attempt that ended in ``exc`` while it held ``batch`` (None: between
        batches)."""
        first = (str(exc).strip().splitlines() or [""])[0]
        where = "between batches" if batch is None else f"batch {batch}"
        self.state, self.last_error = state, f"{where}: {type(exc).__name__}: {first}"[:ERROR_CHARS]


def online_status(broker: dict[str, Any], records: dict[str, ProducerRecord]) -> dict[str, Any]:
    """The status of a run from the broker's ``status()`` and the producers' records
    (JSON-ready)."""
    elapsed = max(float(broker.get("elapsed_s", 0.0)), 1e-9)
    claims: dict[str, list[int]] = {}
    for index, producer in broker.get("claims", {}).items():
        claims.setdefault(producer, []).append(int(index))
    producers = []
    for name in sorted(set(records) | set(broker.get("per_producer", {}))):
        record = records.get(name, ProducerRecord())
        delivered = int(broker.get("per_producer", {}).get(name, 0))
        # its current loop runs
        started = int(broker.get("registrations", {}).get(name, 0)) > record.restarts
        state = "running" if record.state == "restarting" and started else record.state
        producers.append(
            {
                "producer": name,
                "state": _state(state, sorted(claims.get(name, []))),
                "batches": delivered,
                "batches_per_s": delivered / elapsed,
                "restarts": record.restarts,
                "released": broker.get("released", {}).get(name, []),
                "last_error": record.last_error,
            }
        )
    left = broker["total"] - broker["consumed"]
    rate = broker.get("consumed_per_s", 0.0)
    eta = 0.0 if left <= 0 else (left / rate if rate > 0 else None)
    keep = (
        "total",
        "consumed",
        "delivered",
        "ready",
        "claimed",
        "max_inflight",
        "duplicates",
        "reclaimed",
        "consumed_samples",
    )
    return {
        **{k: broker[k] for k in keep if k in broker},
        "elapsed_s": elapsed,
        "trainer": {"batches_per_s": rate, "samples_per_s": broker.get("samples_per_s", 0.0)},
        "eta_s": eta,
        "producers": producers,
    }


def _state(state: str, claimed: list[int]) -> str:
    if state != "running":
        return state
    return (
        f"capturing batch {claimed[0]}"
        if claimed
        else "waiting (store full or nothing left to claim)"
    )


def read_online_status(out_dir: Path) -> dict[str, Any] | None:
    """The last status a run wrote in ``out_dir``; None before its first report (or when it is
    unreadable)."""
    try:
        return json.loads((Path(out_dir) / STATUS_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def eta_text(status: dict[str, Any]) -> str:
    if status["consumed"] >= status["total"]:
        return "done"
    return "unknown" if status.get("eta_s") is None else human_duration(status["eta_s"])


def status_note(status: dict[str, Any]) -> str:
    """Short enough for a progress card: the store's backlog, the trainer's rate, the producers and
    restarts."""
    restarts = sum(p["restarts"] for p in status["producers"])
    failed = [p["producer"] for p in status["producers"] if p["state"] == "failed"]
    note = (
        f"store {status['ready']}/{status['max_inflight']} batches held - trainer "
        f"{status['trainer']['samples_per_s']:,.2f} samples/s - {len(status['producers'])} producers, "
        f"{sum(p['batches_per_s'] for p in status['producers']):,.2f} batches/s"
    )
    if restarts:
        note += f", restarted: {', '.join(_restarted(status))}"
    return note + (f", FAILED: {failed}" if failed else "")


def _restarted(status: dict[str, Any]) -> list[str]:
    return [f"{p['producer']} x{p['restarts']}" for p in status["producers"] if p["restarts"]]


def status_line(status: dict[str, Any]) -> str:
    """The run's log line: every number of the table in one line."""
    producers = ", ".join(
        f"{p['producer']} {p['state']} {p['batches']} batches {p['batches_per_s']:.2f}/s"
        + (f" {p['restarts']} restarts (last: {p['last_error']})" if p["restarts"] else "")
        for p in status["producers"]
    )
    return (
        f"online: {status['consumed']}/{status['total']} batches trained, trainer "
        f"{status['trainer']['batches_per_s']:.2f} batches/s ({status['trainer']['samples_per_s']:.2f} "
        f"samples/s), store {status['ready']}/{status['max_inflight']} batches held, {status['duplicates']} "
        f"duplicates dropped, {status['reclaimed']} re-captured, ETA {eta_text(status)}; producers: {producers}"
    )


def producer_table(status: dict[str, Any]) -> LiveTable:
    """One row per producer, then the trainer and the store: the live table a person watches."""
    rows = [
        {
            "worker": p["producer"],
            "state": p["state"],
            "batches": str(p["batches"]),
            "rate": f"{p['batches_per_s']:.2f} batches/s",
            "restarts": p["restarts"],
            "last_error": p["last_error"],
        }
        for p in status["producers"]
    ]
    trainer = status["trainer"]
    done = status["consumed"] >= status["total"]
    rows.append(
        {
            "worker": "trainer",
            "state": "done" if done else "training",
            "batches": f"{status['consumed']}/{status['total']}",
            "rate": f"{trainer['batches_per_s']:.2f} batches/s, {trainer['samples_per_s']:.2f} samples/s",
            "restarts": "",
            "last_error": "",
        }
    )
    rows.append(
        {
            "worker": "store",
            "state": f"{status['ready']}/{status['max_inflight']} batches held "
            "(train.online.max_inflight)",
            "batches": f"{status['delivered']} delivered",
            "rate": "",
            "restarts": "",
            "last_error": f"{status['duplicates']} duplicates dropped, {status['reclaimed']} re-captured",
        }
    )
    description = f"ETA {eta_text(status)} - {status_note(status)}"
    return LiveTable(rows=rows, description=description)
