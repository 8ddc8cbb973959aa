"""Values checked against their annotations: what `HubViTConfig` refuses with the field, the value and the expected
type named, the same on every transformers release (configuration_hubvit.py says why hubvit checks them itself);
the training options' types and choices are checked with the same `matches` (hubvit/training/option_checks.py).

This file travels to the Hub next to every checkpoint: flat, no I/O, imported relatively.
"""

import types
import typing


def to_2tuple(value, name):
    """An int or an (h, w) pair as a tuple of two positive ints; `name` is the config field for errors."""
    if isinstance(value, int) and not isinstance(value, bool):
        pair = (value, value)
    elif isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        pair = (int(value[0]), int(value[1]))
    else:
        raise ValueError(f"{name} must be an int or an (height, width) pair of ints, got {value!r}")
    if min(pair) <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return pair


def type_name(expected):
    """An annotation as it is written: `int`, `float | None`, `int | list[int] | tuple[int, int]`."""
    return expected.__name__ if isinstance(expected, type) and typing.get_origin(expected) is None else str(expected)


def matches(value, expected):
    """Whether `value` has the annotated type. `bool` is no `int` here, and a `float` field takes an `int` (PEP 484's
    numeric tower: `layer_norm_eps=1`, or a `0` written by hand in config.json) but no `bool`."""
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, option) for option in args)
    if origin is typing.Literal:
        return any(value == choice and type(value) is type(choice) for choice in args)
    if origin is list:
        return isinstance(value, list) and all(matches(item, args[0]) for item in value)
    if origin is tuple:
        return isinstance(value, tuple) and len(value) == len(args) and all(map(matches, value, args))
    if expected is type(None):
        return value is None
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected in (bool, str, dict):
        return isinstance(value, expected)
    raise TypeError(f"no check for the annotation {expected!r}")  # a field declared with a type not handled above


def check_types(config, annotations):
    """Refuse the first field whose value does not have its annotated type, naming field, value and type."""
    for name, expected in annotations.items():
        value = getattr(config, name)
        if not matches(value, expected):
            raise ValueError(f"{name}={value!r} has type {type(value).__name__}; expected {type_name(expected)}")
