"""Options as typed dataclasses: the one place where a flag of a command or a trainer is declared and parsed.

A field carries its help text in its metadata (`option`, `argument`). transformers' `HfArgumentParser` derives the
flags from the fields, for the training groups (`hubvit train`) and the commands' `Options` alike (`flag_parser`,
`add_command`), so every flag takes both spellings (`--image_size`, `--image-size`) and a boolean takes `--name`,
`--name false` and, where it defaults to true, `--no-name`. An unknown flag gets one refusal with the flags it most
resembles (`refuse_unknown_flags`); a bad value is a `HubViTError` naming it: a command's `__post_init__` turns text
into the typed value, so `hubvit.convert_timm(src, out, tolerance=...)` and `hubvit convert timm SRC OUT
--tolerance ...` meet the same checks.
"""

import argparse
import dataclasses
import math
import os
import typing

from .errors import HubViTError

TOLERANCE = 1e-5
"""The converters' default parity check: max |difference| <= 1e-5 x max |source output| (float32)."""


def option(default=dataclasses.MISSING, help="", **metadata):
    """A keyword-only option (`--name` on the command line); no default makes it required. Further metadata
    (`metavar`, `choices`, `nargs`, `const`, `required`) goes to argparse as `HfArgumentParser` passes it."""
    return dataclasses.field(default=default, kw_only=True, metadata={"help": help, **metadata})


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


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, with `(default: X)` added where X is a value rather than None (defaults that depend on
    the run say so in their own help)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default not in (None, argparse.SUPPRESS, False) and "default" not in text:
            text += " (default: %(default)s)"
        return text


def flag_parser(groups=(), **kwargs):
    """transformers' `HfArgumentParser` over dataclass groups, abbreviations refused, defaults shown."""
    from transformers import HfArgumentParser

    kwargs.setdefault("formatter_class", HelpFormatter)
    return HfArgumentParser(tuple(groups), allow_abbrev=False, **kwargs)


def parse_groups(parser, argv):
    """The groups' dataclasses from a command line (argparse's usual exit 2 on a malformed one; an unknown or
    abbreviated flag gets the usage and the flags it most resembles)."""
    *groups, unknown = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    refuse_unknown_flags(parser, unknown)
    return groups


def flag_type(annotation):
    """The type a flag's text becomes before the command's `Options` checks it: the annotation where argparse can
    convert to it (bool, int, float, str, a Literal, each optional), else text (`patch_size: int | tuple | str`
    gets the text and its `Options` parses it)."""
    kinds = [kind for kind in typing.get_args(annotation) or (annotation,) if kind is not type(None)]
    plain = len(kinds) == 1 and (kinds[0] in (bool, int, float, str) or typing.get_origin(kinds[0]) is typing.Literal)
    single = kinds[0] if plain else str
    return typing.Optional[single] if type(None) in typing.get_args(annotation) else single


def flags_of(options_class):
    """The keyword fields of a command's `Options` as the plain dataclass `HfArgumentParser` reads (its flags);
    the positional fields are left to `add_command`."""
    hints = typing.get_type_hints(options_class)
    fields = [
        (
            field.name,
            flag_type(hints[field.name]),
            dataclasses.field(default=field.default, default_factory=field.default_factory, metadata=field.metadata),
        )
        for field in dataclasses.fields(options_class)
        if not is_positional(field)
    ]
    return dataclasses.make_dataclass(f"{options_class.__name__}Flags", fields, kw_only=True)


def subcommands(parser, dest, **kwargs):
    """A subparsers action whose parsers are `HfArgumentParser`s (`add_command` fills one per command; a parser
    of a group of commands is `subparsers.add_parser(word, dataclass_types=())`)."""
    from transformers import HfArgumentParser

    return parser.add_subparsers(dest=dest, required=True, parser_class=HfArgumentParser, **kwargs)


def add_command(subparsers, word, options_class, **kwargs):
    """The parser of one command in `subparsers`: its positional fields as arguments, its keyword fields as
    `HfArgumentParser` flags (the subparsers' `parser_class` is `HfArgumentParser`)."""
    parser = subparsers.add_parser(
        word, dataclass_types=(flags_of(options_class),), allow_abbrev=False, formatter_class=HelpFormatter, **kwargs
    )
    for field in dataclasses.fields(options_class):
        if is_positional(field):
            parser.add_argument(field.name, metavar=field.metadata["metavar"], help=field.metadata["help"] or None)
    return parser


def build_options(options_class, namespace):
    """`options_class` from parsed flags (which checks them)."""
    return options_class(**{field.name: getattr(namespace, field.name) for field in dataclasses.fields(options_class)})


class Flattened:
    """A trainer's option groups flattened into one object (`build`), the one the rest of the package reads."""

    HELP = "hubvit train --help"

    @classmethod
    def build(cls, *groups, **options):
        """From group instances (or a flattened one) and keyword options; an unknown name is a `UsageError`."""
        from .errors import UsageError

        values, explicit = {}, set()
        for group in groups:
            if not dataclasses.is_dataclass(group) or isinstance(group, type):
                raise UsageError(f"expected option groups ({cls.__name__} or its parts), got {group!r}")
            values.update(dataclasses.asdict(group))
            explicit |= set_by_caller(group)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise UsageError(f"unknown option(s) {', '.join(unknown)}; see `{cls.HELP}` for the names")
        values.update(options)
        built = cls(**values)
        built._explicit = frozenset(explicit | set(options))
        return built


def set_by_caller(group):
    """The options a caller chose: those a command line named (recorded by its parse), else those that differ
    from their defaults."""
    recorded = getattr(group, "_explicit", None)
    if recorded is not None:
        return set(recorded)
    return {f.name for f in dataclasses.fields(group) if getattr(group, f.name) != f.default}


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
