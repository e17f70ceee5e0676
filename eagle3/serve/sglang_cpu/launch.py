"""``python -m eagle3.serve.sglang_cpu.launch <flags of sglang.launch_server>``: SGLang's server on
this CPU.

The same steps as ``python -m sglang.launch_server`` (plugins, server args, ``run_server``, the
process tree killed on the way out), after ``shim.install``. The shim is installed at import, not
under ``__main__``: SGLang starts its scheduler and detokenizer with ``multiprocessing``'s spawn,
which re-imports this module by name (as ``__mp_main__``) in each child before anything of SGLang is
unpickled there, so every process has it. A wrong or missing SGLang exits with one line (code 2)
before anything loads.
"""

from __future__ import annotations

import argparse
import os
import sys

from eagle3.serve.sglang_cpu.shim import RuntimeMismatch, install

try:
    install()
except RuntimeMismatch as exc:
    print(f"error: {exc}", file=sys.stderr)
    raise SystemExit(2) from None


def parse(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed by SGLang's own parser (``ServerArgs.add_cli_args``), as
    ``sglang.launch_server`` parses it: ``SystemExit`` (argparse's way) on an unknown flag or a bad
    value."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    return parser.parse_args(argv)


def main(argv: list[str]) -> None:
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    server_args = prepare_server_args(argv)
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main(sys.argv[1:])
