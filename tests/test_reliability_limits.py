"""Issue 27, the six BAD cases: data lost, a hang with no bound, the machine exhausted. Each one, rerun, must end in
one line and a non-zero exit within its deadline, with nothing lost.

Hostile servers are real sockets on 127.0.0.1 (one that accepts and never answers); deadlines are shortened through
the HUBVIT_* environment variables so each test takes seconds. A case that hung on the old code runs in a thread
(or, where it burns CPU, a child process) with a bound, so the test fails instead of hanging.
"""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hub_server import configure_hf_client
from hubvit.cli import main as cli
from test_reliability import ENV, ROOT, SilentServer, tiny_folder


def within(seconds, function, *args):
    """(finished, result or exception, elapsed) of `function(*args)` run in a daemon thread for at most `seconds`."""
    box = {}

    def run():
        try:
            box["result"] = function(*args)
        except BaseException as error:  # noqa: BLE001  (handed to the test)
            box["result"] = error

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive(), box.get("result"), time.monotonic() - started


@pytest.fixture
def short_deadlines(monkeypatch):
    monkeypatch.setenv("HUBVIT_CONNECT_TIMEOUT", "1")
    monkeypatch.setenv("HUBVIT_READ_TIMEOUT", "1")
    monkeypatch.setenv("HUBVIT_DEADLINE", "4")


@pytest.fixture
def silent_hub(monkeypatch, tmp_path, short_deadlines):
    with SilentServer() as server:
        configure_hf_client(monkeypatch, server.endpoint, "hf_test", tmp_path / "hf_home")
        yield server


def files_of(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


# --- BAD 1: publish replaced its own local source --------------------------------------------------------------------


def test_publish_refuses_a_work_dir_entry_that_is_its_own_local_source(tmp_path, capsys):
    timm = pytest.importorskip("timm")
    from timm.models import save_for_hf

    work = tmp_path / "W"
    source = work / "adv-zoo"
    model = timm.create_model(
        "vit_base_patch16_224",
        pretrained=False,
        depth=1,
        embed_dim=32,
        num_heads=2,
        img_size=16,
        patch_size=8,
        num_classes=3,
    )
    save_for_hf(model, source)
    before = files_of(source)
    manifest = tmp_path / "zoo.yaml"
    manifest.write_text(f"- source: {source}\n  converter: timm\n  repo_id: adv-zoo\n")
    status = cli(["publish", str(manifest), "--dry-run", "--work-dir", str(work)])
    captured = capsys.readouterr()
    assert status == 2
    assert "is SRC or holds SRC" in captured.out
    assert files_of(source) == before


# --- BAD 2: export onnx wrote through a symbolic link beside OUT -----------------------------------------------------


def test_export_onnx_refuses_a_verification_report_that_is_a_symbolic_link(tmp_path, capsys):
    src = tiny_folder(tmp_path / "src")
    capsys.readouterr()
    out = tmp_path / "d" / "model.onnx"
    out.parent.mkdir()
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    (out.parent / "model.verification.json").symlink_to(victim)
    status = cli(["export", "onnx", str(src), str(out)])
    err = capsys.readouterr().err
    assert status == 2 and "symbolic link" in err and "model.verification.json" in err
    assert len(err.strip().splitlines()) == 1
    assert victim.read_text() == "keep me" and not out.exists()


def test_export_onnx_keeps_an_existing_verification_report_without_overwrite(tmp_path, capsys):
    src = tiny_folder(tmp_path / "src")
    out = tmp_path / "model.onnx"
    report = tmp_path / "model.verification.json"
    report.write_text("an older report")
    status = cli(["export", "onnx", str(src), str(out)])
    err = capsys.readouterr().err
    assert status == 2 and "--overwrite" in err and str(report) in err
    assert report.read_text() == "an older report"


# --- BAD 3 and 4: a Hub endpoint that accepts and never answers -----------------------------------------------------


def test_publish_with_a_silent_hub_gives_up_within_the_deadline(silent_hub, tmp_path, capsys):
    manifest = tmp_path / "zoo.yaml"
    manifest.write_text("- source: timm/vit_tiny_patch16_224.augreg_in21k\n  converter: timm\n  repo_id: me/zoo\n")
    finished, status, elapsed = within(30, cli, ["publish", str(manifest)])
    assert finished, "publish still waiting after 30 s"
    out = capsys.readouterr().out
    assert status == 2, status
    assert silent_hub.endpoint in out and "did not answer in time" in out
    assert elapsed < 15


def test_convert_from_a_silent_hub_gives_up_within_the_deadline(silent_hub, tmp_path, capsys):
    finished, status, elapsed = within(
        30, cli, ["convert", "timm", "timm/vit_tiny_patch16_224.augreg_in21k", str(tmp_path / "out")]
    )
    assert finished, "convert still waiting after 30 s"
    err = capsys.readouterr().err
    assert status == 2, status
    assert silent_hub.endpoint in err and "did not answer in time" in err
    assert len(err.strip().splitlines()) == 1 and elapsed < 15


# --- BAD 5: a YAML manifest whose aliases expand to 10^9 strings ----------------------------------------------------


BILLION_LAUGHS = """\
- source: timm/x
  converter: timm
  repo_id: me/x
  options: &a9 [&a8 [&a7 [&a6 [&a5 [&a4 [&a3 [&a2 [&a1 [&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol],
    *a0, *a0, *a0, *a0, *a0, *a0, *a0, *a0, *a0], *a1, *a1, *a1, *a1, *a1, *a1, *a1, *a1, *a1],
    *a2, *a2, *a2, *a2, *a2, *a2, *a2, *a2, *a2], *a3, *a3, *a3, *a3, *a3, *a3, *a3, *a3, *a3],
    *a4, *a4, *a4, *a4, *a4, *a4, *a4, *a4, *a4], *a5, *a5, *a5, *a5, *a5, *a5, *a5, *a5, *a5],
    *a6, *a6, *a6, *a6, *a6, *a6, *a6, *a6, *a6], *a7, *a7, *a7, *a7, *a7, *a7, *a7, *a7, *a7],
    *a8, *a8, *a8, *a8, *a8, *a8, *a8, *a8, *a8]
"""


def test_a_yaml_manifest_with_aliases_is_refused_without_expanding_them(tmp_path):
    manifest = tmp_path / "zoo.yaml"
    manifest.write_text(BILLION_LAUGHS)
    assert len(BILLION_LAUGHS) < 1500
    code = "import sys; from hubvit.conversion.publish import read_manifest; read_manifest(sys.argv[1])"
    try:
        run = subprocess.run(
            [sys.executable, "-c", code, str(manifest)],
            check=False,
            cwd=ROOT,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("reading a 1 kB manifest took more than 60 s")
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert "ManifestError" in last and "alias *a0" in last and "line 5" in last


# --- BAD 6: a named pipe among the images ---------------------------------------------------------------------------


def test_analyze_skips_a_named_pipe_among_the_images(tmp_path, capsys):
    from PIL import Image

    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (40, 40), (200, 30, 90)).save(images / "a.png")
    pipe = images / "b.png"
    os.mkfifo(pipe)
    argv = [
        "analyze",
        "attention-distance",
        "s/16",
        "--images",
        str(images),
        "--image-size",
        "32",
        "--output-dir",
        str(tmp_path / "out"),
    ]
    try:
        finished, status, _ = within(60, cli, argv)
    finally:
        try:  # wake a reader blocked on the pipe (the old code), so the thread can end
            os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    assert finished, "analyze blocked on a named pipe"
    captured = capsys.readouterr()
    assert status == 0
    assert f"skipped {pipe}: not a regular file (a named pipe)" in captured.err and "1 images" in captured.out
