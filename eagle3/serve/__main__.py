"""``python -m eagle3.serve --model PATH --port P``: the reference server (see ``eagle3.serve.cli``)."""

from eagle3.serve.cli import main

if __name__ == "__main__":
    main()
