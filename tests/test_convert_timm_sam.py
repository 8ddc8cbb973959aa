"""`hubvit convert timm` on timm's `VisionTransformerSAM` (the Segment Anything image encoders): windowed blocks over
a zero-padded grid, global blocks, decomposed relative positions and the convolutional neck, proven against timm's
own forward on the same random weights (float32, 1e-5 of the output scale) at the native size and at a size whose
grid the window does not divide; and the windowed attention's own contract."""

import pytest
import torch

timm = pytest.importorskip("timm")
from timm.models import save_for_hf  # noqa: E402
from transformers import AutoModel, AutoModelForImageClassification  # noqa: E402

from hubvit import HubViTConfig, HubViTModel  # noqa: E402
from hubvit.cli import main as cli  # noqa: E402
from utils import randomize_, relative_error, tiny_config  # noqa: E402

# an 8 x 8 grid, windows of 3 (padded to 9 x 9), block 1 global
TINY = dict(depth=3, embed_dim=64, num_heads=4, img_size=64, patch_size=8, window_size=3, global_attn_indexes=[1])

# name: (timm architecture, model_args on top of TINY, config fields the conversion must produce)
FAMILIES = {
    "sam_neck_headless": (
        "samvit_base_patch16",
        dict(num_classes=0),
        dict(
            neck_size=256,
            attention_window_size=3,
            global_attention_blocks=[1],
            decomposed_relative_position=True,
            final_norm=False,
        ),
    ),
    "sam_neck_with_a_head": ("samvit_base_patch16", dict(num_classes=5, neck_chans=32), dict(neck_size=32)),
    "channel_norm_instead_of_a_neck_no_table": (
        "samvit_base_patch16_224",
        dict(num_classes=5),
        dict(neck_size=None, final_norm=True, position_embedding_type="none"),
    ),
    "windows_without_relative_positions": (
        "samvit_base_patch16",
        dict(num_classes=5, use_rel_pos=False),
        dict(decomposed_relative_position=False),
    ),
    "every_block_global": (
        "samvit_base_patch16",
        dict(num_classes=0, window_size=0, global_attn_indexes=[]),
        dict(attention_window_size=0, global_attention_blocks=None),
    ),
}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def converted(tmp_path, name, args, seed=0):
    with torch.no_grad():
        source = randomize_(timm.create_model(name, pretrained=False, **{**TINY, **args}).eval(), seed=seed)
    save_for_hf(source, tmp_path / "timm", safe_serialization=True)
    assert cli(["convert", "timm", str(tmp_path / "timm"), str(tmp_path / "out")]) == 0
    auto = AutoModelForImageClassification if source.num_classes else AutoModel
    model, info = auto.from_pretrained(tmp_path / "out", trust_remote_code=True, output_loading_info=True)
    assert not any(info.values()), info
    return source, model.eval()


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("size", [(64, 64), (40, 56)], ids=["native", "grid_5x7_padded_to_6x9"])
@torch.no_grad()
def test_sam_family_matches_timm(family, size, tmp_path):
    """The pooled features (timm's pre-logits: the neck's map averaged) agree; at 40 x 56 the table is resized and
    the global block's offset tables interpolated, as timm does on the fly."""
    name, args, expected = FAMILIES[family]
    source, model = converted(tmp_path, name, args, seed=len(family))
    for field, value in expected.items():
        assert getattr(model.config, field) == value, (field, getattr(model.config, field))
    pixels = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(0))
    features = source.forward_features(pixels)
    pooled = source.forward_head(features, pre_logits=True)
    assert relative_error(model.base_model(pixel_values=pixels).pooler_output, pooled) <= 1e-5
    if source.num_classes:
        assert relative_error(model(pixel_values=pixels).logits, source.forward_head(features)) <= 1e-5


@torch.no_grad()
def test_block_outputs_match_timms_intermediates(tmp_path):
    """Each block's map (timm's `forward_intermediates`, NCHW, no norm): windows are put back in their places."""
    source, model = converted(tmp_path, "samvit_base_patch16", dict(num_classes=0))
    pixels = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    theirs = source.forward_intermediates(pixels, intermediates_only=True)
    ours = model.forward_intermediates(pixels, indices=list(range(3)), intermediates_only=True)
    for index, (mine, reference) in enumerate(zip(ours, theirs, strict=True)):
        assert relative_error(mine, reference) <= 1e-5, index


def test_sam_with_rotary_tables_is_refused_by_name(tmp_path, capsys):
    source = timm.create_model("samvit_base_patch16", pretrained=False, **TINY, use_rope=True, use_rel_pos=False)
    save_for_hf(source, tmp_path / "timm", safe_serialization=True)
    assert cli(["convert", "timm", str(tmp_path / "timm"), str(tmp_path / "out")]) == 2
    assert "separate window and global rotary tables (use_rope)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


WINDOWED = dict(
    class_token=False,
    pooling="mean",
    attention_window_size=3,
    global_attention_blocks=[1],
    decomposed_relative_position=True,
)


@torch.no_grad()
def test_windowed_attention_weights_stay_within_windows():
    """On a 6 x 6 grid, windows of 3: each query's weights are zero outside its window and sum to one inside it;
    the global block's reach every patch. The eager path that returns them computes what SDPA computes."""
    config = tiny_config(image_size=48, patch_size=8, **WINDOWED)
    eager = randomize_(HubViTModel._from_config(config, attn_implementation="eager").eval())
    fused = HubViTModel._from_config(config, attn_implementation="sdpa").eval()
    fused.load_state_dict(eager.state_dict())
    pixels = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(2))
    outputs = eager(pixels, output_attentions=True)
    rows, columns = torch.meshgrid(torch.arange(6), torch.arange(6), indexing="ij")
    window = (rows // 3 * 2 + columns // 3).reshape(-1)
    same_window = window[:, None] == window[None, :]
    windowed, global_block = outputs.attentions[0], outputs.attentions[1]
    assert windowed.shape == (2, config.num_attention_heads, 36, 36)
    assert windowed[..., ~same_window].abs().max() == 0
    assert torch.allclose(windowed.sum(-1), torch.ones(()), atol=1e-6)
    assert (global_block[..., ~same_window] > 0).all()
    assert relative_error(fused(pixels).pooler_output, outputs.pooler_output) <= 1e-5


@torch.no_grad()
def test_padding_takes_part_in_edge_windows_so_their_weights_over_patches_sum_below_one():
    """An 8 x 8 grid in windows of 3 is padded to 9 x 9: the last row and column of windows also attend to the
    zero-padded tokens (as SAM does), which the returned matrix over the image's patches leaves out."""
    config = tiny_config(image_size=64, patch_size=8, **WINDOWED)
    model = randomize_(HubViTModel._from_config(config, attn_implementation="eager").eval())
    weights = (
        model(torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0)), output_attentions=True)
        .attentions[0]
        .sum(-1)[0, 0]
        .reshape(8, 8)
    )
    assert torch.allclose(weights[:6, :6], torch.ones(()), atol=1e-6)
    assert (weights[6:, :] < 1 - 1e-4).all() and (weights[:, 6:] < 1 - 1e-4).all()


@torch.no_grad()
def test_a_new_native_size_resizes_the_global_blocks_offset_tables_and_keeps_the_outputs():
    """`resize_position_embeddings` stores what the forward pass computed on the fly: global blocks' tables grow to
    2 * side - 1 offsets, windowed blocks' stay at their window's."""
    config = tiny_config(image_size=48, patch_size=8, neck_size=16, final_norm=False, **WINDOWED)
    model = randomize_(HubViTModel(config).eval())
    pixels = torch.randn(1, 3, 80, 64, generator=torch.Generator().manual_seed(3))
    before = model(pixels).pooler_output
    model.resize_position_embeddings((80, 64))
    attention = model.encoder.layers[1].attention
    assert tuple(attention.relative_position_rows.shape) == (19, config.hidden_size // config.num_attention_heads)
    assert attention.relative_position_columns.shape[0] == 15
    assert model.encoder.layers[0].attention.relative_position_rows.shape[0] == 5
    assert relative_error(model(pixels).pooler_output, before) <= 1e-5


@pytest.mark.parametrize(
    "fields, named",
    [
        (dict(attention_window_size=3), "attention_window_size=3 partitions the patch grid; expected no prefix"),
        (dict(attention_window_size=-1, class_token=False, pooling="mean"), "attention_window_size=-1"),
        (dict(global_attention_blocks=[1], class_token=False, pooling="mean"), "global_attention_blocks=[1]"),
        (dict(neck_size=16), "neck_size=16 with pooling='cls'"),
        (
            dict(attention_window_size=3, class_token=False, pooling="mean", position_embedding_type="relative_2d"),
            "windows take position tables and decomposed relative positions only",
        ),
    ],
)
def test_settings_no_model_can_run_are_refused_by_name(fields, named):
    with pytest.raises(ValueError, match=named.replace("[", r"\[").replace("(", r"\(")):
        HubViTConfig(**fields)


def test_patch_sequences_are_refused_where_blocks_read_one_grid():
    config = tiny_config(**WINDOWED)
    model = HubViTModel(config).eval()
    patches = torch.randn(1, 16, 3 * 8 * 8)
    with pytest.raises(ValueError, match="attention_window_size=3, decomposed_relative_position=True"):
        model(patches, pixel_attention_mask=torch.ones(1, 16), spatial_shapes=torch.tensor([[4, 4]]))


def test_the_card_cites_segment_anything_by_title(tmp_path):
    converted(tmp_path, "samvit_base_patch16", dict(num_classes=0))
    card = (tmp_path / "out" / "README.md").read_text()
    assert "title = {Segment Anything}" in card


@torch.no_grad()
def test_attention_distance_reads_a_windowed_block_within_its_windows():
    """`hubvit analyze`'s attention distance on SAM's parts: a windowed block's queries reach at most across their
    3 x 3 window of 8-pixel patches (2 * sqrt(2) patches), the global block's further."""
    from hubvit.analysis.attention import attention_distance

    config = tiny_config(image_size=48, patch_size=8, **WINDOWED)
    model = randomize_(HubViTModel(config).eval())
    result = attention_distance(model, [torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(4))])
    windowed, global_block = result["mean_distance"][0], result["mean_distance"][1]
    assert max(windowed) <= 2 * 2**0.5 * 8 and max(global_block) > max(windowed)
