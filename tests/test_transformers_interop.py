"""Interop with transformers' own ViT family: `hubvit convert transformers` and `hubvit export transformers`.

Every check compares against transformers' forward on the same random weights (every tensor randomised). Tolerance:
float32 parity, `max|hubvit - transformers| <= 1e-5 * max|transformers|`; both sides run the same float32 operations
in a different grouping (fused qkv, folded position rows), so anything above rounding level is a real mistake.
"""

import json
import shutil

import pytest
import torch
import transformers
from PIL import Image
from safetensors.torch import load_file, save_file

from hubvit.folder import make_image_processor, write_folder
from hubvit.modeling import HubViTForImageClassification
from hubvit.cli import main as cli
from utils import assert_close, randomize_, run_without_hubvit, tiny_config

TINY = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
LABELS = {0: "cat", 1: "dog", 2: "bird"}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def transformers_model(architecture, seed=0, **overrides):
    """A randomised transformers model of `architecture` at the tiny size."""
    cls = getattr(transformers, architecture)
    config_class = cls.config_class
    sizes = dict(TINY, mlp_ratio=2) if architecture.startswith("Dinov2") else dict(TINY, intermediate_size=64)
    if architecture.startswith("Dinov2WithRegisters"):
        sizes["num_register_tokens"] = 3
    config = config_class(**sizes, id2label=LABELS, label2id={v: k for k, v in LABELS.items()}, **overrides)
    return randomize_(cls(config), seed).eval()


def pixels(size=32, seed=1):
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(seed))


def convert(src, out, *options):
    assert cli(["convert", "transformers", str(src), str(out), *options]) == 0
    return out


CASES = [
    ("ViTModel", True),
    ("ViTForImageClassification", False),
    ("ViTMSNModel", True),
    ("ViTMSNForImageClassification", False),  # transformers 5.25 saves its first block without the `vit.` prefix
    ("DeiTModel", True),
    ("DeiTForImageClassification", False),
    ("DeiTForImageClassificationWithTeacher", False),
    ("Dinov2Model", True),
    ("Dinov2WithRegistersModel", True),
    ("Dinov2ForImageClassification", False),
    ("Dinov2WithRegistersForImageClassification", False),
]
# folders holding transformers v5's in-memory names (`layers.{i}.attention.q_proj`, `mlp.fc1`) instead of the legacy
# names save_pretrained writes; one as a torch pickle (read with weights_only)
IN_MEMORY = [
    ("ViTForImageClassification", False, "pytorch_model.bin"),
    ("Dinov2WithRegistersModel", True, "model.safetensors"),
]
SIZES = (32, 48)

LOAD_AS_REMOTE_CODE = """
import json, torch
from safetensors.torch import save_file
from transformers import AutoModel, AutoModelForImageClassification
outputs = {}
for name, headless in JOBS:
    auto = AutoModel if headless else AutoModelForImageClassification
    model = auto.from_pretrained(name, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    for size in SIZES:
        x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            out = model(pixel_values=x)
        for field in ("last_hidden_state", "pooler_output", "logits", "cls_logits", "distillation_logits"):
            value = getattr(out, field, None)
            if value is not None:
                outputs[f"{name}/{size}/{field}"] = value.contiguous()
    outputs[f"{name}/eps"] = torch.tensor([model.config.layer_norm_eps], dtype=torch.float64)
save_file(outputs, "outputs.safetensors")
print(json.dumps(len(outputs)))
"""


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Every case saved by transformers, converted through the CLI, then run as remote code with hubvit hidden.

    Returns (reference transformers models by folder name, outputs of the loaded folders by `name/size/field`).
    """
    root = tmp_path_factory.mktemp("transformers-interop")
    references, jobs = {}, []
    for architecture, headless in CASES:
        reference = transformers_model(architecture)
        reference.save_pretrained(root / architecture)
        on_disk = load_file(root / architecture / "model.safetensors")
        assert any(k.endswith("encoder.layer.0.attention.attention.query.weight") for k in on_disk), "legacy names"
        convert(root / architecture, root / f"{architecture}-hubvit")
        references[f"{architecture}-hubvit"] = (architecture, headless, reference)
    for architecture, headless, filename in IN_MEMORY:
        reference = transformers_model(architecture, seed=3)
        src = root / f"{architecture}-in-memory"
        src.mkdir()
        state = reference.state_dict()
        assert any("q_proj" in key for key in state)
        state = {k: v.contiguous() for k, v in state.items()}
        if filename.endswith(".bin"):
            torch.save(state, src / filename)
        else:
            save_file(state, src / filename, metadata={"format": "pt"})
        reference.config.architectures = [architecture]
        reference.config.to_json_file(src / "config.json")
        convert(src, root / f"{architecture}-in-memory-hubvit")
        references[f"{architecture}-in-memory-hubvit"] = (architecture, headless, reference)
    reference = transformers_model("Dinov2ForImageClassification", seed=4)
    reference.save_pretrained(root / "Dinov2ForImageClassification-body")
    convert(
        root / "Dinov2ForImageClassification-body", root / "Dinov2ForImageClassification-body-hubvit", "--drop-head"
    )
    references["Dinov2ForImageClassification-body-hubvit"] = ("Dinov2Model", True, reference.dinov2)
    jobs = [(name, headless) for name, (_, headless, _) in references.items()]
    code = f"JOBS = {jobs!r}\nSIZES = {SIZES!r}\n" + LOAD_AS_REMOTE_CODE
    run_without_hubvit(code, cwd=root)
    return references, load_file(root / "outputs.safetensors"), root


@pytest.mark.parametrize(
    "name",
    [f"{a}-hubvit" for a, _ in CASES]
    + [f"{a}-in-memory-hubvit" for a, _, _ in IN_MEMORY]
    + ["Dinov2ForImageClassification-body-hubvit"],
)
@torch.no_grad()
def test_converted_folder_matches_transformers(converted, name):
    """Logits (or last_hidden_state and pooler_output) of the folder, loaded as remote code, against transformers,
    at the native 32x32 and at 48x48 (transformers with interpolate_pos_encoding)."""
    references, outputs, root = converted
    architecture, headless, reference = references[name]
    for size in SIZES:
        kwargs = {} if architecture.startswith("Dinov2") else {"interpolate_pos_encoding": True}
        theirs = reference(pixel_values=pixels(size), **kwargs)
        ours = {field.split("/")[-1]: v for field, v in outputs.items() if field.startswith(f"{name}/{size}/")}
        if headless:
            tokens = theirs.last_hidden_state
            assert_close(ours["last_hidden_state"], tokens, f"last_hidden_state at {size}")
            # hubvit's pooler is the normed [CLS] token (DeiT: mean of [CLS] and distillation, as timm's pre_logits)
            pooled = (tokens[:, 0] + tokens[:, 1]) / 2 if architecture.startswith("DeiT") else tokens[:, 0]
            assert_close(ours["pooler_output"], pooled, f"pooler_output at {size}")
        else:
            assert_close(ours["logits"], theirs.logits, f"logits at {size}")
            if architecture.endswith("WithTeacher"):
                assert_close(ours["cls_logits"], theirs.cls_logits, "cls_logits")
                assert_close(ours["distillation_logits"], theirs.distillation_logits, "distillation_logits")
    assert outputs[f"{name}/eps"].item() == pytest.approx(reference.config.layer_norm_eps, rel=1e-9)
    config = json.loads((root / name / "config.json").read_text())
    assert {int(k): v for k, v in config["id2label"].items()} == ({} if headless else LABELS)


def test_image_processor_settings_carry_over(tmp_path):
    reference = transformers_model("ViTForImageClassification")
    reference.save_pretrained(tmp_path / "src")
    transformers.ViTImageProcessor(
        size={"height": 32, "width": 32},
        image_mean=[0.1, 0.2, 0.3],
        image_std=[0.4, 0.5, 0.6],
        resample=Image.Resampling.BICUBIC,
    ).save_pretrained(tmp_path / "src")
    convert(tmp_path / "src", tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "preprocessor_config.json").read_text())
    assert saved["image_mean"] == [0.1, 0.2, 0.3] and saved["image_std"] == [0.4, 0.5, 0.6]
    assert saved["resample"] == int(Image.Resampling.BICUBIC)
    assert saved["size"] == {"height": 32, "width": 32}


def test_a_wrong_conversion_is_refused(tmp_path, capsys, converter_bug):
    """One weight off by 1e-3 of its scale: transformers' own forward at conversion catches it, nothing is written."""
    transformers_model("ViTForImageClassification").save_pretrained(tmp_path / "vit")
    assert cli(["convert", "transformers", str(tmp_path / "vit"), str(tmp_path / "out")]) == 2
    assert "does not reproduce transformers" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_refusals(tmp_path, capsys):
    vit = tmp_path / "vit"
    transformers_model("ViTModel").save_pretrained(vit)
    bert_config = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, vocab_size=50
    )
    bert = transformers.BertModel(bert_config)
    for name, model in (("bert", bert),):
        model.save_pretrained(tmp_path / name)
        assert cli(["convert", "transformers", str(tmp_path / name), str(tmp_path / f"{name}-out")]) == 2
        err = capsys.readouterr().err
        assert model.__class__.__name__ in err and "ViTForImageClassification" in err, err
        assert not (tmp_path / f"{name}-out").exists()

    swiglu = tmp_path / "swiglu"
    transformers_model("Dinov2Model", use_swiglu_ffn=True).save_pretrained(swiglu)
    assert cli(["convert", "transformers", str(swiglu), str(tmp_path / "b")]) == 2
    assert "use_swiglu_ffn=True" in capsys.readouterr().err

    extra = tmp_path / "extra"
    shutil.copytree(vit, extra)
    weights = load_file(extra / "model.safetensors")
    weights["encoder.layer.2.layernorm_before.weight"] = torch.ones(32)
    save_file(weights, extra / "model.safetensors", metadata={"format": "pt"})
    assert cli(["convert", "transformers", str(extra), str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "source tensors nothing maps" in err and "encoder.layer.2.layernorm_before.weight" in err
    assert not (tmp_path / "c").exists()


def hubvit_folder(path, seed=0, **overrides):
    config = tiny_config(**overrides)
    model = randomize_(HubViTForImageClassification(config), seed).eval()
    write_folder(model, path, make_image_processor(config, mean=(0.1, 0.2, 0.3), std=(0.3, 0.2, 0.1)))
    return model


@torch.no_grad()
def test_export_round_trip(tmp_path):
    """hubvit -> transformers' ViTForImageClassification (no remote code) -> the same logits."""
    labels = dict(id2label=LABELS, label2id={v: k for k, v in LABELS.items()})
    # a table without a [CLS] row and no patch bias are expressible (zero row, zero bias)
    flax_like = dict(hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6)
    no_cls_row = dict(position_embedding_includes_prefix=False, patch_bias=False)
    for name, overrides in (("plain", {}), ("no-cls-row", no_cls_row)):
        ours = hubvit_folder(tmp_path / name, **labels, **overrides, **flax_like)
        assert cli(["export", "transformers", str(tmp_path / name), str(tmp_path / f"{name}-vit")]) == 0
        vit, info = transformers.ViTForImageClassification.from_pretrained(
            tmp_path / f"{name}-vit", output_loading_info=True
        )
        assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
        assert type(vit).__module__.startswith("transformers.models.vit")
        assert vit.config.layer_norm_eps == 1e-6 and vit.config.id2label == LABELS
        assert_close(vit.eval()(pixel_values=pixels()).logits, ours(pixel_values=pixels()).logits, f"{name} logits")
        processor = transformers.AutoImageProcessor.from_pretrained(tmp_path / f"{name}-vit")
        assert list(processor.image_mean) == [0.1, 0.2, 0.3]

    headless = hubvit_folder(tmp_path / "headless", num_labels=0)
    assert cli(["export", "transformers", str(tmp_path / "headless"), str(tmp_path / "headless-vit")]) == 0
    vit = transformers.ViTModel.from_pretrained(tmp_path / "headless-vit", add_pooling_layer=False).eval()
    ours = headless.hubvit(pixel_values=pixels()).last_hidden_state
    assert_close(vit(pixel_values=pixels()).last_hidden_state, ours, "headless last_hidden_state")


@torch.no_grad()
def test_transformers_hubvit_transformers_round_trip(tmp_path):
    reference = transformers_model("ViTForImageClassification", seed=5)
    reference.save_pretrained(tmp_path / "src")
    convert(tmp_path / "src", tmp_path / "hubvit")
    assert cli(["export", "transformers", str(tmp_path / "hubvit"), str(tmp_path / "back")]) == 0
    back = transformers.ViTForImageClassification.from_pretrained(tmp_path / "back").eval()
    assert back.config.layer_norm_eps == 1e-12
    assert_close(back(pixel_values=pixels()).logits, reference(pixel_values=pixels()).logits, "round trip")


def test_export_refusals(tmp_path, capsys):
    hubvit_folder(tmp_path / "map", pooling="map", class_token=False)
    assert cli(["export", "transformers", str(tmp_path / "map"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "pooling='map'" in err and "class_token=False" in err
    assert not (tmp_path / "out").exists()

    dinov2_like = dict(layer_scale_init_value=1.0, num_register_tokens=2, position_embedding_includes_prefix=False)
    hubvit_folder(tmp_path / "dino", **dinov2_like)
    assert cli(["export", "transformers", str(tmp_path / "dino"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "layer_scale_init_value" in err and "num_register_tokens=2" in err

    transformers_model("ViTModel").save_pretrained(tmp_path / "not-hubvit")
    assert cli(["export", "transformers", str(tmp_path / "not-hubvit"), str(tmp_path / "out")]) == 2
    assert "not a hubvit folder" in capsys.readouterr().err
