"""Issue 27, POOR: hostile servers on 127.0.0.1 against push and the JAX https download.

Each server is a real socket: one that answers HTTP 500, one that answers 200 with a body that is not JSON, one that
trickles one byte a second, one that sends an endless body. Deadlines and caps are shortened through HUBVIT_*
variables; what is checked is one line naming the endpoint and how it failed, within the deadline.
"""

import socket
import threading
import time

import pytest
from hub_server import configure_hf_client
from hubvit.hub import PushError, push_folder
from hubvit.cli import main as cli
from test_reliability import tiny_folder
from test_reliability_limits import within


class HostileServer:
    """A loopback HTTP server whose every connection is handled by `behaviour(connection)` after the request head."""

    def __init__(self, behaviour):
        self.behaviour = behaviour

    def __enter__(self):
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(16)
        self.endpoint = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self):
        while not self.stopped.is_set():
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection):
        with connection:
            try:
                head = b""
                while b"\r\n\r\n" not in head:
                    data = connection.recv(65536)
                    if not data:
                        return
                    head += data
                self.behaviour(connection, self.stopped)
            except OSError:
                return

    def __exit__(self, *exc):
        self.stopped.set()
        self.socket.close()


def status_500(connection, stopped):
    body = b'{"error": "internal"}'
    connection.sendall(
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
    )


def not_json(connection, stopped):
    body = b"<html>a captive portal</html>"
    connection.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        b"Connection: close\r\n\r\n%s" % (len(body), body)
    )


def trickle(connection, stopped):
    connection.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\nConnection: close\r\n\r\n"
    )
    while not stopped.is_set():
        connection.sendall(b" ")
        time.sleep(0.5)


def endless(connection, stopped):
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n")
    chunk = b"\0" * 65536
    while not stopped.is_set():
        connection.sendall(chunk)


@pytest.fixture
def short_deadlines(monkeypatch, tmp_path):
    monkeypatch.setenv("HUBVIT_CONNECT_TIMEOUT", "2")
    monkeypatch.setenv("HUBVIT_READ_TIMEOUT", "2")
    monkeypatch.setenv("HUBVIT_DEADLINE", "4")
    monkeypatch.setenv("HUBVIT_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("push") / "tiny")


def push_against(behaviour, folder, monkeypatch, tmp_path):
    with HostileServer(behaviour) as server:
        configure_hf_client(monkeypatch, server.endpoint, "hf_test", tmp_path / "hf_home")
        finished, result, elapsed = within(30, push_folder, folder, "me/tiny")
    assert finished, "push still waiting after 30 s"
    assert isinstance(result, PushError), repr(result)
    message = str(result)
    assert server.endpoint in message and "\n" not in message
    return message, elapsed


def test_a_push_answered_with_http_500_names_the_status_not_the_token(folder, monkeypatch, tmp_path, short_deadlines):
    message, _ = push_against(status_500, folder, monkeypatch, tmp_path)
    assert "HTTP 500" in message and "token" not in message


def test_a_push_answered_with_a_body_that_is_not_json_says_so(folder, monkeypatch, tmp_path, short_deadlines):
    message, _ = push_against(not_json, folder, monkeypatch, tmp_path)
    assert "not JSON" in message


def test_a_push_to_a_server_trickling_bytes_stops_at_the_deadline(folder, monkeypatch, tmp_path, short_deadlines):
    message, elapsed = push_against(trickle, folder, monkeypatch, tmp_path)
    assert "too slow" in message and "4 s deadline" in message
    assert elapsed < 8  # the 4 s deadline plus at most one 2 s read


def test_a_jax_download_trickling_bytes_stops_at_the_deadline(tmp_path, capsys, short_deadlines):
    with HostileServer(trickle) as server:
        finished, status, elapsed = within(
            30, cli, ["convert", "jax", f"{server.endpoint}/vit.npz", str(tmp_path / "out")]
        )
    assert finished, "download still going after 30 s"
    lines = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert status == 2 and len(lines) == 1
    assert server.endpoint in lines[0] and "too slow" in lines[0] and elapsed < 8


def test_a_jax_download_with_an_endless_body_stops_at_the_size_cap(tmp_path, capsys, short_deadlines, monkeypatch):
    monkeypatch.setenv("HUBVIT_MAX_DOWNLOAD_BYTES", str(10**6))
    monkeypatch.setenv("HUBVIT_DEADLINE", "60")
    with HostileServer(endless) as server:
        finished, status, _ = within(30, cli, ["convert", "jax", f"{server.endpoint}/vit.npz", str(tmp_path / "out")])
    assert finished, "download still going after 30 s"
    lines = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert status == 2 and len(lines) == 1 and "more than 1000000 bytes" in lines[0]
    part = next((tmp_path / "cache").rglob("*.part"))
    assert part.stat().st_size <= 10**6


def test_a_jax_download_answered_with_http_500_names_the_status(tmp_path, capsys, short_deadlines):
    with HostileServer(status_500) as server:
        status = cli(["convert", "jax", f"{server.endpoint}/vit.npz", str(tmp_path / "out")])
    lines = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert status == 2 and len(lines) == 1 and "HTTP 500" in lines[0] and server.endpoint in lines[0]
