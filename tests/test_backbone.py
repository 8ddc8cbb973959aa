"""hubvit as a backbone for dense heads: `HubViTBackbone` (transformers' `AutoBackbone` semantics) and
`forward_intermediates` (timm's), each proven against the source library on the same converted weights.

Tolerances: 1e-5 relative to the output scale (`utils.RTOL`) where both sides run the same float32 operations on the
same weights (feature maps against `Dinov2Backbone`, intermediates against timm's `VisionTransformer`); 1e-4 for Depth
Anything's predicted depth, as issue 38 asks: the neck and head (convolutions, bilinear upsampling) sit on top of
the backbone and may round differently. Inputs are non-square and off the native grid, so position tables are
resized on both sides.
"""

import inspect
import json
import unittest
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoConfig,
    DepthAnythingConfig,
    DepthAnythingForDepthEstimation,
    Dinov2Backbone,
    Dinov2Config,
    Dinov2Model,
    Dinov2WithRegistersBackbone,
    Dinov2WithRegistersConfig,
    Dinov2WithRegistersModel,
    DPTConfig,
    DPTForDepthEstimation,
    Mask2FormerConfig,
    Mask2FormerForUniversalSegmentation,
    UperNetConfig,
    UperNetForSemanticSegmentation,
)

import hubvit
from hubvit import (
    HubViTBackbone,
    HubViTConfig,
    HubViTForImageClassification,
    HubViTForSemanticSegmentation,
    HubViTModel,
)
from hubvit.folder import write_folder
from utils import RTOL, TINY_TIMM, randomize_, relative_error, run_without_hubvit, tiny_config

DEPTH_TOLERANCE = 1e-4
EARLIER = Path(__file__).parent / "fixtures" / "earlier-2026-12-03" / "plain"

# A 4-block DINOv2 with 7-pixel patches at 28 x 28 (a 4 x 4 grid); inputs are 21 x 35 (3 x 5 patches).
DINOV2 = dict(image_size=28, patch_size=7, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, mlp_ratio=2)
SOURCES = {
    "dinov2": (Dinov2Config, Dinov2Model, Dinov2Backbone, {}),
    "dinov2_with_registers": (
        Dinov2WithRegistersConfig,
        Dinov2WithRegistersModel,
        Dinov2WithRegistersBackbone,
        dict(num_register_tokens=2),
    ),
}
# Depth Anything's neck and head at the tiny width; "metric" ends in a sigmoid, so no output is clipped to 0.
DEPTH_HEAD = dict(
    reassemble_hidden_size=32,
    neck_hidden_sizes=[8, 16, 32, 32],
    fusion_hidden_size=16,
    head_hidden_size=8,
    patch_size=7,
    depth_estimation_type="metric",
    max_depth=1,
)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def pixels(height, width, seed=0):
    return torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """{family: (transformers folder, hubvit folder)}: a random DINOv2 (with and without registers) saved by
    transformers and converted by `hubvit convert transformers` (which checks it against transformers' forward)."""
    root = tmp_path_factory.mktemp("dinov2")
    folders = {}
    for family, (config_class, model_class, _, extra) in SOURCES.items():
        source = randomize_(model_class(config_class(**DINOV2, **extra)), seed=len(family)).eval()
        source.save_pretrained(root / family)
        hubvit.convert_transformers(root / family, root / f"{family}-hubvit")
        folders[family] = (root / family, root / f"{family}-hubvit")
    return folders


# ------------------------------------------------------------------------------------------------- configuration


def test_a_folder_written_before_the_backbone_existed_serves_as_one():
    """Its config (no backbone fields) selects the last stage, normed, as maps; its weights load whole; its
    auto_map gains the backbone when saved again."""
    config = HubViTConfig.from_pretrained(EARLIER)
    assert "out_indices" not in json.loads((EARLIER / "config.json").read_text())
    assert (config.stage_names, config.out_features, config.out_indices) == (
        ["stem", "stage1", "stage2"],
        ["stage2"],
        [2],
    )
    assert config.apply_layernorm and config.reshape_hidden_states
    assert config.auto_map["AutoBackbone"] == "modeling_hubvit.HubViTBackbone"
    backbone, info = HubViTBackbone.from_pretrained(EARLIER, output_loading_info=True)
    assert not any(info.values()), info
    model = HubViTForImageClassification.from_pretrained(EARLIER).eval()
    x = pixels(24, 40)
    with torch.no_grad():
        (feature_map,) = backbone.eval()(x).feature_maps
        tokens = model.hubvit(x).last_hidden_state
    assert torch.equal(feature_map, tokens[:, 1:].reshape(2, 3, 5, -1).permute(0, 3, 1, 2))


def test_out_indices_and_out_features_are_two_views_of_one_choice_and_round_trip():
    config = tiny_config(num_hidden_layers=4, out_indices=[0, 2, -1])
    assert config.out_features == ["stem", "stage2", "stage4"]
    config.out_features = ["stage1", "stage3"]
    assert config.out_indices == [1, 3]
    loaded = HubViTConfig.from_dict(config.to_dict())
    assert (loaded.out_features, loaded.out_indices) == (["stage1", "stage3"], [1, 3])


@pytest.mark.parametrize(
    "chosen, depth, expected",
    [
        (None, 2, [2]),  # the last stage stays the last, shallower
        (None, 6, [6]),  # and deeper
        ([1, 2], 2, [1, 2]),  # blocks that still exist stay chosen
        ([-2, -1], 6, [-2, -1]),  # counted from the end: stages 5 and 6 now
        ([1, 4], 2, [2]),  # stage 4 is gone: the last stage (logged)
    ],
)
def test_a_depth_changed_at_loading_keeps_the_stages_valid_so_the_folder_saves_and_reloads(
    tmp_path, chosen, depth, expected
):
    """`from_pretrained(folder, num_hidden_layers=N)` sets the depth after the stages were checked; without following
    it, a config naming stage4 of a 2-block model would be saved and then refuse to load."""
    tiny_config(num_hidden_layers=4, out_indices=chosen).save_pretrained(tmp_path / "four")
    config = AutoConfig.from_pretrained(tmp_path / "four", num_hidden_layers=depth)
    assert config.out_indices == expected
    assert config.out_features == [config.stage_names[i] for i in expected]
    config.save_pretrained(tmp_path / "changed")
    assert AutoConfig.from_pretrained(tmp_path / "changed").out_features == config.out_features


def test_an_old_folders_auto_map_gains_the_backbone_when_saved_again():
    old = {"AutoConfig": "configuration_hubvit.HubViTConfig", "AutoModel": "user/repo--modeling_hubvit.HubViTModel"}
    assert tiny_config(auto_map=old).auto_map["AutoBackbone"] == "user/repo--modeling_hubvit.HubViTBackbone"


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(out_indices=[3]), "out_indices=[3] has [3] outside the 3 stages"),
        (dict(out_indices=[-4]), "expected indices in [-3, 2] over ['stem', 'stage1', 'stage2']"),
        (dict(out_features=["stage9"]), "unknown stages ['stage9']; expected names from ['stem', 'stage1', 'stage2']"),
        (dict(out_indices=[2, 1]), "in the order of ['stem', 'stage1', 'stage2'], got [2, 1]"),
        (dict(out_indices=[1, 1]), "once each"),
        (dict(out_indices=[1], out_features=["stage2"]), "name different stages"),
    ],
)
def test_bad_stages_are_refused_naming_the_value_and_the_stages(fields, message):
    with pytest.raises(ValueError) as error:
        tiny_config(**fields)
    assert message in str(error.value)


# ------------------------------------------------------------------------------- against transformers' DINOv2


@pytest.mark.parametrize("family", list(SOURCES))
@pytest.mark.parametrize(
    "choice",
    [
        dict(out_indices=[1, 2, 3, 4]),
        dict(out_indices=[0, 2], apply_layernorm=False),
        dict(out_features=["stage4"], reshape_hidden_states=False),
        dict(out_indices=[1, -1], reshape_hidden_states=False, apply_layernorm=False),
    ],
    ids=["maps-normed", "maps-raw-with-stem", "tokens-normed", "tokens-raw"],
)
def test_feature_maps_match_dinov2_backbone(converted, family, choice):
    """Same stages, same norm, same layout (NCHW without prefix tokens, or every token) as transformers' own."""
    source_folder, folder = converted[family]
    reference = SOURCES[family][2].from_pretrained(source_folder, **choice).eval()
    backbone, info = HubViTBackbone.from_pretrained(folder, output_loading_info=True, **choice)
    assert not any(info.values()), info
    x = pixels(21, 35)
    with torch.no_grad():
        expected, actual = reference(x).feature_maps, backbone.eval()(x).feature_maps
    assert len(actual) == len(expected) == len(reference.out_features)
    assert backbone.channels == reference.channels
    for ours, theirs in zip(actual, expected):
        assert ours.shape == theirs.shape
        assert relative_error(ours, theirs) <= RTOL


def test_hidden_states_and_attentions_match_dinov2_backbone(converted):
    source_folder, folder = converted["dinov2"]
    reference = Dinov2Backbone.from_pretrained(source_folder, attn_implementation="eager").eval()
    backbone = HubViTBackbone.from_pretrained(folder).eval()
    x = pixels(21, 35, seed=1)
    with torch.no_grad():
        expected = reference(x, output_hidden_states=True, output_attentions=True)
        actual = backbone(x, output_hidden_states=True, output_attentions=True)
    assert len(actual.hidden_states) == len(expected.hidden_states) == 5  # stem + 4 blocks
    assert len(actual.attentions) == len(expected.attentions) == 4
    for ours, theirs in zip(actual.hidden_states + actual.attentions, expected.hidden_states + expected.attentions):
        assert relative_error(ours, theirs) <= RTOL
    assert backbone(x).hidden_states is None and backbone(x).attentions is None


def test_depth_anything_on_the_converted_backbone_predicts_the_dinov2_depth(converted):
    """transformers' Depth Anything built twice: on `Dinov2Backbone`, and on the hubvit backbone converted from those
    weights with the same neck and head; the predicted depth agrees (issue 38's proof)."""
    source_folder, folder = converted["dinov2"]
    stages = dict(out_indices=[1, 2, 3, 4], reshape_hidden_states=False)  # the neck reads tokens
    dinov2_config = Dinov2Config.from_pretrained(source_folder, **stages)
    reference = DepthAnythingForDepthEstimation(DepthAnythingConfig(backbone_config=dinov2_config, **DEPTH_HEAD))
    reference.backbone = Dinov2Backbone.from_pretrained(source_folder, **stages)
    randomize_(reference.neck, seed=5)
    randomize_(reference.head, seed=6)

    hubvit_config = AutoConfig.from_pretrained(folder, **stages)
    assert isinstance(hubvit_config, HubViTConfig)
    model = DepthAnythingForDepthEstimation(DepthAnythingConfig(backbone_config=hubvit_config, **DEPTH_HEAD))
    assert isinstance(model.backbone, HubViTBackbone), "built by transformers' load_backbone through AutoBackbone"
    model.backbone.load_state_dict(HubViTBackbone.from_pretrained(folder).state_dict())
    model.neck.load_state_dict(reference.neck.state_dict())
    model.head.load_state_dict(reference.head.state_dict())
    for height, width in ((28, 28), (21, 35)):
        x = pixels(height, width, seed=height)
        with torch.no_grad():
            expected = reference.eval()(x).predicted_depth
            actual = model.eval()(x).predicted_depth
        assert actual.shape == expected.shape == (2, height, width)
        assert expected.std() > 1e-2, "a depth map that varies, so a wrong backbone shows"
        assert relative_error(actual, expected) <= DEPTH_TOLERANCE, ((height, width), relative_error(actual, expected))


def test_a_dense_model_with_a_hubvit_backbone_config_saves_and_reloads(tmp_path):
    """The backbone config travels inside the dense model's config.json (model_type "hubvit", resolved through
    AutoConfig) and the reloaded model predicts the same depth."""
    backbone_config = tiny_config(patch_size=8, num_hidden_layers=4, out_indices=[1, 2, 3, 4])
    backbone_config.reshape_hidden_states = False
    config = DepthAnythingConfig(backbone_config=backbone_config, **{**DEPTH_HEAD, "patch_size": 8})
    model = randomize_(DepthAnythingForDepthEstimation(config), seed=2).eval()
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())["backbone_config"]
    assert saved["model_type"] == "hubvit" and saved["out_indices"] == [1, 2, 3, 4]
    reloaded = DepthAnythingForDepthEstimation.from_pretrained(tmp_path).eval()
    x = pixels(24, 40)
    with torch.no_grad():
        assert torch.equal(reloaded(x).predicted_depth, model(x).predicted_depth)


def upernet(config):
    return UperNetForSemanticSegmentation(
        UperNetConfig(backbone_config=config, hidden_size=16, auxiliary_channels=8, num_labels=3)
    )


def dpt(config):
    config.reshape_hidden_states = False  # DPT's neck reads tokens, like Depth Anything's
    head = dict(neck_hidden_sizes=[8, 16, 32, 32], fusion_hidden_size=16, reassemble_factors=[4, 2, 1, 0.5])
    return DPTForDepthEstimation(DPTConfig(backbone_config=config, hidden_size=32, patch_size=8, **head))


def mask2former(config):
    sizes = dict(feature_size=32, mask_feature_size=32, hidden_dim=32, encoder_feedforward_dim=32, dim_feedforward=32)
    return Mask2FormerForUniversalSegmentation(
        Mask2FormerConfig(
            backbone_config=config, num_queries=5, encoder_layers=1, decoder_layers=2, num_attention_heads=2, **sizes
        )
    )


@pytest.mark.parametrize("build", [upernet, dpt, mask2former])
def test_transformers_dense_heads_run_on_the_hubvit_backbone(build):
    """UperNet (and DPT, Mask2Former) take a hubvit `backbone_config` unchanged and run at a non-square size. These
    heads have no DINOv2 counterpart to compare with here: the check is shapes and finite outputs."""
    model = randomize_(build(tiny_config(num_hidden_layers=4, out_indices=[1, 2, 3, 4])), seed=1).eval()
    assert isinstance(
        model.model.pixel_level_module.encoder if build is mask2former else model.backbone, HubViTBackbone
    )
    x = pixels(32, 48)
    with torch.no_grad():
        outputs = model(x)
    if build is upernet:
        assert outputs.logits.shape == (2, 3, 32, 48)
        result = outputs.logits
    elif build is dpt:
        assert outputs.predicted_depth.shape == (2, 64, 96)  # DPT's head upsamples twice the input
        result = outputs.predicted_depth
    else:
        assert outputs.masks_queries_logits.shape == (2, 5, 4, 6)  # queries x maps at the backbone's stride 8
        result = outputs.masks_queries_logits
    assert torch.isfinite(result).all()


# ------------------------------------------------------------------ transformers' own backbone tests (its sdist)


def backbone_tester_mixin():
    """`BackboneTesterMixin` from the installed release's `tests/test_backbone_common.py` (tests/transformers_sources.py
    fetches the sdist once, as for the common model tests)."""
    import importlib
    import sys

    from transformers_sources import PACKAGE, ensure_sources

    root = str(ensure_sources())
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module(f"{PACKAGE}.test_backbone_common").BackboneTesterMixin


class BackboneInputs:
    """What the mixin asks of a model tester: a 4-block config selecting two stages, and a non-square batch."""

    def prepare_config_and_inputs_for_common(self):
        config = tiny_config(num_hidden_layers=4, out_features=["stage2", "stage4"])
        return config, {"pixel_values": pixels(24, 40)}


class TestTransformersBackboneCommon(backbone_tester_mixin(), unittest.TestCase):
    """transformers' `BackboneTesterMixin`, as transformers runs it on `Dinov2Backbone`: stage names, the
    out_features / out_indices alignment, channels, save and reload of the config, outputs and stage selection."""

    all_model_classes = (HubViTBackbone,)
    config_class = HubViTConfig
    has_attentions = True

    def setUp(self):
        self.model_tester = BackboneInputs()


# -------------------------------------------------------------------------------------------- the backbone itself


def test_backbone_loads_from_a_classifier_folder_and_gives_its_normed_hidden_states(tmp_path):
    """A classifier's folder serves as a backbone: the head and pooler are left out, the body's weights loaded; each
    map is the final norm of that block's tokens, prefix dropped, laid out over the patch grid (non-square)."""
    model = randomize_(HubViTForImageClassification(tiny_config(num_labels=3, num_register_tokens=2)), seed=7).eval()
    folder = write_folder(model, tmp_path / "classifier")
    backbone, info = HubViTBackbone.from_pretrained(folder, out_indices=[0, 1, 2], output_loading_info=True)
    assert not any(info.values()), info  # the classifier's keys are ignored by name, nothing else is left over
    x = pixels(24, 40)
    with torch.no_grad():
        maps = backbone.eval()(x).feature_maps
        hidden = model.hubvit(x, output_hidden_states=True).hidden_states
    for feature_map, state in zip(maps, hidden):
        expected = model.hubvit.norm(state)[:, 3:].reshape(2, 3, 5, -1).permute(0, 3, 1, 2)
        assert torch.equal(feature_map, expected)


def test_backbone_runs_no_block_after_the_last_stage_unless_hidden_states_are_asked_for():
    backbone = HubViTBackbone(tiny_config(num_hidden_layers=4, out_indices=[1])).eval()
    calls = []
    for index, layer in enumerate(backbone.encoder.layers):
        layer.register_forward_hook(lambda module, inputs, output, index=index: calls.append(index))
    with torch.no_grad():
        backbone(pixels(32, 32))
        assert calls == [0]
        calls.clear()
        assert len(backbone(pixels(32, 32), output_hidden_states=True).hidden_states) == 5
        assert calls == [0, 1, 2, 3]


def test_backbone_serves_another_patch_size_as_the_model_does():
    """`patch_size=` (FlexiViT's resized kernel) reaches the backbone: maps on the new grid, equal to the body's."""
    config = tiny_config(out_indices=[1, 2], apply_layernorm=False)
    body = randomize_(HubViTModel(config), seed=3).eval()
    backbone = HubViTBackbone(config).eval()
    backbone.load_state_dict(body.state_dict())
    x = pixels(24, 36)
    with torch.no_grad():
        maps = backbone(x, patch_size=4).feature_maps
        hidden = body(x, patch_size=4, output_hidden_states=True).hidden_states
    assert [tuple(m.shape) for m in maps] == [(2, 32, 6, 9)] * 2
    for feature_map, state in zip(maps, hidden[1:]):
        assert torch.equal(feature_map, state[:, 1:].reshape(2, 6, 9, -1).permute(0, 3, 1, 2))


@pytest.mark.parametrize("release", ["installed", pytest.param("4.57.6", marks=pytest.mark.heavy)])
def test_folder_loads_as_a_backbone_through_remote_code_without_hubvit(tmp_path, release):
    """A folder written by hubvit carries the backbone: where hubvit cannot be imported, `AutoBackbone` resolves to
    the code copied into the folder (its auto_map), which loads the weights and gives the in-process maps bit for bit.

    transformers 5.10 to 5.25 check the Hub before reading a local folder in `AutoBackbone.from_pretrained` (a local
    path fails `repo_exists`'s id validation, for DINOv2 as for hubvit); there the class comes from the auto_map
    through `AutoBackbone.from_config` and loads with its own `from_pretrained`. 4.57 has no such check and loads
    through `AutoBackbone.from_pretrained(folder, trust_remote_code=True, out_indices=...)` itself."""
    model = randomize_(HubViTForImageClassification(tiny_config(num_labels=3)), seed=4).eval()
    folder = write_folder(model, tmp_path / "ckpt")
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    assert auto_map["AutoBackbone"] == "modeling_hubvit.HubViTBackbone"
    x = pixels(24, 40)
    torch.save(x, tmp_path / "x.pt")
    with torch.no_grad():
        expected = HubViTBackbone.from_pretrained(folder, out_indices=[1, 2]).eval()(x).feature_maps
    release_path = None
    if release != "installed":
        from transformers_releases import ensure_release

        release_path = str(ensure_release(release))
    isolated = run_without_hubvit(
        f"""
        import sys
        if {release_path!r}:
            sys.path.insert(0, {release_path!r})
        import inspect, json, torch, transformers
        from transformers import AutoBackbone, AutoConfig
        folder = {str(folder)!r}
        if "repo_exists" in inspect.getsource(AutoBackbone.from_pretrained):
            route = "from_config"
            config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
            backbone_class = type(AutoBackbone.from_config(config, trust_remote_code=True))
            backbone = backbone_class.from_pretrained(folder, out_indices=[1, 2])
        else:
            route = "from_pretrained"
            backbone = AutoBackbone.from_pretrained(folder, trust_remote_code=True, out_indices=[1, 2])
        x = torch.load({str(tmp_path / "x.pt")!r}, weights_only=True)
        with torch.no_grad():
            maps = backbone.eval()(x).feature_maps
        print(json.dumps(dict(
            transformers=transformers.__version__,
            route=route,
            module=type(backbone).__module__,
            name=type(backbone).__name__,
            out_features=list(backbone.out_features),
            maps=[m.tolist() for m in maps],
        )))
        """,
        cwd=tmp_path,
    )
    if release != "installed":
        assert (isolated["transformers"], isolated["route"]) == (release, "from_pretrained")
    assert isolated["module"].startswith("transformers_modules."), "must run the code copied into the folder"
    assert (isolated["name"], isolated["out_features"]) == ("HubViTBackbone", ["stage1", "stage2"])
    assert len(isolated["maps"]) == 2
    for theirs, ours in zip(isolated["maps"], expected):
        assert torch.equal(torch.tensor(theirs), ours)


# --------------------------------------------------------------------------------- timm's forward_intermediates

timm = pytest.importorskip("timm")
from timm.models import save_for_hf  # noqa: E402

# name: (timm model name, model_args on top of TINY_TIMM); prefix tokens 1, 5 (cls + 4 registers), 0; `avg_fc_norm`
# norms after pooling, so its intermediates' `norm` is the identity, as in timm; CLIP norms the encoder input.
TIMM_FAMILIES = {
    "vit": ("vit_base_patch16_224", {}),
    "dinov2_reg4": ("vit_base_patch14_reg4_dinov2", dict(patch_size=14, img_size=56)),
    "gap_no_cls": ("vit_medium_patch16_gap_256", dict(num_classes=0)),
    "avg_fc_norm": ("vit_base_patch16_224", dict(global_pool="avg", fc_norm=True)),
    "clip_pre_norm": ("vit_base_patch16_clip_224", {}),
    "dinov3_rotary_registers": ("vit_base_patch16_dinov3", dict(num_classes=0)),
    "eva02_rotary_swiglu": ("eva02_tiny_patch14_224", dict(patch_size=8, img_size=32)),
}
CALLS = [
    dict(),
    dict(indices=2, norm=True),
    dict(indices=[0, -1], output_fmt="NLC", return_prefix_tokens=True),
    dict(indices=[1, 0], return_prefix_tokens=True),
    dict(indices=[0], stop_early=True, norm=True),
    dict(indices=1, intermediates_only=True),
    dict(indices=[1], output_dict=True, return_prefix_tokens=True),
]


def convert_timm(name, args, folder, seed=3):
    """A random timm model (position tables resized at any input size) and its `hubvit convert timm` body."""
    source = randomize_(timm.create_model(name, pretrained=False, dynamic_img_size=True, **{**TINY_TIMM, **args}), seed)
    save_for_hf(source.eval(), folder / "timm", safe_serialization=True)
    hubvit.convert_timm(folder / "timm", folder / "hubvit")
    model = HubViTForImageClassification.from_pretrained(folder / "hubvit").eval()
    return source, model.hubvit


@pytest.fixture(scope="module")
def timm_pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("timm")
    return {
        family: convert_timm(name, args, root / family, seed=len(family))
        for family, (name, args) in TIMM_FAMILIES.items()
    }


def leaves(result):
    """Every tensor of a forward_intermediates result, in order (dicts by key)."""
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, dict):
        return [tensor for key in sorted(result) for tensor in leaves(result[key])]
    return [tensor for item in result for tensor in leaves(item)]


@pytest.mark.parametrize("family", list(TIMM_FAMILIES))
def test_forward_intermediates_matches_timm(timm_pairs, family):
    source, body = timm_pairs[family]
    patch = body.config.patch_size
    x = pixels(3 * patch, 5 * patch, seed=2)  # 3 x 5 patches, the native grid is 2 x 2 or 4 x 4
    accepts = inspect.signature(source.forward_intermediates).parameters
    with torch.no_grad():
        for call in [call for call in CALLS if set(call) <= set(accepts)]:  # Eva has no `output_dict`
            expected, actual = source.forward_intermediates(x, **call), body.forward_intermediates(x, **call)
            assert type(actual) is type(expected), call
            if isinstance(expected, dict):
                assert sorted(actual) == sorted(expected), call
            expected, actual = leaves(expected), leaves(actual)
            assert [t.shape for t in actual] == [t.shape for t in expected], call
            for ours, theirs in zip(actual, expected):
                assert relative_error(ours, theirs) <= RTOL, (call, relative_error(ours, theirs))


@pytest.mark.parametrize(
    "call, message",
    [
        (dict(indices=3), "indices=3 asks for the last 3 blocks; expected 1 to 2"),
        (dict(indices=[0, 2]), "expected block indices 0 to 1 (or -2 to -1)"),
        (dict(indices=[]), "names no block"),
        (dict(output_fmt="NHWC"), "output_fmt='NHWC' is not supported; expected 'NCHW' or 'NLC'"),
    ],
)
def test_forward_intermediates_refuses_bad_arguments_naming_them(call, message):
    with pytest.raises(ValueError) as error:
        HubViTModel(tiny_config()).forward_intermediates(pixels(32, 32), **call)
    assert message in str(error.value)


def test_pruned_model_keeps_timms_intermediates_and_saves_as_pruned(tmp_path):
    """`prune_intermediate_layers` drops the blocks timm's drops (same indices returned); the pruned model's
    intermediates equal timm's pruned ones, and it reloads as saved."""
    source, body = convert_timm("vit_base_patch16_224", dict(depth=4), tmp_path)
    assert body.prune_intermediate_layers([0, 2]) == source.prune_intermediate_layers([0, 2], prune_head=False)
    assert len(body.encoder.layers) == len(source.blocks) == 3
    assert (body.config.num_hidden_layers, body.config.out_indices) == (3, [1, 3])
    x = pixels(24, 40)
    with torch.no_grad():
        expected = source.forward_intermediates(x, indices=[0, 2], norm=True)
        actual = body.forward_intermediates(x, indices=[0, 2], norm=True)
        for ours, theirs in zip(leaves(actual), leaves(expected)):
            assert relative_error(ours, theirs) <= RTOL
        body.save_pretrained(tmp_path / "pruned")
        reloaded, info = HubViTModel.from_pretrained(tmp_path / "pruned", output_loading_info=True)
        assert not any(info.values()), info
        assert torch.equal(reloaded.eval()(x).last_hidden_state, body(x).last_hidden_state)


# ------------------------------------------------------------------------ a segmentation head that travels in the folder

LABELS = dict(id2label={0: "background", 1: "one", 2: "two"}, label2id={"background": 0, "one": 1, "two": 2})


def segmentation_model(seed=8, **overrides):
    return randomize_(HubViTForSemanticSegmentation(tiny_config(num_labels=3, **LABELS, **overrides)), seed).eval()


def test_segmentation_logits_are_one_linear_map_of_each_normed_patch_token():
    """Logits on the patch grid (prefix tokens dropped), row-major like the feature maps."""
    model = segmentation_model(num_register_tokens=1)
    x = pixels(24, 40)
    with torch.no_grad():
        logits = model(x).logits
        tokens = model.hubvit(x).last_hidden_state[:, 2:]
        expected = model.decode_head(tokens).reshape(2, 3, 5, 3).permute(0, 3, 1, 2)
    assert logits.shape == (2, 3, 3, 5)
    assert torch.equal(logits, expected)


def test_segmentation_loss_is_the_cross_entropy_of_upsampled_logits_without_ignored_pixels():
    model = segmentation_model()
    x = pixels(24, 40)
    labels = torch.full((2, 24, 40), 255)
    labels[:, 4:12, 8:30] = torch.randint(0, 3, (2, 8, 22), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        outputs = model(x, labels=labels)
        upsampled = torch.nn.functional.interpolate(outputs.logits, size=(24, 40), mode="bilinear")
        log_probabilities = upsampled.log_softmax(dim=1)
        kept = labels != 255
        picked = log_probabilities.permute(0, 2, 3, 1)[kept].gather(1, labels[kept][:, None])
    assert relative_error(outputs.loss, -picked.mean()) <= RTOL


def test_segmentation_head_learns_a_fixed_labelling():
    """40 Adam steps on two images take the loss to under half its start: gradients reach the head and the body."""
    model = segmentation_model().train()
    x = pixels(32, 32)
    labels = torch.randint(0, 3, (2, 4, 4), generator=torch.Generator().manual_seed(1)).repeat_interleave(8, 1)
    labels = labels.repeat_interleave(8, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        loss = model(x, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses[::10]


def test_segmentation_model_starts_from_a_classifiers_folder_with_its_body_and_a_new_head(tmp_path):
    """Same number of classes, so a head sharing the classifier's name would load it silently: `decode_head` is
    reported missing (initialised), the image classifier ignored, the body loaded as saved."""
    classifier = randomize_(HubViTForImageClassification(tiny_config(num_labels=3)), seed=9).eval()
    folder = write_folder(classifier, tmp_path / "classifier")
    model, info = HubViTForSemanticSegmentation.from_pretrained(folder, output_loading_info=True)
    assert set(info["missing_keys"]) == {"decode_head.weight", "decode_head.bias"}
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    for name, tensor in classifier.hubvit.state_dict().items():
        assert torch.equal(model.hubvit.state_dict()[name], tensor), name


def test_segmentation_labels_of_the_wrong_shape_are_refused_naming_it():
    with pytest.raises(ValueError, match=r"labels must be \(batch, height, width\) .* got shape \(2, 24\)"):
        segmentation_model()(pixels(24, 40), labels=torch.zeros(2, 24, dtype=torch.long))


def test_segmentation_folder_serves_the_image_segmentation_pipeline_without_hubvit(tmp_path):
    """`pipeline("image-segmentation", model=folder, trust_remote_code=True)` where hubvit cannot be imported gives
    the masks and labels the installed hubvit gives (SegformerImageProcessor upsamples and takes the argmax)."""
    import numpy as np
    from PIL import Image
    from transformers import SegformerImageProcessor, pipeline

    model = segmentation_model()
    processor = SegformerImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    folder = write_folder(model, tmp_path / "segmenter", image_processor=processor)
    assert json.loads((folder / "config.json").read_text())["auto_map"]["AutoModelForSemanticSegmentation"] == (
        "modeling_hubvit.HubViTForSemanticSegmentation"
    )
    image = tmp_path / "image.png"
    Image.fromarray((np.random.default_rng(0).random((40, 56, 3)) * 255).astype("uint8")).save(image)
    expected = [
        (row["label"], np.asarray(row["mask"]).tolist())
        for row in pipeline("image-segmentation", model=str(folder))(str(image))
    ]
    assert {label for label, _ in expected} <= set(LABELS["label2id"])
    assert all(len(mask) == 40 and len(mask[0]) == 56 for _, mask in expected), "masks at the image's size"
    isolated = run_without_hubvit(
        f"""
        import json
        import numpy as np
        from transformers import pipeline
        segmenter = pipeline("image-segmentation", model={str(folder)!r}, trust_remote_code=True)
        rows = segmenter({str(image)!r})
        print(json.dumps(dict(
            module=type(segmenter.model).__module__,
            rows=[[row["label"], np.asarray(row["mask"]).tolist()] for row in rows],
        )))
        """,
        cwd=tmp_path,
    )
    assert isolated["module"].startswith("transformers_modules.")
    assert [tuple(row) for row in isolated["rows"]] == expected
