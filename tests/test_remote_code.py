"""A saved hubvit folder is self-contained: it loads where hubvit cannot be imported, through the Auto classes and
`pipeline`, and gives exactly the outputs of the in-process model (same code, same weights: bit-exact)."""

import json

import numpy as np
import torch
from PIL import Image
from transformers import pipeline

from hubvit import HubViTForImageClassification
from hubvit.folder import REQUIRED_FILES, write_folder
from utils import randomize_, run_without_hubvit, tiny_config


def test_folder_loads_and_runs_without_hubvit(tmp_path):
    config = tiny_config(
        num_labels=3, id2label={0: "zero", 1: "one", 2: "two"}, label2id={"zero": 0, "one": 1, "two": 2}
    )
    model = randomize_(HubViTForImageClassification(config), seed=4).eval()
    folder = write_folder(model, tmp_path / "ckpt")
    for name in REQUIRED_FILES + ("preprocessor_config.json",):
        assert (folder / name).is_file(), name
    assert set(json.loads((folder / "config.json").read_text())["auto_map"]) == {
        "AutoConfig",
        "AutoModel",
        "AutoModelForImageClassification",
        "AutoBackbone",
    }

    x = torch.randn(2, 3, 40, 24, generator=torch.Generator().manual_seed(0))
    torch.save(x, tmp_path / "x.pt")
    image = Image.fromarray((np.random.default_rng(0).random((50, 70, 3)) * 255).astype("uint8"))
    image.save(tmp_path / "image.png")
    with torch.no_grad():
        logits = model(x).logits
        pooled = model.hubvit(x).pooler_output
    expected_pipeline = pipeline("image-classification", model=str(folder))(str(tmp_path / "image.png"))

    isolated = run_without_hubvit(
        f"""
        import json, torch
        from transformers import AutoConfig, AutoModel, AutoModelForImageClassification, pipeline
        try:
            import hubvit
            raise SystemExit("hubvit should not be importable here")
        except ImportError:
            pass
        folder = {str(folder)!r}
        config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
        classifier = AutoModelForImageClassification.from_pretrained(folder, trust_remote_code=True).eval()
        body = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
        x = torch.load({str(tmp_path / "x.pt")!r}, weights_only=True)
        with torch.no_grad():
            logits = classifier(x).logits
            pooled = body(x).pooler_output
        results = pipeline("image-classification", model=folder, trust_remote_code=True)({str(tmp_path / "image.png")!r})
        print(json.dumps(dict(
            config_class=type(config).__module__ + "." + type(config).__name__,
            model_class=type(classifier).__module__,
            labels=config.id2label,
            logits=logits.tolist(),
            pooled=pooled.tolist(),
            pipeline=results,
        )))
        """,
        cwd=tmp_path,
    )
    assert isolated["model_class"].startswith("transformers_modules."), "must run the code copied into the folder"
    assert isolated["labels"] == {"0": "zero", "1": "one", "2": "two"}
    assert torch.equal(torch.tensor(isolated["logits"]), logits)
    assert torch.equal(torch.tensor(isolated["pooled"]), pooled)
    assert isolated["pipeline"] == expected_pipeline
