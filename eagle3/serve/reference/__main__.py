"""``python -m eagle3.serve.reference --model PATH --port P``: the reference server (see
``eagle3.serve.reference.cli``)."""

from eagle3.serve.reference.cli import main

if __name__ == "__main__":
    main()
