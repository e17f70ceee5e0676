"""Server launch commands of the gate's arms, generated from config, never hand-typed (DESIGN §5).

Design choices:
- One function builds every arm. The arms share one argument list (model, tp, dtype, context length, memory
  fraction, max running requests, CUDA graph batch size, extra args) and the speculative arm only appends the five
  ``--speculative-*`` flags, so "baseline and speculative differ only in speculation" holds by construction;
  preflight still diffs the two lists in case either was edited by hand.
- ``--max-running-requests`` is always emitted, the same for both arms: without it SGLang 0.5.23 caps only the
  speculative server at 48 (``ServerArgs._handle_speculative_decoding`` in ``python/sglang/srt/server_args.py``), so
  the arms would compare different batch limits at high concurrency. Preflight checks both arms carry it.
- Flag spellings are those of the pinned SGLang (``SGLANG_VERSION``, the ``sglang`` extra). In 0.5.23 the CUDA graph
  cap is ``--cuda-graph-max-bs-decode`` (the older ``--cuda-graph-max-bs`` is gone; argparse would reject it as an
  ambiguous prefix) and tensor parallelism is ``--tp-size``.
- Two flavours: ``sglang`` (``python -m sglang.launch_server``) and ``reference`` (``python -m eagle3.serve``, the
  project's CPU server). The reference flavour carries the same model, context, batch and speculative flags;
  GPU/Hub-only flags (tp, memory fraction, CUDA graphs, revision, remote code, extra args) are SGLang's alone and
  are left out, identically for both arms.
- A command names a concrete port (port 0 becomes a free one here), so a printed line can be pasted. It is run by
  the project's one launcher (``eagle3.serve.launch.ServerProcess``), which owns where a server listens: it gets
  the line without ``--host``/``--port`` and adds them back, last.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from eagle3.config import PipelineConfig, SpeculativeConfig
from eagle3.procs import free_port
from eagle3.serve.launch import ServerProcess

SGLANG_VERSION = "0.5.23"
Arm = Literal["baseline", "eagle3"]
Flavour = Literal["sglang", "reference"]
ARMS: tuple[str, ...] = ("baseline", "eagle3")
FLAVOURS: tuple[str, ...] = ("sglang", "reference")
MODULES: dict[str, str] = {"sglang": "sglang.launch_server", "reference": "eagle3.serve"}
REFERENCE_THREADS = 1  # torch intra-op threads of a reference arm (see shared_args)

ALGORITHM_FLAG = "--speculative-algorithm"
DRAFT_FLAG = "--speculative-draft-model-path"
SPECULATIVE_FLAGS: tuple[str, ...] = (
    ALGORITHM_FLAG,
    DRAFT_FLAG,
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
)
MAX_RUNNING_FLAG = "--max-running-requests"
# Flags whose value differs per launch by design (where the server listens), ignored when arms are compared.
ADDRESS_FLAGS: tuple[str, ...] = ("--host", "--port")


@dataclass(frozen=True)
class LaunchCommand:
    """One server launch: ``argv`` starts with ``python -m <module>``; ``url`` is where it will listen."""

    arm: str
    flavour: str
    argv: list[str]
    host: str
    port: int
    draft: str | None = None
    speculative: dict[str, int | str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def shell(self) -> str:
        return shlex.join(self.argv)

    def server_args(self) -> list[str]:
        """The arguments after ``python -m <module>`` (what the server's own parser sees)."""
        return self.argv[3:]

    def server(self, *, log_path: Path | None = None, health_timeout_s: float = 300.0) -> ServerProcess:
        """This command under the launcher, with this interpreter (the one with the packages) as ``python``."""
        return ServerProcess(
            [sys.executable, *without_address(self.argv[1:])],
            host=self.host,
            port=self.port,
            name=f"{self.arm} server",
            log_path=log_path,
            health_timeout_s=health_timeout_s,
        )


def _served_dtype(config: PipelineConfig, flavour: str) -> str:
    if config.server.dtype != "auto" or flavour == "sglang":
        return config.server.dtype
    return config.target.dtype


def shared_args(config: PipelineConfig, flavour: str, *, host: str, port: int) -> list[str]:
    """Flags every arm of one flavour carries, in a fixed order."""
    server, target = config.server, config.target
    args = ["--model-path", target.model_path]
    if flavour == "sglang" and target.revision:
        args += ["--revision", target.revision]
    if flavour == "sglang" and target.trust_remote_code:
        args.append("--trust-remote-code")
    args += ["--dtype", _served_dtype(config, flavour)]
    args += ["--context-length", str(server.context_length or target.context_length)]
    args += [MAX_RUNNING_FLAG, str(server.max_running_requests)]
    if flavour == "sglang":
        args += ["--tp-size", str(server.tp)]
        if server.mem_fraction_static is not None:
            args += ["--mem-fraction-static", str(server.mem_fraction_static)]
        if server.cuda_graph_max_bs is not None:
            args += ["--cuda-graph-max-bs-decode", str(server.cuda_graph_max_bs)]
        args += list(server.extra_args)
    else:  # arms are up side by side on one shared CPU; torch's default (a thread per core) oversubscribes it as soon
        # as anything else runs and one arm's throughput swings 10x (measured 8-77 vs 124-135 tok/s with one thread)
        args += ["--num-threads", str(REFERENCE_THREADS)]
    args += ["--host", host, "--port", str(port)]
    return args


def speculative_args(spec: SpeculativeConfig, draft: str) -> list[str]:
    """The five speculative flags (DESIGN §5: set all of steps/topk/draft tokens, never some)."""
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


def build_launch(
    config: PipelineConfig,
    arm: str,
    *,
    flavour: str = "sglang",
    draft: str | Path | None = None,
    speculative: SpeculativeConfig | None = None,
    port: int | None = None,
) -> LaunchCommand:
    """The launch command of one arm. ``speculative`` defaults to ``config.speculative``; port 0 picks a free one."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}: use one of {list(ARMS)}")
    if flavour not in FLAVOURS:
        raise ValueError(f"unknown flavour {flavour!r}: use one of {list(FLAVOURS)}")
    host = config.server.host
    port = config.server.port if port is None else port
    port = port or free_port(host)
    argv = ["python", "-m", MODULES[flavour], *shared_args(config, flavour, host=host, port=port)]
    if arm == "baseline":
        return LaunchCommand(arm, flavour, argv, host, port)
    if draft is None:
        raise ValueError("the eagle3 arm needs a draft: pass --draft <export dir> (an SGLang-ready draft directory)")
    spec = speculative or config.speculative
    draft_path = str(Path(draft).expanduser().resolve()) if Path(draft).expanduser().exists() else str(draft)
    argv += speculative_args(spec, draft_path)
    return LaunchCommand(arm, flavour, argv, host, port, draft=draft_path, speculative=spec.model_dump(mode="json"))


def split_speculative(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """Split server args into the non-speculative ones and a ``{flag: value}`` dict of ``--speculative-*`` flags."""
    shared: list[str] = []
    spec: dict[str, str] = {}
    i = 0
    while i < len(args):
        token = args[i]
        name, eq, inline = token.partition("=")
        if name.startswith("--speculative-"):
            if eq:
                spec[name] = inline
                i += 1
            else:
                spec[name] = args[i + 1] if i + 1 < len(args) else ""
                i += 2
            continue
        shared.append(token)
        i += 1
    return shared, spec


def without_address(args: list[str]) -> list[str]:
    """``args`` without ``--host``/``--port`` and their values (where a server listens is not a served setting)."""
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


def parse_with_sglang(args: list[str]):  # -> argparse.Namespace
    """Parse server args with the pinned SGLang's own parser (needs the ``sglang`` extra importable).

    Raises ``SystemExit`` (argparse's way) on an unknown flag or a bad value, ``ImportError`` without SGLang.
    """
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    return parser.parse_args(args)

