"""A command's options as one frozen, typed dataclass: the one place where a flag is declared and checked.

Each field carries its help text in its metadata (`option`, `argument`); `__post_init__` checks the values and turns
text into the typed value, so `hubvit.convert_timm(src, out, tolerance=...)` and `hubvit convert timm SRC OUT
--tolerance ...` meet the same checks and the same `HubViTError`. The command line (`hubvit.cli`) is derived from
these fields, as transformers' `HfArgumentParser` derives the training flags from theirs.
"""

import dataclasses
import math
import os

from .errors import HubViTError

TOLERANCE = 1e-5
"""The converters' default parity check: max |difference| <= 1e-5 x max |source output| (float32)."""


def option(default=dataclasses.MISSING, help="", *, metavar=None, choices=None):
    """A keyword-only option (`--name` on the command line); no default makes it required."""
    metadata = {"help": help}
    if metavar is not None:
        metadata["metavar"] = metavar
    if choices is not None:
        metadata["choices"] = tuple(choices)
    return dataclasses.field(default=default, kw_only=True, metadata=metadata)


def argument(metavar, help=""):
    """A positional argument (`SRC`, `OUT`, ...): positional in the Python function too."""
    return dataclasses.field(metadata={"help": help, "metavar": metavar, "positional": True})


def is_positional(field):
    return bool(field.metadata.get("positional"))


def refuse_unknown_flags(parser, unknown):
    """The one refusal of flags a parser does not know, for the commands' parsers and the trainers' alike: the
    parser's usage, the unknown flags and the known ones they most resemble (argparse's exit status 2)."""
    import difflib

    if not unknown:
        return
    known = [flag for action in parser._actions for flag in action.option_strings]
    guesses = difflib.get_close_matches(unknown[0].partition("=")[0], known, n=2, cutoff=0.6)
    hint = f"; did you mean {' or '.join(guesses)}?" if guesses else ""
    parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")


def settle(options, **values):
    """Set checked values on a frozen options object (from its `__post_init__`)."""
    for name, value in values.items():
        object.__setattr__(options, name, value)


def positive(value, name):
    """`value` as a positive finite float, or `HubViTError` naming `name` (NaN, inf, 0 or less would make a check
    always pass or fail, or a request never end)."""
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


def text(value, name, optional=True):
    """A string option (None allowed when `optional`), or `HubViTError` naming `name`."""
    if (value is None and optional) or isinstance(value, str):
        return value
    raise HubViTError(f"{name}={value!r}; expected a string" + (" or None" if optional else ""))


def path_text(value, name):
    """A path or Hub id given as str or os.PathLike, as text (an empty one is left to the path checks, which say
    why it is refused); `HubViTError` for anything else."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise HubViTError(f"{name}={value!r}; expected a path (str or pathlib.Path)")
    return value


def nonempty_path(value, name):
    """`path_text`, refusing an empty or blank value (an unset shell variable) with the argument's name."""
    value = path_text(value, name)
    if not value.strip():
        raise HubViTError(f"{name}={value!r}; expected a path (an unset shell variable?)")
    return value
