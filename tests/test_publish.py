"""`hubvit publish MANIFEST` against the loopback Hub: a three-entry zoo with one entry that cannot be converted.

The sources live on the same loopback Hub (a timm-layout repo and a transformers repo); the targets are repos of the
test user. What is checked is what a maintainer relies on: every entry is tried, the table says what happened with
the parity figure and the commit the push made, the exit status says something failed, a rerun skips what is
current and redoes what changed, and a dry run (with --force: converting what is current) uploads nothing.
Each push and dry run loads the folder in a fresh Python (about 25 s here), so the steps are kept few.
"""

import re

import pytest
import torch
from huggingface_hub import ModelCard

from hubvit.conversion.publish import Entry, read_manifest
from hubvit.cli import main as cli
import utils

timm = pytest.importorskip("timm")
from timm.models import save_for_hf  # noqa: E402

TINY_TIMM = dict(utils.TINY_TIMM, num_classes=5)

MANIFEST = """\
entries:
  - source: timm/tiny_vit.augreg_in1k
    converter: timm
    repo_id: test-user/zoo-timm
  - source: google/tiny-vit
    converter: transformers
    options: {tolerance: 1e-5}
    repo_id: test-user/zoo-vit
    private: true
  - source: timm/tiny_vit.augreg_in1k
    converter: timm
    options: {model-args: '{"img_size": 48}'}
    repo_id: test-user/zoo-broken
"""


def files_of(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def seed_timm(server, tmp_path, seed):
    torch.manual_seed(seed)
    model = timm.create_model("vit_base_patch16_224.augreg_in1k", pretrained=False, **TINY_TIMM)
    save_for_hf(model, tmp_path / f"timm{seed}")
    if "timm/tiny_vit.augreg_in1k" not in server.repos:
        server.create_repo("timm/tiny_vit.augreg_in1k")
    return server.commit("timm/tiny_vit.augreg_in1k", files_of(tmp_path / f"timm{seed}"))


def seed_transformers(server, tmp_path):
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
    server.create_repo("google/tiny-vit")
    return server.commit("google/tiny-vit", files_of(tmp_path / "vit"))


def table(output):
    """{entry: (result, parity, commit)} from the summary table."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] not in ("entry",) and not set(cells[0]) <= {"-"}:
            rows[cells[0]] = tuple(cells[1:])
    return rows


def uploads(server):
    return [r for r in server.requests if r[0] in ("POST", "PUT", "DELETE") and not r[1].startswith("/api/validate")]


@pytest.mark.heavy
def test_publish_a_zoo(hub_server, tmp_path, capsys):
    server = hub_server
    timm_commit = seed_timm(server, tmp_path, seed=0)
    vit_commit = seed_transformers(server, tmp_path)
    manifest = tmp_path / "zoo.yaml"
    manifest.write_text(MANIFEST)

    assert cli(["publish", str(manifest)]) == 2
    captured = capsys.readouterr()
    rows = table(captured.out)
    assert list(rows) == ["test-user/zoo-timm", "test-user/zoo-vit", "test-user/zoo-broken"]
    for repo_id in ("test-user/zoo-timm", "test-user/zoo-vit"):
        result, parity, commit = rows[repo_id]
        assert result == "pushed" and commit == server.repo(repo_id).branches["main"]
        assert float(parity) <= 1e-4  # the converter's own check against the source passed, with this figure
    assert server.repo("test-user/zoo-vit").private and not server.repo("test-user/zoo-timm").private
    result = rows["test-user/zoo-broken"][0]
    assert result.startswith("failed (cannot convert this timm") and "shape mismatches" not in result  # one line
    assert "test-user/zoo-broken" not in server.repos
    assert "1 of 3 entries failed: test-user/zoo-broken (cannot convert this timm" in captured.err  # with its cause

    card = ModelCard(server.files("test-user/zoo-timm")["README.md"].decode())
    record = card.data.to_dict()["hubvit"]
    assert record["source"] == {"repo_id": "timm/tiny_vit.augreg_in1k", "revision": timm_commit.oid}
    assert f"{record['max_abs_diff']:.2e}" == rows["test-user/zoo-timm"][1]
    vit_card = ModelCard(server.files("test-user/zoo-vit")["README.md"].decode())
    assert vit_card.data.to_dict()["hubvit"]["source"]["revision"] == vit_commit.oid

    commits = {r: len(server.commits(r)) for r in ("test-user/zoo-timm", "test-user/zoo-vit")}
    assert cli(["publish", str(manifest)]) == 2
    rows = table(capsys.readouterr().out)
    assert rows["test-user/zoo-timm"][0] == rows["test-user/zoo-vit"][0] == "skipped"
    assert {r: len(server.commits(r)) for r in commits} == commits

    new_source = seed_timm(server, tmp_path, seed=1)
    assert cli(["publish", str(manifest)]) == 2
    rows = table(capsys.readouterr().out)
    assert rows["test-user/zoo-timm"][0] == "pushed" and rows["test-user/zoo-vit"][0] == "skipped"
    card = ModelCard(server.files("test-user/zoo-timm")["README.md"].decode())
    assert card.data.to_dict()["hubvit"]["source"]["revision"] == new_source.oid

    one = tmp_path / "one.yaml"
    one.write_text("- {source: google/tiny-vit, converter: transformers, repo_id: test-user/zoo-vit, private: true}\n")
    written = len(uploads(server))
    assert cli(["publish", str(one), "--dry-run"]) == 0
    assert table(capsys.readouterr().out)["test-user/zoo-vit"][0] == "skipped"  # a dry run predicts the real one
    assert cli(["publish", str(one), "--dry-run", "--force"]) == 0
    result, parity, commit = table(capsys.readouterr().out)["test-user/zoo-vit"]
    assert result == "checked" and float(parity) <= 1e-4 and commit == "-"  # converted and load-checked
    assert len(uploads(server)) == written
    assert not server.unhandled


def test_yaml_and_csv_manifests_read_the_same(tmp_path):
    (tmp_path / "zoo.yaml").write_text(MANIFEST)
    (tmp_path / "zoo.csv").write_text(
        "source,converter,options,repo_id,private\n"
        "timm/tiny_vit.augreg_in1k,timm,,test-user/zoo-timm,false\n"
        "google/tiny-vit,transformers,--tolerance 1e-5,test-user/zoo-vit,private\n"
        'timm/tiny_vit.augreg_in1k,timm,"--model-args \'{""img_size"": 48}\'",test-user/zoo-broken,\n'
    )
    assert (
        read_manifest(tmp_path / "zoo.yaml")
        == read_manifest(tmp_path / "zoo.csv")
        == [
            Entry("timm/tiny_vit.augreg_in1k", "timm", "test-user/zoo-timm", [], False),
            Entry("google/tiny-vit", "transformers", "test-user/zoo-vit", ["--tolerance", "1e-5"], True),
            Entry(
                "timm/tiny_vit.augreg_in1k", "timm", "test-user/zoo-broken", ["--model-args", '{"img_size": 48}'], False
            ),
        ]
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("- {source: a, converter: timm}\n", r"entry 1: missing \['repo_id'\]"),
        ("- {source: a, converter: onnx, repo_id: u/a}\n", r"entry 1: converter 'onnx'; expected one of"),
        ("- {source: a, converter: timm, repo_id: u/a, privte: true}\n", r"unknown fields \['privte'\]"),
        (
            "- {source: a, converter: timm, repo_id: u/a}\n- {source: b, converter: jax, repo_id: u/a}\n",
            "several entries push to u/a",
        ),
        ("- {source: a, converter: timm, repo_id: u/a, private: maybe}\n", "private 'maybe'; expected true/false"),
    ],
)
def test_a_bad_manifest_is_refused_before_anything_runs(tmp_path, capsys, text, message):
    (tmp_path / "zoo.yaml").write_text(text)
    assert cli(["publish", str(tmp_path / "zoo.yaml")]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and len(err.strip().splitlines()) == 1


def test_a_manifest_that_is_not_utf8_is_refused_naming_the_byte(tmp_path, capsys):
    (tmp_path / "zoo.yaml").write_bytes("- {source: caf\u00e9, converter: timm, repo_id: u/a}\n".encode("latin-1"))
    assert cli(["publish", str(tmp_path / "zoo.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert "byte 14 is not UTF-8" in err and "save the manifest as UTF-8" in err and len(err.splitlines()) == 1


@pytest.mark.heavy
def test_publish_a_modern_family_pushes_it_with_its_papers_citation(hub_server, tmp_path, capsys):
    """A DINOv3 timm repo (rotary positions, registers, layer scale) published like any other entry: pushed with
    the converter's parity figure, and the card cites the family's paper by title."""
    torch.manual_seed(0)
    model = timm.create_model("vit_base_patch16_dinov3", pretrained=False, **dict(utils.TINY_TIMM, num_classes=0))
    save_for_hf(model, tmp_path / "dinov3")
    hub_server.create_repo("timm/tiny_dinov3.lvd")
    hub_server.commit("timm/tiny_dinov3.lvd", files_of(tmp_path / "dinov3"))
    manifest = tmp_path / "one.yaml"
    manifest.write_text("- {source: timm/tiny_dinov3.lvd, converter: timm, repo_id: test-user/dinov3}\n")
    assert cli(["publish", str(manifest)]) == 0
    result, parity, commit = table(capsys.readouterr().out)["test-user/dinov3"]
    assert (
        result == "pushed" and float(parity) <= 1e-5 and commit == hub_server.repo("test-user/dinov3").branches["main"]
    )
    card = ModelCard(hub_server.files("test-user/dinov3")["README.md"].decode())
    assert "title = {DINOv3}" in card.content and "dinov3" in card.data.tags
