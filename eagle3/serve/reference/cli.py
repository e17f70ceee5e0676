"""``python -m eagle3.serve.reference`` / ``eagle3 serve``: parse flags, load the generator, serve
until killed."""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from collections.abc import Sequence

from aiohttp import web

from eagle3.serve.reference.app import build_app
from eagle3.serve.reference.args import parse_args

logger = logging.getLogger(__name__)

USAGE_EXIT = 2  # argparse's code for bad usage; a taken port is one too


def make_generator(args: argparse.Namespace) -> object:
    if args.synthetic_tokens is not None:
        from eagle3.serve.reference.generator import SyntheticGenerator

        return SyntheticGenerator(args)
    from eagle3.serve.reference.generator import ModelGenerator

    return ModelGenerator(args)


def _check_port_free(host: str, port: int) -> None:
    """Exit with one line (code 2, bad usage, as argparse's own errors) when ``host:port`` cannot be
    bound, e.g. another server already listens there."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        # as aiohttp binds: TIME_WAIT is no conflict
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            print(
                f"error: cannot listen on {host}:{port} ({exc.strerror}): another server uses the port; stop it or "
                "pass --port",
                file=sys.stderr,
            )
            raise SystemExit(USAGE_EXIT) from None


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # before the model loads: a taken port fails in a second, in one line
    _check_port_free(args.host, args.port)
    generator = make_generator(args)
    logger.info("eagle3 reference server on http://%s:%d", args.host, args.port)
    web.run_app(
        build_app(args, generator),
        host=args.host,
        port=args.port,
        print=None,
        access_log=None,
        shutdown_timeout=2.0,
    )
