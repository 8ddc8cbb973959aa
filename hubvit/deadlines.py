"""The numbers a network call is held to (timeouts, deadlines, minimum rate, size caps, each with its HUBVIT_*
knob), the stack of bounded operations in progress, and the one line that describes a failed call
(`hubvit.network` applies them)."""

from __future__ import annotations

import os
import threading
import time
from urllib.parse import urlsplit

from .errors import HubViTError

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
METADATA_DEADLINE_S = 120.0
TRANSFER_DEADLINE_S = 7200.0
MAX_API_BODY_BYTES = 64 << 20
MAX_DOWNLOAD_BYTES = 64 << 30
RATE_WINDOW_S = 60.0
MIN_RATE = 10_000.0  # bytes/s over RATE_WINDOW_S; below it a download fails (a trickle, not a slow link)


def _env_float(name, default):
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise HubViTError(f"{name}={text!r}; expected a positive number of seconds or bytes") from None
    if not value > 0:
        raise HubViTError(f"{name}={text!r}; expected a positive number")
    return value


def connect_timeout():
    return _env_float("HUBVIT_CONNECT_TIMEOUT", CONNECT_TIMEOUT_S)


def read_timeout():
    return _env_float("HUBVIT_READ_TIMEOUT", READ_TIMEOUT_S)


def deadline_seconds(kind="metadata"):
    """The total time one operation (or one request of this kind) may take: 120 s for metadata, 2 h for transfers;
    HUBVIT_METADATA_DEADLINE / HUBVIT_TRANSFER_DEADLINE, else HUBVIT_DEADLINE, set them."""
    default = _env_float("HUBVIT_DEADLINE", METADATA_DEADLINE_S if kind == "metadata" else TRANSFER_DEADLINE_S)
    return _env_float(_deadline_knob(kind), default)


def transfer_deadline(size):
    """(seconds, basis) for an operation moving `size` bytes: its requests' metadata deadline plus the bytes at the
    minimum rate, so a trickle ends in a time that fits the size; at most the transfer deadline (basis None then)."""
    ceiling, metadata, rate = deadline_seconds("transfer"), deadline_seconds("metadata"), min_rate()
    fitted = metadata + size / rate
    if fitted >= ceiling:
        return ceiling, None
    return fitted, f"{metadata:g} s for its requests + {size} bytes at the minimum rate of {rate:g} bytes/s"


def _deadline_knob(kind):
    return "HUBVIT_METADATA_DEADLINE" if kind == "metadata" else "HUBVIT_TRANSFER_DEADLINE"


def rate_window():
    return _env_float("HUBVIT_RATE_WINDOW", RATE_WINDOW_S)


def min_rate():
    return _env_float("HUBVIT_MIN_RATE", MIN_RATE)


class RateFloor:
    """Fails a body that arrives slower than `min_rate()` bytes/s, judged over each `rate_window()` seconds."""

    def __init__(self):
        self.window, self.rate = rate_window(), min_rate()
        self.start, self.counted = time.monotonic(), 0

    def add(self, count):
        """Count `count` bytes; returns None, or (bytes, seconds) of a window that was too slow."""
        self.counted += count
        elapsed = time.monotonic() - self.start
        if elapsed < self.window:
            return None
        if self.counted < self.rate * elapsed:
            return self.counted, elapsed
        self.start, self.counted = time.monotonic(), 0
        return None


def max_download_bytes():
    return int(_env_float("HUBVIT_MAX_DOWNLOAD_BYTES", MAX_DOWNLOAD_BYTES))


# ---------------------------------------------------------------------------------------------------- network


class _Operation:
    """One bounded network operation: what it is, its deadline, and the first failure the transport saw."""

    def __init__(self, what, deadline_s, endpoint=None, hub=True, basis=None):
        self.what, self.hub, self.basis = what, hub, basis
        self.deadline_s = deadline_s
        self.deadline = time.monotonic() + deadline_s
        self.endpoint = endpoint
        self.failures = []

    def remaining(self):
        return self.deadline - time.monotonic()

    def record(self, line, url=None):
        self.failures.append((urlsplit(str(url)).netloc if url is not None else None, line))

    @property
    def failure(self):
        """The first failure at the operation's own endpoint (other threads may use the client meanwhile), else the
        first failure seen."""
        if not self.failures:
            return None
        if self.endpoint:
            host = urlsplit(str(self.endpoint)).netloc
            for netloc, line in self.failures:
                if netloc == host:
                    return line
        return self.failures[0][1]


_LOCK = threading.Lock()
_ACTIVE: list[_Operation] = []


def _current():
    with _LOCK:
        return _ACTIVE[-1] if _ACTIVE else None


def _where(url, operation):
    parts = urlsplit(str(url))
    endpoint = f"{parts.scheme}://{parts.netloc}" if parts.netloc else str(url)
    what = f" ({operation.what})" if operation is not None else ""
    server = "the Hub at " if operation is not None and operation.hub else ""
    return f"{server}{endpoint}{what}"


def describe(kind, url, operation=None, seconds=None, status=None, reason=""):
    """The one line for a failed call: `kind` is refused, silent, slow, request_slow, crawling, rate_limited,
    redirects, status, too_large, no_space or not_json."""
    where = _where(url, operation)
    if kind == "refused":
        return (
            f"cannot reach {where}: the connection was refused or failed ({reason})"
            if reason
            else (f"cannot reach {where}: the connection was refused")
        )
    if kind == "silent":
        return (
            f"{where} did not answer in time: silent for {seconds:g} s (connect or read timeout; "
            "HUBVIT_CONNECT_TIMEOUT/HUBVIT_READ_TIMEOUT, --timeout for push)"
        )
    if kind == "slow":
        basis = getattr(operation, "basis", None)
        return f"{where} is too slow: the operation did not finish within its {round(seconds, 1):g} s deadline " + (
            f"({basis}; HUBVIT_METADATA_DEADLINE, HUBVIT_MIN_RATE)" if basis else "(HUBVIT_DEADLINE)"
        )
    if kind == "request_slow":  # reason: "metadata request GET /api/..." or "transfer GET /..."
        request_kind, _, call = reason.partition(" ")
        return (
            f"{where} is too slow: {call} did not finish within the {seconds:g} s deadline of a "
            f"{request_kind} request ({_deadline_knob(request_kind)}, else HUBVIT_DEADLINE)"
        )
    if kind == "crawling":  # seconds: (bytes, elapsed, minimum rate)
        count, elapsed, rate = seconds
        return (
            f"{where} is too slow: {count} bytes in {elapsed:.0f} s, below the minimum of {rate:g} bytes/s "
            "(HUBVIT_MIN_RATE over HUBVIT_RATE_WINDOW seconds)"
        )
    if kind == "rate_limited":  # reason: the request and the header; seconds: (wait, seconds left)
        wait, left = seconds
        return (
            f"{where} rate-limited {reason} (HTTP 429): it asks to wait {wait:.0f} s, longer than the "
            f"{max(left, 0):.0f} s left before the deadline (HUBVIT_DEADLINE); refused instead of waiting, try again later"
        )
    if kind == "redirects":
        return f"{where} redirected in a loop: more than {seconds} redirects ({reason})"
    if kind == "status":
        return f"{where} answered with an error: HTTP {status}{' ' + reason if reason else ''}"
    if kind == "too_large":
        return f"{where} sent more than {seconds} bytes, the cap for this body (HUBVIT_MAX_DOWNLOAD_BYTES); refused"
    if kind == "no_space":
        return f"{where} sent more than {seconds} bytes, the free space of {reason}; refused"
    if kind == "not_json":
        return f"{where} answered with a body that is not JSON ({reason})"
    raise ValueError(kind)
