"""`hubvit convert timm`, proven against timm's own forward on the same random weights, family by family.

Tolerances: 1e-5 relative to the output scale at the native size (float32, same operations in both libraries);
1e-4 at a second, non-square size, where both sides resize the position table (bicubic + antialias, float32) and the
attention runs over a different number of tokens.
"""

import json
import os

import pytest
import torch

timm = pytest.importorskip("timm")
from timm.data import ImageNetInfo  # noqa: E402
from timm.models import save_for_hf  # noqa: E402
from transformers import AutoModel, AutoModelForImageClassification  # noqa: E402

from hubvit.cli import main as cli  # noqa: E402
from utils import TINY_TIMM, randomize_, relative_error  # noqa: E402

TINY = TINY_TIMM

# name: (timm model name with pretrained tag, model_args on top of TINY, config fields the family must produce)
FAMILIES = {
    "augreg_in1k": ("vit_base_patch16_224.augreg_in1k", {}, dict(pooling="cls", layer_norm_eps=1e-6)),
    "augreg_in21k": ("vit_base_patch16_224.augreg_in21k", {}, dict(num_labels=21843)),
    "vit_b32": ("vit_base_patch32_224.augreg_in21k_ft_in1k", dict(patch_size=32, img_size=64), dict(patch_size=32)),
    "deit": ("deit_base_patch16_224.fb_in1k", {}, dict(pooling="cls")),
    "deit_distilled": (
        "deit_base_distilled_patch16_224.fb_in1k",
        {},
        dict(distillation_token=True, position_embedding_includes_prefix=True),
    ),
    "deit3": (
        "deit3_base_patch16_224.fb_in1k",
        {},
        dict(layer_scale_init_value=1e-6, position_embedding_includes_prefix=False),
    ),
    "dino": ("vit_base_patch16_224.dino", {}, dict(num_labels=0)),
    "dinov2": (
        "vit_base_patch14_dinov2.lvd142m",
        dict(patch_size=14, img_size=56),
        dict(num_labels=0, patch_size=14, layer_scale_init_value=1e-5),
    ),
    "dinov2_reg4": (
        "vit_base_patch14_reg4_dinov2.lvd142m",
        dict(patch_size=14, img_size=56),
        dict(num_labels=0, num_register_tokens=4, position_embedding_includes_prefix=False),
    ),
    "clip_openai": (
        "vit_base_patch16_clip_quickgelu_224.openai",
        {},
        dict(hidden_act="quick_gelu", pre_norm=True, patch_bias=False, layer_norm_eps=1e-5, num_labels=512),
    ),
    "openclip": (
        "vit_base_patch16_clip_224.laion2b",
        {},
        dict(hidden_act="gelu", pre_norm=True, patch_bias=False, layer_norm_eps=1e-5),
    ),
    "siglip": ("vit_base_patch16_siglip_224.webli", {}, dict(class_token=False, pooling="map", num_labels=0)),
    "avg_fc_norm": ("vit_base_patch16_224.augreg_in1k", dict(global_pool="avg", fc_norm=True), dict(fc_norm=True)),
    "gap_no_cls": (
        "vit_medium_patch16_gap_256.sw_in12k_ft_in1k",
        dict(num_classes=3),
        dict(class_token=False, pooling="mean", fc_norm=False, qkv_bias=False, num_labels=3),
    ),
    "aimv2": (
        "aimv2_large_patch14_224.apple_pt",
        dict(patch_size=8, num_classes=0),
        dict(norm_type="rms_norm", mlp_type="gated", patch_norm=True, proj_bias=False, qkv_bias=False, pooling="mean"),
    ),
    "beit3": (
        "beit3_base_patch16_224.in22k_ft_in1k",
        dict(patch_size=8),
        dict(attention_inner_norm=True, mlp_inner_norm=True),
    ),
    "radio_no_final_norm": ("vit_base_patch16_radio_v3.c_radio", dict(num_classes=0), dict(final_norm=False)),
    "dinov2_giant_swiglu_packed": (
        "vit_giant_patch14_dinov2.lvd142m",
        dict(patch_size=8, num_classes=0),
        dict(mlp_type="gated", hidden_act="silu"),
    ),
    "residual_post_norm": ("vit_base_patch16_rpn_224.sw_in1k", {}, dict(norm_placement="residual_post")),
    "so400m_grid_floored": (
        "vit_so400m_patch14_siglip_384.webli",
        dict(patch_size=8, img_size=36, num_classes=0),
        dict(image_size=36, patch_size=8),
    ),
}
LABELS = {"gap_no_cls": (["n1", "n2", "n3"], {"n1": "red fox", "n2": "grey wolf", "n3": "brown bear"})}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@torch.no_grad()
def timm_model(name, args, **extra):
    return timm.create_model(name, pretrained=False, **{**TINY, **args, **extra}).eval()


def convert(*argv):
    return cli(["convert", "timm", *map(str, argv)])


def second_size(config):
    """A non-square input one patch shorter and one patch wider than the native grid (whole patches: timm's
    `dynamic_img_size` refuses others)."""
    (rows, columns), (ph, pw) = config.grid_size, config.patch_size_2d
    return (rows - 1) * ph, (columns + 1) * pw


@torch.no_grad()
def assert_matches_timm(folder, source, state_dict, name, args, headless):
    """Logits and pre-logit features of the converted folder against timm at the native and a non-square size."""
    auto = AutoModel if headless else AutoModelForImageClassification
    model, info = auto.from_pretrained(folder, trust_remote_code=True, output_loading_info=True)
    model.eval()
    assert not any(info.values()), info
    body = model if headless else model.hubvit
    dynamic = timm_model(name, args, dynamic_img_size=True)
    dynamic.load_state_dict(state_dict)
    (height, width), size2 = model.config.image_size_2d, second_size(model.config)
    for reference, (h, w), tolerance in ((source, (height, width), 1e-5), (dynamic, size2, 1e-4)):
        pixels = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(h * w))
        features = reference.forward_head(reference.forward_features(pixels), pre_logits=True)
        pooled = body(pixel_values=pixels).pooler_output
        assert relative_error(pooled, features) <= tolerance, ((h, w), relative_error(pooled, features))
        if headless:
            assert relative_error(pooled, reference(pixels)) <= tolerance
        else:
            error = relative_error(model(pixel_values=pixels).logits, reference(pixels))
            assert error <= tolerance, ((h, w), error)
    return model


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_matches_timm(family, tmp_path, capsys):
    name, args, expected = FAMILIES[family]
    source = randomize_(timm_model(name, args), seed=len(family))
    model_config = {}
    if family in LABELS:
        model_config = dict(label_names=LABELS[family][0], label_descriptions=LABELS[family][1])
    safe = list(FAMILIES).index(family) % 2 == 0
    save_for_hf(source, tmp_path / "timm", model_config=model_config, safe_serialization=safe)
    assert (tmp_path / "timm" / ("model.safetensors" if safe else "pytorch_model.bin")).is_file()

    assert convert(tmp_path / "timm", tmp_path / "out") == 0
    printed = capsys.readouterr().out
    assert "max |Δpooler_output|" in printed

    headless = source.num_classes == 0
    model = assert_matches_timm(tmp_path / "out", source, source.state_dict(), name, args, headless)
    config = model.config
    for field, value in expected.items():
        assert getattr(config, field) == value, (field, getattr(config, field))
    assert (config.interpolation_mode, config.interpolation_antialias, config.interpolation_align_corners) == (
        "bicubic",
        True,
        False,
    )

    pretrained_cfg = source.pretrained_cfg
    processor = json.loads((tmp_path / "out" / "preprocessor_config.json").read_text())
    assert processor["image_mean"] == pytest.approx(list(pretrained_cfg["mean"]))
    assert processor["image_std"] == pytest.approx(list(pretrained_cfg["std"]))
    size = args.get("img_size", 32)
    assert processor["crop_size"] == {"height": size, "width": size} and processor["do_center_crop"]
    assert processor["size"] == {"shortest_edge": int(size / pretrained_cfg["crop_pct"])}  # timm floors it
    assert processor["resample"] == {"bicubic": 3, "bilinear": 2}[pretrained_cfg["interpolation"]]
    card = (tmp_path / "out" / "README.md").read_text()
    assert "## Verification" in card and "max |Δpooler_output|" in card
    if pretrained_cfg["crop_pct"] != 1.0:
        assert f"crop_pct={pretrained_cfg['crop_pct']}" in card

    labels = config.id2label
    if family in LABELS:
        names, descriptions = LABELS[family]
        assert [labels[i] for i in range(3)] == [descriptions[n] for n in names]
    elif config.num_labels in (1000, 21843):
        info = ImageNetInfo("imagenet-1k" if config.num_labels == 1000 else "imagenet-21k")
        assert [labels[i] for i in (0, 7, config.num_labels - 1)] == [
            info.index_to_description(i) for i in (0, 7, config.num_labels - 1)
        ]
    elif config.num_labels:
        assert labels[5] == "LABEL_5"


def test_single_file_with_architecture_and_training_state(tmp_path, capsys):
    """A bare .pth beside optimizer state and an epoch counter: the extras are dropped with a printed reason."""
    name, args = "deit3_base_patch16_224", dict(num_classes=10)
    source = randomize_(timm_model(name, args))
    checkpoint = {**source.state_dict(), "optimizer": {"lr": torch.tensor(0.1)}, "epoch": 7}
    torch.save(checkpoint, tmp_path / "deit3.pth")
    model_args = json.dumps({**TINY, "img_size": [32, 32]})
    assert convert(tmp_path / "deit3.pth", tmp_path / "out", "--architecture", name, "--model-args", model_args) == 0
    printed = capsys.readouterr().out
    assert "dropped 1 tensors (training state (optimizer, schedule, AMP)): optimizer" in printed
    assert "dropped 1 tensors (training metadata, not weights): epoch" in printed
    model = assert_matches_timm(tmp_path / "out", source, source.state_dict(), name, args, headless=False)
    assert model.config.num_labels == 10 and model.config.id2label[3] == "LABEL_3"
    assert "optimizer" in (tmp_path / "out" / "README.md").read_text()


def refused(tmp_path, capsys, *argv):
    """Run a conversion that must fail; returns its error text after checking nothing was written."""
    assert convert(*argv, tmp_path / "out") == 2
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
    return capsys.readouterr().err


def test_truncated_file_is_refused(tmp_path, capsys):
    save_for_hf(randomize_(timm_model("vit_base_patch16_224", {})), tmp_path / "timm", safe_serialization=True)
    for file in ("model.safetensors",):
        data = (tmp_path / "timm" / file).read_bytes()
        (tmp_path / "timm" / file).write_bytes(data[: len(data) // 2])
    error = refused(tmp_path, capsys, tmp_path / "timm")
    assert "truncated or corrupt" in error and "model.safetensors" in error

    torch.save(timm_model("vit_base_patch16_224", {}).state_dict(), tmp_path / "vit.pth")
    data = (tmp_path / "vit.pth").read_bytes()
    (tmp_path / "vit.pth").write_bytes(data[: len(data) // 2])
    error = refused(tmp_path, capsys, tmp_path / "vit.pth", "--architecture", "vit_base_patch16_224")
    assert "truncated or corrupt" in error and "vit.pth" in error


def test_other_architecture_is_refused(tmp_path, capsys):
    resnet = timm.create_model("resnet18", pretrained=False, num_classes=10)
    torch.save(resnet.state_dict(), tmp_path / "resnet18.pth")
    as_vit = ("--architecture", "vit_base_patch16_224", "--model-args", json.dumps(TINY))
    error = refused(tmp_path, capsys, tmp_path / "resnet18.pth", *as_vit)
    assert "source tensors nothing maps" in error and "layer1.0.conv1.weight" in error
    assert "hubvit tensors left unfilled" in error and "embeddings.patch_embedding.weight" in error

    error = refused(tmp_path, capsys, tmp_path / "resnet18.pth", "--architecture", "resnet18")
    assert "resnet18 builds timm's ResNet" in error

    deeper = timm_model("vit_base_patch16_224", dict(depth=3))
    torch.save(deeper.state_dict(), tmp_path / "vit3.pth")
    error = refused(tmp_path, capsys, tmp_path / "vit3.pth", *as_vit)
    assert "mapped tensors hubvit does not have" in error and "encoder.layers.2.attention.qkv.weight" in error


def test_unsupported_settings_are_refused(tmp_path, capsys):
    for name, args, reason, key in (
        ("vit_base_patch16_224", dict(global_pool="avgmax"), "global_pool='avgmax'", None),
        # sbb's parallel blocks have no `mlp` attribute: refused by name, not an AttributeError
        (
            "vit_pwee_patch16_reg1_gap_256",
            dict(img_size=32),
            "ParallelScalingBlock (expected the pre-norm Block or ResPostBlock)",
            None,
        ),
        ("vit_dpwee_patch16_reg1_gap_256", dict(img_size=32), "DiffParallelScalingBlock", None),
    ):
        save_for_hf(timm_model(name, args), tmp_path / "timm")
        error = refused(tmp_path, capsys, tmp_path / "timm")
        assert "cannot express" in error and reason in error, error
        if key:
            assert key in error
        (tmp_path / "timm" / "config.json").unlink()


@pytest.mark.parametrize(
    "name, args, reason",
    [
        ("xcit_nano_12_p16_224", dict(img_size=32, depth=1), "builds timm's Xcit"),  # an int patch_size: no crash
        ("crossvit_tiny_240", dict(img_size=[32, 48], embed_dim=[32, 48], num_heads=[2, 2]), "builds timm's CrossVit"),
        (
            "vit_small_r26_s32_224",
            dict(img_size=64, depth=1, embed_dim=32, num_heads=2),
            "HybridEmbed (hybrid stems are not supported",
        ),
    ],
    ids=["xcit", "crossvit", "hybrid"],
)
def test_a_class_or_stem_hubvit_lacks_is_the_reason_given_before_any_size_check(tmp_path, capsys, name, args, reason):
    """Sizes are checked after the class and its parts: a hybrid's stem, not its token count, is why it is refused."""
    save_for_hf(timm.create_model(name, pretrained=False, **args).eval(), tmp_path / "timm")
    error = refused(tmp_path, capsys, tmp_path / "timm")
    assert reason in error and "Traceback" not in error and "tokens at image_size" not in error, error


def test_a_refusal_lists_the_source_tensors_no_rule_knows(tmp_path, capsys):
    weights = timm_model("vit_base_patch16_224", dict(global_pool="avgmax")).state_dict()
    weights["blocks.0.attn.relative_position_bias_table"] = torch.zeros(3, 4)
    torch.save(weights, tmp_path / "vit.pth")
    args = json.dumps({**TINY, "global_pool": "avgmax"})
    error = refused(
        tmp_path, capsys, tmp_path / "vit.pth", "--architecture", "vit_base_patch16_224", "--model-args", args
    )
    assert "global_pool='avgmax'" in error and "blocks.0.attn.relative_position_bias_table" in error, error


class Exploit:
    """Unpickling this runs a shell command: what a malicious checkpoint does."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_pickle_with_code_is_refused(tmp_path, capsys):
    marker = tmp_path / "exploited"
    state = timm_model("vit_base_patch16_224", {}).state_dict()
    torch.save({**state, "payload": Exploit(marker)}, tmp_path / "evil.pth")
    assert b"system" in (tmp_path / "evil.pth").read_bytes()
    error = refused(tmp_path, capsys, tmp_path / "evil.pth", "--architecture", "vit_base_patch16_224")
    assert "refused to unpickle" in error
    assert not marker.exists()


def test_verify_fails_above_tolerance(tmp_path, capsys, converter_bug):
    """A converter bug (one weight off by 1e-3 of its scale) is caught by --verify and nothing is written."""
    save_for_hf(randomize_(timm_model("vit_base_patch16_224", {})), tmp_path / "timm")
    error = refused(tmp_path, capsys, tmp_path / "timm")
    assert "does not reproduce timm" in error and "logits" in error
    assert convert(tmp_path / "timm", tmp_path / "out", "--no-verify") == 0


def test_unclear_sources_are_refused(tmp_path, capsys):
    torch.save(timm_model("vit_base_patch16_224", {}).state_dict(), tmp_path / "vit.pth")
    assert "--architecture NAME" in refused(tmp_path, capsys, tmp_path / "vit.pth")
    error = refused(tmp_path, capsys, tmp_path / "vit.pth", "--architecture", "vit_nonexistent_patch3")
    assert "has no model named 'vit_nonexistent_patch3'" in error
    bad_json = ("--architecture", "vit_base_patch16_224", "--model-args", "{depth: 2}")
    error = refused(tmp_path, capsys, tmp_path / "vit.pth", *bad_json)
    assert "--model-args is not valid JSON" in error
    save_for_hf(timm_model("vit_base_patch16_224", {}), tmp_path / "timm")
    error = refused(tmp_path, capsys, tmp_path / "timm", "--architecture", "deit_base_patch16_224")
    assert "disagrees with" in error and "vit_base_patch16_224" in error


def test_a_glu_mlp_with_its_gate_last_is_packed_gate_first(tmp_path):
    """timm's GluMlp(gate_last=True) multiplies the first half by the activated second: the converter swaps the
    halves into hubvit's gate-first fc1 (no pretrained tag has it; a model built with it has no JSON model_args,
    so the weights file is converted with the architecture's own model_args)."""
    from timm.layers import GluMlp

    from hubvit.conversion.timm import map_weights, read_settings
    from hubvit import HubViTConfig, HubViTModel
    from hubvit.folder import expected_shapes

    source = randomize_(timm_model("vit_base_patch16_224", dict(num_classes=0, mlp_layer=GluMlp)), seed=5)
    settings, problems = read_settings(source, "vit_base_patch16_224")
    assert problems == [] and settings["mlp_type"] == "gated"
    config = HubViTConfig(**settings, num_labels=0)
    state = map_weights(source.state_dict(), "GluMlp ViT", source).finish(expected_shapes(config))
    model = HubViTModel(config).eval()
    model.load_state_dict(state)
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert relative_error(model(pixel_values=pixels).pooler_output, source(pixels)) <= 1e-5


TEXT_TOWER = dict(context_length=8, vocab_size=50, width=32, heads=2, layers=1)


@torch.no_grad()
def test_an_open_clip_checkpoint_converts_its_image_tower_and_matches_open_clip(tmp_path, capsys):
    """open_clip's own ViT (OpenAI CLIP's layout, `visual.*`): through timm's CLIP remap, the projection kept as the
    head, the text tower named and left out; the logits are open_clip's `encode_image` (1e-5 of the scale)."""
    open_clip = pytest.importorskip("open_clip")
    vision = dict(image_size=32, layers=2, width=32, patch_size=8, head_width=16)
    source = randomize_(open_clip.CLIP(embed_dim=16, vision_cfg=vision, text_cfg=TEXT_TOWER)).eval()
    torch.save(source.state_dict(), tmp_path / "open_clip.bin")
    args = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
    argv = ["--architecture", "vit_base_patch16_clip_224", "--model-args", json.dumps(args)]
    assert convert(tmp_path / "open_clip.bin", *argv, tmp_path / "out") == 0
    assert "open_clip tensors outside the image tower" in capsys.readouterr().out
    converted = AutoModelForImageClassification.from_pretrained(tmp_path / "out", trust_remote_code=True).eval()
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    assert relative_error(converted(pixel_values=pixels).logits, source.encode_image(pixels)) <= 1e-5


@torch.no_grad()
def test_an_open_clip_checkpoint_with_a_timm_trunk_converts_the_trunk(tmp_path):
    """`visual.trunk.*`: the timm model itself, its projection head and the text tower left out."""
    open_clip = pytest.importorskip("open_clip")
    vision = dict(timm_model_name="vit_tiny_patch16_224", timm_model_pretrained=False, timm_pool="", image_size=224)
    source = randomize_(open_clip.CLIP(embed_dim=16, vision_cfg=vision, text_cfg=TEXT_TOWER)).eval()
    torch.save(source.state_dict(), tmp_path / "open_clip.bin")
    assert convert(tmp_path / "open_clip.bin", "--architecture", "vit_tiny_patch16_224", tmp_path / "out") == 0
    converted = AutoModel.from_pretrained(tmp_path / "out", trust_remote_code=True).eval()
    pixels = torch.randn(
        1, 3, 224, 224, generator=torch.Generator().manual_seed(0)
    )  # open_clip builds the trunk at 224
    expected = source.visual.trunk.forward_features(pixels)
    assert relative_error(converted(pixel_values=pixels).last_hidden_state, expected) <= 1e-5
