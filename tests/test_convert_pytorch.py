"""`hubvit convert pytorch`, proven against a plain PyTorch ViT on `nn.TransformerEncoder` written out here.

`VisionTransformer` below is the reference layout of the blog post "Vision Transformer (ViT) from First Principles", with its own resize for other resolutions
(bicubic, no antialias, align_corners=False, [CLS] row kept). Tolerance 1e-5 relative to the logit scale at the
native and at resized inputs: float32 on both sides and the same resize of the same table.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModel, AutoModelForImageClassification

from hubvit.cli import main as cli
from utils import TINY_PYTORCH, relative_error

TINY = TINY_PYTORCH


class VisionTransformer(nn.Module):
    """A ViT whose encoder is PyTorch's own pre-norm `nn.TransformerEncoder`."""

    def __init__(self, image_size, patch_size, dim, depth, heads, mlp_dim, num_classes=5, activation="gelu"):
        super().__init__()
        self.grid = image_size // patch_size
        self.patch_embed = nn.Conv2d(3, dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + self.grid**2, dim))
        layer = nn.TransformerEncoderLayer(
            dim, heads, mlp_dim, dropout=0.0, activation=activation, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes) if num_classes else nn.Identity()

    def position_table(self, grid):
        if grid == (self.grid, self.grid):
            return self.pos_embed
        cls_row, rows = self.pos_embed[:, :1], self.pos_embed[:, 1:]
        rows = rows.reshape(1, self.grid, self.grid, -1).permute(0, 3, 1, 2)
        rows = F.interpolate(rows, size=grid, mode="bicubic", align_corners=False)
        return torch.cat([cls_row, rows.permute(0, 2, 3, 1).flatten(1, 2)], dim=1)

    def forward(self, pixels):
        patches = self.patch_embed(pixels)
        grid = tuple(patches.shape[-2:])
        tokens = patches.flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls_token.expand(len(tokens), -1, -1), tokens], dim=1)
        tokens = self.blocks(tokens + self.position_table(grid))
        return self.head(self.norm(tokens)[:, 0])


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@torch.no_grad()
def source_model(seed=0, **overrides):
    """The reference class with every tensor random and away from 0 and 1, so a swapped tensor shows."""
    model = VisionTransformer(**{**TINY, **overrides})
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=generator)
        if "norm" in name and name.endswith("weight"):
            param.copy_(1.0 + 0.2 * noise)
        elif param.ndim >= 2 and name not in ("cls_token", "pos_embed"):
            param.copy_(noise / param[0].numel() ** 0.5)
        else:
            param.copy_(0.5 * noise)
    return model.eval()


def convert(*argv):
    return cli(["convert", "pytorch", *map(str, argv)])


@torch.no_grad()
def assert_matches_source(model, source, sizes):
    for height, width in sizes:
        pixels = torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(height * width))
        error = relative_error(model(pixel_values=pixels).logits, source(pixels))
        assert error <= 1e-5, ((height, width), error)


def test_matches_the_source_at_native_and_resized_inputs(tmp_path, capsys):
    source = source_model()
    torch.save(source.state_dict(), tmp_path / "vit.pth")
    assert convert(tmp_path / "vit.pth", tmp_path / "out", "--num-heads", 4) == 0
    assert "32x32 max |Δlogits|" in capsys.readouterr().out
    model = AutoModelForImageClassification.from_pretrained(tmp_path / "out", trust_remote_code=True).eval()
    assert_matches_source(model, source, sizes=[(32, 32), (48, 48), (24, 40)])
    config = model.config
    assert (config.layer_norm_eps, config.final_layer_norm_eps) == (1e-5, 1e-6)
    assert model.hubvit.encoder.layers[0].norm1.eps == 1e-5 and model.hubvit.norm.eps == 1e-6
    assert (config.interpolation_mode, config.interpolation_antialias, config.interpolation_align_corners) == (
        "bicubic",
        False,
        False,
    )
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size, config.patch_size) == (48, 2, 96, 8)


def test_headless_relu_model_from_a_training_checkpoint(tmp_path, capsys):
    """nn.TransformerEncoderLayer's default ReLU, no head, weights under 'model' with DDP's `module.` prefix."""
    source = source_model(seed=1, num_classes=0, activation="relu")
    state = {f"module.{key}": value for key, value in source.state_dict().items()}
    torch.save({"model": state, "epoch": torch.tensor(3)}, tmp_path / "checkpoint.pth")
    assert convert(tmp_path / "checkpoint.pth", tmp_path / "out", "--num-heads", 4, "--activation", "relu") == 0
    assert "dropped the other top-level entries ['epoch']" in capsys.readouterr().err
    model = AutoModel.from_pretrained(tmp_path / "out", trust_remote_code=True).eval()
    assert model.config.num_labels == 0 and model.config.hidden_act == "relu"
    with torch.no_grad():
        pixels = torch.randn(2, 3, 40, 40, generator=torch.Generator().manual_seed(0))
        assert relative_error(model(pixel_values=pixels).pooler_output, source(pixels)) <= 1e-5


def test_activation_is_not_in_the_weights_and_matters(tmp_path, capsys):
    """GELU-trained weights converted with --activation relu pass the converter's own check (it runs
    nn.TransformerEncoder with the options given) yet differ from the source far beyond tolerance: the options that
    no shape carries (activation, heads, eps) are the caller's to get right."""
    source = source_model(seed=2)
    torch.save(source.state_dict(), tmp_path / "vit.pth")
    assert convert(tmp_path / "vit.pth", tmp_path / "out", "--num-heads", 4, "--activation", "relu") == 0
    model = AutoModelForImageClassification.from_pretrained(tmp_path / "out", trust_remote_code=True).eval()
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert relative_error(model(pixel_values=pixels).logits, source(pixels)) > 1e-3


def test_verify_fails_above_tolerance(tmp_path, capsys, converter_bug):
    torch.save(source_model().state_dict(), tmp_path / "vit.pth")
    assert convert(tmp_path / "vit.pth", tmp_path / "out", "--num-heads", 4) == 2
    assert "does not reproduce PyTorch" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_other_layouts_are_refused(tmp_path, capsys):
    state = source_model().state_dict()
    torch.save({k: v for k, v in state.items() if k != "cls_token"}, tmp_path / "no_cls.pth")
    assert convert(tmp_path / "no_cls.pth", tmp_path / "out", "--num-heads", 4) == 2
    assert "no cls_token in the state dict" in capsys.readouterr().err

    torch.save({**state, "blocks.layers.0.extra": torch.zeros(2)}, tmp_path / "extra.pth")
    assert convert(tmp_path / "extra.pth", tmp_path / "out", "--num-heads", 4) == 2
    error = capsys.readouterr().err
    assert "source tensors nothing maps" in error and "blocks.layers.0.extra" in error

    torch.save(state, tmp_path / "vit.pth")
    assert convert(tmp_path / "vit.pth", tmp_path / "out", "--num-heads", 5) == 2
    assert "--num-heads 5 does not divide the width 48" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_open_clip_state_dict_is_sent_to_the_timm_converter(tmp_path, capsys):
    open_clip = pytest.importorskip("open_clip")
    vision = dict(image_size=32, layers=1, width=32, patch_size=8, head_width=16)
    text = dict(context_length=8, vocab_size=50, width=32, heads=2, layers=1)
    torch.save(open_clip.CLIP(embed_dim=16, vision_cfg=vision, text_cfg=text).state_dict(), tmp_path / "oc.bin")
    assert cli(["convert", "pytorch", str(tmp_path / "oc.bin"), str(tmp_path / "out"), "--num-heads", "2"]) == 2
    assert "is an open_clip state dict (visual.*): convert its image tower with `hubvit convert timm" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "out").exists()
