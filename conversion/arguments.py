"""argparse pieces every converter's `add_arguments` shares: `--verify/--no-verify`, `--tolerance`, and the type
that refuses a non-positive number."""

import argparse
import math

TOLERANCE = 1e-5


def add_verify_arguments(parser):
    """`--verify/--no-verify` and `--tolerance`, the same for every converter."""
    parser.add_argument(
        "--verify", action=argparse.BooleanOptionalAction, default=True,
        help="run the source implementation and the converted model on the same input and fail above tolerance "
        "(default: on)",
    )
    parser.add_argument(
        "--tolerance", type=positive_number, default=TOLERANCE,
        help=f"relative tolerance of the check: max |difference| <= tolerance x max |source output| ({TOLERANCE:g})",
    )


def positive_number(text):
    """argparse type for --tolerance and --timeout: a positive finite number (NaN, inf, 0 or less would make a check
    always pass or fail, or a request never end)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value
