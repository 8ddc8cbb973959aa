"""Folders written by the single-file model of 2026-12-07 (tests/fixtures/before-components-2026-12-07) load into
today's components and compute what they computed then.

Tolerance: 1e-5 of each output's largest magnitude, float32 parity. The split moved code, not arithmetic, but the
outputs were recorded on one CPU kind (AVX2) and are replayed on others, whose matrix kernels sum in another order:
on an AVX-512 machine (AMD family 26) three outputs of this set differ by 1.1e-6 of their scale at the commit that
recorded them.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from component_fixtures import FIXTURES, ROOT, fixture_outputs
from hubvit import HubViTForImageClassification, HubViTForSemanticSegmentation

TOLERANCE = 1e-5


@pytest.mark.parametrize("name", list(FIXTURES))
def test_a_folder_written_before_the_split_loads_every_tensor(name):
    head = HubViTForSemanticSegmentation if FIXTURES[name].get("segmentation") else HubViTForImageClassification
    _, info = head.from_pretrained(str(ROOT / name), output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info


@pytest.mark.parametrize("name", list(FIXTURES))
def test_a_folder_written_before_the_split_gives_its_recorded_outputs_at_two_sizes(name):
    folder = ROOT / name
    written = json.loads((folder / "written_by.json").read_text())
    inputs = load_file(folder / "inputs.safetensors")
    expected = load_file(folder / "expected.safetensors")
    actual = fixture_outputs(folder, FIXTURES[name], inputs)
    assert sorted(actual) == sorted(expected)
    for key, reference in expected.items():
        assert actual[key].shape == reference.shape, key
        scale = reference.abs().max().clamp_min(1e-12)
        difference = (actual[key] - reference).abs().max()
        assert difference <= TOLERANCE * scale, (
            f"{name} {key}: max |difference| {difference:.3g} > {TOLERANCE} x {scale:.3g} "
            f"(written by hubvit {written['hubvit']})"
        )


def test_the_fixtures_hold_every_position_kind_and_pooling():
    """The set covers what the split touched: a kind or pooling added later needs no fixture of this day."""
    configs = [json.loads((ROOT / name / "config.json").read_text()) for name in FIXTURES]
    assert {c["position_embedding_type"] for c in configs} == {
        "learned",
        "learned_2d",
        "relative_2d",
        "sincos_2d",
        "none",
    }
    assert {c["pooling"] for c in configs} == {"cls", "mean", "map", "first", "cls_mean"}
    assert any(c["image_size"] != [32, 32] and isinstance(c["image_size"], list) for c in configs)
    assert torch.Size([2, 3, 37, 29]) == load_file(ROOT / "padded-learned" / "inputs.safetensors")["other"].shape
