"""Converting by name: Hub repo ids through huggingface_hub, and `.npz` addresses through a resumable download.

The Hub is the loopback API server of tests/hub_server.py holding a timm-layout repo and a transformers repo; the
`.npz` address is a stdlib HTTP server on 127.0.0.1 that honours Range requests and can be slowed down, so a
download killed part way (SIGKILL of the process doing it) leaves a `.part` file the next run resumes.
"""

import hashlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard

from hubvit.conversion import sources
from hubvit.cli import main as cli
import utils

timm = pytest.importorskip("timm")
from timm.models import save_for_hf  # noqa: E402

pytestmark = pytest.mark.heavy

TINY_TIMM = dict(utils.TINY_TIMM, num_classes=5)


def folder_files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def timm_repo(server, tmp_path, repo_id, seed):
    torch.manual_seed(seed)
    model = timm.create_model("vit_base_patch16_224.augreg_in1k", pretrained=False, **TINY_TIMM)
    save_for_hf(model, tmp_path / f"timm{seed}", safe_serialization="both")  # as the timm/ repos hold them
    if repo_id not in server.repos:
        server.create_repo(repo_id)
    return server.commit(repo_id, folder_files(tmp_path / f"timm{seed}"), message=f"seed {seed}"), model


def card_metadata(folder):
    card = ModelCard.load(folder / "README.md")
    return card.data.to_dict()["hubvit"], card.text


def test_timm_repo_id_and_revision(hub_server, tmp_path, capsys):
    server, repo_id = hub_server, "timm/tiny_vit.augreg_in1k"
    first, first_model = timm_repo(server, tmp_path, repo_id, seed=0)
    second, _ = timm_repo(server, tmp_path, repo_id, seed=1)

    assert cli(["convert", "timm", repo_id, str(tmp_path / "latest")]) == 0
    record, text = card_metadata(tmp_path / "latest")
    assert record["source"] == {"repo_id": repo_id, "revision": second.oid}
    assert f"`{repo_id}` at commit `{second.oid}`" in text
    assert "hubvit convert timm timm/tiny_vit.augreg_in1k" in text
    fetched = [path for _, path, _ in server.requests if "/resolve/" in path]
    assert any(path.endswith("/model.safetensors") for path in fetched)
    assert not any(path.endswith(".bin") for path in fetched)  # one weights format only

    assert cli(["convert", "timm", repo_id, str(tmp_path / "first"), "--revision", first.oid[:10]]) == 0
    record, _ = card_metadata(tmp_path / "first")
    assert record["source"] == {"repo_id": repo_id, "revision": first.oid}
    from safetensors.torch import load_file

    converted = load_file(tmp_path / "first" / "model.safetensors")
    assert torch.equal(converted["hubvit.embeddings.class_token"], first_model.cls_token.detach())


def test_transformers_repo_id(hub_server, tmp_path):
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=3,
        layer_norm_eps=1e-6,
    )
    ViTForImageClassification(config).save_pretrained(tmp_path / "vit")
    repo_id = "google/tiny-vit"
    hub_server.create_repo(repo_id)
    commit = hub_server.commit(repo_id, folder_files(tmp_path / "vit"))
    assert cli(["convert", "transformers", repo_id, str(tmp_path / "out")]) == 0
    record, text = card_metadata(tmp_path / "out")
    assert record["source"] == {"repo_id": repo_id, "revision": commit.oid}
    assert "# hubvit tiny-vit (ViTForImageClassification)" in text


def test_offline_uses_the_cache_and_names_the_repo_it_lacks(hub_server, tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants

    repo_id = "timm/cached_vit"
    commit, _ = timm_repo(hub_server, tmp_path, repo_id, seed=0)
    assert cli(["convert", "timm", repo_id, str(tmp_path / "online")]) == 0
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    before = len(hub_server.requests)
    assert cli(["convert", "timm", repo_id, str(tmp_path / "offline")]) == 0
    assert len(hub_server.requests) == before
    assert card_metadata(tmp_path / "offline")[0]["source"]["revision"] == commit.oid

    capsys.readouterr()
    assert cli(["convert", "timm", "timm/never_downloaded", str(tmp_path / "missing")]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1
    assert "timm/never_downloaded: not in the Hugging Face cache" in error and "HF_HUB_OFFLINE is set" in error


def test_unknown_repo_and_revision_are_one_line_errors(hub_server, tmp_path, capsys):
    assert cli(["convert", "timm", "nobody/nothing", str(tmp_path / "a")]) == 2
    assert "nobody/nothing: no such repo on http://127.0.0.1" in capsys.readouterr().err
    timm_repo(hub_server, tmp_path, "timm/tiny", seed=0)
    assert cli(["convert", "timm", "timm/tiny", str(tmp_path / "b"), "--revision", "v9"]) == 2
    assert "timm/tiny: no revision 'v9'" in capsys.readouterr().err
    assert cli(["convert", "timm", "not a path", str(tmp_path / "c")]) == 2
    assert "not a path: no such file or folder; expected a local file or folder, or a Hub repo id" in (
        capsys.readouterr().err
    )


# ---------------------------------------------------------------------------------------------------- .npz


def vision_transformer_npz(depth=2, width=32, heads=4, mlp=64, patch=8, grid=4, classes=3, seed=0):
    """Random arrays in the original vision_transformer layout (docs: /work/shared/FACTS.md section 1)."""
    rng = np.random.default_rng(seed)
    arrays = {
        "embedding/kernel": (patch, patch, 3, width),
        "embedding/bias": (width,),
        "cls": (1, 1, width),
        "Transformer/posembed_input/pos_embedding": (1, grid * grid + 1, width),
        "Transformer/encoder_norm/scale": (width,),
        "Transformer/encoder_norm/bias": (width,),
        "head/kernel": (width, classes),
        "head/bias": (classes,),
    }
    for i in range(depth):
        block = f"Transformer/encoderblock_{i}"
        for norm in ("LayerNorm_0", "LayerNorm_2"):
            arrays.update({f"{block}/{norm}/scale": (width,), f"{block}/{norm}/bias": (width,)})
        for name in ("query", "key", "value"):
            arrays[f"{block}/MultiHeadDotProductAttention_1/{name}/kernel"] = (width, heads, width // heads)
            arrays[f"{block}/MultiHeadDotProductAttention_1/{name}/bias"] = (heads, width // heads)
        arrays[f"{block}/MultiHeadDotProductAttention_1/out/kernel"] = (heads, width // heads, width)
        arrays[f"{block}/MultiHeadDotProductAttention_1/out/bias"] = (width,)
        mlp_block = f"{block}/MlpBlock_3"
        arrays.update(
            {
                f"{mlp_block}/Dense_0/kernel": (width, mlp),
                f"{mlp_block}/Dense_0/bias": (mlp,),
                f"{mlp_block}/Dense_1/kernel": (mlp, width),
                f"{mlp_block}/Dense_1/bias": (width,),
            }
        )
    buffer = io.BytesIO()
    np.savez(buffer, **{k: rng.standard_normal(s).astype(np.float32) for k, s in arrays.items()})
    return buffer.getvalue()


class FileServer:
    """Serves `data` at /ckpt/ViT-Ti_8.npz with ETag and Range support; `delay` seconds between 4 KiB chunks;
    `cut_at`: stop after that many bytes of the file although Content-Length promised them all."""

    def __init__(self, data, delay=0.0):
        self.data, self.delay, self.requests, self.cut_at = data, delay, [], None
        etag = f'"{hashlib.sha256(data).hexdigest()[:16]}"'
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path != "/ckpt/ViT-Ti_8.npz":
                    self.send_error(404)
                    return
                start = 0
                ranged = self.headers.get("Range")
                if ranged and self.headers.get("If-Range", etag) == etag:
                    start = int(ranged.removeprefix("bytes=").split("-")[0])
                owner.requests.append({"range": ranged, "if_range": self.headers.get("If-Range")})
                body = owner.data[start:]
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(owner.data) - 1}/{len(owner.data)}")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("ETag", etag)
                self.end_headers()
                try:
                    if owner.cut_at is not None:
                        body = body[: owner.cut_at - start]
                    for offset in range(0, len(body), 4096):
                        self.wfile.write(body[offset : offset + 4096])
                        self.wfile.flush()
                        time.sleep(owner.delay)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/ckpt/ViT-Ti_8.npz"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def npz_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HUBVIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_killed_download_resumes_and_the_card_records_the_sha256(tmp_path, npz_cache, capsys):
    data = vision_transformer_npz()
    server = FileServer(data, delay=0.01)
    try:
        code = f"from hubvit.conversion.sources import fetch; fetch({server.url!r})"
        env = {**os.environ, "HUBVIT_CACHE": str(npz_cache), "HF_HUB_OFFLINE": "0"}
        process = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline:
            parts = list(npz_cache.glob("downloads/*/*.part"))
            if parts and parts[0].stat().st_size >= len(data) // 3:
                break
            time.sleep(0.02)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        [part] = npz_cache.glob("downloads/*/*.part")
        kept = part.stat().st_size
        assert 0 < kept < len(data)

        server.delay = 0.0
        assert cli(["convert", "jax", server.url, str(tmp_path / "out")]) == 0
        assert server.requests[-1]["range"] == f"bytes={kept}-" and server.requests[-1]["if_range"]
        digest = hashlib.sha256(data).hexdigest()
        cached = next(npz_cache.glob("downloads/*/ViT-Ti_8.npz"))
        assert cached.read_bytes() == data and not list(npz_cache.glob("downloads/*/*.part"))

        record, text = card_metadata(tmp_path / "out")
        assert record["source"] == {"url": server.url, "sha256": digest}
        assert digest in text and f"hubvit convert jax {server.url}" in text

        served = len(server.requests)
        assert cli(["convert", "jax", server.url, str(tmp_path / "again"), "--sha256", digest]) == 0
        assert len(server.requests) == served  # from the cache
    finally:
        server.close()


def test_a_dropped_connection_says_how_to_resume(tmp_path, npz_cache):
    data = vision_transformer_npz(seed=1)
    server = FileServer(data)
    server.cut_at = cut = 40960  # the server promises every byte and closes the connection after this many

    try:
        with pytest.raises(ValueError, match=rf"interrupted at {cut} of {len(data)} bytes.*run the same command again"):
            sources.resolve(server.url, "url")
        server.cut_at = None
        source = sources.resolve(server.url, "url")
        assert server.requests[-1]["range"] == f"bytes={cut}-"
        assert source.path.read_bytes() == data and source.sha256 == hashlib.sha256(data).hexdigest()
    finally:
        server.close()


def test_sha256_mismatch_and_offline_cache_miss_are_refused(tmp_path, npz_cache, monkeypatch, capsys):
    data = vision_transformer_npz(seed=2)
    server = FileServer(data)
    try:
        assert cli(["convert", "jax", server.url, str(tmp_path / "a"), "--sha256", "0" * 64]) == 2
        assert f"sha256 {hashlib.sha256(data).hexdigest()}, expected {'0' * 64}" in capsys.readouterr().err
        from huggingface_hub import constants

        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        other = server.url.replace("ViT-Ti_8", "other")
        assert cli(["convert", "jax", other, str(tmp_path / "b")]) == 2
        assert "not in hubvit's cache" in capsys.readouterr().err
    finally:
        server.close()


def test_an_out_folder_named_like_the_repo_namespace_is_not_taken_for_src(tmp_path, monkeypatch):
    """`hubvit convert timm timm/NAME timm`: SRC is a repo id, not a local folder inside OUT, so OUT is accepted;
    a local SRC inside OUT is still refused."""
    from hubvit.conversion.common import ConversionError
    from hubvit.folder import check_output_path

    monkeypatch.chdir(tmp_path)
    assert check_output_path("timm", "timm/vit_tiny_patch16_224.augreg_in21k").name == "timm"
    (tmp_path / "timm").mkdir()
    (tmp_path / "timm" / "weights.safetensors").write_bytes(b"x")
    with pytest.raises(ConversionError, match="is SRC or holds SRC"):
        check_output_path("timm", "timm/weights.safetensors")
