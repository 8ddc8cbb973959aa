"""Issue 39, BAD (Hub client) and the held network items: hostile answers on 127.0.0.1 against push, publish and the
JAX https download.

Headers trickled one byte a second, a whoami body trickled under the metadata deadline, a 429 asking to wait
11.6 days on preupload (push) and on the tree listing (publish), a 302 loop, a whoami answer that is a JSON list, a
429 on whoami, a download slower than the minimum rate, an endless body larger than the free disk. Deadlines,
windows and rates are shortened through HUBVIT_* variables; each case must end within seconds in one line that names
the endpoint and what went wrong.
"""

import collections
import functools
import shutil
import time

import pytest
from hub_server import HTTPError, _Handler, configure_hf_client
from hubvit.hub import PushError, push_folder
from hubvit.cli import main as cli
from test_reliability import tiny_folder
from test_reliability_limits import within
from test_reliability_network import HostileServer, endless, trickle


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("push") / "tiny")


@pytest.fixture
def quick(monkeypatch, tmp_path):
    """Short connect timeout, the default 60 s read timeout (a trickle never trips it), a cache of the test's own."""
    for name in ("HUBVIT_DEADLINE", "HUBVIT_METADATA_DEADLINE", "HUBVIT_TRANSFER_DEADLINE", "HUBVIT_READ_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HUBVIT_CONNECT_TIMEOUT", "2")
    monkeypatch.setenv("HUBVIT_CACHE", str(tmp_path / "cache"))


def trickle_headers(connection, stopped):
    """A status line, then a header whose value never ends, one byte a second."""
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Slow: ")
    while not stopped.is_set():
        connection.sendall(b"a")
        time.sleep(1)


def error_lines(capsys):
    return [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]


# ---------------------------------------------------------------------------------------------------- deadlines


def test_the_deadline_holds_while_the_headers_trickle_in(folder, monkeypatch, tmp_path, quick):
    monkeypatch.setenv("HUBVIT_DEADLINE", "3")
    with HostileServer(trickle_headers) as server:
        configure_hf_client(monkeypatch, server.endpoint, "hf_test", tmp_path / "hf_home")
        finished, result, elapsed = within(30, push_folder, folder, "me/tiny")
    assert finished, "push still waiting for the headers after 30 s"
    assert isinstance(result, PushError), repr(result)
    message = str(result)
    assert server.endpoint in message and "\n" not in message
    assert "too slow" in message and "3 s deadline" in message and elapsed < 6


def test_push_timeout_and_deadline_hold_while_the_headers_trickle_in(folder, monkeypatch, tmp_path, capsys, quick):
    monkeypatch.setenv("HUBVIT_DEADLINE", "3")
    with HostileServer(trickle_headers) as server:
        configure_hf_client(monkeypatch, server.endpoint, "hf_test", tmp_path / "hf_home")
        args = ["push", str(folder), "me/tiny", "--timeout", "5", "--no-load-check"]
        finished, status, elapsed = within(30, cli, args)
    assert finished, "hubvit push --timeout 5 still waiting for the headers after 30 s"
    lines = error_lines(capsys)
    assert status == 2 and len(lines) == 1, lines
    assert server.endpoint in lines[0] and "too slow" in lines[0] and elapsed < 6


def test_whoami_inside_a_push_gets_the_metadata_deadline_not_the_transfer_one(folder, monkeypatch, tmp_path, quick):
    monkeypatch.setenv("HUBVIT_METADATA_DEADLINE", "3")
    monkeypatch.setenv("HUBVIT_TRANSFER_DEADLINE", "600")
    with HostileServer(trickle) as server:
        configure_hf_client(monkeypatch, server.endpoint, "hf_test", tmp_path / "hf_home")
        finished, result, elapsed = within(30, push_folder, folder, "me/tiny")
    assert finished, "whoami still trickling after 30 s: it ran under the transfer deadline"
    assert isinstance(result, PushError), repr(result)
    message = str(result)
    assert server.endpoint in message and "\n" not in message
    assert "/api/whoami-v2" in message and "3 s deadline of a metadata request" in message
    assert "HUBVIT_METADATA_DEADLINE" in message and elapsed < 6


# ---------------------------------------------------------------------------------------------------- 429, 302, odd JSON


def answer(monkeypatch, route, behaviour):
    """Make the fake Hub's handler for `route` (`_preupload`, `_tree`, `_whoami`) do `behaviour(handler)`."""
    monkeypatch.setattr(_Handler, route, lambda self, *args: behaviour(self))


def too_many_requests(seconds):
    def behaviour(handler):
        raise HTTPError(429, "slow down", headers={"Retry-After": str(seconds)})

    return behaviour


def test_a_429_asking_for_days_on_preupload_is_refused_at_once(hub_server, folder, monkeypatch):
    answer(monkeypatch, "_preupload", too_many_requests(1000000))
    push = functools.partial(push_folder, load_check=False)
    finished, result, elapsed = within(30, push, folder, f"{hub_server.user}/tiny")
    assert finished, "push still sleeping on Retry-After after 30 s"
    assert isinstance(result, PushError), repr(result)
    message = str(result)
    assert "\n" not in message and hub_server.endpoint in message
    assert "/preupload/" in message and "Retry-After: 1000000" in message and "rate-limited" in message
    assert elapsed < 10


def test_a_429_asking_for_days_on_the_tree_listing_fails_that_publish_entry(hub_server, monkeypatch, tmp_path):
    from hubvit.conversion.publish import publish_all

    hub_server.create_repo("google/tiny-vit")
    answer(monkeypatch, "_tree", too_many_requests(1000000))
    manifest = tmp_path / "zoo.yaml"
    manifest.write_text("- {source: google/tiny-vit, converter: transformers, repo_id: test-user/zoo-vit}\n")
    finished, outcomes, elapsed = within(30, publish_all, manifest, False, False, tmp_path / "work")
    assert finished, "publish still sleeping on Retry-After after 30 s"
    [outcome] = outcomes
    assert outcome.result == "failed", outcome
    assert "Retry-After: 1000000" in outcome.detail and "/tree/" in outcome.detail, outcome.detail
    assert hub_server.endpoint in outcome.detail and elapsed < 10


def test_a_push_whose_upload_answer_trickles_ends_at_a_deadline_fitted_to_the_folder(
    hub_server, folder, monkeypatch, quick
):
    """The transfer ceiling is 2 h, but a push of this folder may take its requests' metadata deadline (2 s here)
    plus its bytes at the minimum rate (set to move them in 2 s): 4 s, said with how it was reckoned."""
    size = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
    monkeypatch.setenv("HUBVIT_METADATA_DEADLINE", "2")
    monkeypatch.setenv("HUBVIT_MIN_RATE", str(size / 2))

    def trickled_answer(handler):
        handler.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        for _ in range(150):
            try:
                handler.wfile.write(b"a")
                handler.wfile.flush()
            except OSError:
                return
            time.sleep(0.2)

    answer(monkeypatch, "_lfs_put", trickled_answer)
    push = functools.partial(push_folder, load_check=False)
    finished, result, elapsed = within(30, push, folder, f"{hub_server.user}/tiny")
    assert finished, "push still uploading after 30 s"
    assert isinstance(result, PushError), repr(result)
    message = str(result)
    assert "\n" not in message and hub_server.endpoint in message and "too slow" in message
    assert f"within its 4 s deadline (2 s for its requests + {size} bytes at the minimum rate" in message
    assert elapsed < 8


def test_a_429_that_outlasts_the_clients_retries_says_rate_limited(hub_server, folder, monkeypatch):
    answer(monkeypatch, "_preupload", too_many_requests(0))
    push = functools.partial(push_folder, load_check=False)
    finished, result, elapsed = within(60, push, folder, f"{hub_server.user}/tiny")
    assert finished and isinstance(result, PushError), repr(result)
    message = str(result)
    assert "\n" not in message and hub_server.endpoint in message
    assert "rate-limited POST /api/models/" in message and "after the client's retries" in message


def test_a_redirect_loop_on_whoami_is_one_line(hub_server, folder, monkeypatch, capsys):
    def loop(handler):
        handler._send(302, headers={"Location": "/api/whoami-v2"})

    answer(monkeypatch, "_whoami", loop)
    assert cli(["push", str(folder), f"{hub_server.user}/tiny", "--no-load-check"]) == 2
    lines = error_lines(capsys)
    assert len(lines) == 1 and "redirected in a loop" in lines[0] and hub_server.endpoint in lines[0], lines


def test_a_whoami_answer_that_is_a_json_list_is_one_line(hub_server, folder, monkeypatch, capsys):
    answer(monkeypatch, "_whoami", lambda handler: handler._json(["not", "a", "user"]))
    assert cli(["push", str(folder), f"{hub_server.user}/tiny", "--no-load-check"]) == 2
    lines = error_lines(capsys)
    assert len(lines) == 1 and "JSON list" in lines[0] and "expected a JSON object" in lines[0], lines
    assert hub_server.endpoint in lines[0] and hub_server.repos == {}


def test_a_429_on_whoami_says_rate_limited_not_refused(hub_server, folder, monkeypatch, capsys):
    answer(monkeypatch, "_whoami", too_many_requests(5))
    assert cli(["push", str(folder), f"{hub_server.user}/tiny", "--no-load-check"]) == 2
    lines = error_lines(capsys)
    assert len(lines) == 1 and "rate-limited" in lines[0] and "refused" not in lines[0], lines
    assert "Retry-After: 5" in lines[0] and hub_server.endpoint in lines[0]


# ---------------------------------------------------------------------------------------------------- JAX download


def jax(server, tmp_path):
    return ["convert", "jax", f"{server.endpoint}/vit.npz", str(tmp_path / "out")]


def test_a_jax_download_below_the_minimum_rate_fails_before_the_deadline(tmp_path, capsys, monkeypatch, quick):
    monkeypatch.setenv("HUBVIT_DEADLINE", "60")
    monkeypatch.setenv("HUBVIT_RATE_WINDOW", "2")
    monkeypatch.setenv("HUBVIT_MIN_RATE", "1000")
    with HostileServer(trickle) as server:
        finished, status, elapsed = within(30, cli, jax(server, tmp_path))
    assert finished, "a 2 bytes/s download still going after 30 s"
    lines = error_lines(capsys)
    assert status == 2 and len(lines) == 1, lines
    assert server.endpoint in lines[0] and "below the minimum of 1000 bytes/s" in lines[0] and elapsed < 6


Usage = collections.namedtuple("Usage", "total used free")


def test_an_endless_jax_download_stops_while_the_disk_keeps_its_reserve(tmp_path, capsys, monkeypatch, quick):
    """A body of unknown size stops at the free space less the bytes kept free, so the disk is never filled."""
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12 - 10**6, 10**6))
    monkeypatch.setenv("HUBVIT_DISK_RESERVE_BYTES", str(400_000))
    monkeypatch.setenv("HUBVIT_DEADLINE", "60")
    with HostileServer(endless) as server:
        finished, status, _ = within(30, cli, jax(server, tmp_path))
    assert finished, "download still going after 30 s"
    lines = error_lines(capsys)
    assert status == 2 and len(lines) == 1, lines
    assert "more than 600000 bytes, the free space of" in lines[0] and server.endpoint in lines[0]
    assert "less the 400000 bytes kept free" in lines[0]
    assert next((tmp_path / "cache").rglob("*.part")).stat().st_size <= 600_000


def test_a_download_is_refused_before_writing_when_the_disk_has_less_than_its_reserve_free(
    tmp_path, capsys, monkeypatch, quick
):
    """The default reserve is the larger of 1 GiB and 5% of the disk: 50 GB of this 1 TB disk, which has 1 MB free."""
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12 - 10**6, 10**6))
    with HostileServer(endless) as server:
        finished, status, _ = within(30, cli, jax(server, tmp_path))
    assert finished
    lines = error_lines(capsys)
    assert status == 2 and len(lines) == 1, lines
    assert "has only 1000000 bytes free, 50000000000 of which are kept free" in lines[0]
    assert not list((tmp_path / "cache").rglob("*.part"))


def declares_a_gigabyte(connection, stopped):
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\nConnection: close\r\n\r\n")
    chunk = b"\0" * 65536
    while not stopped.is_set():
        connection.sendall(chunk)


def test_a_jax_download_larger_than_the_free_disk_is_refused_before_writing(tmp_path, capsys, monkeypatch, quick):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12 - 10**6, 10**6))
    monkeypatch.setenv("HUBVIT_MAX_DOWNLOAD_BYTES", str(2 * 10**6))  # keeps the test small if the check is missing
    with HostileServer(declares_a_gigabyte) as server:
        finished, status, _ = within(30, cli, jax(server, tmp_path))
    assert finished
    lines = error_lines(capsys)
    assert status == 2 and len(lines) == 1, lines
    assert "1000000000 bytes (Content-Length)" in lines[0] and "only 1000000 bytes free" in lines[0]
    assert not list((tmp_path / "cache").rglob("*.part"))


def test_a_hub_file_below_the_minimum_rate_fails_before_the_deadline(hub_server, monkeypatch, tmp_path):
    from hubvit.conversion.common import ConversionError
    from hubvit.conversion.sources import download_repo

    hub_server.create_repo("slow/repo")
    hub_server.commit("slow/repo", {"config.json": b"{}" + b" " * 5000})
    monkeypatch.setenv("HUBVIT_DEADLINE", "60")
    monkeypatch.setenv("HUBVIT_RATE_WINDOW", "1")
    monkeypatch.setenv("HUBVIT_MIN_RATE", "1000")
    send_bytes = _Handler._send_bytes

    def trickled(handler, data, headers):
        if handler.command != "GET" or len(data) < 1000:
            return send_bytes(handler, data, headers)
        handler._status = 200
        handler.send_response(200)
        for name, value in {**headers, "Content-Length": str(len(data))}.items():
            handler.send_header(name, value)
        handler.end_headers()
        try:
            for index in range(len(data)):
                handler.wfile.write(data[index : index + 1])
                handler.wfile.flush()
                time.sleep(0.05)
        except OSError:
            return

    monkeypatch.setattr(_Handler, "_send_bytes", trickled)
    finished, result, elapsed = within(30, download_repo, "slow/repo")
    assert finished, "a 20 bytes/s Hub download still going after 30 s"
    assert isinstance(result, ConversionError), repr(result)
    message = str(result)
    assert "\n" not in message and hub_server.endpoint in message
    assert "below the minimum of 1000 bytes/s" in message and elapsed < 10
