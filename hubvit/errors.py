"""The one error type hubvit raises for bad input, so callers can catch every such case with one `except`."""


class HubViTError(ValueError):
    """Bad input to a hubvit function: the message names the value and what was expected."""
