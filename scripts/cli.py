"""`python scripts/cli.py ...`: the installed `hubvit` command (`hubvit.cli`), runnable from a source checkout."""

import sys

from hubvit.cli import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
