"""`hubvit convert jax` against Flax: the source library runs the original module layout on random weights.

tests/flax_reference.py re-implements both JAX codebases (google-research/vision_transformer and big_vision) in
Flax with the original module names, so `init` gives the checkpoint layout and `np.savez` writes it as the released
files are written. Each test converts such a file through the CLI, loads the folder with
`AutoModelForImageClassification` and `trust_remote_code=True`, and compares logits with Flax on the same NHWC input.

Tolerance: float32 parity, `max|hubvit - flax| <= 1e-5 * max|flax|`. Both sides compute the same float32 graph in a
different order (XLA vs torch kernels); the measured gap is about 2e-7 relative, and a wrong transpose, head order or
GELU variant is orders of magnitude larger (the `--gelu erf` test shows the smallest such change exceeds it).
"""

import os
import re
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

from transformers import AutoModelForImageClassification  # noqa: E402

from hubvit import cli  # noqa: E402
from utils import relative_error  # noqa: E402

try:
    from flax_reference import (
        VisionTransformerBV,
        VisionTransformerOrig,
        flatten_params,  # noqa: E402
        flatten_to_npz,
        random_params,
        resize_posemb_bv,
        resize_posemb_orig,
        to_bfloat16,
    )
except ImportError:  # tests/ imported as a package
    from tests.flax_reference import (
        VisionTransformerBV,
        VisionTransformerOrig,
        flatten_params,  # noqa: E402
        flatten_to_npz,
        random_params,
        resize_posemb_bv,
        resize_posemb_orig,
        to_bfloat16,
    )

IMG, P, D, DEPTH, H, MLP, NC = 32, 8, 32, 2, 4, 64, 10
ORIG = dict(num_classes=NC, patch_size=P, hidden_size=D, num_layers=DEPTH, num_heads=H, mlp_dim=MLP)
BV = dict(num_classes=NC, patch_size=P, width=D, depth=DEPTH, num_heads=H, mlp_dim=MLP)
TOL = 1e-5


def images(size=IMG, seed=0):
    """A fixed NHWC batch in [-1, 1], what mean = std = 0.5 preprocessing gives."""
    return np.random.default_rng(seed).uniform(-1, 1, (2, size, size, 3)).astype(np.float32)


class Reference:
    """A Flax model, its random params, and its logits and pooled features on `images()` (jit compiled once)."""

    def __init__(self, model, seed, size=IMG, params=None):
        self.model = model
        self.params = params if params is not None else random_params(model, IMG, seed=seed)
        apply = jax.jit(lambda p, x: model.apply({"params": p}, x, mutable=["intermediates"]))
        logits, state = apply(self.params, images(size))
        self.logits = np.asarray(logits)
        self.pooled = np.asarray(state["intermediates"]["pooled"][0])

    def save(self, path, **kwargs):
        flatten_to_npz(self.params, path, **kwargs)
        return path


@pytest.fixture(scope="module")
def reference():
    """Flax references by name, built on first use and shared across tests (each costs a jit compile)."""
    cache = {}

    def get(name, factory):
        if name not in cache:
            cache[name] = factory()
        return cache[name]

    return get


def convert(src, out, *flags):
    code = cli.main(["convert", "jax", str(src), str(out), *map(str, flags)])
    assert code == 0, f"conversion failed with exit code {code}"
    return out


def load(folder):
    model, info = AutoModelForImageClassification.from_pretrained(
        str(folder), trust_remote_code=True, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval()


@torch.no_grad()
def run(model, x):
    output = model(torch.from_numpy(x).permute(0, 3, 1, 2))
    return output.logits.numpy()


def orig_reference(reference, classifier, rep=None, gelu_tanh=True):
    name = f"orig-{classifier}-{rep}-{gelu_tanh}"
    model = VisionTransformerOrig(**ORIG, classifier=classifier, representation_size=rep, approximate_gelu=gelu_tanh)
    return reference(name, lambda: Reference(model, seed=1))


def bv_reference(reference, pool, scan, posemb="learn"):
    model = VisionTransformerBV(**BV, pool_type=pool, scan=scan, posemb=posemb)
    return reference(f"bv-{pool}-{scan}-{posemb}", lambda: Reference(model, seed=2))


# ------------------------------------------------------------------------------------------------ parity


@pytest.mark.parametrize("classifier", ["token", "gap"])
@pytest.mark.parametrize("rep", [None, 16])
def test_vision_transformer(reference, tmp_path, classifier, rep):
    ref = orig_reference(reference, classifier, rep)
    model = load(convert(ref.save(tmp_path / "w.npz"), tmp_path / "out"))
    config = model.config
    assert config.pooling == ("cls" if classifier == "token" else "mean")
    assert config.class_token == (classifier == "token") and config.position_embedding_includes_prefix
    assert config.representation_size == rep and config.num_labels == NC
    assert (config.hidden_act, config.layer_norm_eps) == ("gelu_pytorch_tanh", 1e-6)
    assert relative_error(run(model, images()), ref.logits) <= TOL


BIG_VISION_CASES = [  # every pooling looped and scanned, every prefix at least once
    ("tok", False, "params/"),
    ("tok", True, "opt/target/"),
    ("gap", False, ""),
    ("gap", True, "params/img/"),
    ("map", False, "params/img/"),
    ("map", True, "params/"),
]


@pytest.mark.parametrize("pool,scan,prefix", BIG_VISION_CASES)
def test_big_vision(reference, tmp_path, pool, scan, prefix):
    ref = bv_reference(reference, pool, scan)
    flat = flatten_params(ref.params, prefix)
    if prefix == "params/img/":  # a two-tower (SigLIP-like) file: the text tower is dropped with a reason
        flat |= {"params/txt/Embed_0/embedding": np.ones((7, 4), np.float32), "params/t": np.ones(1, np.float32)}
    np.savez(tmp_path / "w.npz", **flat)
    out = convert(tmp_path / "w.npz", tmp_path / "out")
    model = load(out)
    config = model.config
    assert config.pooling == {"tok": "cls", "gap": "mean", "map": "map"}[pool]
    assert config.class_token == (pool == "tok") and not config.position_embedding_includes_prefix
    assert config.num_hidden_layers == DEPTH and config.num_attention_heads == H
    assert relative_error(run(model, images()), ref.logits) <= TOL
    if prefix == "params/img/":
        card = (out / "README.md").read_text()
        assert "outside the image tower" in card and "params/txt/Embed_0/embedding" in card


def test_big_vision_first_token(reference, tmp_path):
    """pool_type '0' reads the first patch token; the keys cannot tell it from 'gap', so it takes a flag."""
    ref = bv_reference(reference, "0", False)
    src = ref.save(tmp_path / "w.npz", prefix="params/")
    model = load(convert(src, tmp_path / "out", "--pool-type", "0"))
    assert model.config.pooling == "first" and not model.config.class_token
    assert relative_error(run(model, images()), ref.logits) <= TOL


def test_sincos_2d_needs_the_flag(reference, tmp_path, capsys):
    ref = bv_reference(reference, "map", True, posemb="sincos2d")
    src = ref.save(tmp_path / "w.npz", prefix="params/")
    assert cli.main(["convert", "jax", str(src), str(tmp_path / "refused")]) == 2
    error = capsys.readouterr().err
    assert "no position table" in error and "--position-embedding sincos_2d" in error
    assert not (tmp_path / "refused").exists()
    model = load(convert(src, tmp_path / "out", "--position-embedding", "sincos_2d", "--image-size", IMG))
    assert model.config.position_embedding_type == "sincos_2d" and model.config.image_size == IMG
    assert relative_error(run(model, images()), ref.logits) <= TOL


def test_bfloat16_stored_as_void(tmp_path):
    """bf16 files hold 2-byte void arrays; Flax runs the same bf16-rounded values in float32."""
    model = VisionTransformerBV(**BV, pool_type="tok")
    params = to_bfloat16(random_params(model, IMG, seed=3))
    flat = flatten_to_npz(params, tmp_path / "w.npz", prefix="params/", bfloat16_as_void=True)
    assert {v.dtype for v in flat.values()} == {np.dtype("V2")}
    ref = Reference(model, seed=3, params=params)
    out = convert(tmp_path / "w.npz", tmp_path / "out")
    assert relative_error(run(load(out), images()), ref.logits) <= TOL
    assert "bfloat16" in (out / "README.md").read_text()


# ------------------------------------------------------------------------------------------------ options


def test_gelu_erf_is_a_real_choice(reference, tmp_path):
    """`--gelu erf` matches Flax with exact GELU and misses the original (tanh) by more than the tolerance."""
    tanh = orig_reference(reference, "token")
    erf = orig_reference(reference, "token", gelu_tanh=False)
    model = load(convert(tanh.save(tmp_path / "w.npz"), tmp_path / "out", "--gelu", "erf"))
    assert model.config.hidden_act == "gelu"
    logits = run(model, images())
    assert relative_error(logits, erf.logits) <= TOL
    assert relative_error(logits, tanh.logits) > 10 * TOL


@pytest.mark.parametrize("layout", ["vision_transformer", "big_vision"])
def test_image_size_matches_the_original_resize(reference, tmp_path, layout):
    """`--image-size 48` equals Flax at 48 px after the original fine-tuning resize (scipy zoom, order 1), and the
    native conversion resizes on the fly to the same numbers (the config records the method)."""
    size, grid = 48, 48 // P
    if layout == "vision_transformer":
        native = orig_reference(reference, "token")
        params = {**native.params, "Transformer": {**native.params["Transformer"]}}
        table = params["Transformer"]["posembed_input"]["pos_embedding"]
        params["Transformer"]["posembed_input"] = {"pos_embedding": resize_posemb_orig(table, grid)}
        big = Reference(VisionTransformerOrig(**ORIG), seed=None, size=size, params=params)
    else:
        native = bv_reference(reference, "gap", False)
        params = {**native.params, "pos_embedding": resize_posemb_bv(native.params["pos_embedding"], grid)}
        big = Reference(VisionTransformerBV(**BV, pool_type="gap"), seed=None, size=size, params=params)
    src = native.save(tmp_path / "w.npz")
    model = load(convert(src, tmp_path / "out", "--image-size", size))
    config = model.config
    assert config.image_size == size
    assert (config.interpolation_mode, config.interpolation_antialias, config.interpolation_align_corners) == (
        "bilinear",
        False,
        True,
    )
    assert relative_error(run(model, images(size)), big.logits) <= TOL
    on_the_fly = load(convert(src, tmp_path / "native"))
    assert relative_error(run(on_the_fly, images(size)), big.logits) <= TOL


@pytest.mark.parametrize(
    "size, patch, mlp_dim",
    [(46, 8, MLP), (384, 14, 134)],  # So400m/14 at 384: 27 x 27 patches, 6 pixels left out, MLP 4304/1152 wide
    ids=["46px-patch8", "so400m-shaped-384px-patch14"],
)
def test_a_siglip_image_tower_at_a_size_its_patches_do_not_divide(tmp_path, size, patch, mlp_dim):
    """A SigLIP-style image tower (MAP head, no [CLS], `params/img/` beside a text tower) made at a size its
    stride-P patch convolution does not divide: Flax's VALID convolution leaves the last pixels out, and the
    converted folder runs the same images to the same numbers (as big_vision and timm run So400m/14 at 384)."""
    model = VisionTransformerBV(**dict(BV, patch_size=patch, mlp_dim=mlp_dim, depth=1), pool_type="map", scan=False)
    ref = Reference(model, seed=3, size=size, params=random_params(model, size, seed=3))
    flat = flatten_params(ref.params, "params/img/") | {"params/txt/Embed_0/embedding": np.ones((7, 4), np.float32)}
    np.savez(tmp_path / "w.npz", **flat)
    converted = load(convert(tmp_path / "w.npz", tmp_path / "out", "--image-size", size))
    assert converted.config.image_size == size and tuple(converted.config.grid_size) == (size // patch,) * 2
    assert relative_error(run(converted, images(size)), ref.logits) <= TOL


def test_drop_pre_logits_and_new_head(reference, tmp_path):
    ref = orig_reference(reference, "token", rep=16)
    src = ref.save(tmp_path / "w.npz")
    headless = load(convert(src, tmp_path / "headless", "--drop-pre-logits"))
    assert headless.config.representation_size is None and headless.config.num_labels == 0
    assert relative_error(run(headless, images()), ref.pooled) <= TOL
    fresh = load(convert(src, tmp_path / "fresh", "--drop-pre-logits", "--num-labels", 5))
    assert fresh.classifier.weight.shape == (5, D) and not fresh.classifier.weight.any()
    assert run(fresh, images()).shape == (2, 5)
    kept = load(convert(src, tmp_path / "kept", "--num-labels", 5))
    assert kept.config.representation_size == 16 and kept.classifier.weight.shape == (5, 16)
    np.testing.assert_array_equal(kept.pre_logits[0].weight.detach().numpy(), ref.params["pre_logits"]["kernel"].T)


# ------------------------------------------------------------------------------------------------ refusals


def refused(tmp_path, capsys, flat):
    np.savez(tmp_path / "w.npz", **flat)
    assert cli.main(["convert", "jax", str(tmp_path / "w.npz"), str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
    return capsys.readouterr().err


def test_refuses_an_archive_that_is_not_a_vit(tmp_path, capsys):
    error = refused(tmp_path, capsys, {"root_block/conv/kernel": np.ones((7, 7, 3, 8), np.float32)})
    assert "not a ViT checkpoint" in error and "root_block/conv/kernel" in error


def test_refuses_missing_and_extra_tensors(tmp_path, capsys):
    flat = flatten_params(random_params(VisionTransformerOrig(**ORIG), IMG, seed=4))
    missing = "Transformer/encoderblock_1/MlpBlock_3/Dense_0/bias"
    flat.pop(missing)
    error = refused(tmp_path, capsys, flat | {"conv_root/kernel": np.ones((7, 7, 3, 8), np.float32)})
    assert "the file lacks" in error and missing in error
    assert "nothing maps" in error and "conv_root/kernel" in error


def test_refuses_pickled_arrays(tmp_path, capsys):
    flat = flatten_params(random_params(VisionTransformerOrig(**ORIG), IMG, seed=4))
    error = refused(tmp_path, capsys, flat | {"cls": np.array([{"not": "a tensor"}], dtype=object)})
    assert "refused to unpickle" in error


def card_verification(folder):
    card = (folder / "README.md").read_text()
    return card[card.index("## Verification") : card.index("## Preprocessing")]


def test_card_states_the_flax_check_measured_on_this_file(reference, tmp_path, capsys):
    """The card's Verification section names the Flax run and carries the figure printed for this very file."""
    src = orig_reference(reference, "token").save(tmp_path / "w.npz")
    section = card_verification(convert(src, tmp_path / "out"))
    printed = capsys.readouterr().out
    figure = re.search(r"measured at conversion: \*\*([0-9.e+-]+)\*\*", section).group(1)
    assert "Flax" in section and "VisionTransformerOrig" in section
    assert f"max |Δlogits| = {figure}" in printed or f"max |Δpooler_output| = {figure}" in printed


def test_a_wrong_conversion_is_refused_by_the_flax_check(reference, tmp_path, capsys, converter_bug):
    """One weight off by 1e-3 of its scale: the Flax forward at conversion catches it and nothing is written."""
    src = orig_reference(reference, "token").save(tmp_path / "w.npz")
    assert cli.main(["convert", "jax", str(src), str(tmp_path / "out")]) == 2
    assert "does not reproduce Flax" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_without_flax_the_card_says_the_file_was_not_verified(reference, tmp_path, monkeypatch):
    """Where jax/flax cannot be imported the converter still writes the folder, and its card says so plainly."""
    import hubvit.conversion

    monkeypatch.setitem(sys.modules, "hubvit.conversion.flax_vit", None)
    monkeypatch.delattr(hubvit.conversion, "flax_vit", raising=False)
    src = orig_reference(reference, "token").save(tmp_path / "w.npz")
    section = card_verification(convert(src, tmp_path / "out"))
    assert "was not verified at conversion" in section and "hubvit[jax]" in section
    assert "measured at conversion" not in section
