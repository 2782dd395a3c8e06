"""The former name of ``python -m app.docs_reference``: ``python -m app.readme`` (with or
without ``--check``) still regenerates or checks the same files, for scripts that call it."""

from __future__ import annotations

import sys

from app.docs_reference import generated_files, main

__all__ = ["generated_files", "main"]

if __name__ == "__main__":
    sys.exit(main())
