"""`hubvit export timm`: a timm Hub-layout folder that timm itself loads, in a Python where hubvit cannot be imported.

The reference is timm's own forward on the exported folder, against hubvit's forward on the folder it came from.
Tolerance: 1e-5 relative to the output scale at the native size (float32, the same operations); 1e-4 at a second,
non-square size, where both resize the position table (bicubic + antialias, float32) and attend over other tokens.
"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

timm = pytest.importorskip("timm")

from hubvit import HubViTForImageClassification  # noqa: E402
from hubvit.folder import make_image_processor, write_folder  # noqa: E402
from hubvit.cli import main as cli  # noqa: E402
from utils import randomize_, relative_error, run_without_hubvit, tiny_config  # noqa: E402

# name: (hubvit config fields, timm model_args the export must choose)
FAMILIES = {
    "vit": (dict(num_labels=5), dict(global_pool="token", class_token=True)),
    "mean_fc_norm": (
        dict(class_token=False, pooling="mean", fc_norm=True, num_labels=3),
        dict(global_pool="avg", fc_norm=True, class_token=False),
    ),
    "siglip_like": (dict(class_token=False, pooling="map", num_labels=0), dict(global_pool="map", num_classes=0)),
    "map_over_cls": (dict(pooling="map", num_labels=2), dict(global_pool="map", pool_include_prefix=True)),
    "dinov2_registers": (
        dict(
            layer_scale_init_value=1e-5, num_register_tokens=2, position_embedding_includes_prefix=False, num_labels=0
        ),
        dict(reg_tokens=2, no_embed_class=True, init_values=1e-5),
    ),
    "clip_like": (
        dict(pre_norm=True, patch_bias=False, layer_norm_eps=1e-5, hidden_act="quick_gelu", num_labels=4),
        dict(pre_norm=True, act_layer="quick_gelu"),
    ),
    "deit_distilled": (dict(distillation_token=True, num_labels=3), dict(global_pool="token")),
    "jax_like": (
        dict(
            hidden_act="gelu_pytorch_tanh",
            interpolation_mode="bilinear",
            interpolation_antialias=False,
            interpolation_align_corners=True,
            num_labels=3,
        ),
        dict(act_layer="gelu_tanh", dynamic_img_size=False),
    ),
}
ARCHITECTURES = {"clip_like": "vit_base_patch16_clip_224", "deit_distilled": "deit_base_distilled_patch16_224"}
LABELS = ["red fox", "grey wolf", "brown bear", "lynx", "otter"]
PREPROCESSING = dict(mean=(0.48, 0.46, 0.41), std=(0.27, 0.26, 0.28), resample="bicubic")

TIMM_SIDE = """
import json, sys
import timm, torch
from safetensors.torch import load_file, save_file
from timm.data import resolve_data_config

inputs, report, outputs = load_file("inputs.safetensors"), {}, {}
for family in FAMILIES:
    config = json.load(open(f"{family}-timm/config.json"))
    overlay = dict(config["pretrained_cfg"], file=f"{family}-timm/model.safetensors")
    by_name = timm.create_model(
        config["architecture"], pretrained=True, pretrained_cfg_overlay=overlay, **config["model_args"]
    ).eval()
    local = timm.create_model(f"local-dir:{family}-timm", pretrained=True).eval()
    data = resolve_data_config({}, model=local)
    report[family] = dict(
        module=type(local).__name__, label_names=config.get("label_names"),
        mean=list(data["mean"]), std=list(data["std"]), interpolation=data["interpolation"],
        input_size=list(data["input_size"]), crop_pct=data["crop_pct"],
    )
    with torch.no_grad():
        for key, pixels in inputs.items():
            if key.startswith(family + "/"):
                outputs[key] = local(pixels)
                outputs[key + "/by_name"] = by_name(pixels)
save_file({k: v.contiguous() for k, v in outputs.items()}, "outputs.safetensors")
print(json.dumps(report))
"""


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def hubvit_folder(path, seed=0, **fields):
    labels = dict(id2label=dict(enumerate(LABELS[: fields["num_labels"]]))) if fields.get("num_labels") else {}
    model = randomize_(HubViTForImageClassification(tiny_config(**fields, **labels)), seed=seed).eval()
    write_folder(model, path, make_image_processor(model.config, **PREPROCESSING))
    return model


def second_size(config):
    """A non-square input one patch shorter and one patch wider than the native resolution."""
    (height, width), (ph, pw) = config.image_size_2d, config.patch_size_2d
    return height - ph, width + pw


@pytest.mark.heavy
@torch.no_grad()
def test_exported_folders_load_in_timm_without_hubvit(tmp_path, capsys):
    """Every family timm's ViT can express, loaded two ways (`local-dir:` and `create_model` with the folder's
    pretrained_cfg and model_args as overlay) in a Python where `import hubvit` fails."""
    inputs, expected, tolerances = {}, {}, {}
    for seed, (family, (fields, _)) in enumerate(FAMILIES.items()):
        model = hubvit_folder(tmp_path / family, seed=seed, **fields)
        assert cli(["export", "timm", str(tmp_path / family), str(tmp_path / f"{family}-timm")]) == 0
        assert "max |Δpooler_output|" in capsys.readouterr().out
        sizes = [model.config.image_size_2d]
        if family != "jax_like":
            sizes.append(second_size(model.config))
        for (h, w), tolerance in zip(sizes, (1e-5, 1e-4)):
            key = f"{family}/{h}x{w}"
            tolerances[key] = tolerance
            inputs[key] = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(h * w + seed))
            expected[key] = model(pixel_values=inputs[key]).logits
    save_file(inputs, tmp_path / "inputs.safetensors")

    report = run_without_hubvit(f"FAMILIES = {list(FAMILIES)!r}\n" + TIMM_SIDE, cwd=tmp_path)
    outputs = load_file(tmp_path / "outputs.safetensors")
    for key, ours in expected.items():
        for theirs in (outputs[key], outputs[key + "/by_name"]):
            assert relative_error(ours, theirs) <= tolerances[key], (key, relative_error(ours, theirs))

    for family, (fields, timm_args) in FAMILIES.items():
        config = json.loads((tmp_path / f"{family}-timm" / "config.json").read_text())
        assert config["architecture"] == ARCHITECTURES.get(family, "vit_base_patch16_224")
        for name, value in timm_args.items():
            assert config["model_args"][name] == value, (family, name)
        seen = report[family]
        assert seen["module"] == ("VisionTransformerDistilled" if family == "deit_distilled" else "VisionTransformer")
        assert seen["label_names"] == (LABELS[: fields["num_labels"]] if fields["num_labels"] else None)
        assert seen["mean"] == pytest.approx(PREPROCESSING["mean"])
        assert seen["std"] == pytest.approx(PREPROCESSING["std"])
        assert (seen["interpolation"], seen["input_size"], seen["crop_pct"]) == ("bicubic", [3, 32, 32], 1.0)
        card = (tmp_path / f"{family}-timm" / "README.md").read_text()
        assert "library_name: timm" in card and "## Verification" in card and "max |Δpooler_output|" in card
    assert "dynamic_img_size=False" in (tmp_path / "jax_like-timm" / "README.md").read_text()


def test_round_trip_through_hubvit_convert_timm(tmp_path, capsys):
    """The exported folder is a timm folder like any other: converting it back gives the same tensors and config."""
    fields = FAMILIES["dinov2_registers"][0]
    model = hubvit_folder(tmp_path / "hubvit", **fields)
    assert cli(["export", "timm", str(tmp_path / "hubvit"), str(tmp_path / "timm")]) == 0
    assert cli(["convert", "timm", str(tmp_path / "timm"), str(tmp_path / "back")]) == 0
    back = HubViTForImageClassification.from_pretrained(tmp_path / "back")
    for name, value in fields.items():
        assert getattr(back.config, name) == value
    original, returned = model.state_dict(), back.state_dict()
    assert original.keys() == returned.keys()
    assert all(torch.equal(original[k], returned[k]) for k in original)


def test_settings_timm_cannot_express_are_refused_together(tmp_path, capsys):
    hubvit_folder(
        tmp_path / "hubvit",
        position_embedding_type="relative_2d",
        representation_size=16,
        layer_norm_eps=1e-12,
        final_layer_norm_eps=1e-5,
        num_labels=3,
    )
    assert cli(["export", "timm", str(tmp_path / "hubvit"), str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "no timm class can express this hubvit model" in error
    for setting in (
        "position_embedding_type='relative_2d'",
        "representation_size=16",
        "layer_norm_eps=1e-12",
        "final_layer_norm_eps=1e-05",
    ):
        assert setting in error
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "fields, setting",
    [
        (dict(pooling="cls_mean"), "pooling='cls_mean'"),
        (dict(pre_norm=True), "patch_bias=True with pre_norm=True"),
        (dict(distillation_token=True, distillation_head=False), "distillation_head=False"),
        (dict(intermediate_size=50, hidden_size=48, num_attention_heads=4), None),
    ],
)
def test_single_settings_are_refused_or_exported(tmp_path, capsys, fields, setting):
    hubvit_folder(tmp_path / "hubvit", num_labels=2, **fields)
    code = cli(["export", "timm", str(tmp_path / "hubvit"), str(tmp_path / "out")])
    if setting is None:
        assert code == 0 and json.loads((tmp_path / "out" / "config.json").read_text())["model_args"]["mlp_ratio"]
        return
    assert code == 2 and setting in capsys.readouterr().err


def test_verify_fails_above_tolerance(tmp_path, capsys, monkeypatch):
    """An exporter bug (timm's final norm bias off by 1e-3 of its scale) is caught; nothing is written."""
    import hubvit.conversion.export_timm as exporter

    map_to_timm = exporter.map_to_timm

    def off_by_a_little(weights, timm_shapes, description):
        state_dict, mapping = map_to_timm(weights, timm_shapes, description)
        state_dict["norm.bias"] = state_dict["norm.bias"] + 1e-3 * state_dict["norm.bias"].abs().max()
        return state_dict, mapping

    monkeypatch.setattr(exporter, "map_to_timm", off_by_a_little)
    hubvit_folder(tmp_path / "hubvit", num_labels=3)
    assert cli(["export", "timm", str(tmp_path / "hubvit"), str(tmp_path / "out")]) == 2
    assert "does not reproduce the exported timm" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_not_a_hubvit_folder_is_refused(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.json").write_text(json.dumps({"model_type": "vit"}))
    assert cli(["export", "timm", str(tmp_path / "src"), str(tmp_path / "out")]) == 2
    assert "not a hubvit folder (config.json model_type='vit'" in capsys.readouterr().err


# name: (timm architecture, model_args on top of TINY_FAMILY, the class the export must write)
MODERN = {
    "eva02": ("eva02_tiny_patch14_224", dict(num_classes=5), "Eva"),
    "eva02_clip_inner_norm": ("eva02_base_patch16_clip_224", dict(num_classes=5), "Eva"),
    "dinov3": ("vit_base_patch16_dinov3", dict(num_classes=0), "Eva"),
    "dinov3_qkvb": ("vit_base_patch16_dinov3_qkvb", dict(num_classes=0), "Eva"),
    "rope_mixed_with_table": ("vit_base_patch16_rope_mixed_ape_224", dict(num_classes=5), "Eva"),
    "pe_core_map": ("vit_pe_core_base_patch16_224", dict(num_classes=0), "Eva"),
    "sapiens2_rms_norm": ("vit_base_patch16_sapiens2", dict(num_classes=5, num_kv_heads=4), "Eva"),
    "sapiens2_grouped_key_value_heads": (
        "vit_base_patch16_sapiens2",
        dict(num_classes=5, depth=3, num_kv_heads=(4, 2, 4)),
        "Eva",
    ),
    "eva02_residual_post_norm": ("eva02_enormous_patch14_clip_224", dict(num_classes=5), "Eva"),
    "beit": ("beit_base_patch16_224", dict(num_classes=5), "Beit"),
    "beitv2_shared_table": (
        "beitv2_base_patch16_224",
        dict(num_classes=5, use_shared_rel_pos_bias=True, use_rel_pos_bias=False),
        "Beit",
    ),
    "relpos": ("vit_relpos_base_patch16_224", dict(num_classes=5), "VisionTransformerRelPos"),
    "relpos_residual_post_norm": ("vit_relpos_base_patch16_rpn_224", dict(num_classes=5), "VisionTransformerRelPos"),
    "aimv2": ("aimv2_large_patch14_224", dict(num_classes=0), "VisionTransformer"),
    "beit3_inner_norms": ("beit3_base_patch16_224", dict(num_classes=5), "VisionTransformer"),
    "dinov2_giant_packed_swiglu": ("vit_giant_patch14_dinov2", dict(num_classes=0, mlp_ratio=4.0), "VisionTransformer"),
    "radio_no_final_norm": ("vit_base_patch16_radio_v3", dict(num_classes=0), "VisionTransformer"),
    "residual_post_norm": ("vit_base_patch16_rpn_224", dict(num_classes=5), "VisionTransformer"),
    "sam_windows_neck": (
        "samvit_base_patch16",
        dict(num_classes=5, window_size=3, global_attn_indexes=[1]),
        "VisionTransformerSAM",
    ),
    "sam_channel_norm_no_table": (
        "samvit_base_patch16_224",
        dict(num_classes=0, window_size=3, global_attn_indexes=[1]),
        "VisionTransformerSAM",
    ),
}
TINY_FAMILY = dict(depth=2, embed_dim=64, num_heads=4, img_size=32, patch_size=8)


@pytest.mark.parametrize("family", list(MODERN))
@torch.no_grad()
def test_a_converted_family_exports_back_to_timms_own_class_and_computes_the_same(family, tmp_path, capsys):
    """timm model (random weights) -> `hubvit convert timm` -> `hubvit export timm` -> timm's `local-dir:` loader:
    the reloaded timm model is the family's class and agrees with the original timm model, the peer, within 1e-5
    of the output scale (float32, the same operations on both sides)."""
    from timm.models import save_for_hf

    name, args, expected_class = MODERN[family]
    source = randomize_(timm.create_model(name, pretrained=False, **{**TINY_FAMILY, **args}).eval(), seed=7)
    save_for_hf(source, tmp_path / "timm", safe_serialization=True)
    assert cli(["convert", "timm", str(tmp_path / "timm"), str(tmp_path / "hubvit")]) == 0
    assert cli(["export", "timm", str(tmp_path / "hubvit"), str(tmp_path / "back")]) == 0
    exported = timm.create_model(f"local-dir:{tmp_path / 'back'}", pretrained=True).eval()
    assert type(exported).__name__ == expected_class
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    assert relative_error(exported(pixels), source(pixels)) <= 1e-5


def test_a_setting_no_timm_class_has_is_refused_naming_each_class_tried(tmp_path, capsys):
    """A learned 2D table is neither timm's VisionTransformer nor its Eva: both are named, nothing is written."""
    hubvit_folder(tmp_path / "hubvit", position_embedding_type="learned_2d", rope_type="axial", num_labels=3)
    assert cli(["export", "timm", str(tmp_path / "hubvit"), str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "timm's VisionTransformer: position_embedding_type='learned_2d'" in error
    assert (
        "position_embedding_type='learned_2d' (timm's eva_giant_patch14_224 built from model_args reads back" in error
    )
    assert not (tmp_path / "out").exists()


def rearranging_forward(source):
    """A converter-like mapping: a rename, a transpose, a split of one tensor in two, two tensors concatenated."""
    return {
        "renamed": source["a"],
        "transposed": source["b"].t(),
        "first_half": source["c"][:2],
        "second_half": source["c"][2:],
        "joined": torch.cat([source["d"], source["e"]]),
    }


def test_the_inverse_of_a_rearranging_mapping_gives_back_the_source_exactly():
    from hubvit.conversion.mapping import inverse

    generator = torch.Generator().manual_seed(0)
    shapes = dict(a=(3, 4), b=(2, 5), c=(4, 3), d=(2,), e=(3,))
    source = {name: torch.randn(shape, generator=generator) for name, shape in shapes.items()}
    target = rearranging_forward(source)
    blank = {name: torch.zeros(shape) for name, shape in shapes.items()}
    recovered, filled = inverse(rearranging_forward, blank, target, "test")
    assert filled == set(shapes)
    assert all(torch.equal(recovered[name], source[name]) for name in shapes)


def test_the_inverse_refuses_a_mapping_that_computes_and_one_source_given_two_values():
    from hubvit.conversion.mapping import inverse
    from hubvit.errors import ConversionError

    blank = {"a": torch.zeros(4)}
    with pytest.raises(ConversionError, match="tensors the mapping computes rather than moves \\(1\\):\n    scaled"):
        inverse(lambda s: {"scaled": 2 * s["a"]}, blank, {"scaled": torch.ones(4)}, "test")
    copies = {"left": torch.ones(4), "right": torch.zeros(4)}
    with pytest.raises(ConversionError, match="source tensors that would need two different values \\(1\\):\n    a"):
        inverse(lambda s: {"left": s["a"], "right": s["a"]}, blank, copies, "test")
