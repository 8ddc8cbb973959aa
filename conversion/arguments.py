"""The options every converter shares, both ways in: the flags of `add_arguments` (`--verify/--no-verify`,
`--tolerance`, `--patch-size`) and the checks the Python functions apply to their keyword arguments, which raise `HubViTError`
naming the argument where argparse would have exited."""

import argparse
import math
import os

from ..errors import HubViTError
from .patch_size import add_patch_size_argument

TOLERANCE = 1e-5


def add_verify_arguments(parser):
    """`--verify/--no-verify`, `--tolerance` and `--patch-size`, the same for every converter."""
    parser.add_argument(
        "--verify",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the source implementation and the converted model on the same input and fail above tolerance "
        "(default: on)",
    )
    parser.add_argument(
        "--tolerance",
        type=positive_number,
        default=TOLERANCE,
        help=f"relative tolerance of the check: max |difference| <= tolerance x max |source output| ({TOLERANCE:g})",
    )
    add_patch_size_argument(parser)


def positive_number(text):
    """argparse type for --tolerance and --timeout: a positive finite number (NaN, inf, 0 or less would make a check
    always pass or fail, or a request never end)."""
    try:
        return positive(text, "value")
    except HubViTError:
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}") from None


def positive(value, name):
    """`value` as a positive finite float, or `HubViTError` naming `name`."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not (math.isfinite(number) and number > 0):
        raise HubViTError(f"{name}={value!r}; expected a positive finite number")
    return number


def whole(value, name, minimum=None, optional=True):
    """`value` as an int (>= `minimum` when given; None allowed when `optional`), or `HubViTError` naming `name`."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        expected = "an integer" + (f" >= {minimum}" if minimum is not None else "") + (" or None" if optional else "")
        raise HubViTError(f"{name}={value!r}; expected {expected}")
    return value


def choice(value, allowed, name, optional=False):
    """`value` if it is one of `allowed` (or None when `optional`), else `HubViTError` listing them."""
    if (value is None and optional) or value in allowed:
        return value
    raise HubViTError(f"{name}={value!r}; expected one of {', '.join(map(str, allowed))}")


def flag(value, name):
    if not isinstance(value, bool):
        raise HubViTError(f"{name}={value!r}; expected True or False")
    return value


def path_text(value, name):
    """A path or Hub id given as str or os.PathLike, as text (an empty one is left to the path checks, which say
    why it is refused); `HubViTError` for anything else."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise HubViTError(f"{name}={value!r}; expected a path (str or pathlib.Path)")
    return value
