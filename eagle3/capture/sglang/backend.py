"""The ``sglang`` capture backend's capture-process side: it starts one worker per tensor-parallel
rank in SGLang's interpreter (``eagle3.capture.sglang.worker``), sends every rank each batch's token
ids, and hands the writer rank 0's states as views of the batch's shared-memory file
(``eagle3.capture.sglang.channel``).

Design choices:
- **Workers, not SGLang in this process.** The capture task runs where Prefect, pyarrow and the
  writer live; SGLang runs where its runtime lives (on this CPU, a venv of its own:
  ``eagle3.serve.launch_commands.sglang_runtime_python``; on a GPU node, this interpreter when the
  ``sglang`` extra is installed, or ``EAGLE3_SGLANG_PYTHON``). A rank per process is how SGLang runs
  tensor parallelism anyway (its scheduler processes), and it keeps a CUDA context, a
  ``torch.distributed`` group and SGLang's process-global state out of a process that runs other
  stages' threads.
- **Every rank gets every batch from here.** Each rank reads the same ids on its stdin and answers
  on its own pipe, so no rank waits on a broadcast from another, and a rank that dies or fails is
  seen at once: the backend then stops every rank (a collective would otherwise hang the others) and
  raises with that rank's log; the next batch (the shard's retry) starts them again.
- **Layers checked, not assumed.** The workers receive the draft's layer ids (``export_layer_ids``),
  which SGLang maps by the target's own ``set_eagle3_layers_to_capture`` exactly as when it serves
  the draft; the backend refuses to capture unless the layers SGLang reports capturing are
  ``config.sglang_layer_ids``, the ids the manifest records. Likewise the hidden size and the KV
  pool's room for the largest batch are checked before any batch.
- **Top-k on the ranks.** For ``fp8_topk`` the ranks compute the target's top-k over their vocab
  shards and merge it (``worker.Runner._topk``): this process never holds a Kimi-sized ``lm_head``,
  and the backend yields ``TopK`` final values instead of states.
- **Memory checked before loading** (``eagle3.capture.footprint.served_plan``): served weights plus
  capture buffers per GPU against the smallest free GPU (or RAM on a CPU), both numbers in the
  refusal.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from eagle3.capture.backends import TopK, register_backend
from eagle3.capture.encoding import encoding_topk
from eagle3.capture.footprint import check_served_fits, free_gpu_bytes, served_plan
from eagle3.capture.sglang.channel import ChannelClosed, LineReader, read_tensors, send, shm_root
from eagle3.config.capture import sglang_ranks
from eagle3.runtime.procs import free_port
from eagle3.runtime.stop import spawn
from eagle3.serve.launch_commands import check_sglang_runtime, sglang_runtime_python
from eagle3.serve.sglang import CPU_FLAGS

if TYPE_CHECKING:
    from eagle3.config.pipeline import PipelineConfig

logger = logging.getLogger(__name__)
WORKER = "eagle3.capture.sglang.worker"
DIR_PREFIX = "eagle3-capture-"
POLL_S = 0.5  # how long one rank's pipe is waited on before the next one's


# Where worker_args takes each flag a load failure may point at.
FLAG_SOURCES = (
    "--context-length is capture.max_seq_len, --max-total-tokens the larger of it and capture.batch_tokens, "
    "--tp-size/--ep-size/--quantization/--mem-fraction-static capture.sglang.*, --dtype capture.dtype"
)


class CaptureWorkerError(RuntimeError):
    """A capture worker failed to start or to forward a batch; the message quotes its log."""


def worker_args(config: PipelineConfig, *, nccl_port: int) -> list[str]:
    """The SGLang flags of every rank: the target as a server of it takes them (model, revision,
    remote code, quantization, tp/ep, memory fraction, extra args; on a CPU the same CPU flags as
    the project's servers) plus the capture-only EAGLE-3 mode with the draft's layer ids, and a KV
    pool sized for the largest batch."""
    target, capture, sglang = config.target, config.capture, config.capture.sglang
    # a planned batch, or one sample longer than one
    tokens = max(capture.batch_tokens, capture.max_seq_len)
    args = [
        "--model-path",
        target.model_path,
        "--dtype",
        capture.dtype,
        "--context-length",
        str(capture.max_seq_len),
        "--tp-size",
        str(sglang_ranks(capture, config.server.tp)),
        "--nccl-port",
        str(nccl_port),
        "--enable-return-aux-hidden-states",
        "--speculative-algorithm",
        "EAGLE3",
        "--return-aux-hidden-state-layer-ids",
        *map(str, config.export_layer_ids),
    ]
    args += ["--revision", target.revision] if target.revision else []
    args += ["--trust-remote-code"] if target.trust_remote_code else []
    args += ["--ep-size", str(sglang.ep)] if sglang.ep > 1 else []
    args += ["--quantization", sglang.quantization] if sglang.quantization else []
    args += (
        ["--mem-fraction-static", str(sglang.mem_fraction_static)]
        if sglang.mem_fraction_static
        else []
    )
    if capture.device == "cpu":
        args += _with_value(CPU_FLAGS, "--max-total-tokens", str(tokens))
    else:
        # prefill only: decode graphs would take memory and start-up time
        args.append("--disable-cuda-graph")
    return [*args, *sglang.extra_args]


def _with_value(flags: tuple[str, ...], flag: str, value: str) -> list[str]:
    out = list(flags)
    out[out.index(flag) + 1] = value
    return out


def worker_env(config: PipelineConfig) -> dict[str, str]:
    """The workers' environment: on a CPU, SGLang's CPU engine, this process's torch threads split
    over the ranks and, for several ranks, SGLang's per-rank core binding (it refuses more ranks
    than NUMA nodes without one)."""
    if config.capture.device != "cpu":
        return {}
    ranks = sglang_ranks(config.capture, config.server.tp)
    cores = (
        sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else list(range(os.cpu_count() or 1))
    )
    share = max(1, len(cores) // ranks)
    bind = "|".join(
        ",".join(map(str, cores[r * share : (r + 1) * share] or cores[-1:])) for r in range(ranks)
    )
    return {
        "SGLANG_USE_CPU_ENGINE": "1",
        "OMP_NUM_THREADS": str(max(1, torch.get_num_threads() // ranks)),
        **({"SGLANG_CPU_OMP_THREADS_BIND": bind} if ranks > 1 else {}),
    }


def worker_python(config: PipelineConfig) -> Path:
    """SGLang's interpreter: the CPU runtime on a CPU; on GPUs ``EAGLE3_SGLANG_PYTHON``, else this
    one."""
    if config.capture.device == "cpu":
        return sglang_runtime_python()
    return Path(os.environ.get("EAGLE3_SGLANG_PYTHON") or sys.executable)


class _Rank:
    """One worker process: its stdin (requests), its reply pipe, its log."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "ab") as sink:
            pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": sink}
            self.proc = spawn(argv, **pipes, env=env, text=True)
        self.replies = LineReader(self.proc.stdout.fileno())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "<no log>"

    def stop(self) -> None:
        if self.alive():
            try:
                send(self.proc.stdin, {"op": "close"})
                self.proc.wait(timeout=30)
            except (ChannelClosed, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            stream.close()


class SGLangBackend:
    """Capture on SGLang's model runner (module docstring). Thread-safe: shard tasks share one,
    batches in turn."""

    def __init__(self, config: PipelineConfig) -> None:
        self.config = config
        self.hidden_size = config.target.hidden_size
        self.topk = encoding_topk(config.capture.encoding, config.capture.topk)
        self.ranks = sglang_ranks(config.capture, config.server.tp)
        self._lock = threading.Lock()
        self._workers: list[_Rank] = []
        self._batch = 0
        self.facts: dict = {}
        self.dir = Path(shm_root()) / f"{DIR_PREFIX}{os.getpid()}-{id(self):x}"
        sweep_stale_dirs(shm_root())
        check_served_fits(
            served_plan(config), free_gpu_bytes(config.capture.device, self.ranks), config=config
        )
        atexit.register(self.close)
        with self._lock:
            self._start()

    def _start(self) -> None:
        python = worker_python(self.config)
        if self.config.capture.device == "cpu":
            check_sglang_runtime(python)
        self.dir.mkdir(parents=True, exist_ok=True)
        args = worker_args(self.config, nccl_port=free_port())
        env = {**os.environ, **worker_env(self.config)}
        logger.info(
            "starting %d SGLang capture worker(s) (%s): %s", self.ranks, python, " ".join(args)
        )
        self._workers = [
            _Rank(
                [
                    str(python),
                    "-m",
                    WORKER,
                    "--rank",
                    str(r),
                    "--out-dir",
                    str(self.dir),
                    "--",
                    *args,
                ],
                env,
                self.dir / f"rank-{r}.log",
            )
            for r in range(self.ranks)
        ]
        ready = self._collect(
            self.config.capture.sglang.start_timeout_s,
            f"load the target with the flags {' '.join(args)} (from the config: {FLAG_SOURCES})",
        )
        self.facts = ready[0]  # layers, hidden size, the pools' capacity (tokens, requests)
        self._check(self.facts)

    def _check(self, facts: dict) -> None:
        capture, expected = self.config.capture, self.config.sglang_layer_ids
        problems = []
        if facts["layers"] != expected:
            problems.append(
                f"SGLang captures layers {facts['layers']} (input_of_layer) for draft ids "
                f"{self.config.export_layer_ids}, not the configured {expected}: check target.family"
            )
        if facts["hidden_size"] != self.hidden_size:
            problems.append(
                f"the target's hidden size is {facts['hidden_size']}: set target.hidden_size to it"
            )
        need = max(capture.batch_tokens, capture.max_seq_len)
        if facts["max_tokens"] < need:
            problems.append(
                f"SGLang's KV pool holds {facts['max_tokens']} tokens, a batch needs {need}: lower "
                "capture.batch_tokens or raise capture.sglang.mem_fraction_static"
            )
        if problems:
            self._stop()
            raise CaptureWorkerError("capture.backend=sglang refused: " + "; ".join(problems))

    def _collect(self, timeout_s: float, what: str) -> list[dict]:
        """Every rank's reply, in rank order, read as they come: a rank that fails or exits is
        reported at once, not after the ranks waiting for it in a collective time out. On any
        failure every rank is stopped and the error quotes that rank's log."""
        replies: dict[int, dict] = {}
        deadline = time.monotonic() + timeout_s
        while len(replies) < len(self._workers):
            for rank, worker in enumerate(self._workers):
                if rank in replies:
                    continue
                try:
                    reply = worker.replies.read(POLL_S)
                except TimeoutError:
                    if worker.alive() and time.monotonic() < deadline:
                        continue
                    reply = {
                        "error": f"no answer in {timeout_s:.0f}s" if worker.alive() else "it exited"
                    }
                except ChannelClosed:
                    reply = {"error": f"its pipe closed (exit code {worker.proc.poll()})"}
                if "error" in reply:
                    self._stop()
                    raise CaptureWorkerError(
                        f"SGLang capture rank {rank} could not {what}: {reply['error']}. "
                        f"Its log {worker.log} ends:\n{worker.tail()}"
                    )
                replies[rank] = reply
        return [replies[rank] for rank in range(len(self._workers))]

    def forward(
        self, batch_ids: list[list[int]]
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor | TopK]]:
        """Per sample, in order: ``(aux [T, 3H], last [T, H])``, or ``(aux, TopK)`` for
        ``fp8_topk``; CPU views of the batch's shared-memory file."""
        with self._lock:
            if not self._workers or not all(w.alive() for w in self._workers):
                # the first batch after a failure (a retried shard) starts the ranks again
                self._start()
            self._batch += 1
            message = {"op": "forward", "batch": self._batch, "ids": batch_ids, "topk": self.topk}
            for worker in self._workers:
                # a rank that is gone is reported by _collect, with its log
                with contextlib.suppress(ChannelClosed):
                    send(worker.proc.stdin, message)
            reply = self._collect(
                self.config.capture.sglang.batch_timeout_s, f"forward batch {self._batch}"
            )[0]
        tensors = read_tensors(Path(reply["file"]), reply["layout"])
        return _samples(tensors, [len(ids) for ids in batch_ids])

    def _stop(self) -> None:
        for worker in self._workers:
            worker.stop()
        self._workers = []

    def close(self) -> None:
        """Stop every rank and remove the batch directory (batches already read stay mapped until
        dropped)."""
        with self._lock:
            self._stop()
            shutil.rmtree(self.dir, ignore_errors=True)


Final = torch.Tensor | TopK


@register_backend("sglang")
def _sglang_factory(config: PipelineConfig) -> SGLangBackend:
    return SGLangBackend(config)


def _samples(
    tensors: dict[str, torch.Tensor], lengths: list[int]
) -> Iterator[tuple[torch.Tensor, Final]]:
    aux = tensors["aux"].split(lengths)
    if "ids" in tensors:
        pairs = zip(tensors["ids"].split(lengths), tensors["probs"].split(lengths), strict=True)
        final: list[Final] = [TopK(ids, probs) for ids, probs in pairs]
    else:
        final = list(tensors["last"].split(lengths))
    yield from zip(aux, final, strict=True)


def sweep_stale_dirs(root: Path) -> None:
    """Remove batch directories whose capture process is gone (a ``kill -9`` leaves its directory
    behind)."""
    for path in root.glob(f"{DIR_PREFIX}*"):
        pid = path.name.removeprefix(DIR_PREFIX).split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
