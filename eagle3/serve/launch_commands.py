"""Server launch commands, generated from config, never hand-typed (docs/DESIGN.md, "Launch"): the
gate's arms, regen's server.

Design choices:
- One function builds every arm. The arms share one argument list (model, tp, dtype, context length,
  memory fraction, max running requests, CUDA graph batch size, extra args) and the speculative arm
  only appends the five ``--speculative-*`` flags, so "baseline and speculative differ only in
  speculation" holds by construction; preflight still diffs the two lists in case either was edited
  by hand.
- ``--max-running-requests`` is always emitted, the same for both arms: without it SGLang 0.5.23
  caps only the speculative server at 48 (``ServerArgs._handle_speculative_decoding`` in
  ``python/sglang/srt/server_args.py``), so the arms would compare different batch limits at high
  concurrency. Preflight checks both arms carry it.
- Flag spellings are those of the pinned SGLang (``SGLANG_VERSION``, the ``sglang`` extra). In
  0.5.23 the CUDA graph cap is ``--cuda-graph-max-bs-decode`` (the older ``--cuda-graph-max-bs`` is
  gone; argparse would reject it as an ambiguous prefix) and tensor parallelism is ``--tp-size``.
- Two engines (``server.engine``): ``sglang`` (``python -m sglang.launch_server``) and ``reference``
  (``python -m eagle3.serve.reference``, the project's CPU server). The reference engine carries the
  same model, context, batch and speculative flags; GPU/Hub-only flags (tp, memory fraction, CUDA
  graphs, revision, remote code, extra args) are SGLang's alone and are left out, identically for
  both arms.
- SGLang with ``server.device=cpu`` is SGLang itself on this CPU: the same command with the
  interpreter of the project's SGLang runtime (``infra/dev.sh sglang``; ``EAGLE3_SGLANG_PYTHON``
  names another), SGLang's entry point replaced by the project's launcher
  (``eagle3.serve.sglang_cpu.launch``: the same steps, after installing the torch ports of the CPU
  kernels), ``SGLANG_USE_CPU_ENGINE=1``, and only the CPU flags (``CPU_FLAGS``) appended. Both arms
  run on ``intel_amx`` attention, the one CPU backend with a draft backend, so the gate compares
  speculation, not two attention implementations.
- SGLang's adaptive speculation (``adaptive_config``: a ``--speculative-adaptive-config`` JSON file,
  written by the gate from its per-level measurement, ``eagle3.gate.serving``) appends
  ``--speculative-adaptive`` and the file to the speculative flags; the reference server has no such
  mode and refuses it.
- A command names a concrete port (port 0 becomes a free one here), so a printed line can be pasted.
  It is run by the project's one launcher (``eagle3.serve.launch.ServerProcess``), which owns where
  a server listens: it gets the line without ``--host``/``--port`` and adds them back, last.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Literal

from eagle3.config.gate import SpeculativeConfig
from eagle3.config.pipeline import PipelineConfig
from eagle3.data.served_log import log_flags
from eagle3.runtime.procs import free_port
from eagle3.serve.launch import LaunchError, ServerProcess
from eagle3.serve.sglang import CPU_FLAGS, CPU_LAUNCHER, SGLANG_VERSION

Arm = Literal["baseline", "eagle3"]
ARMS: tuple[str, ...] = ("baseline", "eagle3")
ENGINES: tuple[str, ...] = ("reference", "sglang")
MODULES: dict[str, str] = {"sglang": "sglang.launch_server", "reference": "eagle3.serve.reference"}
# torch intra-op threads of a server on a CPU, both engines: servers up side by side on one shared
# CPU with torch's default (a thread per core) oversubscribe it as soon as anything else runs, and
# one arm's throughput swings 10x (measured on the reference server: 8-77 vs 124-135 tok/s with one
# thread; SGLang's decode attention on a loaded 2-core box: 66 ms a call with two threads, 1.5 ms
# with one).
CPU_THREADS = 1
CPU_ENV: dict[str, str] = {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": str(CPU_THREADS)}
# SGLang loads a large target and captures CUDA graphs
HEALTH_TIMEOUT_S = {"reference": 180.0, "sglang": 1800.0}

ALGORITHM_FLAG = "--speculative-algorithm"
DRAFT_FLAG = "--speculative-draft-model-path"
SPECULATIVE_FLAGS: tuple[str, ...] = (
    ALGORITHM_FLAG,
    DRAFT_FLAG,
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
)
ADAPTIVE_FLAGS: tuple[str, ...] = ("--speculative-adaptive", "--speculative-adaptive-config")
MAX_RUNNING_FLAG = "--max-running-requests"
# Flags whose value differs per launch by design (where the server listens), ignored when arms are
# compared.
ADDRESS_FLAGS: tuple[str, ...] = ("--host", "--port")


@dataclass(frozen=True)
class LaunchCommand:
    """One server launch: ``argv`` starts with ``python -m <module>``; ``url`` is where it will
    listen."""

    arm: str
    engine: str
    argv: list[str]
    host: str
    port: int
    draft: str | None = None
    speculative: dict[str, int | str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def shell(self) -> str:
        return " ".join(
            [*(f"{k}={shlex.quote(v)}" for k, v in self.env.items()), shlex.join(self.argv)]
        )

    def server_args(self) -> list[str]:
        """The arguments after ``python -m <module>`` (what the server's own parser sees)."""
        return self.argv[3:]

    def server(
        self, *, log_path: Path | None = None, health_timeout_s: float | None = None
    ) -> ServerProcess:
        """This command under the launcher; ``python`` is this interpreter (the one with the
        packages).

        ``health_timeout_s`` defaults to the engine's (``HEALTH_TIMEOUT_S``)."""
        python = sys.executable if self.argv[0] == "python" else self.argv[0]
        if self.argv[2] == CPU_LAUNCHER:
            check_sglang_runtime(Path(python))
        return ServerProcess(
            [python, *without_address(self.argv[1:])],
            host=self.host,
            port=self.port,
            name=f"{self.arm} server ({self.engine})",
            log_path=log_path,
            health_timeout_s=health_timeout_s or HEALTH_TIMEOUT_S[self.engine],
            env=self.env,
        )


def sglang_runtime_python() -> Path:
    """The interpreter of the SGLang CPU runtime: ``EAGLE3_SGLANG_PYTHON``, else the one
    ``infra/dev.sh sglang`` installs (``$EAGLE3_HOME/sglang-cpu``, or ``EAGLE3_SGLANG_RUNTIME``)."""
    if os.environ.get("EAGLE3_SGLANG_PYTHON"):
        return Path(os.environ["EAGLE3_SGLANG_PYTHON"])
    home = Path(os.environ.get("EAGLE3_HOME", "~/.eagle3")).expanduser()
    return (
        Path(os.environ.get("EAGLE3_SGLANG_RUNTIME", home / "sglang-cpu")).expanduser()
        / "bin"
        / "python"
    )


class EngineUnavailable(LaunchError):
    """The configured engine is not installed where the launcher looks; the message says how to
    install it."""


@cache
def check_sglang_runtime(python: Path) -> None:
    """Raise ``EngineUnavailable`` (one line: how to install) unless ``python`` runs SGLang
    ``SGLANG_VERSION``."""
    install = "install it with `bash infra/dev.sh sglang` (or set EAGLE3_SGLANG_PYTHON to an interpreter that has it)"
    if not python.exists():
        raise EngineUnavailable(
            f"server.engine=sglang on a CPU needs the SGLang {SGLANG_VERSION} runtime, not "
            f"found at {python}: {install}"
        )
    probe = "import importlib.metadata as m; print(m.version('sglang'))"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120)
    found = done.stdout.strip() or "no SGLang"
    if done.returncode != 0 or found != SGLANG_VERSION:
        raise EngineUnavailable(
            f"{python} has {found if done.returncode == 0 else 'no SGLang'}, the CPU runtime "
            f"needs SGLang {SGLANG_VERSION}: {install}"
        )


def check_engine(config: PipelineConfig, engine: str | None = None) -> None:
    """Raise ``EngineUnavailable`` (one line) when ``engine`` (default ``server.engine``) cannot
    start here: SGLang on a CPU without the project's runtime. Commands call it before any work, not
    when the first server starts."""
    if (engine or config.server.engine) == "sglang" and config.server.device == "cpu":
        check_sglang_runtime(sglang_runtime_python())


def served_dtype(config: PipelineConfig) -> str:
    """The dtype every server of the config serves in, on both engines: ``server.dtype``, or when
    that is ``auto`` the target's (``target.dtype``). Never SGLang's own ``auto``, which serves a
    float32 checkpoint in float16: the reference server would then compute in another precision than
    SGLang, and regen, the gate's arms and capture would each see another target."""
    return config.target.dtype if config.server.dtype == "auto" else config.server.dtype


def shared_args(config: PipelineConfig, engine: str, *, host: str, port: int) -> list[str]:
    """Flags every arm of one engine carries, in a fixed order."""
    server, target = config.server, config.target
    args = ["--model-path", target.model_path]
    if engine == "sglang" and target.revision:
        args += ["--revision", target.revision]
    if engine == "sglang" and target.trust_remote_code:
        args.append("--trust-remote-code")
    args += ["--dtype", served_dtype(config)]
    args += ["--context-length", str(server.context_length or target.context_length)]
    args += [MAX_RUNNING_FLAG, str(server.max_running_requests)]
    if engine == "sglang":
        args += ["--tp-size", str(server.tp)]
        if server.mem_fraction_static is not None:
            args += ["--mem-fraction-static", str(server.mem_fraction_static)]
        if server.cuda_graph_max_bs is not None:
            args += ["--cuda-graph-max-bs-decode", str(server.cuda_graph_max_bs)]
        args += list(server.extra_args)
        if server.device == "cpu":
            args += CPU_FLAGS
    else:
        args += ["--num-threads", str(CPU_THREADS)]
    if server.log_requests:  # the same flags on both engines, the same logs
        args += log_flags(Path(server.log_requests).expanduser())
    args += ["--host", host, "--port", str(port)]
    return args


def speculative_args(spec: SpeculativeConfig, draft: str) -> list[str]:
    """The five speculative flags (set all of steps/topk/draft tokens, never some)."""
    return [
        ALGORITHM_FLAG,
        spec.algorithm,
        DRAFT_FLAG,
        draft,
        "--speculative-num-steps",
        str(spec.num_steps),
        "--speculative-eagle-topk",
        str(spec.eagle_topk),
        "--speculative-num-draft-tokens",
        str(spec.num_draft_tokens),
    ]


def _entry(config: PipelineConfig, engine: str) -> tuple[list[str], dict[str, str]]:
    """``python -m <module>`` of an engine, and the environment it needs."""
    if engine == "sglang" and config.server.device == "cpu":
        return [str(sglang_runtime_python()), "-m", CPU_LAUNCHER], dict(CPU_ENV)
    return ["python", "-m", MODULES[engine]], {}


def build_launch(
    config: PipelineConfig,
    arm: str,
    *,
    engine: str | None = None,
    draft: str | Path | None = None,
    speculative: SpeculativeConfig | None = None,
    port: int | None = None,
    adaptive_config: str | Path | None = None,
) -> LaunchCommand:
    """The launch command of one arm on ``engine`` (default ``server.engine``). ``speculative``
    defaults to ``config.speculative``; port 0 picks a free one; ``adaptive_config`` (SGLang only)
    turns on SGLang's adaptive speculation with that JSON file (``speculative.num_steps`` must be
    one of its candidate steps)."""
    engine = engine or config.server.engine
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}: use one of {list(ARMS)}")
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}: use one of {list(ENGINES)}")
    host = config.server.host
    port = config.server.port if port is None else port
    port = port or free_port(host)
    entry, env = _entry(config, engine)
    argv = [*entry, *shared_args(config, engine, host=host, port=port)]
    if arm == "baseline":
        return LaunchCommand(arm, engine, argv, host, port, env=env)
    if draft is None:
        raise ValueError(
            "the eagle3 arm needs a draft: pass --draft <export dir> (an SGLang-ready draft directory)"
        )
    spec = speculative or config.speculative
    draft_path = (
        str(Path(draft).expanduser().resolve()) if Path(draft).expanduser().exists() else str(draft)
    )
    argv += speculative_args(spec, draft_path)
    if adaptive_config is not None:
        if engine != "sglang":
            raise ValueError(
                "adaptive speculation (--speculative-adaptive-config) is SGLang's: build it with "
                "engine='sglang'"
            )
        argv += [
            ADAPTIVE_FLAGS[0],
            ADAPTIVE_FLAGS[1],
            str(Path(adaptive_config).expanduser().resolve()),
        ]
    return LaunchCommand(
        arm,
        engine,
        argv,
        host,
        port,
        draft=draft_path,
        speculative=spec.model_dump(mode="json"),
        env=env,
    )


def split_speculative(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """Split server args into the non-speculative ones and a ``{flag: value}`` dict of
    ``--speculative-*`` flags (a switch such as ``--speculative-adaptive``, followed by another flag
    or nothing, has the value ``""``)."""
    shared: list[str] = []
    spec: dict[str, str] = {}
    i = 0
    while i < len(args):
        token = args[i]
        name, eq, inline = token.partition("=")
        if name.startswith("--speculative-"):
            valued = not eq and i + 1 < len(args) and not args[i + 1].startswith("--")
            spec[name] = inline if eq else args[i + 1] if valued else ""
            i += 2 if valued else 1
            continue
        shared.append(token)
        i += 1
    return shared, spec


def without_address(args: list[str]) -> list[str]:
    """``args`` without ``--host``/``--port`` and their values (where a server listens is not a
    served setting)."""
    out: list[str] = []
    skip = False
    for token in args:
        if skip:
            skip = False
            continue
        name = token.partition("=")[0]
        if name in ADDRESS_FLAGS:
            skip = "=" not in token
            continue
        out.append(token)
    return out
