"""`hubvit push` against a local server speaking the Hub's HTTP API (tests/hub_server.py).

The real huggingface_hub and transformers run end to end: the folder goes up (weights through LFS), comes back
by repo id with `trust_remote_code=True`, and gives the same outputs as the local folder. Outputs are compared
with `torch.equal`: the same bytes of weights run through the same modeling code, so any difference at all means
the pushed checkpoint is not the local one.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard, list_repo_files
from transformers import AutoImageProcessor, AutoModelForImageClassification

from hub_server import READ_TOKEN
from hubvit import HubViTForImageClassification
from hubvit.card import CardInfo
from hubvit.folder import make_image_processor, write_folder
from hubvit.hub import PushError, push_folder
from hubvit.cli import main as cli
from utils import randomize_, tiny_config

pytestmark = pytest.mark.heavy

FIGURE = 3.7e-06  # stands for the max |difference| a converter measured against its source library
LABELS = ["tabby", "tiger", "lynx"]


def write(path, seed):
    config = tiny_config(num_labels=3, id2label=dict(enumerate(LABELS)), label2id={n: i for i, n in enumerate(LABELS)})
    model = randomize_(HubViTForImageClassification(config), seed).eval()
    card = CardInfo(
        provenance="Random weights for the push tests.",
        command=f"python make_tiny.py --seed {seed}",
        family="deit",
        verification="Compared with the source library's forward on the same random weights.",
        max_abs_diff=FIGURE,
        license="apache-2.0",
        datasets=["imagenet-1k"],
        base_model="facebook/deit-tiny-patch16-224",
    )
    return write_folder(model, path, make_image_processor(config, resample="bicubic"), card=card)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write(tmp_path_factory.mktemp("push") / "tiny-deit", seed=0)


def image():
    return np.random.default_rng(1).integers(0, 256, (40, 36, 3), dtype=np.uint8)


def logits(model_id_or_path):
    processor = AutoImageProcessor.from_pretrained(model_id_or_path)
    model = AutoModelForImageClassification.from_pretrained(model_id_or_path).eval()
    with torch.no_grad():
        return model(**processor(images=image(), return_tensors="pt")).logits


def load_without_hubvit(repo_id, cwd):
    """The card's usage snippets, run by repo id in a Python where hubvit cannot be imported.

    Reaches the local server through the HF_ENDPOINT/HF_TOKEN environment the fixture set; float32 logits go
    through JSON as Python floats, exactly.
    """
    code = f"""
import json, sys
sys.modules["hubvit"] = None
import numpy as np, torch
from PIL import Image
from transformers import AutoImageProcessor, AutoModelForImageClassification, pipeline
image = np.random.default_rng(1).integers(0, 256, (40, 36, 3), dtype=np.uint8)
processor = AutoImageProcessor.from_pretrained("{repo_id}")
model = AutoModelForImageClassification.from_pretrained("{repo_id}", trust_remote_code=True).eval()
with torch.no_grad():
    logits = model(**processor(images=image, return_tensors="pt")).logits
pipe = pipeline("image-classification", model="{repo_id}", trust_remote_code=True)
label = pipe(Image.fromarray(image))[0]["label"]
print(json.dumps({{"module": type(model).__module__, "logits": logits.tolist(), "pipeline_label": label}}))
"""
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def writes(server):
    """Requests that would change the Hub: repo creation, commits, branches, LFS uploads."""
    return [r for r in server.requests if r[0] in ("POST", "PUT", "DELETE") and not r[1].startswith("/api/validate")]


def test_push_load_and_update(hub_server, folder, tmp_path, capsys):
    server = hub_server
    repo_id = f"{server.user}/tiny-deit"
    assert cli(["push", str(folder), repo_id]) == 0
    assert capsys.readouterr().out.strip().endswith(server.repo(repo_id).branches["main"])

    local_files = {p.name for p in folder.iterdir()}
    assert set(list_repo_files(repo_id)) == local_files | {".gitattributes"}
    head = server.commits(repo_id)[0]
    assert "model.safetensors" in head.lfs and server.lfs_uploads == 1  # the weights went through LFS
    assert server.files(repo_id)["model.safetensors"] == (folder / "model.safetensors").read_bytes()
    assert "loads with trust_remote_code=True" in head.message

    card = ModelCard(server.files(repo_id)["README.md"].decode())
    card.validate()  # the Hub's YAML check (POST /api/validate-yaml)
    meta = card.data.to_dict()
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "image-classification"
    assert {"vision", "vit", "hubvit", "deit"} <= set(meta["tags"])
    assert meta["license"] == "apache-2.0" and meta["datasets"] == ["imagenet-1k"]
    assert meta["base_model"] == "facebook/deit-tiny-patch16-224"
    verification = card.text.split("## Verification", 1)[1].split("##", 1)[0]
    figures = [float(x) for x in re.findall(r"\*\*([0-9.]+e[-+]\d+)\*\*", verification)]
    assert figures and abs(figures[0] - FIGURE) <= 0.01 * FIGURE
    assert f'"{repo_id}"' in card.text and "REPO_ID" not in card.text  # usage snippets name the real repo
    assert "REPO_ID" in (folder / "README.md").read_text()  # the local card is left as written
    assert "touvron2021training" in card.text and "dosovitskiy2021an" in card.text

    remote = load_without_hubvit(repo_id, tmp_path)
    assert remote["module"].startswith("transformers_modules.")  # the uploaded code, not the installed hubvit
    assert server.requests_to(f"/{repo_id}/resolve/")
    local_logits = logits(folder)
    assert torch.equal(torch.tensor(remote["logits"]), local_logits)
    assert remote["pipeline_label"] == LABELS[local_logits.argmax().item()]

    stale = {"model.safetensors.index.json": "{}", "model-00001-of-00002.safetensors": b"old shard", "notes.txt": "x"}
    server.commit(repo_id, stale, message="someone else's commit")
    newer = write(tmp_path / "tiny-deit", seed=1)
    assert cli(["push", str(newer), repo_id, "--commit-message", "retrained"]) == 0
    assert list(server.repos) == [repo_id]
    assert [c.title for c in server.commits(repo_id)][:3] == ["retrained", "someone else's commit", head.title]
    assert set(server.files(repo_id)) == local_files | {".gitattributes", "notes.txt"}  # stale weights deleted
    assert server.files(repo_id)["model.safetensors"] == (newer / "model.safetensors").read_bytes()
    updated = logits(repo_id)  # the installed hubvit code with the Hub's new weights
    assert torch.equal(updated, logits(newer)) and not torch.equal(updated, local_logits)
    assert not server.unhandled


def test_branch_pull_request_and_private(hub_server, folder, capsys):
    server = hub_server
    repo_id = f"{server.user}/branches"
    assert cli(["push", str(folder), repo_id, "--revision", "dev"]) == 0
    assert "model.safetensors" in server.files(repo_id, "dev")
    assert set(server.files(repo_id, "main")) == {".gitattributes"}

    assert cli(["push", str(folder), repo_id, "--create-pr", "--commit-message", "propose weights"]) == 0
    assert capsys.readouterr().out.strip().endswith("/discussions/1")
    repo = server.repo(repo_id)
    assert repo.commits[repo.pulls[1]].title == "propose weights"
    assert "model.safetensors" in server.files(repo_id, "refs/pr/1")
    assert set(server.files(repo_id, "main")) == {".gitattributes"}

    private_id = f"{server.user}/secret"
    info = push_folder(folder, private_id, private=True)  # the call the fine-tuning script makes
    assert server.repo(private_id).private and info.oid == server.repo(private_id).branches["main"]
    assert not server.api(token=False).repo_exists(private_id)

    before = len(server.commits(repo_id))
    with pytest.raises(PushError, match="exists and is public"):
        push_folder(folder, repo_id, private=True)
    assert len(server.commits(repo_id)) == before


def test_refusals_upload_nothing(hub_server, folder, tmp_path, monkeypatch, capsys):
    server = hub_server
    no_weights = shutil.copytree(folder, tmp_path / "no-weights")
    (no_weights / "model.safetensors").unlink()
    assert cli(["push", str(no_weights), f"{server.user}/a"]) == 2
    assert "missing model.safetensors" in capsys.readouterr().err

    broken = shutil.copytree(folder, tmp_path / "broken")
    code = (broken / "modeling_hubvit.py").read_text()
    (broken / "modeling_hubvit.py").write_text(code.replace("class HubViTModel(", "class HubViTModel[("))
    assert cli(["push", str(broken), f"{server.user}/b"]) == 2
    err = capsys.readouterr().err
    assert "does not load" in err and "SyntaxError" in err

    monkeypatch.setenv("HF_TOKEN", READ_TOKEN)
    assert cli(["push", str(folder), f"{server.user}/c"]) == 2
    assert "read-only" in capsys.readouterr().err
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_token_of_this_hub")
    assert cli(["push", str(folder), f"{server.user}/d"]) == 2
    assert "refused" in capsys.readouterr().err
    monkeypatch.delenv("HF_TOKEN")
    assert cli(["push", str(folder), f"{server.user}/e"]) == 2
    assert "no Hugging Face token" in capsys.readouterr().err

    assert server.repos == {} and writes(server) == []


def test_card_of_a_fine_tuned_headless_model(tmp_path):
    from hubvit import HubViTModel  # noqa: F401  (registers the classes)
    from hubvit.card import render_card

    config = tiny_config(num_labels=0, num_register_tokens=2, layer_scale_init_value=1e-5)
    model = randomize_(HubViTForImageClassification(config), 2).eval()
    info = CardInfo(
        provenance="Fine-tuned on digits.",
        command="accelerate launch scripts/finetune.py --dataset digits",
        family="dinov2",
        citation_key=["dinov2", "registers"],
        eval_results={
            "eval_accuracy": 0.9712,
            "eval_top5_accuracy": 0.9981,
            "eval_runtime": 3.2,
            "eval_samples": 360,
            "train_runtime_s": 41.0,
        },
        datasets=["digits"],
        eval_split="validation",
    )
    render_card(model, info, make_image_processor(config)).save(tmp_path / "README.md")
    card = ModelCard.load(tmp_path / "README.md")
    meta = card.data.to_dict()
    assert meta["pipeline_tag"] == "image-feature-extraction" and "dinov2" in meta["tags"]
    [index] = meta["model-index"]
    [result] = index["results"]
    assert result["dataset"] == {"name": "digits", "type": "digits", "split": "validation"}
    assert {m["type"]: m["value"] for m in result["metrics"]} == {"accuracy": 0.9712, "top5_accuracy": 0.9981}
    assert "| eval_accuracy (validation) | 0.9712 |" in card.text and "| train_runtime_s | 41.0000 |" in card.text
    assert "AutoModel.from_pretrained" in card.text and 'pipeline("image-feature-extraction"' in card.text
    assert "oquab2024dinov2" in card.text and "darcet2024vision" in card.text and "dosovitskiy2021an" in card.text
    assert "| 8x8 | 32 | 2 | 4 | 64 |" in card.text and "2 registers" in card.text
