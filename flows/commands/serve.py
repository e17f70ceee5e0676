"""``eagle3 serve``: the reference server (``eagle3.serve.reference``), the one server the project ships.

It passes its arguments to ``eagle3.serve.reference.cli`` as they are (argparse lives in the library, which cannot
import typer; see ``eagle3 serve --help``), so ``eagle3 serve`` and ``python -m eagle3.serve.reference`` take the
same flags.
"""

from __future__ import annotations

import typer


def serve(ctx: typer.Context) -> None:
    """The reference server (SGLang HTTP subset): eagle3 serve --model PATH --port P [...]; --help for flags."""
    from eagle3.serve.reference.cli import main

    main(list(ctx.args))


def register(app: typer.Typer) -> None:
    app.command(
        "serve",
        context_settings={
            "allow_extra_args": True,
            "ignore_unknown_options": True,
            "help_option_names": [],
        },
        add_help_option=False,
    )(serve)
