"""The ``cuhook`` command of the wheel: the Rust CLI bundled beside the library, executed in
place of Python (``cuhook run``, ``view``, ``export``, ``demo``, ``symbols``: the same
subcommands and options)."""

from __future__ import annotations

import os
import sys
from typing import NoReturn, Optional, Sequence

from ._native import BUNDLED_CLI


def main(argv: Optional[Sequence[str]] = None) -> NoReturn:
    """Replace this process with the bundled ``cuhook`` binary, passing ``argv`` (default: the
    command line's arguments). It finds the bundled ``libcuhook.so`` beside itself."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not os.access(BUNDLED_CLI, os.X_OK):
        sys.stderr.write(
            f"cuhook: the bundled command {BUNDLED_CLI} is missing or not executable "
            "(reinstall the package: pip install cuhook's source directory)\n"
        )
        sys.exit(127)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(BUNDLED_CLI, ["cuhook", *args])


if __name__ == "__main__":
    main()
