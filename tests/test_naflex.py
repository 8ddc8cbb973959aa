"""Native resolution (issue 49, first part): a batch of images at their own sizes as patch sequences, SigLIP 2's
NaFlex interface (`pixel_values` (B, N, P*P*C), `pixel_attention_mask`, `spatial_shapes`) on `HubViTModel` and the
classifier, and transformers' `Siglip2VisionModel` converted and checked against itself on such a batch.

The batches come from transformers' own `Siglip2ImageProcessor` (aspect ratio kept under a patch budget, patches in
row, column, channel order, padded to the budget). Tolerance: 1e-5 of the output scale (float32, the same
operations in another order: the position tables are resized by `F.interpolate` here and by an explicit weight
matrix in transformers).
"""

import numpy as np
import pytest
import torch
import transformers
from transformers import AutoModel

from hubvit import HubViTForImageClassification, HubViTModel
from hubvit.cli import main as cli
from utils import randomize_, relative_error, tiny_config

SIZES = ((20, 40), (40, 16), (24, 24), (8, 44))  # wide, tall, square, a strip: four aspect ratios


def images(sizes=SIZES, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]


def processor(max_num_patches=24, patch_size=4):
    return transformers.Siglip2ImageProcessor(patch_size=patch_size, max_num_patches=max_num_patches)


def siglip2_tower(**fields):
    config = transformers.Siglip2VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, patch_size=4, num_patches=16
    )
    for name, value in fields.items():
        setattr(config, name, value)
    return randomize_(transformers.Siglip2VisionModel(config).eval(), seed=3)


def padded_error(ours, theirs, mask):
    """Relative error over the real patches only: what a model writes at padded positions is nobody's output."""
    return relative_error(ours[mask], theirs[mask])


@pytest.mark.parametrize("head", [True, False], ids=["map-head", "no-head"])
@torch.no_grad()
def test_a_siglip2_naflex_tower_converts_and_matches_transformers_on_a_mixed_batch(tmp_path, head):
    source = siglip2_tower(vision_use_head=head)
    source.save_pretrained(tmp_path / "siglip2")
    assert cli(["convert", "transformers", str(tmp_path / "siglip2"), str(tmp_path / "out")]) == 0
    model = AutoModel.from_pretrained(tmp_path / "out", trust_remote_code=True).eval()
    inputs = processor()(images=images(), return_tensors="pt")
    assert len(set(map(tuple, inputs["spatial_shapes"].tolist()))) == 4
    theirs, ours = source(**inputs), model(**inputs)
    mask = inputs["pixel_attention_mask"].bool()
    assert padded_error(ours.last_hidden_state, theirs.last_hidden_state, mask) <= 1e-5
    if head:
        assert relative_error(ours.pooler_output, theirs.pooler_output) <= 1e-5
    else:
        assert theirs.pooler_output is None and ours.pooler_output is None


@torch.no_grad()
def test_the_vision_tower_of_a_siglip2_dual_encoder_converts_the_same_way(tmp_path):
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=99)
    vision = siglip2_tower().config.to_dict()
    source = randomize_(transformers.Siglip2Model(transformers.Siglip2Config(text_config=text, vision_config=vision)))
    source.eval().save_pretrained(tmp_path / "siglip2")
    assert cli(["convert", "transformers", str(tmp_path / "siglip2"), str(tmp_path / "out")]) == 0
    model = AutoModel.from_pretrained(tmp_path / "out", trust_remote_code=True).eval()
    inputs = processor()(images=images(), return_tensors="pt")
    theirs, ours = source.vision_model(**inputs), model(**inputs)
    assert relative_error(ours.pooler_output, theirs.pooler_output) <= 1e-5


POOLINGS = {
    "map": dict(class_token=False, pooling="map"),
    "mean": dict(class_token=False, pooling="mean", fc_norm=True),
    "cls-registers": dict(pooling="cls", num_register_tokens=2),
    "cls-mean": dict(pooling="cls_mean"),
}


@pytest.mark.parametrize("pooling", list(POOLINGS))
@torch.no_grad()
def test_each_image_of_a_mixed_batch_gives_what_it_gives_alone(pooling):
    """Padding changes nothing: every token and the pooled vector of an image in a padded batch of four aspect
    ratios equal that image's own sequence, unpadded (1e-5 of the scale)."""
    config = tiny_config(patch_size=4, image_size=16, **POOLINGS[pooling])
    model = randomize_(HubViTModel(config), seed=5).eval()
    make = processor()
    batch = make(images=images(), return_tensors="pt")
    together = model(**batch)
    assert (batch["pixel_attention_mask"].sum(-1) < 24).sum() >= 2  # at least two images are padded in the batch
    prefix = config.num_prefix_tokens
    for index, image in enumerate(images()):
        alone = unpadded(make(images=[image], return_tensors="pt"))
        count = prefix + alone["pixel_values"].shape[1]
        alone = model(**alone)
        assert relative_error(together.last_hidden_state[index, :count], alone.last_hidden_state[0]) <= 1e-5
        assert relative_error(together.pooler_output[index], alone.pooler_output[0]) <= 1e-5


def unpadded(single):
    """One image's processor output cut to its own patches: the sequence with no padding at all."""
    count = int(single["pixel_attention_mask"].sum())
    return dict(
        pixel_values=single["pixel_values"][:, :count],
        pixel_attention_mask=single["pixel_attention_mask"][:, :count],
        spatial_shapes=single["spatial_shapes"],
    )


WHOLE = {
    "no-prefix-map": dict(class_token=False, pooling="map"),
    "cls-row-registers": dict(num_register_tokens=2),
    "registers-without-rows-keep-aspect": dict(
        num_register_tokens=2, position_embedding_includes_prefix=False, interpolation_keep_aspect=True
    ),
    "row-column-tables": dict(position_embedding_type="learned_2d"),
    "sincos": dict(position_embedding_type="sincos_2d", class_token=False, pooling="mean"),
    "axial-rotary-beside-a-table": dict(rope_type="axial"),
    "axial-rotary-reference-grid-offset-xy": dict(
        rope_type="axial", rope_reference_grid=[3, 5], rope_grid_offset=1.0, rope_grid_indexing="xy"
    ),
    "dinov3-rotary-max-normalised": dict(
        rope_type="dinov3", position_embedding_type="none", rope_normalize_coords="max", num_register_tokens=2
    ),
    "mixed-rotary-learned-frequencies": dict(rope_type="mixed", position_embedding_type="none"),
}


@pytest.mark.parametrize("fields", list(WHOLE))
@torch.no_grad()
def test_an_unpadded_sequence_of_a_whole_image_computes_what_the_image_does(fields):
    """One image as its full grid of patches, nothing padded, is the (B, C, H, W) forward on the same pixels: the
    prefix tokens keep their table rows, each position kind gives the same table."""
    config = tiny_config(patch_size=4, image_size=16, num_labels=3, **WHOLE[fields])
    model = randomize_(HubViTForImageClassification(config), seed=6).eval()
    pixels = torch.randn(1, 3, 20, 28, generator=torch.Generator().manual_seed(0))
    patches = pixels.reshape(1, 3, 5, 4, 7, 4).permute(0, 2, 4, 3, 5, 1).reshape(1, 35, 48)
    sequence = model(patches, pixel_attention_mask=torch.ones(1, 35), spatial_shapes=torch.tensor([[5, 7]]))
    assert relative_error(sequence.logits, model(pixels).logits) <= 1e-5


@pytest.mark.parametrize(
    "fields",
    [
        {},
        dict(position_embedding_type="learned_2d"),
        dict(position_embedding_type="sincos_2d", class_token=False, pooling="mean"),
        dict(rope_type="dinov3", position_embedding_type="none"),
        dict(rope_type="mixed"),
    ],
    ids=["table", "row-column-tables", "sincos", "dinov3-rotary", "mixed-rotary-beside-a-table"],
)
@torch.no_grad()
def test_the_classifier_takes_a_mixed_batch(fields):
    """Each image of a batch of four aspect ratios, padded to the longest, gets the logits it gets alone: a rotary
    kind turns each image's patches by the coordinates of its own grid."""
    config = tiny_config(patch_size=4, image_size=16, num_labels=3, **fields)
    model = randomize_(HubViTForImageClassification(config), seed=7).eval()
    make = processor()  # (its padding runs to the budget, beyond the longest image)
    logits = model(**make(images=images(), return_tensors="pt")).logits
    alone = torch.cat([model(**unpadded(make(images=[image], return_tensors="pt"))).logits for image in images()])
    assert logits.shape == (4, 3) and relative_error(logits, alone) <= 1e-5


@pytest.mark.parametrize(
    "change, message",
    [
        (
            dict(position_embedding_type="relative_2d"),
            "patch sequences (spatial_shapes) take position tables and rotary kinds",
        ),
        (
            dict(attention_window_size=2, class_token=False, pooling="mean"),
            "patch sequences (spatial_shapes) need one grid per image; attention_window_size=2",
        ),
    ],
)
def test_a_model_whose_blocks_read_one_grid_refuses_patch_sequences(change, message):
    model = HubViTModel(tiny_config(patch_size=4, image_size=16, **change)).eval()
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        model(**processor()(images=images(), return_tensors="pt"))


def move_last_patch_past_a_padding_slot(batch):
    """The count still equals `spatial_shapes`, but a padding slot now sits before the image's last patch."""
    mask = batch["pixel_attention_mask"]
    image = int((mask.sum(-1) < mask.shape[1]).nonzero()[0])
    last = int(mask[image].sum()) - 1
    mask[image, last], mask[image, last + 1] = 0, 1


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda b: b.update(pixel_values=b["pixel_values"][..., :-1]), r"pixel_values must be \(batch, patches, 48\)"),
        (lambda b: b.update(spatial_shapes=b["spatial_shapes"][:2]), r"spatial_shapes must be \(batch, 2\) = \(4, 2\)"),
        (lambda b: b["pixel_attention_mask"][0, -1].fill_(1), r"pixel_attention_mask marks \[.*\] patches per image"),
        (lambda b: b.pop("pixel_attention_mask"), r"pixel_attention_mask must be \(batch, patches\) = \(4, 24\)"),
        (move_last_patch_past_a_padding_slot, r"pixel_attention_mask of image \d has a hole at position \d+"),
    ],
    ids=["patch-width", "shapes-rows", "mask-count", "mask-missing", "mask-hole"],
)
def test_a_patch_sequence_batch_that_disagrees_with_itself_is_refused(edit, message):
    model = HubViTModel(tiny_config(patch_size=4, image_size=16, class_token=False, pooling="mean")).eval()
    batch = dict(processor()(images=images(), return_tensors="pt"))
    edit(batch)
    with pytest.raises(ValueError, match=message):
        model(**batch)


@torch.no_grad()
def test_a_converted_siglip2_tower_exports_back_to_its_own_class(tmp_path):
    """`hubvit export transformers` writes `Siglip2VisionModel` (the converter's mapping run backwards), which
    computes what the source does on a mixed batch."""
    source = siglip2_tower()
    source.save_pretrained(tmp_path / "siglip2")
    assert cli(["convert", "transformers", str(tmp_path / "siglip2"), str(tmp_path / "hubvit")]) == 0
    assert cli(["export", "transformers", str(tmp_path / "hubvit"), str(tmp_path / "back")]) == 0
    back = transformers.AutoModel.from_pretrained(tmp_path / "back").eval()
    assert type(back).__name__ == "Siglip2VisionModel"
    inputs = processor()(images=images(), return_tensors="pt")
    assert relative_error(back(**inputs).pooler_output, source(**inputs).pooler_output) <= 1e-5


@pytest.mark.parametrize("carried", [False, True], ids=["default-processor", "processor-of-the-source"])
@torch.no_grad()
def test_a_converted_siglip2_folder_serves_the_feature_extraction_pipeline_at_each_images_size(tmp_path, carried):
    """The folder's image processor is SigLIP 2's (the source's own, or one at its patch size and table budget):
    `AutoImageProcessor` loads it from the hubvit folder and transformers' pipeline feeds the model patch
    sequences; the features are the source's on the same processor's output."""
    source = siglip2_tower()
    source.save_pretrained(tmp_path / "siglip2")
    if carried:
        processor(max_num_patches=16).save_pretrained(tmp_path / "siglip2")
    assert cli(["convert", "transformers", str(tmp_path / "siglip2"), str(tmp_path / "out")]) == 0
    loaded = transformers.AutoImageProcessor.from_pretrained(tmp_path / "out")
    assert type(loaded).__name__.startswith("Siglip2ImageProcessor") and loaded.max_num_patches == 16
    extract = transformers.pipeline("image-feature-extraction", model=str(tmp_path / "out"), trust_remote_code=True)
    image = images(sizes=((12, 40),))[0]
    features = torch.tensor(extract(__import__("PIL.Image").Image.fromarray(image), return_tensors=False))
    inputs = loaded(images=[image], return_tensors="pt")
    expected, mask = source(**inputs).last_hidden_state, inputs["pixel_attention_mask"].bool()
    assert features.shape == expected.shape and not mask.all()  # the image leaves part of the budget as padding
    assert padded_error(features, expected, mask) <= 1e-5


@torch.no_grad()
def test_intermediates_give_each_image_its_maps_at_its_own_grid():
    """`forward_intermediates` on a mixed batch: per block, each image's (D, rows, columns) map equals the map of
    that image alone, unpadded; "NLC" gives the padded patch tokens and the dict their validity, as timm's
    NaFlexVit."""
    from hubvit import HubViTModel

    model = randomize_(HubViTModel(tiny_config(patch_size=4, image_size=16, num_register_tokens=1)), seed=8).eval()
    make = processor()
    batch = make(images=images(), return_tensors="pt")
    maps = model.forward_intermediates(**batch, indices=[0, 1], intermediates_only=True)
    grids = batch["spatial_shapes"].tolist()
    for index, image in enumerate(images()):
        alone = unpadded(make(images=[image], return_tensors="pt"))
        own = model.forward_intermediates(**alone, indices=[0, 1], intermediates_only=True)
        for block in range(2):
            assert maps[block][index].shape == (32, *grids[index])
            assert relative_error(maps[block][index], own[block][0]) <= 1e-5
    tokens = model.forward_intermediates(**batch, indices=1, output_fmt="NLC", output_dict=True)
    assert tokens["image_intermediates"][0].shape == (4, 24, 32)
    assert torch.equal(tokens["patch_valid"], batch["pixel_attention_mask"].bool())


@torch.no_grad()
def test_the_backbone_returns_each_images_maps_at_its_own_grid(tmp_path):
    from hubvit import HubViTBackbone

    config = tiny_config(patch_size=4, image_size=16, out_indices=[1, 2])
    model = randomize_(HubViTBackbone(config), seed=9).eval()
    make = processor()
    batch = make(images=images(), return_tensors="pt")
    stages = model(**batch).feature_maps
    assert len(stages) == 2 and all(len(stage) == 4 for stage in stages)
    for index, image in enumerate(images()):
        own = model(**unpadded(make(images=[image], return_tensors="pt"))).feature_maps
        for stage in range(2):
            assert stages[stage][index].shape == (32, *batch["spatial_shapes"][index].tolist())
            assert relative_error(stages[stage][index], own[stage][0]) <= 1e-5


@pytest.mark.parametrize(
    "fields",
    [
        dict(class_token=False, pooling="map"),
        dict(num_register_tokens=1, num_labels=3),
        dict(rope_type="dinov3", position_embedding_type="none", num_labels=3),
        dict(position_embedding_type="learned_2d", num_labels=3),
        dict(position_embedding_type="sincos_2d", class_token=False, pooling="mean"),
    ],
    ids=["map", "cls", "dinov3-rotary", "row-column-tables", "sincos"],
)
def test_the_onnx_graph_of_patch_sequences_runs_any_batch_and_length(tmp_path, fields):
    """`hubvit export onnx --patch_sequences` (checked in onnxruntime and OpenVINO on two mixed batches before it is
    written): the graph takes a batch and a patch budget the export never saw and gives PyTorch's outputs."""
    import onnxruntime

    from hubvit.folder import write_folder

    model_class = HubViTForImageClassification if fields.get("num_labels") else HubViTModel
    model = randomize_(model_class(tiny_config(patch_size=4, image_size=16, **fields)), seed=10).eval()
    write_folder(model, tmp_path / "src")
    assert cli(["export", "onnx", str(tmp_path / "src"), str(tmp_path / "seq.onnx"), "--patch_sequences"]) == 0
    runtimes = {
        row["runtime"] for row in __import__("json").loads((tmp_path / "seq.verification.json").read_text())["checks"]
    }
    assert "onnxruntime" in runtimes
    session = onnxruntime.InferenceSession(str(tmp_path / "seq.onnx"), providers=["CPUExecutionProvider"])
    batch = processor(max_num_patches=40)(images=images(sizes=((12, 60), (36, 28))), return_tensors="pt")
    outputs = session.run(None, {name: value.numpy() for name, value in batch.items()})
    with torch.no_grad():
        expected = model(**batch)
    if fields.get("num_labels"):
        assert relative_error(outputs[0], expected.logits) <= 1e-5
    else:
        assert relative_error(outputs[1], expected.pooler_output) <= 1e-5


def test_exporting_patch_sequences_of_a_relative_bias_model_is_refused_in_one_line(tmp_path, capsys):
    """The model refuses such batches by name; so does the exporter, before it traces anything."""
    from hubvit.folder import write_folder

    model = HubViTForImageClassification(
        tiny_config(patch_size=4, image_size=16, position_embedding_type="relative_2d")
    )
    write_folder(model, tmp_path / "src")
    status = cli(["export", "onnx", str(tmp_path / "src"), str(tmp_path / "seq.onnx"), "--patch_sequences"])
    error = capsys.readouterr().err
    assert status == 2 and not (tmp_path / "seq.onnx").exists()
    last = error.strip().splitlines()[-1]
    assert "Traceback" not in error and last.startswith("hubvit export onnx: error: --patch_sequences"), error
    assert "position_embedding_type='relative_2d'" in last
