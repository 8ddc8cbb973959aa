"""Self-check of hubvit.conversion.flax_vit, the Flax models the JAX converter is checked against.

1. The param trees have exactly the key names and shapes of the released
   checkpoints: google-research/vision_transformer ``vit_jax/models_vit.py``
   (pre-Linen names ``MultiHeadDotProductAttention_1``, ``LayerNorm_2``,
   ``MlpBlock_3``, ``Transformer/posembed_input``) and google-research/big_vision
   ``big_vision/models/vit.py`` (Linen names, top-level ``pos_embedding``,
   ``Transformer/encoderblock`` when scanned, ``MAPHead_0``).
2. Logits agree with timm (an independent implementation) after timm's own
   ``.npz`` loader reads the file written by ``flatten_to_npz``. timm uses
   exact-erf GELU, so the reference runs with ``approximate_gelu=False`` here.
"""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")
from flax import traverse_util  # noqa: E402
from timm.models.vision_transformer import _load_weights  # noqa: E402
from utils import relative_error  # noqa: E402

try:
    from flax_reference import (
        VisionTransformerBV,
        VisionTransformerOrig,
        flatten_params,
        flatten_to_npz,
        posemb_sincos_2d,
        random_params,
        randomize,
        resize_posemb_bv,
        resize_posemb_orig,
        run,
        to_bfloat16,
    )
except ImportError:  # tests/ imported as a package
    from tests.flax_reference import (
        VisionTransformerBV,
        VisionTransformerOrig,
        flatten_params,
        flatten_to_npz,
        posemb_sincos_2d,
        random_params,
        randomize,
        resize_posemb_bv,
        resize_posemb_orig,
        run,
        to_bfloat16,
    )

IMG, P, D, DEPTH, H, MLP, NC = 32, 8, 32, 2, 4, 64, 10
N = (IMG // P) ** 2
TINY = dict(num_classes=NC, patch_size=P)
ORIG = dict(TINY, hidden_size=D, num_layers=DEPTH, num_heads=H, mlp_dim=MLP)
BV = dict(TINY, width=D, depth=DEPTH, num_heads=H, mlp_dim=MLP)


def images(n=2, size=IMG, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (n, size, size, 3)).astype(np.float32)


def shapes(model):
    """{'a/b': shape} of the param tree, traced only (eager init is slow)."""
    x = jax.ShapeDtypeStruct((1, IMG, IMG, 3), np.float32)
    tree = jax.eval_shape(model.init, jax.random.PRNGKey(0), x)["params"]
    return {k: v.shape for k, v in traverse_util.flatten_dict(tree, sep="/").items()}


def mha(prefix, stack=()):
    s = tuple(stack)
    return (
        {f"{prefix}/{n}/kernel": s + (D, H, D // H) for n in ("query", "key", "value")}
        | {f"{prefix}/{n}/bias": s + (H, D // H) for n in ("query", "key", "value")}
        | {f"{prefix}/out/kernel": s + (H, D // H, D), f"{prefix}/out/bias": s + (D,)}
    )


def ln(prefix, stack=()):
    return {f"{prefix}/scale": tuple(stack) + (D,), f"{prefix}/bias": tuple(stack) + (D,)}


def mlp(prefix, stack=()):
    s = tuple(stack)
    return {
        f"{prefix}/Dense_0/kernel": s + (D, MLP),
        f"{prefix}/Dense_0/bias": s + (MLP,),
        f"{prefix}/Dense_1/kernel": s + (MLP, D),
        f"{prefix}/Dense_1/bias": s + (D,),
    }


def block(prefix, names, stack=()):
    ln0, attn, ln1, mlpn = names
    return (
        ln(f"{prefix}/{ln0}", stack)
        | mha(f"{prefix}/{attn}", stack)
        | ln(f"{prefix}/{ln1}", stack)
        | mlp(f"{prefix}/{mlpn}", stack)
    )


STEM = {"embedding/kernel": (P, P, 3, D), "embedding/bias": (D,)}
HEAD = {"head/kernel": (D, NC), "head/bias": (NC,)}
ORIG_NAMES = ("LayerNorm_0", "MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3")
BV_NAMES = ("LayerNorm_0", "MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0")


# ---------------------------------------------------------------- layouts


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_orig_layout(classifier):
    want = dict(STEM) | ln("Transformer/encoder_norm")
    for i in range(DEPTH):
        want |= block(f"Transformer/encoderblock_{i}", ORIG_NAMES)
    tok = classifier == "token"
    want["Transformer/posembed_input/pos_embedding"] = (1, N + tok, D)
    if tok:
        want["cls"] = (1, 1, D)
    want |= {"pre_logits/kernel": (D, 16), "pre_logits/bias": (16,), "head/kernel": (16, NC), "head/bias": (NC,)}
    model = VisionTransformerOrig(**ORIG, classifier=classifier, representation_size=16)
    assert shapes(model) == want


@pytest.mark.parametrize(
    "pool,scan,posemb",
    [
        ("tok", False, "learn"),
        ("tok", True, "sincos2d"),
        ("gap", False, "sincos2d"),
        ("gap", True, "learn"),
        ("map", False, "learn"),
        ("map", True, "learn"),
        ("0", False, "learn"),
        ("0", True, "sincos2d"),
    ],
)
def test_bv_layout(pool, scan, posemb):
    want = dict(STEM) | HEAD | ln("Transformer/encoder_norm")
    if scan:
        want |= block("Transformer/encoderblock", BV_NAMES, stack=(DEPTH,))
    else:
        for i in range(DEPTH):
            want |= block(f"Transformer/encoderblock_{i}", BV_NAMES)
    if posemb == "learn":
        want["pos_embedding"] = (1, N, D)
    if pool == "tok":
        want["cls"] = (1, 1, D)
    if pool == "map":
        want |= (
            {"MAPHead_0/probe": (1, 1, D)}
            | mha("MAPHead_0/MultiHeadDotProductAttention_0")
            | ln("MAPHead_0/LayerNorm_0")
            | mlp("MAPHead_0/MlpBlock_0")
        )
    model = VisionTransformerBV(**BV, pool_type=pool, scan=scan, posemb=posemb)
    assert shapes(model) == want


def test_bv_pre_logits_layout():
    got = shapes(VisionTransformerBV(**BV, rep_size=True))
    assert got["pre_logits/kernel"] == (D, D) and got["head/kernel"] == (D, NC)


def test_randomize_replaces_everything():
    model = VisionTransformerBV(**BV, pool_type="map", scan=True)
    a, b = flatten_params(random_params(model, IMG, 0)), flatten_params(random_params(model, IMG, 1))
    assert shapes(model) == {k: v.shape for k, v in a.items()}
    for k, v in a.items():
        assert v.dtype == np.float32 and np.all(v != 0) and np.all(v != 1), k
        assert not np.array_equal(v, b[k]), k
    again = flatten_params(random_params(model, IMG, 0))
    assert all(np.array_equal(v, again[k]) for k, v in a.items())  # seeded


# ------------------------------------------------------- cross-check vs timm


def timm_vit(**kw):
    model = timm.create_model(
        "vit_base_patch16_224",
        pretrained=False,
        img_size=IMG,
        patch_size=P,
        embed_dim=D,
        depth=DEPTH,
        num_heads=H,
        mlp_ratio=MLP / D,
        num_classes=NC,
        **kw,
    )
    return model.eval()


def timm_logits(model, path, x, **load_kw):
    with torch.no_grad():
        _load_weights(model, str(path), **load_kw)
        return model(torch.from_numpy(x).permute(0, 3, 1, 2)).numpy()


# classifier -> timm kwargs. gap needs fc_norm=False: timm's default for 'avg'
# moves the final LN after pooling (and its loader then skips encoder_norm).
ORIG_TIMM = {"token": {}, "gap": dict(class_token=False, global_pool="avg", fc_norm=False)}


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_orig_matches_timm(classifier, tmp_path):
    model = VisionTransformerOrig(**ORIG, classifier=classifier, approximate_gelu=False)
    params = random_params(model, IMG, seed=1)
    flatten_to_npz(params, tmp_path / "w.npz")
    x = images()
    ref = run(model, params, x)
    assert relative_error(timm_logits(timm_vit(**ORIG_TIMM[classifier]), tmp_path / "w.npz", x), ref) < 1e-5
    if classifier == "token":  # tanh GELU (the original) differs measurably: the check has teeth
        assert relative_error(run(VisionTransformerOrig(**ORIG), params, x), ref) > 1e-5


# pool_type '0' is not covered: timm refuses token pooling without a class
# token ('Token pooling needs the class token'); test_pooling_and_pre_logits covers it.
BV_TIMM = {
    "tok": dict(no_embed_class=True),
    "gap": dict(class_token=False, global_pool="avg", fc_norm=False),
    "map": dict(class_token=False, global_pool="map"),
}


@pytest.mark.parametrize(
    "pool,scan,prefix",
    [
        ("tok", False, "params/"),
        ("gap", True, ""),
        ("map", False, "params/img/"),
        ("map", True, "opt/target/"),
    ],
)
def test_bv_matches_timm(pool, scan, prefix, tmp_path):
    model = VisionTransformerBV(**BV, pool_type=pool, scan=scan, approximate_gelu=False)
    params = random_params(model, IMG, seed=2)
    flatten_to_npz(params, tmp_path / "w.npz", prefix=prefix)
    x = images()
    got = timm_logits(timm_vit(**BV_TIMM[pool]), tmp_path / "w.npz", x)
    assert relative_error(got, run(model, params, x)) < 1e-5


def test_bv_bfloat16_void_matches_timm(tmp_path):
    model = VisionTransformerBV(**BV, pool_type="tok", approximate_gelu=False)
    params = to_bfloat16(random_params(model, IMG, seed=3))
    flat = flatten_to_npz(params, tmp_path / "w.npz", prefix="params/", bfloat16_as_void=True)
    assert all(v.dtype == np.dtype("V2") for v in flat.values())
    with np.load(tmp_path / "w.npz") as f:
        assert f["params/embedding/kernel"].dtype == np.dtype("V2")
    x = images()
    got = timm_logits(timm_vit(**BV_TIMM["tok"]), tmp_path / "w.npz", x, load_bfloat16=True)
    assert relative_error(got, run(model, params, x)) < 1e-5


def test_bv_sincos_matches_timm(tmp_path):
    """timm's loader has no sincos2d; feed it our fixed table as a learned one.

    That checks the rest of the sincos model against timm; the table itself is
    checked entry by entry in test_sincos_table.
    """
    model = VisionTransformerBV(**BV, pool_type="map", posemb="sincos2d", approximate_gelu=False)
    params = random_params(model, IMG, seed=4)
    flatten_to_npz(
        params | {"pos_embedding": np.asarray(posemb_sincos_2d(IMG // P, IMG // P, D))},
        tmp_path / "w.npz",
        prefix="params/",
    )
    x = images()
    got = timm_logits(timm_vit(**BV_TIMM["map"]), tmp_path / "w.npz", x)
    assert relative_error(got, run(model, params, x)) < 1e-5


def test_sincos_table():
    h, w, d = 3, 5, 16
    pe = np.asarray(posemb_sincos_2d(h, w, d))
    assert pe.shape == (1, h * w, d)
    q = d // 4
    for r, (yy, xx) in enumerate((yy, xx) for yy in range(h) for xx in range(w)):
        for i in range(q):
            om = 10000.0 ** (-i / (q - 1))
            np.testing.assert_allclose(
                pe[0, r, [i, q + i, 2 * q + i, 3 * q + i]],
                [np.sin(xx * om), np.cos(xx * om), np.sin(yy * om), np.cos(yy * om)],
                atol=1e-6,
            )


# ---------------------------------------- parts timm cannot load: self-checks


@pytest.mark.parametrize("which", ["orig", "bv"])
def test_pooling_and_pre_logits(which):
    """What timm cannot load: pool_type '0' (timm wants a class token for
    token pooling) and pre_logits (timm dropped the representation layer)."""
    if which == "orig":
        model = VisionTransformerOrig(**ORIG, representation_size=16)
    else:
        model = VisionTransformerBV(**BV, rep_size=16, pool_type="0")
    params = random_params(model, IMG, seed=6)
    logits, enc, pooled = run(model, params, images(), intermediates=True)
    assert enc.shape == (2, N + (which == "orig"), D)
    np.testing.assert_array_equal(pooled, enc[:, 0])
    hid = np.tanh(pooled @ params["pre_logits"]["kernel"] + params["pre_logits"]["bias"])
    want = hid @ params["head"]["kernel"] + params["head"]["bias"]
    np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------- resize


def torch_bilinear_align_corners(grid, new):
    t = torch.from_numpy(grid).permute(2, 0, 1)[None]
    out = torch.nn.functional.interpolate(t, size=new, mode="bilinear", align_corners=True)
    return out[0].permute(1, 2, 0).reshape(1, -1, grid.shape[-1]).numpy()


def test_resize_posemb():
    g, new = IMG // P, (7, 5)
    pe = randomize({"pe": np.zeros((1, 1 + g * g, D), np.float32)}, seed=7)["pe"]
    out = resize_posemb_orig(pe, new)
    assert out.shape == (1, 1 + 35, D)
    np.testing.assert_array_equal(out[:, :1], pe[:, :1])  # cls row kept
    want = torch_bilinear_align_corners(pe[0, 1:].reshape(g, g, D), new)
    np.testing.assert_allclose(out[:, 1:], want, atol=1e-5)
    # gap tables and big_vision tables have no cls row: same zoom on all rows.
    np.testing.assert_array_equal(resize_posemb_orig(pe[:, 1:], new, has_cls=False), out[:, 1:])
    np.testing.assert_array_equal(resize_posemb_bv(pe[:, 1:], new), out[:, 1:])
    # Same grid: unchanged; corners of an upsampled grid keep the old corners.
    np.testing.assert_allclose(resize_posemb_bv(pe[:, 1:], g), pe[:, 1:], atol=1e-6)
    big = resize_posemb_bv(pe[:, 1:], 12).reshape(12, 12, D)
    np.testing.assert_allclose(big[-1, -1], pe[0, -1], atol=1e-6)


def test_resized_table_runs_at_new_resolution():
    """Fine-tuning flow: a 32px checkpoint's table resized for a 48px model."""
    params = random_params(VisionTransformerOrig(**ORIG), IMG, seed=8)
    table = params["Transformer"]["posembed_input"]["pos_embedding"]
    params["Transformer"]["posembed_input"]["pos_embedding"] = resize_posemb_orig(table, 48 // P)
    out = run(VisionTransformerOrig(**ORIG), params, images(size=48))
    assert out.shape == (2, NC) and np.all(np.isfinite(out))
