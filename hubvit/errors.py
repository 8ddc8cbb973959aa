"""The error types hubvit raises for bad input, so callers can catch every such case with one `except HubViTError`."""


class HubViTError(ValueError):
    """Bad input to a hubvit function: the message names the value and what was expected."""


class ConversionError(HubViTError):
    """A checkpoint that cannot be converted faithfully; the message says what did not match."""


class UsageError(HubViTError):
    """A bad training option or input, reported before any training starts."""


class NetworkError(ConnectionError):
    """A network call that failed or ran out of time; the message names the endpoint and how it failed. Not bad
    input (the same call may work later), so not a `HubViTError`; an `OSError`, as Python's own connection errors."""


class OutputExistsError(HubViTError, FileExistsError):
    """OUT exists and holds something, and `overwrite` was not given (also a `FileExistsError`)."""


def listing(items, limit=40):
    """Sorted items one per indented line, the tail counted rather than printed."""
    items = sorted(items)
    more = f"\n    ... and {len(items) - limit} more" if len(items) > limit else ""
    return "\n".join(f"    {item}" for item in items[:limit]) + more
