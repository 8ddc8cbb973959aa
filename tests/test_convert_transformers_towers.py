"""`hubvit convert transformers` on the vision towers beyond ViT: DINOv3 ViT (and its backbone), SigLIP and CLIP (vision
models and the dual encoders' towers), AIMv2, I-JEPA, BEiT and Data2Vec-vision.

Each folder is written by transformers' own `save_pretrained` from a randomised model and converted through the CLI;
the converted folder, loaded as remote code, is compared with the transformers model itself on the same batch:
`last_hidden_state` and `pooler_output`, at the native size and (where the class runs at other sizes) at one two
patches larger. Tolerance: float32 parity, 1e-5 of the output scale (the same operations grouped differently:
fused q/k/v, DINOv3's angles from periods rather than inverse frequencies, about 1e-7 apart).
"""

import json

import pytest
import torch
import transformers
from transformers import AutoImageProcessor, AutoModel

from hubvit import HubViTBackbone
from hubvit.cli import main as cli
from utils import randomize_, relative_error

SMALL = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8
)
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=99)

# name: (architecture, config fields on top of SMALL, hubvit fields the conversion must produce, sizes to compare)
TOWERS = {
    "dinov3_registers": (
        "DINOv3ViTModel",
        dict(num_register_tokens=2),
        dict(rope_type="dinov3", num_register_tokens=2, key_bias=False, position_embedding_type="none"),
        (32, 48),
    ),
    "dinov3_gated_key_bias": (
        "DINOv3ViTModel",
        dict(use_gated_mlp=True, hidden_act="silu", key_bias=True),
        dict(mlp_type="gated", key_bias=True),
        (32, 48),
    ),
    "siglip": ("SiglipVisionModel", {}, dict(class_token=False, pooling="map"), (32, 48)),
    "metaclip2": ("MetaClip2VisionModel", {}, dict(pre_norm=True, patch_bias=False, fc_norm=True), (32, 48)),
    "git": ("GitVisionModel", {}, dict(pre_norm=True, fc_norm=False, final_norm=True, pooling="cls"), (32, 48)),
    "internvl_mean_pooling": ("InternVLVisionModel", {}, dict(layer_scale_init_value=0.1, final_norm=False), (32, 48)),
    "internvl_rms_biases": (
        "InternVLVisionModel",
        dict(norm_type="rms_norm", attention_bias=True),
        dict(norm_type="rms_norm", qkv_bias=True, pooling="none"),
        (32, 48),
    ),
    "internvl_final_norm": ("InternVLVisionModel", dict(use_mean_pooling=False), dict(final_norm=True), (32, 48)),
    # Idefics3 and SmolVLM bucket each image's positions, which is the table itself at the native size only
    "idefics3": ("Idefics3VisionTransformer", {}, dict(class_token=False, pooling="none"), (32,)),
    "smolvlm": ("SmolVLMVisionTransformer", {}, dict(class_token=False, pooling="none"), (32,)),
    "clip": (
        "CLIPVisionModel",
        {},
        dict(pre_norm=True, patch_bias=False, fc_norm=True, hidden_act="quick_gelu"),
        (32, 48),
    ),
    "aimv2": (
        "Aimv2VisionModel",
        {},
        dict(norm_type="rms_norm", patch_norm=True, mlp_type="gated", pooling="map"),
        (32,),
    ),
    "aimv2_biases": (
        "Aimv2VisionModel",
        dict(qkv_bias=True, mlp_bias=True),
        dict(proj_bias=True, mlp_bias=True),
        (32,),
    ),
    "ijepa": ("IJepaModel", {}, dict(class_token=False, pooling="none", interpolation_antialias=False), (32, 48)),
    "beit_relative_mean": (
        "BeitModel",
        dict(use_relative_position_bias=True),
        dict(position_embedding_type="relative_2d_class", pooling="mean", fc_norm=True),
        (32, 48),
    ),
    "beit_shared_and_own_tables_cls": (
        "BeitModel",
        dict(use_relative_position_bias=True, use_shared_relative_position_bias=True, use_mean_pooling=False),
        dict(position_embedding_type="relative_2d_class", pooling="cls"),
        (32, 48),
    ),
    "beit_absolute_no_layer_scale": (
        "BeitModel",
        dict(use_absolute_position_embeddings=True, layer_scale_init_value=0.0),
        dict(position_embedding_type="learned", layer_scale_init_value=None),
        (32, 48),
    ),
    "data2vec_without_pooler": (
        "Data2VecVisionModel",
        dict(use_relative_position_bias=True),
        dict(pooling="none", final_norm=False),
        (32, 48),
    ),
}
DUAL = {  # the dual encoders: (architecture, config class, vision config class)
    "siglip_model": ("SiglipModel", "SiglipConfig", "SiglipVisionConfig"),
    "clip_model": ("CLIPModel", "CLIPConfig", "CLIPVisionConfig"),
    "metaclip2_model": ("MetaClip2Model", "MetaClip2Config", "MetaClip2VisionConfig"),
}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def source_model(architecture, **fields):
    cls = getattr(transformers, architecture)
    return randomize_(cls(cls.config_class(**SMALL, **fields)), seed=len(architecture)).eval()


def dual_model(architecture, config_class, vision_class):
    vision = getattr(transformers, vision_class)(**SMALL).to_dict()
    config = getattr(transformers, config_class)(vision_config=vision, text_config=TEXT)
    return randomize_(getattr(transformers, architecture)(config), seed=1).eval()


@torch.no_grad()
def assert_same_outputs(vision, converted, sizes, resize):
    """Both outputs of `converted` against the transformers vision model, at every size (1e-5 of the scale)."""
    for size in sizes:
        pixels = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(size))
        theirs = vision(pixel_values=pixels, **(resize if size != 32 else {}))
        ours = converted(pixel_values=pixels)
        assert relative_error(ours.last_hidden_state, theirs.last_hidden_state) <= 1e-5, size
        pooled = getattr(theirs, "pooler_output", None)
        if pooled is None and ours.pooler_output is not None:  # GIT's tower: hubvit pools its normed [CLS]
            pooled = theirs.last_hidden_state[:, 0]
        if pooled is None:
            assert ours.pooler_output is None
        else:
            assert relative_error(ours.pooler_output, pooled) <= 1e-5, size


@pytest.mark.parametrize("name", list(TOWERS))
def test_a_tower_converts_and_matches_transformers(name, tmp_path):
    architecture, fields, expected, sizes = TOWERS[name]
    source = source_model(architecture, **fields)
    source.save_pretrained(tmp_path / "src")
    assert cli(["convert", "transformers", str(tmp_path / "src"), str(tmp_path / "out")]) == 0
    converted = AutoModel.from_pretrained(tmp_path / "out", trust_remote_code=True).eval()
    for field, value in expected.items():
        assert getattr(converted.config, field) == value, (field, getattr(converted.config, field))
    resize = {} if architecture.startswith("DINOv3") else {"interpolate_pos_encoding": True}
    assert_same_outputs(source, converted, sizes, resize)


@pytest.mark.parametrize("name", list(DUAL))
def test_a_dual_encoder_folder_gives_its_vision_tower(name, tmp_path, capsys):
    source = dual_model(*DUAL[name])
    source.save_pretrained(tmp_path / "src")
    assert cli(["convert", "transformers", str(tmp_path / "src"), str(tmp_path / "out")]) == 0
    assert "outside the vision tower under 'vision_model.'" in capsys.readouterr().out
    converted = AutoModel.from_pretrained(tmp_path / "out", trust_remote_code=True).eval()
    assert_same_outputs(source.vision_model, converted, (32, 48), {"interpolate_pos_encoding": True})


@torch.no_grad()
def test_a_converted_dinov3_backbone_gives_transformers_feature_maps(tmp_path):
    """transformers' `DINOv3ViTBackbone` folder, converted: hubvit's `AutoBackbone` returns the same maps (normed,
    prefix tokens removed, (batch, hidden, rows, columns)) for the same stages. (transformers 5.10 to 5.25 cannot
    read a local folder through `AutoBackbone.from_pretrained`: tests/test_backbone.py covers that route.)"""
    source = randomize_(
        transformers.DINOv3ViTBackbone(transformers.DINOv3ViTConfig(**SMALL, num_register_tokens=1, out_indices=[1, 2]))
    ).eval()
    source.save_pretrained(tmp_path / "src")
    assert cli(["convert", "transformers", str(tmp_path / "src"), str(tmp_path / "out")]) == 0
    ours = HubViTBackbone.from_pretrained(tmp_path / "out", out_indices=[1, 2]).eval()
    pixels = torch.randn(2, 3, 40, 48, generator=torch.Generator().manual_seed(0))
    theirs, mine = source(pixels).feature_maps, ours(pixels).feature_maps
    assert len(theirs) == len(mine) == 2
    for expected, got in zip(theirs, mine):
        assert got.shape == expected.shape == (2, 64, 5, 6)
        assert relative_error(got, expected) <= 1e-5


def test_the_image_processor_and_the_papers_travel_with_the_folder(tmp_path):
    """A SigLIP folder's own processor (bicubic, mean = std = 0.5) is the converted folder's; its card cites SigLIP
    and SigLIP 2 by title."""
    source_model("SiglipVisionModel").save_pretrained(tmp_path / "src")
    transformers.SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path / "src")
    assert cli(["convert", "transformers", str(tmp_path / "src"), str(tmp_path / "out")]) == 0
    processor = AutoImageProcessor.from_pretrained(tmp_path / "out")
    assert list(processor.image_mean) == [0.5, 0.5, 0.5] and processor.size["height"] == 32
    card = (tmp_path / "out" / "README.md").read_text()
    assert "Sigmoid Loss for Language Image Pre-Training" in card and "SigLIP 2: Multilingual" in card


@pytest.mark.parametrize(
    "architecture, title",
    [
        ("DINOv3ViTModel", "title = {DINOv3}"),
        ("CLIPVisionModel", "Learning Transferable Visual Models From Natural Language Supervision"),
        ("Aimv2VisionModel", "Multimodal Autoregressive Pre-training of Large Vision Encoders"),
        ("IJepaModel", "Self-Supervised Learning from Images with a Joint-Embedding Predictive Architecture"),
        ("BeitModel", "BEiT: BERT Pre-Training of Image Transformers"),
        ("Data2VecVisionModel", "data2vec: A General Framework for Self-supervised Learning"),
    ],
)
def test_the_card_of_each_tower_cites_its_paper_by_title(tmp_path, architecture, title):
    source_model(architecture).save_pretrained(tmp_path / "src")
    assert cli(["convert", "transformers", str(tmp_path / "src"), str(tmp_path / "out"), "--no-verify"]) == 0
    assert title in (tmp_path / "out" / "README.md").read_text()


@pytest.mark.parametrize(
    "architecture, fields, message",
    [
        ("Aimv2VisionModel", dict(is_native=True, use_head=False), "is_native=True"),
        (
            "BeitModel",
            dict(use_absolute_position_embeddings=True, use_relative_position_bias=True),
            "use_absolute_position_embeddings=True beside a relative position bias",
        ),
        ("DINOv3ViTModel", dict(query_bias=True, value_bias=False), "query_bias=True, value_bias=False"),
        ("InternVLVisionModel", dict(use_qk_norm=True), "use_qk_norm=True (one RMSNorm over all heads"),
    ],
)
def test_what_hubvit_cannot_express_is_refused_by_name(tmp_path, capsys, architecture, fields, message):
    source_model(architecture, **fields).save_pretrained(tmp_path / "src")
    assert cli(["convert", "transformers", str(tmp_path / "src"), str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def edited_config(folder, edit):
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c.pop("vision_config"), "config.json has no vision_config: a CLIPVision tower is described there"),
        (
            lambda c: c.update(vision_config={"hidden_size": 32, "patch_size": 8}),
            "the vision_config of CLIPModel it describes (unset fields at CLIPVisionConfig's defaults) is no ViT "
            "hubvit can build: hidden_size=32 is not divisible by num_attention_heads=12",
        ),
    ],
    ids=["no-vision-config", "truncated-vision-config"],
)
def test_a_dual_encoder_config_without_a_usable_vision_config_is_refused_naming_it(tmp_path, capsys, edit, message):
    dual_model(*DUAL["clip_model"]).save_pretrained(tmp_path / "src")
    edited_config(tmp_path / "src", edit)
    assert cli(["convert", "transformers", str(tmp_path / "src"), str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error, error
    assert not (tmp_path / "out").exists()


def test_a_folder_whose_config_and_weights_disagree_is_refused_naming_the_tensor(tmp_path, capsys):
    """Two register tokens saved, none in config.json: transformers cannot load the folder it would verify against."""
    source_model("DINOv3ViTModel", num_register_tokens=2).save_pretrained(tmp_path / "src")
    edited_config(tmp_path / "src", lambda c: c.update(num_register_tokens=0))
    assert cli(["convert", "transformers", str(tmp_path / "src"), str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "config.json and the weights disagree" in error and "Traceback" not in error, error
    assert "embeddings.register_tokens saved (1, 2, " in error
    assert not (tmp_path / "out").exists()


def test_a_folder_of_another_class_names_every_class_read(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.json").write_text(json.dumps({"architectures": ["SwinModel"], "model_type": "swin"}))
    assert cli(["convert", "transformers", str(tmp_path / "src"), str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "SwinModel" in error and all(name in error for name in ("DINOv3ViTModel", "SiglipModel", "BeitModel"))


# towers whose folder exports to another class computing the same function (MetaCLIP 2 as CLIP, Idefics3 and
# SmolVLM as SigLIP 2) or to none (GIT's, with data2vec's without its pooler): the hubvit config does not record them
NO_WAY_BACK = {"data2vec_without_pooler", "metaclip2", "git", "idefics3", "smolvlm"}
NO_WAY_BACK |= {"internvl_mean_pooling", "internvl_rms_biases", "internvl_final_norm"}  # no exporter for InternVL yet


@pytest.mark.parametrize("name", [name for name in TOWERS if name not in NO_WAY_BACK])
@torch.no_grad()
def test_a_converted_tower_exports_back_to_its_transformers_class(name, tmp_path):
    """transformers model -> `hubvit convert transformers` -> `hubvit export transformers` -> `from_pretrained`: the
    exported folder is the source's class and computes what the source computed (1e-5 of the output scale)."""
    architecture, fields, _, _ = TOWERS[name]
    source = source_model(architecture, **fields)
    source.save_pretrained(tmp_path / "src")
    assert cli(["convert", "transformers", str(tmp_path / "src"), str(tmp_path / "hubvit")]) == 0
    assert cli(["export", "transformers", str(tmp_path / "hubvit"), str(tmp_path / "back")]) == 0
    assert json.loads((tmp_path / "back" / "config.json").read_text())["architectures"] == [architecture]
    exported = getattr(transformers, architecture).from_pretrained(tmp_path / "back").eval()
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    theirs, ours = source(pixel_values=pixels), exported(pixel_values=pixels)
    assert relative_error(ours.last_hidden_state, theirs.last_hidden_state) <= 1e-5
    if theirs.pooler_output is not None:
        assert relative_error(ours.pooler_output, theirs.pooler_output) <= 1e-5


def test_a_folder_no_transformers_class_reads_back_is_refused_naming_the_closest(tmp_path, capsys):
    """Data2Vec saved without its pooler has no final norm; BEiT, the closest class, always has one."""
    source_model("Data2VecVisionModel", use_relative_position_bias=True).save_pretrained(tmp_path / "src")
    assert cli(["convert", "transformers", str(tmp_path / "src"), str(tmp_path / "hubvit")]) == 0
    assert cli(["export", "transformers", str(tmp_path / "hubvit"), str(tmp_path / "back")]) == 2
    error = capsys.readouterr().err
    assert "final_norm=False (transformers' BeitModel built from its config reads back as True)" in error
    assert not (tmp_path / "back").exists()


def test_an_aimv2_folder_whose_head_query_was_trained_is_not_exported_as_aimv2(tmp_path, capsys):
    """The converter creates AIMv2's identity query projection; a folder where it no longer is one (fine-tuned)
    computes what `Aimv2VisionModel` cannot, and the export says which tensor."""
    from safetensors.torch import load_file, save_file

    source_model("Aimv2VisionModel").save_pretrained(tmp_path / "src")
    assert cli(["convert", "transformers", str(tmp_path / "src"), str(tmp_path / "hubvit")]) == 0
    weights = load_file(tmp_path / "hubvit" / "model.safetensors")
    key = next(k for k in weights if k.endswith("pooler.map_head.q.weight"))
    weights[key] = weights[key] * 1.5
    save_file(weights, tmp_path / "hubvit" / "model.safetensors", metadata={"format": "pt"})
    assert cli(["export", "transformers", str(tmp_path / "hubvit"), str(tmp_path / "back")]) == 2
    assert "pooler.map_head.q.weight must hold what Aimv2VisionModel implies" in capsys.readouterr().err
    assert not (tmp_path / "back").exists()


def test_a_tower_folder_with_a_classifier_is_refused_by_the_tower_export(tmp_path, capsys):
    """A converted DINOv3 fine-tuned with a head: `DINOv3ViTModel` has none, so nothing is written."""
    from hubvit import HubViTForImageClassification
    from hubvit.folder import write_folder

    source_model("DINOv3ViTModel").save_pretrained(tmp_path / "src")
    assert cli(["convert", "transformers", str(tmp_path / "src"), str(tmp_path / "hubvit")]) == 0
    body = AutoModel.from_pretrained(tmp_path / "hubvit", trust_remote_code=True)
    classifier = HubViTForImageClassification(body.config.__class__(**{**body.config.to_dict(), "num_labels": 3}))
    write_folder(classifier, tmp_path / "headed")
    assert cli(["export", "transformers", str(tmp_path / "headed"), str(tmp_path / "back")]) == 2
    assert "DINOv3ViTModel is a vision model without a classification head" in capsys.readouterr().err


def test_a_converted_dinov2_backbone_gives_transformers_feature_maps(tmp_path):
    """`Dinov2Backbone` converts as its body; hubvit's backbone on the folder returns transformers' maps."""
    config = transformers.Dinov2Config(**SMALL, mlp_ratio=2, out_indices=[1, 2], reshape_hidden_states=True)
    source = randomize_(transformers.Dinov2Backbone(config)).eval()
    source.save_pretrained(tmp_path / "src")
    assert cli(["convert", "transformers", str(tmp_path / "src"), str(tmp_path / "out")]) == 0
    ours = HubViTBackbone.from_pretrained(tmp_path / "out", out_indices=[1, 2]).eval()
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs, mine = source(pixels).feature_maps, ours(pixels).feature_maps
    assert len(theirs) == len(mine) == 2
    for expected, got in zip(theirs, mine):
        assert got.shape == expected.shape
        assert relative_error(got, expected) <= 1e-5


@torch.no_grad()
def test_an_mae_pretraining_folder_gives_its_encoder_and_names_the_decoder_it_drops(tmp_path, capsys):
    """`ViTMAEForPreTraining`: the encoder converts; its pixel decoder is dropped by name. Against transformers'
    `ViTMAEModel` with no patch masked and none shuffled (mask ratio 0, noise that sorts to the identity)."""
    decoder = dict(decoder_hidden_size=16, decoder_num_hidden_layers=1, decoder_num_attention_heads=2)
    source = randomize_(transformers.ViTMAEForPreTraining(transformers.ViTMAEConfig(**SMALL, **decoder))).eval()
    source.save_pretrained(tmp_path / "src")
    assert cli(["convert", "transformers", str(tmp_path / "src"), str(tmp_path / "out")]) == 0
    assert "MAE's pixel decoder of pre-training, not part of the encoder" in capsys.readouterr().out
    converted = AutoModel.from_pretrained(tmp_path / "out", trust_remote_code=True).eval()
    encoder = transformers.ViTMAEModel.from_pretrained(tmp_path / "src", mask_ratio=0.0).eval()
    for size in (32, 48):
        pixels = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(size))
        noise = torch.arange((size // 8) ** 2, dtype=torch.float32).expand(2, -1)
        theirs = encoder(pixel_values=pixels, noise=noise, interpolate_pos_encoding=size != 32).last_hidden_state
        assert relative_error(converted(pixel_values=pixels).last_hidden_state, theirs) <= 1e-5, size
