"""Bounded network calls: every Hub call (huggingface_hub's shared HTTP client) and the JAX https download get a
connect timeout, a silence timeout per read and a total deadline per operation (`bounded(...)`), plus a size cap on
bodies; a failure becomes one line naming the endpoint and whether it refused, stayed silent, was too slow or
answered with an error status.

HUBVIT_CONNECT_TIMEOUT, HUBVIT_READ_TIMEOUT, HUBVIT_DEADLINE (seconds) and HUBVIT_MAX_DOWNLOAD_BYTES set the numbers.
"""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from .errors import HubViTError, NetworkError

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
METADATA_DEADLINE_S = 120.0
TRANSFER_DEADLINE_S = 7200.0
MAX_API_BODY_BYTES = 64 << 20
MAX_DOWNLOAD_BYTES = 64 << 30


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
    """The total time one operation may take: 120 s for metadata, 2 h for transfers, or HUBVIT_DEADLINE."""
    return _env_float("HUBVIT_DEADLINE", METADATA_DEADLINE_S if kind == "metadata" else TRANSFER_DEADLINE_S)


def max_download_bytes():
    return int(_env_float("HUBVIT_MAX_DOWNLOAD_BYTES", MAX_DOWNLOAD_BYTES))


# ---------------------------------------------------------------------------------------------------- network


class _Operation:
    """One bounded network operation: what it is, its deadline, and the first failure the transport saw."""

    def __init__(self, what, deadline_s, endpoint=None, hub=True):
        self.what, self.hub = what, hub
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
    """The one line for a failed call: `kind` is refused, silent, slow, status, too_large or not_json."""
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
        return f"{where} is too slow: the operation did not finish within its {seconds:g} s deadline (HUBVIT_DEADLINE)"
    if kind == "status":
        return f"{where} answered with an error: HTTP {status}{' ' + reason if reason else ''}"
    if kind == "too_large":
        return f"{where} sent more than {seconds} bytes, the cap for this body (HUBVIT_MAX_DOWNLOAD_BYTES); refused"
    if kind == "not_json":
        return f"{where} answered with a body that is not JSON ({reason})"
    raise ValueError(kind)


def _httpx():
    import httpx2

    return httpx2


def _deadline_error():
    httpx = _httpx()

    class DeadlineExceeded(httpx.ReadTimeout):
        """The operation's total deadline passed (a subclass of the client's timeout, so callers treat it so)."""

    return DeadlineExceeded


_DEADLINE_ERROR = None


def _raise_deadline(request, operation):
    global _DEADLINE_ERROR
    if _DEADLINE_ERROR is None:
        _DEADLINE_ERROR = _deadline_error()
    line = describe("slow", request.url, operation, seconds=operation.deadline_s)
    operation.record(line, request.url)
    raise _DEADLINE_ERROR(line, request=request)


def _bounded_stream(stream, request, operation, cap):
    """A response body that stops at the operation's deadline and at its size cap."""
    httpx = _httpx()

    class BoundedStream(httpx.SyncByteStream):
        def __iter__(self):
            received = 0
            for chunk in stream:
                received += len(chunk)
                if received > cap:
                    line = describe("too_large", request.url, operation, seconds=cap)
                    if operation is not None:
                        operation.record(line, request.url)
                    raise httpx.RemoteProtocolError(line, request=request)
                if operation is not None and operation.remaining() <= 0:
                    _raise_deadline(request, operation)
                yield chunk

        def close(self):
            stream.close()

    return BoundedStream()


def _make_transport(inner):
    httpx = _httpx()

    class BoundedTransport(httpx.BaseTransport):
        """Wraps the client's transport: timeouts clamped to the deadline, failures classified, bodies capped."""

        def __init__(self, inner):
            self.inner = inner

        def handle_request(self, request):
            operation = _current()
            connect, read = connect_timeout(), read_timeout()
            timeout = dict(request.extensions.get("timeout") or {})
            connect = min(connect, timeout.get("connect") or connect)
            read = min(read, timeout.get("read") or read)
            if operation is not None:
                remaining = operation.remaining()
                if remaining <= 0:
                    _raise_deadline(request, operation)
                connect, read = min(connect, remaining), min(read, remaining)
            request.extensions["timeout"] = {"connect": connect, "read": read, "write": read, "pool": connect}
            try:
                response = self.inner.handle_request(request)
            except httpx.TimeoutException as error:
                if operation is not None:
                    if operation.remaining() <= 0:
                        _raise_deadline(request, operation)
                    seconds = connect if isinstance(error, httpx.ConnectTimeout) else read
                    operation.record(describe("silent", request.url, operation, seconds=seconds), request.url)
                raise
            except httpx.TransportError as error:
                if operation is not None:
                    operation.record(
                        describe("refused", request.url, operation, reason=str(error) or type(error).__name__),
                        request.url,
                    )
                raise
            if response.status_code >= 500 and operation is not None:
                operation.record(
                    describe(
                        "status", request.url, operation, status=response.status_code, reason=response.reason_phrase
                    ),
                    request.url,
                )
            length = response.headers.get("Content-Length")
            api = "/api/" in request.url.path
            cap = max_download_bytes() if not api else MAX_API_BODY_BYTES
            if length and length.isdecimal():
                cap = min(cap, int(length))
            response.stream = _bounded_stream(response.stream, request, operation, cap)
            return response

        def close(self):
            self.inner.close()

    return BoundedTransport(inner)


def install():
    """Make huggingface_hub's shared client use the bounded transport (again, if another factory replaced it)."""
    from huggingface_hub.utils import _http

    previous = _http._GLOBAL_CLIENT_FACTORY
    if getattr(previous, "hubvit_bounded", False):
        return

    def factory():
        client = previous()
        client._transport = _make_transport(client._transport)
        client._mounts = {
            key: (_make_transport(value) if value is not None else None) for key, value in client._mounts.items()
        }
        return client

    factory.hubvit_bounded = True
    _http.set_client_factory(factory)


def _http_status(error):
    response = getattr(error, "response", None)
    return getattr(response, "status_code", None), getattr(
        response, "reason_phrase", ""
    ) if response is not None else ""


@contextmanager
def bounded(what, endpoint=None, kind="metadata", deadline=None, error=NetworkError):
    """Run the Hub calls in this block under one total deadline; a network failure becomes `error` (one line).

    `what` names the operation in the message (`model_info of x/y`, `download of x/y`, `push to x/y`).
    """
    install()
    operation = _Operation(what, deadline or deadline_seconds(kind), endpoint or _default_endpoint())
    with _LOCK:
        _ACTIVE.append(operation)
    try:
        yield operation
    except (HubViTError, NetworkError):
        raise
    except Exception as failure:
        line = classify(failure, operation)
        if line is None:
            raise
        raise error(line) from None
    finally:
        with _LOCK:
            _ACTIVE.remove(operation)


def classify(failure, operation):
    """The one line for an exception raised inside `bounded`, or None if it is not a network failure."""
    httpx = _httpx()
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    endpoint = operation.endpoint or _default_endpoint()
    status, reason = _http_status(failure)
    if isinstance(failure, HfHubHTTPError) and status is not None and status >= 500:
        return describe("status", endpoint, operation, status=status, reason=reason)
    if operation.failure is not None and isinstance(
        failure, (httpx.TransportError, LocalEntryNotFoundError, HfHubHTTPError, OSError)
    ):
        return operation.failure
    if isinstance(failure, httpx.TimeoutException):
        return describe("silent", endpoint, operation, seconds=read_timeout())
    if isinstance(failure, httpx.TransportError):
        return describe("refused", endpoint, operation, reason=str(failure) or type(failure).__name__)
    if isinstance(failure, json.JSONDecodeError):
        return describe("not_json", endpoint, operation, reason=f"{failure.msg} at byte {failure.pos}")
    return None


def _default_endpoint():
    from huggingface_hub import constants

    return constants.ENDPOINT


def read_bounded(response, url, write, deadline_s=None, chunk=1 << 16, expected=None):
    """Copy an urllib response body into `write(bytes)` under a silence timeout per read, a total deadline and a
    size cap (Content-Length, else HUBVIT_MAX_DOWNLOAD_BYTES); returns the number of bytes."""
    operation = _Operation(
        f"download of {Path(urlsplit(url).path).name}", deadline_s or deadline_seconds("transfer"), hub=False
    )
    cap = expected if expected is not None else max_download_bytes()
    sock = _socket_of(response)
    received = 0
    while True:
        remaining = operation.remaining()
        if remaining <= 0:
            raise NetworkError(describe("slow", url, operation, seconds=operation.deadline_s))
        if sock is not None:
            sock.settimeout(min(read_timeout(), remaining))
        try:
            data = response.read1(chunk)
        except TimeoutError:
            if operation.remaining() <= 0:
                raise NetworkError(describe("slow", url, operation, seconds=operation.deadline_s)) from None
            raise NetworkError(describe("silent", url, operation, seconds=read_timeout())) from None
        if not data:
            return received
        received += len(data)
        if received > cap:
            raise NetworkError(describe("too_large", url, operation, seconds=cap))
        write(data)


def _socket_of(response):
    raw = getattr(getattr(response, "fp", None), "raw", None)
    return getattr(raw, "_sock", None)
