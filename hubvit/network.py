"""Bounded network calls: every Hub call (huggingface_hub's shared HTTP client) and the JAX https download get a
connect timeout, a silence timeout per read and a total deadline per operation (`bounded(...)`), plus a size cap on
bodies; a failure becomes one line naming the endpoint and whether it refused, stayed silent, was too slow or
answered with an error status.

The deadline holds at every socket read and write (the response headers included), not only between requests.
Inside an operation each request also has its own deadline by kind: a metadata request (`/api/...`, LFS batch,
HEAD) the metadata one, a transfer (file bodies) the transfer one. A 429 whose Retry-After (or RateLimit reset)
would not end before the deadline is refused at once instead of letting the client sleep it out. Downloads also fail
when slower than a minimum rate over a window.

HUBVIT_CONNECT_TIMEOUT, HUBVIT_READ_TIMEOUT, HUBVIT_DEADLINE (both kinds), HUBVIT_METADATA_DEADLINE,
HUBVIT_TRANSFER_DEADLINE, HUBVIT_RATE_WINDOW (seconds), HUBVIT_MIN_RATE (bytes/s) and HUBVIT_MAX_DOWNLOAD_BYTES set
the numbers.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from .deadlines import (
    _ACTIVE,
    _LOCK,
    MAX_API_BODY_BYTES,
    RateFloor,
    _current,
    _Operation,
    _where,
    connect_timeout,
    deadline_seconds,
    describe,
    max_download_bytes,
    read_timeout,
    transfer_deadline,
)
from .errors import HubViTError, NetworkError

logger = logging.getLogger(__name__)


def _httpx():
    import httpx2

    return httpx2


_CLASSES = {}


def _bounded_error():
    """The error the bounded transport raises for a deadline, a cap or a refused wait: a `TransportError` the
    client's retry loop does not retry (it retries timeouts, network and protocol errors), so a passed deadline is
    not tried again after a sleep."""
    if "error" not in _CLASSES:
        httpx = _httpx()

        class BoundedFailure(httpx.TransportError):
            """A bounded network call gave up: deadline, size cap, minimum rate or a rate-limit wait refused."""

        _CLASSES["error"] = BoundedFailure
    return _CLASSES["error"]


def _fail(line, request, operation):
    if operation is not None:
        operation.record(line, request.url)
    raise _bounded_error()(line, request=request)


def _request_kind(request):
    """metadata (API calls, LFS batch and verify, HEAD) or transfer (file bodies up or down)."""
    path = request.url.path
    if "/api/" in path or request.method == "HEAD" or path.endswith(("/objects/batch", "/objects/verify")):
        return "metadata"
    return "transfer"


class _Limit:
    """The deadline of one request inside an operation: its kind's own, or the operation's if that comes first."""

    def __init__(self, request, operation):
        self.request, self.operation = request, operation
        self.kind = _request_kind(request)
        self.seconds = deadline_seconds(self.kind)
        self.deadline = time.monotonic() + self.seconds
        self.own = self.deadline < operation.deadline
        self.deadline = min(self.deadline, operation.deadline)

    def remaining(self):
        return self.deadline - time.monotonic()

    def fail(self):
        request, operation = self.request, self.operation
        if self.own:
            what = f"{self.kind} {request.method} {request.url.path}"
            line = describe("request_slow", request.url, operation, seconds=self.seconds, reason=what)
        else:
            line = describe("slow", request.url, operation, seconds=operation.deadline_s)
        _fail(line, request, operation)


_LOCAL = threading.local()
# A socket timeout clamped to the time left may fire a hair before the deadline by the clock: still the deadline.
_TIMER_SLACK_S = 0.05


@contextmanager
def _until(limit):
    """Socket reads and writes in this thread (headers included) end at `limit`'s deadline."""
    previous = getattr(_LOCAL, "limit", None)
    _LOCAL.limit = limit
    try:
        yield
    finally:
        _LOCAL.limit = previous


def _clamp(timeout, error):
    limit = getattr(_LOCAL, "limit", None)
    if limit is None:
        return timeout
    left = limit.remaining()
    if left <= 0:
        raise error("the deadline passed")
    return left if timeout is None else min(timeout, left)


def _make_backend(inner):
    """httpcore's network backend with every socket read and write clamped to the current request's deadline."""
    import httpcore2

    class DeadlineStream(httpcore2.NetworkStream):
        def __init__(self, stream):
            self.stream = stream

        def read(self, max_bytes, timeout=None):
            return self.stream.read(max_bytes, _clamp(timeout, httpcore2.ReadTimeout))

        def write(self, buffer, timeout=None):
            return self.stream.write(buffer, _clamp(timeout, httpcore2.WriteTimeout))

        def close(self):
            self.stream.close()

        def start_tls(self, ssl_context, server_hostname=None, timeout=None):
            timeout = _clamp(timeout, httpcore2.ConnectTimeout)
            return DeadlineStream(self.stream.start_tls(ssl_context, server_hostname, timeout))

        def get_extra_info(self, info):
            return self.stream.get_extra_info(info)

    class DeadlineBackend(httpcore2.NetworkBackend):
        hubvit_bounded = True

        def __init__(self, backend):
            self.backend = backend

        def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
            timeout = _clamp(timeout, httpcore2.ConnectTimeout)
            return DeadlineStream(self.backend.connect_tcp(host, port, timeout, local_address, socket_options))

        def connect_unix_socket(self, path, timeout=None, socket_options=None):
            timeout = _clamp(timeout, httpcore2.ConnectTimeout)
            return DeadlineStream(self.backend.connect_unix_socket(path, timeout, socket_options))

        def sleep(self, seconds):
            self.backend.sleep(seconds)

    if getattr(inner, "hubvit_bounded", False):
        return inner
    return DeadlineBackend(inner)


def _bounded_stream(stream, request, operation, cap, limit=None):
    """A response body that stops at the request's deadline, at its size cap and, for file bodies, below the
    minimum rate."""
    httpx = _httpx()

    class BoundedStream(httpx.SyncByteStream):
        def __iter__(self):
            received = 0
            floor = RateFloor() if limit is not None and limit.kind == "transfer" else None
            chunks = iter(stream)
            while True:
                try:
                    with _until(limit):
                        chunk = next(chunks)
                except StopIteration:
                    return
                except httpx.TimeoutException:
                    if limit is not None and limit.remaining() <= _TIMER_SLACK_S:
                        limit.fail()
                    raise
                received += len(chunk)
                if received > cap:
                    _fail(describe("too_large", request.url, operation, seconds=cap), request, operation)
                if limit is not None and limit.remaining() <= 0:
                    limit.fail()
                slow = floor.add(len(chunk)) if floor is not None else None
                if slow is not None:
                    line = describe("crawling", request.url, operation, seconds=(*slow, floor.rate))
                    _fail(line, request, operation)
                yield chunk

        def close(self):
            stream.close()

    return BoundedStream()


def rate_limit_wait(headers):
    """(seconds, header text) the client would sleep before retrying a 429, or None: the RateLimit reset when no
    requests remain, else a Retry-After in seconds (what huggingface_hub's retry loop reads)."""
    try:
        from huggingface_hub.utils._http import parse_ratelimit_headers

        info = parse_ratelimit_headers(headers)
    except Exception:  # noqa: BLE001  (a client without it, or a header it cannot read: Retry-After decides)
        info = None
    if info is not None and info.remaining == 0:
        return float(info.reset_in_seconds), f"RateLimit {headers.get('RateLimit')!r}"
    value = (headers.get("Retry-After") or "").strip()
    if value.isdigit():
        return float(value), f"Retry-After: {value}"
    return None


def _make_transport(inner):
    httpx = _httpx()

    pool = getattr(inner, "_pool", None)
    if pool is not None and hasattr(pool, "_network_backend"):
        pool._network_backend = _make_backend(pool._network_backend)

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
            limit = None
            if operation is not None:
                limit = _Limit(request, operation)
                remaining = limit.remaining()
                if remaining <= 0:
                    limit.fail()
                connect, read = min(connect, remaining), min(read, remaining)
            request.extensions["timeout"] = {"connect": connect, "read": read, "write": read, "pool": connect}
            try:
                with _until(limit):
                    response = self.inner.handle_request(request)
            except httpx.TimeoutException as error:
                if operation is not None:
                    if limit.remaining() <= _TIMER_SLACK_S:
                        limit.fail()
                    seconds = connect if isinstance(error, httpx.ConnectTimeout) else read
                    operation.record(describe("silent", request.url, operation, seconds=seconds), request.url)
                raise
            except httpx.TransportError as error:
                if operation is not None and not isinstance(error, _bounded_error()):
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
            if response.status_code == 429 and operation is not None:
                self._check_wait(request, response, operation, limit)
            length = response.headers.get("Content-Length")
            api = "/api/" in request.url.path
            cap = max_download_bytes() if not api else MAX_API_BODY_BYTES
            if length and length.isdecimal():
                cap = min(cap, int(length))
            response.stream = _bounded_stream(response.stream, request, operation, cap, limit)
            return response

        @staticmethod
        def _check_wait(request, response, operation, limit):
            """A 429 the client would sleep out past the deadline is refused now, naming what it asked for."""
            found = rate_limit_wait(response.headers)
            if found is None:
                return
            wait, header = found
            left = min(operation.remaining(), deadline_seconds(limit.kind))
            if wait + 1 < left:  # the client sleeps wait + 1 s, then retries under the same deadline
                logger.info("%s: rate-limited, %s; the client waits %g s", request.url, header, wait + 1)
                return
            response.close()
            what = f"{request.method} {request.url.path} ({header})"
            _fail(
                describe("rate_limited", request.url, operation, seconds=(wait, left), reason=what), request, operation
            )

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
def bounded(what, endpoint=None, kind="metadata", deadline=None, error=NetworkError, size=None):
    """Run the Hub calls in this block under one total deadline; a network failure becomes `error` (one line).

    `what` names the operation in the message (`model_info of x/y`, `download of x/y`, `push to x/y`); `size`: the
    bytes it moves, which fit the deadline to them (`transfer_deadline`).
    """
    install()
    basis = None
    if deadline is None and size is not None:
        deadline, basis = transfer_deadline(size)
    operation = _Operation(what, deadline or deadline_seconds(kind), endpoint or _default_endpoint(), basis=basis)
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
    if isinstance(failure, HfHubHTTPError) and status == 429 and operation.failure is None:
        try:
            what = f" {failure.response.request.method} {failure.response.request.url.path}"
        except (AttributeError, RuntimeError):  # a response built without its request
            what = ""
        return (
            f"{_where(endpoint, operation)} rate-limited{what} (HTTP 429) after the client's retries; try again later"
        )
    if operation.failure is not None and any(
        isinstance(error, (httpx.TransportError, LocalEntryNotFoundError, HfHubHTTPError, OSError))
        for error in _chain(failure)
    ):  # the client may wrap the transport's error (an LFS upload's RuntimeError)
        return operation.failure
    if isinstance(failure, httpx.TimeoutException):
        return describe("silent", endpoint, operation, seconds=read_timeout())
    if isinstance(failure, httpx.TransportError):
        return describe("refused", endpoint, operation, reason=str(failure) or type(failure).__name__)
    if isinstance(failure, httpx.TooManyRedirects):
        request = getattr(failure, "_request", None)
        last = f"last: {request.method} {request.url}" if request is not None else str(failure)
        return describe("redirects", endpoint, operation, seconds=_max_redirects(), reason=last)
    if isinstance(failure, httpx.RequestError):
        return f"{_where(endpoint, operation)} failed: {type(failure).__name__}: {str(failure).splitlines()[0]}"
    if isinstance(failure, json.JSONDecodeError):
        return describe("not_json", endpoint, operation, reason=f"{failure.msg} at byte {failure.pos}")
    return None


def _chain(error):
    """`error` and the errors it was raised from."""
    seen = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__
    return seen


def _max_redirects():
    try:
        from huggingface_hub.utils import get_session

        return get_session().max_redirects
    except Exception:  # noqa: BLE001  (only for the message)
        return 20


def _default_endpoint():
    from huggingface_hub import constants

    return constants.ENDPOINT


def read_bounded(response, url, write, deadline_s=None, chunk=1 << 16, expected=None, cap=None, cap_place=None):
    """Copy an urllib response body into `write(bytes)` under a silence timeout per read, a total deadline, a
    minimum rate over a window (HUBVIT_MIN_RATE, HUBVIT_RATE_WINDOW) and a size cap: `cap` if given (`cap_place`:
    the folder whose free space it is), else Content-Length (`expected`), else HUBVIT_MAX_DOWNLOAD_BYTES; returns
    the number of bytes."""
    operation = _Operation(
        f"download of {Path(urlsplit(url).path).name}", deadline_s or deadline_seconds("transfer"), hub=False
    )
    limits = [(max_download_bytes(), None)]
    if expected is not None:
        limits.append((expected, None))
    if cap is not None:
        limits.append((cap, cap_place))
    cap, cap_place = min(limits, key=lambda item: item[0])
    sock = _socket_of(response)
    floor = RateFloor()
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
            if cap_place is not None:
                raise NetworkError(describe("no_space", url, operation, seconds=cap, reason=cap_place))
            raise NetworkError(describe("too_large", url, operation, seconds=cap))
        write(data)
        slow = floor.add(len(data))
        if slow is not None:
            raise NetworkError(describe("crawling", url, operation, seconds=(*slow, floor.rate)))


def _socket_of(response):
    raw = getattr(getattr(response, "fp", None), "raw", None)
    return getattr(raw, "_sock", None)
