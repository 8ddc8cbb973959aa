"""The fake Hub in tests/hub_server.py works with the REAL huggingface_hub client and transformers.

Everything runs against 127.0.0.1; the fixture points the client at it (see the module docstring of
hub_server.py for the import-time constants gotcha).
"""

import hashlib
import json
import os

import pytest

huggingface_hub = pytest.importorskip("huggingface_hub")
from huggingface_hub import (  # noqa: E402
    HfApi,
    create_branch,
    create_repo,
    hf_hub_download,
    list_repo_files,
    list_repo_tree,
    snapshot_download,
    upload_folder,
    whoami,
)
from huggingface_hub.errors import (  # noqa: E402
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

try:
    from hub_server import HubServer  # the `hub_server` fixture comes from conftest.py
except ImportError:  # tests/ imported as a package
    from tests.hub_server import HubServer

BIG = 10 * 1024 * 1024 + 4096  # just over the Hub's 10 MiB LFS threshold


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "hubvit", "hidden_size": 32}))
    (d / "notes.txt").write_text("a small text file\n")
    # not an LFS suffix: it must go through LFS because of its size
    (d / "blob.dat").write_bytes(os.urandom(BIG))
    return d


def test_push_pull_roundtrip(hub_server, folder, tmp_path):
    server = hub_server
    repo_id = f"{server.user}/roundtrip"

    url = create_repo(repo_id)
    assert url.startswith(server.endpoint) and url.repo_id == repo_id
    with pytest.raises(HfHubHTTPError) as e:  # exists => 409
        create_repo(repo_id)
    assert e.value.response.status_code == 409
    assert create_repo(repo_id, exist_ok=True).repo_id == repo_id

    info = upload_folder(repo_id=repo_id, folder_path=folder, commit_message="first")
    assert info.oid == server.repo(repo_id).branches["main"]
    assert server.lfs_uploads == 1 and server.lfs_verifies == 1
    head = server.commits(repo_id)[0]
    assert head.title == "first" and set(head.lfs) == {"blob.dat"}  # config.json, notes.txt: regular
    assert server.requests_to(".git/info/lfs/objects/batch")

    files = list_repo_files(repo_id)
    assert sorted(files) == [".gitattributes", "blob.dat", "config.json", "notes.txt"]
    tree = {e.path: e for e in list_repo_tree(repo_id)}
    big_sha = hashlib.sha256((folder / "blob.dat").read_bytes()).hexdigest()
    assert tree["blob.dat"].lfs.sha256 == big_sha and tree["blob.dat"].size == BIG
    assert tree["notes.txt"].lfs is None

    # pull: small (regular) and big (LFS, 302 to the "CDN" origin) files, bytes equal
    for name in ("config.json", "blob.dat"):
        path = hf_hub_download(repo_id, name)
        assert open(path, "rb").read() == (folder / name).read_bytes()
        assert str(tmp_path / "hf_home") in os.path.realpath(path)  # isolated cache
    assert server.requests_to("/_cdn/" + big_sha)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(repo_id, "missing.txt")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(repo_id, "config.json", revision="nope")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download(f"{server.user}/nope", "config.json")

    snap = snapshot_download(repo_id)
    assert sorted(os.listdir(snap)) == [".gitattributes", "blob.dat", "config.json", "notes.txt"]
    assert open(os.path.join(snap, "notes.txt")).read() == "a small text file\n"

    # second upload to the same repo: a new commit, not a new repo; unchanged LFS file is not re-uploaded
    (folder / "notes.txt").write_text("changed\n")
    upload_folder(repo_id=repo_id, folder_path=folder, commit_message="second")
    assert list(server.repos) == [repo_id]
    assert [c.title for c in server.commits(repo_id)] == ["second", "first", "initial commit"]
    assert server.files(repo_id)["notes.txt"] == b"changed\n"
    assert server.files(repo_id, server.commits(repo_id)[1].oid)["notes.txt"] == b"a small text file\n"
    assert server.lfs_uploads == 1
    # nothing changed => the client makes no commit at all
    upload_folder(repo_id=repo_id, folder_path=folder, commit_message="noop")
    assert len(server.commits(repo_id)) == 3
    # the new head is what a download of "main" now sees
    assert open(hf_hub_download(repo_id, "notes.txt"), "rb").read() == b"changed\n"


def test_branch_and_pull_request(hub_server, tmp_path):
    server = hub_server
    repo_id = f"{server.user}/branches"
    create_repo(repo_id)
    d = tmp_path / "f"
    d.mkdir()
    (d / "config.json").write_text("{}")
    upload_folder(repo_id=repo_id, folder_path=d)

    create_branch(repo_id, branch="dev")
    with pytest.raises(HfHubHTTPError):
        create_branch(repo_id, branch="dev")
    create_branch(repo_id, branch="dev", exist_ok=True)
    (d / "dev.txt").write_text("on dev")
    upload_folder(repo_id=repo_id, folder_path=d, revision="dev", commit_message="dev commit")
    assert "dev.txt" in server.files(repo_id, "dev") and "dev.txt" not in server.files(repo_id, "main")
    assert len(server.commits(repo_id, "main")) == 2 and len(server.commits(repo_id, "dev")) == 3
    assert "dev.txt" in list_repo_files(repo_id, revision="dev")
    assert open(hf_hub_download(repo_id, "dev.txt", revision="dev")).read() == "on dev"

    (d / "pr.txt").write_text("proposed")
    info = upload_folder(repo_id=repo_id, folder_path=d, create_pr=True, commit_message="a PR")
    assert info.pr_revision == "refs/pr/1" and info.pr_num == 1
    assert info.pr_url == f"{server.endpoint}/{repo_id}/discussions/1"
    assert server.repo(repo_id).pulls[1] == info.oid
    assert "pr.txt" in server.files(repo_id, "refs/pr/1") and "pr.txt" not in server.files(repo_id, "main")
    assert open(hf_hub_download(repo_id, "pr.txt", revision="refs/pr/1")).read() == "proposed"
    assert set(server.repo(repo_id).branches) == {"main", "dev"} and list(server.repo(repo_id).pulls) == [1]


def test_private_repo_and_tokens(hub_server, tmp_path):
    server = hub_server
    assert whoami()["name"] == server.user
    with pytest.raises(HfHubHTTPError) as e:
        whoami(token="hf_not_a_valid_token")
    assert e.value.response.status_code == 401

    repo_id = f"{server.user}/secret"
    create_repo(repo_id, private=True)
    assert server.repo(repo_id).private
    server.commit(repo_id, {"config.json": "{}"})

    assert HfApi().model_info(repo_id).private is True  # with the (valid) HF_TOKEN
    anon = server.api(token=False)
    with pytest.raises(RepositoryNotFoundError):
        anon.model_info(repo_id)
    with pytest.raises(RepositoryNotFoundError):
        anon.list_repo_files(repo_id)
    assert not anon.repo_exists(repo_id)
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download(repo_id, "config.json", token=False, cache_dir=tmp_path / "anon")
    # writes need a token
    d = tmp_path / "w"
    d.mkdir()
    (d / "x.txt").write_text("x")
    with pytest.raises(HfHubHTTPError):
        anon.upload_folder(repo_id=repo_id, folder_path=d)
    assert server.api().list_repo_files(repo_id) == [".gitattributes", "config.json"]
    assert not server.unhandled


def test_transformers_push_to_hub_of_a_hubvit_model_round_trips(hub_server, tmp_path):
    """transformers' own `push_to_hub` on a hubvit model uploads the modeling files beside the weights (what a user
    without hubvit runs), and the Auto classes load the same model back from the Hub."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    try:
        from utils import randomize_, tiny_config
    except ImportError:
        from tests.utils import randomize_, tiny_config
    from hubvit import HubViTForImageClassification

    server = hub_server
    model = randomize_(HubViTForImageClassification(tiny_config(num_labels=3))).eval()
    repo_id = f"{server.user}/tiny-hubvit"
    model.push_to_hub(repo_id)
    files = server.files(repo_id)
    assert {"config.json", "model.safetensors", "configuration_hubvit.py", "modeling_hubvit.py"} <= set(files)
    assert "model.safetensors" in server.repo(repo_id).head().lfs  # *.safetensors -> LFS by suffix

    loaded = transformers.AutoModelForImageClassification.from_pretrained(
        repo_id, trust_remote_code=True, cache_dir=tmp_path / "cache"
    ).eval()
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(pixel_values=pixels).logits, model(pixel_values=pixels).logits)
    assert not server.unhandled


def test_server_options_without_fixture(monkeypatch, tmp_path):
    # Own server with options; configure_hf_client is what the fixture does. Without it, the import-time
    # constants stay on huggingface.co: Xet would be used (the fake answers 501) and the first request of the
    # process would fetch huggingface.co/api/agent-harnesses, even with an explicit HfApi(endpoint=...).
    try:
        from hub_server import configure_hf_client
    except ImportError:
        from tests.hub_server import configure_hf_client
    with HubServer(lfs_threshold=10, lfs_redirect=False) as server:
        configure_hf_client(monkeypatch, server.endpoint, None, tmp_path / "home")
        api = server.api()
        api.create_repo("someone/x")
        api.upload_file(path_or_fileobj=b"0123456789abc", path_in_repo="a.dat", repo_id="someone/x")
        api.upload_file(path_or_fileobj=b"small", path_in_repo="b.dat", repo_id="someone/x")
        head = server.repo("someone/x").head()
        assert head.lfs == {"a.dat": hashlib.sha256(b"0123456789abc").hexdigest()}
        assert server.lfs_uploads == 1
        path = hf_hub_download("someone/x", "a.dat", token=server.token)  # LFS served with 200, no redirect
        assert open(path, "rb").read() == b"0123456789abc"
        assert not server.requests_to("/_cdn/")
        with pytest.raises(HfHubHTTPError):  # no HF_TOKEN in the environment here
            api.create_repo("someone/y", token=False)


def test_fixture_refuses_non_loopback_connections(hub_server):
    import socket

    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("192.0.2.1", 443), timeout=1)  # TEST-NET-1: nothing leaves the machine
    assert hub_server.blocked_connections == [("192.0.2.1", 443)]
    hub_server.blocked_connections.clear()  # else the fixture fails this test at teardown
