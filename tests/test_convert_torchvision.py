"""`hubvit convert torchvision`, proven against torchvision's own `VisionTransformer` on the same random weights.

torchvision runs a new resolution only after `interpolate_embeddings` (bicubic, align_corners=True) has resized the
state dict; hubvit resizes on the fly with the interpolation its config records. Tolerance 1e-5 relative to the
logit scale at the native and at a second size: float32 on both sides, the same resize of a float32 table, and the
same operations in the blocks.
"""

import json

import pytest
import torch

torchvision = pytest.importorskip("torchvision")
from torchvision.models import ViT_B_16_Weights  # noqa: E402
from torchvision.models.vision_transformer import VisionTransformer, interpolate_embeddings  # noqa: E402
from transformers import AutoModelForImageClassification  # noqa: E402

from hubvit.cli import main as cli  # noqa: E402
from utils import TINY_TORCHVISION, randomize_, relative_error  # noqa: E402

TINY = TINY_TORCHVISION


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@torch.no_grad()
def torchvision_vit(seed=0, **overrides):
    return randomize_(VisionTransformer(**{**TINY, **overrides}), seed).eval()


@torch.no_grad()
def assert_matches_torchvision(folder, source, sizes):
    """Logits of the converted folder against torchvision at each size, torchvision resized by its own function."""
    auto = AutoModelForImageClassification
    model, info = auto.from_pretrained(folder, trust_remote_code=True, output_loading_info=True)
    assert not any(info.values()), info
    model.eval()
    arguments = {**TINY, "num_classes": source.num_classes, "representation_size": source.representation_size}
    arguments.update(patch_size=source.patch_size, hidden_dim=source.hidden_dim, mlp_dim=source.mlp_dim)
    arguments.update(num_layers=len(source.encoder.layers))
    for size in sizes:
        reference = VisionTransformer(**{**arguments, "image_size": size}).eval()
        reference.load_state_dict(interpolate_embeddings(size, source.patch_size, source.state_dict()))
        pixels = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(size))
        error = relative_error(model(pixel_values=pixels).logits, reference(pixels))
        assert error <= 1e-5, (size, error)
    return model


def convert(*argv):
    return cli(["convert", "torchvision", *map(str, argv)])


def test_vision_transformer_matches_torchvision_at_two_sizes(tmp_path, capsys):
    source = torchvision_vit(num_classes=5)
    torch.save(source.state_dict(), tmp_path / "vit.pth")
    assert convert(tmp_path / "vit.pth", tmp_path / "out", "--num-heads", 4) == 0
    assert "32x32 max |Δlogits|" in capsys.readouterr().out
    model = assert_matches_torchvision(tmp_path / "out", source, sizes=(32, 56))
    config = model.config
    assert (config.interpolation_mode, config.interpolation_antialias, config.interpolation_align_corners) == (
        "bicubic",
        False,
        True,
    )
    assert (config.layer_norm_eps, config.hidden_act, config.num_attention_heads) == (1e-6, "gelu", 4)
    assert config.id2label[3] == "LABEL_3"
    card = (tmp_path / "out" / "README.md").read_text()
    assert "interpolate_embeddings" in card and "max |Δlogits|" in card


def test_representation_layer_is_kept(tmp_path, capsys):
    """`heads.pre_logits` (Linear + tanh before the head) becomes hubvit's representation layer."""
    source = torchvision_vit(seed=1, num_classes=1000, representation_size=24)
    torch.save(source.state_dict(), tmp_path / "vit.pth")
    assert convert(tmp_path / "vit.pth", tmp_path / "out", "--num-heads", 4) == 0
    model = assert_matches_torchvision(tmp_path / "out", source, sizes=(32, 40))
    assert model.config.representation_size == 24
    categories = ViT_B_16_Weights.IMAGENET1K_V1.meta["categories"]
    assert [model.config.id2label[i] for i in (0, 999)] == [categories[0], categories[999]]


def test_image_size_resizes_with_torchvision_interpolate_embeddings(tmp_path, capsys):
    """--image-size 48 on a 32 px table: the folder's native size is 48 and equals torchvision's own resize."""
    from safetensors.torch import save_file

    source = torchvision_vit(seed=2, num_classes=3)
    save_file(source.state_dict(), tmp_path / "vit.safetensors")
    assert convert(tmp_path / "vit.safetensors", tmp_path / "out", "--num-heads", 4, "--image-size", 48) == 0
    assert "resized from 32 to 48 px with torchvision's interpolate_embeddings" in capsys.readouterr().out
    at_48 = VisionTransformer(**{**TINY, "image_size": 48, "num_classes": 3}).eval()
    at_48.load_state_dict(interpolate_embeddings(48, 8, source.state_dict()))
    model = assert_matches_torchvision(tmp_path / "out", at_48, sizes=(48, 64))
    assert model.config.image_size == 48
    assert torch.equal(model.hubvit.embeddings.position_embedding, at_48.encoder.pos_embedding)


def test_architecture_gives_the_heads_and_checks_the_shapes(tmp_path, capsys):
    torch.save(torchvision_vit().state_dict(), tmp_path / "tiny.pth")
    assert convert(tmp_path / "tiny.pth", tmp_path / "out", "--architecture", "vit_b_16") == 2
    error = capsys.readouterr().err
    assert "not torchvision's vit_b_16" in error and "patch_size=8 (torchvision vit_b_16: 16)" in error
    assert "hidden_dim=48 (torchvision vit_b_16: 768)" in error
    assert not (tmp_path / "out").exists()

    assert convert(tmp_path / "tiny.pth", tmp_path / "out", "--num-heads", 5) == 2
    assert "--num-heads 5 does not divide the width 48" in capsys.readouterr().err


def test_verify_fails_above_tolerance(tmp_path, capsys, converter_bug):
    torch.save(torchvision_vit().state_dict(), tmp_path / "vit.pth")
    assert convert(tmp_path / "vit.pth", tmp_path / "out", "--num-heads", 4) == 2
    assert "does not reproduce torchvision" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert convert(tmp_path / "vit.pth", tmp_path / "out", "--num-heads", 4, "--no-verify") == 0
    assert "not verified at conversion: skipped (--no-verify)" in (tmp_path / "out" / "README.md").read_text()


def test_other_state_dicts_are_refused(tmp_path, capsys):
    resnet = torchvision.models.resnet18(num_classes=10)
    torch.save(resnet.state_dict(), tmp_path / "resnet.pth")
    assert convert(tmp_path / "resnet.pth", tmp_path / "out", "--num-heads", 4) == 2
    assert "no conv_proj.weight in the state dict" in capsys.readouterr().err

    state = torchvision_vit().state_dict()
    state["encoder.layers.encoder_layer_0.extra.weight"] = torch.zeros(3)
    torch.save(state, tmp_path / "extra.pth")
    assert convert(tmp_path / "extra.pth", tmp_path / "out", "--num-heads", 4) == 2
    error = capsys.readouterr().err
    assert "source tensors nothing maps" in error and "encoder_layer_0.extra.weight" in error


@pytest.mark.heavy
def test_vit_b_32_by_architecture_name(tmp_path, capsys):
    """The real builder: torchvision.models.vit_b_32 (88M parameters) at 64 px, converted by name, checked at 96 px."""
    source = randomize_(torchvision.models.vit_b_32(image_size=64)).eval()
    torch.save(source.state_dict(), tmp_path / "vit_b_32.pth")
    argv = ("--architecture", "vit_b_32", "--weights", "IMAGENET1K_V1")
    assert convert(tmp_path / "vit_b_32.pth", tmp_path / "out", *argv) == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (768, 12, 12)
    model = AutoModelForImageClassification.from_pretrained(tmp_path / "out", trust_remote_code=True).eval()
    reference = torchvision.models.vit_b_32(image_size=96).eval()
    reference.load_state_dict(interpolate_embeddings(96, 32, source.state_dict()))
    pixels = torch.randn(1, 3, 96, 96, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert relative_error(model(pixel_values=pixels).logits, reference(pixels)) <= 1e-5
    assert model.config.id2label[0] == ViT_B_16_Weights.IMAGENET1K_V1.meta["categories"][0]
    processor = json.loads((tmp_path / "out" / "preprocessor_config.json").read_text())
    transform = torchvision.models.ViT_B_32_Weights.IMAGENET1K_V1.transforms()
    assert processor["size"] == {"shortest_edge": transform.resize_size[0]}
    assert processor["crop_size"] == {"height": transform.crop_size[0], "width": transform.crop_size[0]}
    assert processor["resample"] == 2 and processor["image_mean"] == pytest.approx(transform.mean)
    assert "resize 256 (bilinear), centre crop 224" in (tmp_path / "out" / "README.md").read_text()


@pytest.mark.parametrize(
    "architecture, image_size, enum",
    [
        ("vit_b_16", 224, "IMAGENET1K_V1"),
        ("vit_b_16", 384, "IMAGENET1K_SWAG_E2E_V1"),
        ("vit_l_16", 512, "IMAGENET1K_SWAG_E2E_V1"),
        ("vit_h_14", 518, "IMAGENET1K_SWAG_E2E_V1"),
    ],
)
def test_preprocessing_is_the_weights_own_transform(architecture, image_size, enum):
    """Without --weights, the weights of the builder whose crop is the native size; their transform's values."""
    from hubvit.conversion.torchvision import preprocessing

    transform = torchvision.models.get_model_weights(architecture)[enum].transforms()
    result = preprocessing(architecture, image_size)
    assert result.size == (transform.crop_size[0],) * 2 and result.resample == transform.interpolation.value
    assert result.crop_pct == transform.crop_size[0] / transform.resize_size[0]
    assert (list(result.mean), list(result.std)) == (transform.mean, transform.std)
