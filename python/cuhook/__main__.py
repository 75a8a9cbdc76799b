"""``python -m cuhook``: the same command as ``cuhook`` (see :mod:`cuhook._cli`)."""

from ._cli import main

main()
