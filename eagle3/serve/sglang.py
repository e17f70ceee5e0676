"""What the project needs to know of SGLang to launch it, without the CPU shim: the pinned release,
the launcher module that replaces ``sglang.launch_server`` on this CPU, and the flags SGLang needs
to serve on a CPU.

The command builder (``eagle3.serve.launch_commands``) and the shim (``eagle3.serve.sglang_cpu``,
which refuses any other release) both read the pin here, so nothing but the launcher and the capture
worker imports the shim. Standard library only: it is imported in SGLang's interpreter too.
"""

from __future__ import annotations

SGLANG_VERSION = "0.5.23"
# run as ``python -m``, never imported by the library
CPU_LAUNCHER = "eagle3.serve.sglang_cpu.launch"
# What SGLang needs to serve on a CPU (docs/ARCHITECTURE.md on the CPU shim): its CPU engine, no
# CUDA graphs, a bounded KV pool (RAM is shared with everything else on the machine), and the
# attention backend that drives the ported ops.
CPU_FLAGS: tuple[str, ...] = (
    "--device",
    "cpu",
    "--attention-backend",
    "intel_amx",
    "--disable-cuda-graph",
    "--max-total-tokens",
    "8192",
)
