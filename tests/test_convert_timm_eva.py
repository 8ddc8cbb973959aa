"""`hubvit convert timm` on timm's `Eva` family (EVA-02, DINOv3, the RoPE ViTs), proven against timm's own forward on
the same random weights.

Tolerances: 1e-5 relative to the output scale (float32) at the native size and at a non-square size one patch
shorter and one wider, where timm runs with `dynamic_img_size=True` (the rotary angles are computed for the grid at
hand on both sides; a learned table is resized bicubic + antialias on both).
"""

import pytest
import torch

timm = pytest.importorskip("timm")
from timm.models import save_for_hf  # noqa: E402
from transformers import AutoModel, AutoModelForImageClassification  # noqa: E402

from hubvit.cli import main as cli  # noqa: E402
from utils import randomize_, relative_error  # noqa: E402

TINY = dict(depth=2, embed_dim=64, num_heads=4, img_size=32, patch_size=8)

# name: (timm architecture, model_args on top of TINY, config fields the family must produce)
FAMILIES = {
    "eva02": (
        "eva02_tiny_patch14_224",
        dict(num_classes=5),
        dict(rope_type="axial", mlp_type="gated", qkv_fused=True, key_bias=False, fc_norm=True, pooling="mean"),
    ),
    "eva02_448_reference_grid": (
        "eva02_base_patch14_448",
        dict(num_classes=5, img_size=64, ref_feat_shape=(4, 4)),
        dict(rope_type="axial", rope_reference_grid=[4, 4], mlp_inner_norm=True),
    ),
    "eva02_clip": (
        "eva02_base_patch16_clip_224",
        dict(num_classes=5),
        dict(attention_inner_norm=True, qkv_fused=False, key_bias=False, pooling="cls", rope_type="axial"),
    ),
    "dinov3": (
        "vit_base_patch16_dinov3",
        dict(num_classes=0),
        dict(
            rope_type="dinov3",
            rope_temperature=100.0,
            rope_rotate_half=True,
            position_embedding_type="none",
            num_register_tokens=4,
            qkv_bias=False,
            layer_scale_init_value=1e-5,
        ),
    ),
    "dinov3_qkvb": ("vit_base_patch16_dinov3_qkvb", dict(num_classes=0), dict(qkv_bias=True, key_bias=False)),
    "rope_axial": (
        "vit_base_patch16_rope_224",
        dict(num_classes=5),
        dict(rope_type="axial", rope_grid_indexing="xy", rope_temperature=100.0, position_embedding_type="none"),
    ),
    "rope_mixed": ("vit_base_patch16_rope_mixed_224", dict(num_classes=5), dict(rope_type="mixed")),
    "rope_axial_with_table": (
        "vit_base_patch16_rope_ape_224",
        dict(num_classes=5),
        dict(rope_type="axial", position_embedding_type="learned", position_embedding_includes_prefix=False),
    ),
    "rope_mixed_with_table": ("vit_base_patch16_rope_mixed_ape_224", dict(num_classes=5), dict(rope_type="mixed")),
    "pe_core_map_head_of_its_own": (
        "vit_pe_core_base_patch16_224",
        dict(num_classes=0),
        dict(pooling="map", map_num_heads=8, pre_norm=True, patch_bias=False, rope_grid_offset=1.0),
    ),
    "pe_lang_no_final_norm": (
        "vit_pe_lang_large_patch14_448",
        dict(num_classes=0, patch_size=8),
        dict(final_norm=False),
    ),
    "pe_spatial": ("vit_pe_spatial_base_patch16_512", dict(num_classes=0), dict(rope_grid_indexing="xy")),
    "eva02_enormous_residual_post_norm": (
        "eva02_enormous_patch14_clip_224",
        dict(num_classes=5),
        dict(norm_placement="residual_post"),
    ),
    "sapiens2_attention_only_layer_scale": (
        "vit_base_patch16_sapiens2",
        dict(num_classes=5, num_kv_heads=4, img_size=(32, 24)),
        dict(scale_attention_branch_only=True, norm_type="rms_norm", qk_norm=True, num_register_tokens=8),
    ),
    "sapiens2_grouped_key_value_heads_per_block": (
        "vit_base_patch16_sapiens2",
        dict(num_classes=5, depth=3, num_kv_heads=(4, 1, 2), img_size=(32, 24)),
        dict(num_key_value_heads=[4, 1, 2], qkv_fused=False),
    ),
    "rope_grouped_key_value_heads": (
        "vit_base_patch16_rope_224",
        dict(num_classes=0, qkv_fused=False, num_kv_heads=2),
        dict(num_key_value_heads=2, rope_type="axial"),
    ),
    "sbb_rope_registers": (
        "vit_base_patch16_rope_reg1_gap_256",
        dict(num_classes=5),
        dict(rope_type="axial", class_token=False, num_register_tokens=1, pooling="mean"),
    ),
}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@torch.no_grad()
def timm_model(name, args, **extra):
    return timm.create_model(name, pretrained=False, **{**TINY, **args, **extra}).eval()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_eva_family_matches_timm(family, tmp_path):
    name, args, expected = FAMILIES[family]
    source = randomize_(timm_model(name, args), seed=len(family))
    save_for_hf(source, tmp_path / "timm", safe_serialization=True)
    assert cli(["convert", "timm", str(tmp_path / "timm"), str(tmp_path / "out")]) == 0

    headless = source.num_classes == 0
    auto = AutoModel if headless else AutoModelForImageClassification
    model, info = auto.from_pretrained(tmp_path / "out", trust_remote_code=True, output_loading_info=True)
    assert not any(info.values()), info
    model.eval()
    for field, value in expected.items():
        assert getattr(model.config, field) == value, (field, getattr(model.config, field))
    dynamic = timm_model(name, args, dynamic_img_size=True)
    dynamic.load_state_dict(source.state_dict())
    (height, width), (ph, pw) = model.config.image_size_2d, model.config.patch_size_2d
    for reference, (h, w) in ((source, (height, width)), (dynamic, (height - ph, width + pw))):
        pixels = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(h * w))
        with torch.no_grad():
            outputs = model(pixel_values=pixels)
            expected_output = reference(pixels)
        ours = outputs.pooler_output if headless else outputs.logits
        assert relative_error(ours, expected_output) <= 1e-5, ((h, w), relative_error(ours, expected_output))


def test_an_eva_setting_hubvit_lacks_is_refused_by_name(tmp_path, capsys):
    """Max-and-average pooling is not a hubvit pooler: refused, the setting named, nothing written."""
    source = timm_model("vit_base_patch16_rope_224", dict(num_classes=0, global_pool="avgmax"))
    save_for_hf(source, tmp_path / "timm", safe_serialization=True)
    status = cli(["convert", "timm", str(tmp_path / "timm"), str(tmp_path / "out")])
    assert status == 2 and not (tmp_path / "out").exists()
    assert "global_pool='avgmax' (hubvit pools with 'token', 'avg', 'map' or none)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "title"),
    [
        ("vit_base_patch16_dinov3", "title = {DINOv3}"),
        ("eva02_tiny_patch14_224", "EVA-02: A Visual Representation for Neon Genesis"),
        ("vit_pe_core_base_patch16_224", "Perception Encoder: The best visual embeddings"),
        ("vit_base_patch16_rope_224", "Rotary Position Embedding for Vision Transformer"),
    ],
)
def test_the_model_card_cites_the_familys_paper(name, title, tmp_path):
    save_for_hf(timm_model(name, dict(num_classes=0)), tmp_path / "timm", safe_serialization=True)
    assert cli(["convert", "timm", str(tmp_path / "timm"), str(tmp_path / "out")]) == 0
    assert title in (tmp_path / "out" / "README.md").read_text()


@pytest.mark.parametrize("name", ["vit_base_patch16_dinov3", "eva02_tiny_patch14_224"])
def test_a_converted_family_folder_fine_tunes_on_the_digits(name, tmp_path):
    """`hubvit.train(model_name_or_path=...)` on a converted DINOv3 or EVA-02 folder: the embedded digits at the
    folder's own size, a new 10-class head, two updates, and a model folder that loads and predicts."""
    import hubvit
    from hubvit import HubViTForImageClassification

    save_for_hf(timm_model(name, dict(num_classes=0)), tmp_path / "timm", safe_serialization=True)
    hubvit.convert_timm(tmp_path / "timm", tmp_path / "converted")
    result = hubvit.train(
        model_name_or_path=str(tmp_path / "converted"),
        output_dir=str(tmp_path / "run"),
        max_train_steps=2,
        max_train_samples=32,
        max_eval_samples=32,
        per_device_train_batch_size=16,
    )
    model = HubViTForImageClassification.from_pretrained(result.model_dir).eval()
    assert model.config.num_labels == 10 and model.config.rope_type is not None
    with torch.no_grad():
        assert model(pixel_values=torch.randn(1, 3, 32, 32)).logits.shape == (1, 10)


def test_rope_mixed_frequencies_of_another_depth_are_refused_naming_the_tensor(tmp_path, capsys):
    """`rope.freqs` holding one block's frequencies for a two-block model: a refusal naming it, not an IndexError."""
    from safetensors.torch import save_file

    source = timm_model("vit_base_patch16_rope_mixed_224", dict(num_classes=5))
    save_for_hf(source, tmp_path / "timm", safe_serialization=True)
    weights = {key: value.contiguous() for key, value in source.state_dict().items()}
    weights["rope.freqs"] = weights["rope.freqs"][:, :1].contiguous()
    save_file(weights, tmp_path / "timm" / "model.safetensors")
    status = cli(["convert", "timm", str(tmp_path / "timm"), str(tmp_path / "out")])
    error = capsys.readouterr().err
    assert status == 2 and not (tmp_path / "out").exists()
    assert "cannot be laid out as their target" in error
    assert "encoder.layers.1.attention.rope_frequencies from rope.freqs (2, 1, 4, 8)" in error, error


def test_model_args_timm_cannot_run_are_refused_in_one_line(tmp_path, capsys):
    """An img_size the patch does not divide: hubvit would floor the grid, but timm's DINOv3 asserts, so there is no
    reference to verify against; the refusal says so instead of ending in timm's traceback."""
    source = timm_model("vit_base_patch16_dinov3", dict(num_classes=0))
    save_for_hf(source, tmp_path / "timm", safe_serialization=True)
    argv = ["convert", "timm", str(tmp_path / "timm"), str(tmp_path / "out"), "--model-args", '{"img_size": 30}']
    status = cli(argv)
    error = capsys.readouterr().err
    assert status == 2 and not (tmp_path / "out").exists()
    assert "cannot run a 30x30 image to verify against" in error and "Traceback" not in error, error
