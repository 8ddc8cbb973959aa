"""Full-size parity of converted folders with the library they came from: the figures in README's conversion tables.

Every timm family of `tests/test_convert_timm.py`, every transformers class of `tests/test_transformers_interop.py`
and the JAX layouts of `hubvit.conversion.flax_vit` (Flax models with the original module names) are
built at full size (ViT-B widths, 12 layers, 224 px; ViT-M/16 GAP at its 256 px) with every tensor random, saved
the way its library saves (`save_for_hf`, `save_pretrained`, `.npz`), converted with the `hubvit` CLI, loaded with
`AutoModel*.from_pretrained(..., trust_remote_code=True)` and run next to the source on the same batch, at the native
size and a non-square one (one patch shorter, one wider; timm with `dynamic_img_size=True`, transformers' ViT/DeiT
with `interpolate_pos_encoding=True`; JAX at the native size only, the Flax models take no other). Printed: max
|hubvit - source| / max |source| for the classifier output (or the features of a headless model).

    python benchmarks/parity.py                   # both tables, about 7 minutes on 2 cores
    python benchmarks/parity.py --only timm       # or: --only transformers, --only jax
    python benchmarks/parity.py --only torchvision   # or: --only pytorch, --only export-timm
    python benchmarks/parity.py --only timm-families # EVA-02, DINOv3, PE, RoPE-ViT, BEiT, relpos: in and back out
    python benchmarks/parity.py --only transformers-towers  # DINOv3, SigLIP, CLIP, AIMv2, I-JEPA, BEiT: in and out

torchvision's ViT is compared at a second size through its own `interpolate_embeddings`; the plain PyTorch ViT on
`nn.TransformerEncoder` is the reference class of `tests/test_convert_pytorch.py`; `export timm` runs timm's model
built from the exported folder (`local-dir:`) against the hubvit folder it came from.
"""

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import AutoModel, AutoModelForImageClassification

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_convert_timm import FAMILIES  # noqa: E402
from test_transformers_interop import CASES  # noqa: E402
from utils import randomize_  # noqa: E402

from hubvit.cli import main as cli  # noqa: E402

VIT_B = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, image_size=224, patch_size=16)


def relative_error(ours, reference):
    return ((ours - reference).abs().max() / reference.abs().max()).item()


def pixels(height, width):
    return torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(height * width))


def quietly(fn, *args):
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args)


def load(folder, headless):
    auto = AutoModel if headless else AutoModelForImageClassification
    return auto.from_pretrained(folder, trust_remote_code=True).eval()


@torch.no_grad()
def timm_row(family, root):
    import timm
    from timm.models import save_for_hf

    name, args, _ = FAMILIES[family]
    args = {k: v for k, v in args.items() if k not in ("img_size", "patch_size")}
    if "dinov2" in name:
        args["img_size"] = 224
    source = randomize_(timm.create_model(name, pretrained=False, **args), seed=len(family)).eval()
    dynamic = timm.create_model(name, pretrained=False, dynamic_img_size=True, **args).eval()
    dynamic.load_state_dict(source.state_dict())
    save_for_hf(source, root / family)
    assert quietly(cli, ["convert", "timm", str(root / family), str(root / f"{family}-hubvit")]) == 0
    headless = source.num_classes == 0
    model = load(root / f"{family}-hubvit", headless)
    (height, width), (ph, pw) = model.config.image_size_2d, model.config.patch_size_2d
    errors = []
    for reference, (h, w) in ((source, (height, width)), (dynamic, (height - ph, width + pw))):
        x = pixels(h, w)
        ours = model(pixel_values=x)
        ours = ours.pooler_output if headless else ours.logits
        errors.append(relative_error(ours, reference(x)))
    return f"{family} (`{name}`, {height}x{width} px)", errors


@torch.no_grad()
def transformers_row(architecture, headless, root):
    cls = getattr(transformers, architecture)
    sizes = dict(VIT_B, mlp_ratio=4) if architecture.startswith("Dinov2") else dict(VIT_B, intermediate_size=3072)
    if architecture.startswith("Dinov2WithRegisters"):
        sizes["num_register_tokens"] = 4
    labels = {} if headless else dict(num_labels=1000)
    source = randomize_(cls(cls.config_class(**sizes, **labels))).eval()
    source.save_pretrained(root / architecture)
    assert (
        quietly(cli, ["convert", "transformers", str(root / architecture), str(root / f"{architecture}-hubvit")]) == 0
    )
    model = load(root / f"{architecture}-hubvit", headless)
    errors = []
    resize = {} if architecture.startswith("Dinov2") else {"interpolate_pos_encoding": True}
    for h, w in ((224, 224), (208, 240)):
        x = pixels(h, w)
        theirs, ours = source(pixel_values=x, **resize), model(pixel_values=x)
        if headless:
            errors.append(relative_error(ours.last_hidden_state, theirs.last_hidden_state))
        else:
            errors.append(relative_error(ours.logits, theirs.logits))
    return architecture, errors


JAX_CASES = (  # (label, Flax module name, module fields): ViT-S/16 and ViT-B/16 in both codebases' layouts
    (
        "vision_transformer ViT-S/16, classifier=token",
        "VisionTransformerOrig",
        dict(hidden_size=384, num_layers=12, num_heads=6, mlp_dim=1536, classifier="token"),
    ),
    (
        "vision_transformer ViT-B/16, classifier=token, pre_logits",
        "VisionTransformerOrig",
        dict(classifier="token", representation_size=768),
    ),
    ("big_vision ViT-B/16, pool_type=gap", "VisionTransformerBV", dict(pool_type="gap")),
    ("big_vision ViT-B/16, pool_type=map (SigLIP-like)", "VisionTransformerBV", dict(pool_type="map")),
)


@torch.no_grad()
def jax_row(label, module, fields, root):
    import jax
    import numpy as np

    import flax_reference

    model = getattr(flax_reference, module)(**fields)
    params = flax_reference.random_params(model, 224, seed=1)
    images = np.random.default_rng(0).uniform(-1, 1, (2, 224, 224, 3)).astype(np.float32)
    reference = torch.from_numpy(np.array(jax.jit(lambda p, x: model.apply({"params": p}, x))(params, images)))
    name = "jax-" + "-".join(f"{key}={value}" for key, value in fields.items())
    flax_reference.flatten_to_npz(params, root / f"{name}.npz")
    assert quietly(cli, ["convert", "jax", str(root / f"{name}.npz"), str(root / f"{name}-hubvit")]) == 0
    model = load(root / f"{name}-hubvit", headless=False)
    logits = model(pixel_values=torch.from_numpy(images).permute(0, 3, 1, 2)).logits
    return label, [relative_error(logits, reference)]


@torch.no_grad()
def torchvision_row(label, root, image_size=None, **kwargs):
    import torchvision
    from torchvision.models.vision_transformer import interpolate_embeddings

    from test_convert_torchvision import randomize_ as randomize_torchvision_

    source = randomize_torchvision_(torchvision.models.vit_b_16(**kwargs))
    torch.save(source.state_dict(), root / "tv.pth")
    extra = ["--image-size", str(image_size)] if image_size else []
    argv = ["convert", "torchvision", str(root / "tv.pth"), str(root / label), "--architecture", "vit_b_16", *extra]
    assert quietly(cli, argv) == 0
    model = load(root / label, headless=False)
    native = image_size or 224
    state = interpolate_embeddings(native, 16, source.state_dict())
    errors = []
    for size in (native, native + 64):
        reference = torchvision.models.vit_b_16(image_size=size, **kwargs).eval()
        reference.load_state_dict(interpolate_embeddings(size, 16, state))
        x = pixels(size, size)
        errors.append(relative_error(model(pixel_values=x).logits, reference(x)))
    return label, errors


@torch.no_grad()
def pytorch_row(root):
    from test_convert_pytorch import source_model

    source = source_model(image_size=224, patch_size=16, dim=768, depth=12, heads=12, mlp_dim=3072, num_classes=1000)
    torch.save(source.state_dict(), root / "pt.pth")
    assert quietly(cli, ["convert", "pytorch", str(root / "pt.pth"), str(root / "pt"), "--num-heads", "12"]) == 0
    model = load(root / "pt", headless=False)
    errors = []
    for h, w in ((224, 224), (208, 240)):
        x = pixels(h, w)
        errors.append(relative_error(model(pixel_values=x).logits, source(x)))
    return "ViT-B/16 on nn.TransformerEncoder(norm_first=True), eps 1e-5 / final 1e-6", errors


@torch.no_grad()
def export_timm_row(label, fields, root):
    import timm

    from hubvit import HubViTConfig, HubViTForImageClassification
    from hubvit.folder import write_folder

    model = randomize_(HubViTForImageClassification(HubViTConfig(**VIT_B, **fields))).eval()
    write_folder(model, root / label)
    assert quietly(cli, ["export", "timm", str(root / label), str(root / f"{label}-timm")]) == 0
    reference = timm.create_model(f"local-dir:{root / label}-timm", pretrained=True).eval()
    errors = []
    for h, w in ((224, 224), (208, 240)):
        x = pixels(h, w)
        errors.append(relative_error(reference(x), model(pixel_values=x).logits))
    return label, errors


MODERN_FAMILIES = (  # timm entry points at their own (base) size, random weights; Sapiens2 at a 256 x 192 input
    # (SAM at its 1024 x 1024)
    ("EVA-02 B/14", "eva02_base_patch14_224", dict(num_classes=1000)),
    ("EVA-02 CLIP B/16 tower", "eva02_base_patch16_clip_224", dict(num_classes=0)),
    ("DINOv3 B/16", "vit_base_patch16_dinov3", dict(num_classes=0)),
    ("PE core B/16", "vit_pe_core_base_patch16_224", dict(num_classes=0)),
    ("RoPE-Mixed ViT-B/16", "vit_base_patch16_rope_mixed_224", dict(num_classes=1000)),
    ("Sapiens2 0.1B", "vit_base_patch16_sapiens2", dict(num_classes=0, img_size=(256, 192))),
    (
        "Sapiens2 0.4B, 8 key/value heads in blocks 8-15",
        "vit_large_patch16_sapiens2",
        dict(num_classes=0, img_size=(256, 192)),
    ),
    ("BEiT B/16", "beit_base_patch16_224", dict(num_classes=1000)),
    ("BEiT v2 B/16", "beitv2_base_patch16_224", dict(num_classes=1000)),
    ("relpos ViT-B/16", "vit_relpos_base_patch16_224", dict(num_classes=1000)),
    ("SAM ViT-B/16 image encoder", "samvit_base_patch16", dict(num_classes=0)),
)


@torch.no_grad()
def modern_family_row(label, name, args, root):
    """One timm family converted (hubvit against timm at the native and, where timm's class runs at any size, a
    non-square size) and exported back (timm's class from the exported folder against the original, native)."""
    import timm
    from timm.models import save_for_hf

    source = randomize_(timm.create_model(name, pretrained=False, **args), seed=len(label)).eval()
    folder = root / name
    save_for_hf(source, folder)
    assert quietly(cli, ["convert", "timm", str(folder), str(root / f"{name}-hubvit")]) == 0
    assert quietly(cli, ["export", "timm", str(root / f"{name}-hubvit"), str(root / f"{name}-back")]) == 0
    headless = source.num_classes == 0
    model = load(root / f"{name}-hubvit", headless)
    back = timm.create_model(f"local-dir:{root / name}-back", pretrained=True).eval()
    (height, width), (ph, pw) = model.config.image_size_2d, model.config.patch_size_2d
    references = [(source, (height, width))]
    if hasattr(source, "dynamic_img_size"):
        dynamic = timm.create_model(name, pretrained=False, dynamic_img_size=True, **args).eval()
        dynamic.load_state_dict(source.state_dict())
        references.append((dynamic, (height - ph, width + pw)))
    elif not getattr(source.patch_embed, "strict_img_size", True):  # SAM: any size, its table resized on the fly
        references.append((source, (height - ph, width + pw)))
    errors = []
    for reference, (h, w) in references:
        x = pixels(h, w)
        ours = model(pixel_values=x)
        errors.append(relative_error(ours.pooler_output if headless else ours.logits, reference(x)))
    x = pixels(height, width)
    exported = relative_error(back(x), source(x))
    label = f"{label} (`{name}`, {height}x{width} px) -> `{type(back).__name__}`"
    return label, errors + ([float("nan")] if len(references) == 1 else []) + [exported]


TOWER_CASES = (  # transformers class, its fields at ViT-B/16 (AIMv2 at its own patch 14), export expected
    ("DINOv3ViTModel", dict(num_register_tokens=4), True),
    ("SiglipVisionModel", {}, True),
    ("SiglipModel", {}, False),
    ("CLIPVisionModel", dict(patch_size=16), True),
    ("CLIPModel", dict(patch_size=16), False),
    ("Aimv2VisionModel", dict(patch_size=14), True),
    ("IJepaModel", {}, True),
    ("BeitModel", dict(use_relative_position_bias=True), True),
    ("Data2VecVisionModel", dict(use_relative_position_bias=True, use_mean_pooling=False), True),
)


@torch.no_grad()
def tower_row(architecture, fields, exports, root):
    """One transformers vision tower at ViT-B size: converted (its last_hidden_state and pooler_output against the
    source's, native and, where the class resizes, 224 -> 256) and exported back (`hubvit export transformers`)."""
    cls = getattr(transformers, architecture)
    sizes = dict(VIT_B, intermediate_size=3072, **fields)
    if architecture in ("SiglipModel", "CLIPModel"):
        vision = getattr(transformers, architecture.replace("Model", "VisionConfig"))(**sizes).to_dict()
        text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, vocab_size=99)
        source = randomize_(cls(cls.config_class(vision_config=vision, text_config=text))).eval()
    else:
        source = randomize_(cls(cls.config_class(**sizes))).eval()
    folder = root / architecture
    source.save_pretrained(folder)
    assert quietly(cli, ["convert", "transformers", str(folder), str(root / f"{architecture}-hubvit")]) == 0
    model = load(root / f"{architecture}-hubvit", True)
    vision = getattr(source, "vision_model", source) if architecture in ("SiglipModel", "CLIPModel") else source
    resizes = architecture not in ("Aimv2VisionModel",)
    errors = []
    for size in (224, 256) if resizes else (224,):
        x = pixels(size, size)
        kwargs = {} if size == 224 or architecture.startswith("DINOv3") else {"interpolate_pos_encoding": True}
        theirs, ours = vision(pixel_values=x, **kwargs), model(pixel_values=x)
        error = relative_error(ours.last_hidden_state, theirs.last_hidden_state)
        if theirs.pooler_output is not None:
            error = max(error, relative_error(ours.pooler_output, theirs.pooler_output))
        errors.append(error)
    errors += [float("nan")] * (2 - len(errors))
    if exports:
        out = root / f"{architecture}-back"
        assert quietly(cli, ["export", "transformers", str(root / f"{architecture}-hubvit"), str(out)]) == 0
        back = getattr(transformers, json.loads((out / "config.json").read_text())["architectures"][0])
        back = back.from_pretrained(out).eval()
        x = pixels(224, 224)
        errors.append(relative_error(back(pixel_values=x).last_hidden_state, vision(pixel_values=x).last_hidden_state))
        architecture = f"{architecture} -> `{type(back).__name__}`"
    else:
        errors.append(float("nan"))
    return architecture, errors


@torch.no_grad()
def siglip2_naflex_row(root):
    """SigLIP 2 NaFlex B/16 (a 16 x 16 table): converted; on one batch of four aspect ratios from transformers' own
    `Siglip2ImageProcessor` (256-patch budget) the real patches' `last_hidden_state` and `pooler_output` against
    the source, each image of the batch against itself unpadded, and the export back against the source."""
    import numpy as np

    config = transformers.Siglip2VisionConfig(**{k: v for k, v in VIT_B.items() if k != "image_size"}, num_patches=256)
    source = randomize_(transformers.Siglip2VisionModel(config)).eval()
    source.save_pretrained(root / "siglip2")
    assert quietly(cli, ["convert", "transformers", str(root / "siglip2"), str(root / "siglip2-hubvit")]) == 0
    assert quietly(cli, ["export", "transformers", str(root / "siglip2-hubvit"), str(root / "siglip2-back")]) == 0
    model, back = load(root / "siglip2-hubvit", True), AutoModel.from_pretrained(root / "siglip2-back").eval()
    rng = np.random.default_rng(0)
    images = [
        rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((224, 448), (448, 160), (256, 256), (96, 512))
    ]
    processor = transformers.Siglip2ImageProcessor(patch_size=16, max_num_patches=256)
    batch = processor(images=images, return_tensors="pt")
    mask = batch["pixel_attention_mask"].bool()
    theirs, ours = source(**batch), model(**batch)
    converted = max(
        relative_error(ours.last_hidden_state[mask], theirs.last_hidden_state[mask]),
        relative_error(ours.pooler_output, theirs.pooler_output),
    )
    alone = []
    for index, image in enumerate(images):
        single = processor(images=[image], return_tensors="pt")
        count = int(single["pixel_attention_mask"].sum())
        single = dict(single, pixel_values=single["pixel_values"][:, :count])
        single["pixel_attention_mask"] = single["pixel_attention_mask"][:, :count]
        alone.append(relative_error(model(**single).pooler_output[0], ours.pooler_output[index]))
    exported = relative_error(back(**batch).pooler_output, theirs.pooler_output)
    shapes = ", ".join(f"{h}x{w}" for h, w in batch["spatial_shapes"].tolist())
    return f"`Siglip2VisionModel` B/16, grids {shapes} in one batch -> `{type(back).__name__}`", [
        converted,
        max(alone),
        exported,
    ]


@torch.no_grad()
def big_vision_naflex_row(root):
    """big_vision NaFlex B/16 (a 16 x 16 table, MAP head, scanned blocks; Flax in big_vision's module layout, random
    weights): converted from its `.npz`; on one batch of four grids padded to the longest, the logits against Flax,
    and each image of the batch against itself alone."""
    import jax
    import numpy as np

    import flax_reference
    from hubvit.conversion.flax_vit import VisionTransformerNaFlex, naflex_inputs, run

    model = VisionTransformerNaFlex(num_classes=1000, posemb_side=16, pool_type="map", scan=True)
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), naflex_inputs(np.zeros((1, 256, 256, 3)), 16))
    params = flax_reference.randomize(shapes["params"], seed=1)
    flax_reference.flatten_to_npz(params, root / "naflex.npz", prefix="params/img/")
    assert quietly(cli, ["convert", "jax", str(root / "naflex.npz"), str(root / "naflex-hubvit")]) == 0
    converted = load(root / "naflex-hubvit", headless=False)
    grids, rng = ((11, 22), (26, 9), (16, 16), (7, 36)), np.random.default_rng(0)
    parts = [naflex_inputs(rng.uniform(-1, 1, (1, 16 * h, 16 * w, 3)).astype(np.float32), 16) for h, w in grids]
    length = max(part[0].shape[1] for part in parts)
    padded = [
        np.concatenate([np.pad(p[k], [(0, 0), (0, length - p[k].shape[1])] + [(0, 0)] * (k == 0)) for p in parts])
        for k in range(4)
    ]
    batch = dict(
        pixel_values=torch.from_numpy(padded[0]),
        pixel_attention_mask=torch.from_numpy(padded[1]).long(),
        spatial_shapes=torch.tensor(grids),
    )
    logits = converted(**batch).logits
    error = relative_error(logits, torch.from_numpy(np.array(run(model, params, tuple(padded)))))
    alone = []
    for index, part in enumerate(parts):
        single = dict(
            pixel_values=torch.from_numpy(part[0]),
            pixel_attention_mask=torch.ones(part[1].shape, dtype=torch.long),
            spatial_shapes=torch.tensor([grids[index]]),
        )
        alone.append(relative_error(converted(**single).logits[0], logits[index]))
    shapes = ", ".join(f"{h}x{w}" for h, w in grids)
    return f"big_vision NaFlex B/16 (MAP, scanned), grids {shapes} in one batch", [error, max(alone)]


EXPORT_TIMM_CASES = (
    ("ViT-B/16, [CLS], 1000 classes", dict(num_labels=1000)),
    (
        "ViT-B/16, 4 registers, layer scale, no_embed_class, headless",
        dict(
            num_register_tokens=4, layer_scale_init_value=1e-5, position_embedding_includes_prefix=False, num_labels=0
        ),
    ),
    ("ViT-B/16, no [CLS], MAP pooling (SigLIP-like), headless", dict(class_token=False, pooling="map", num_labels=0)),
)


def print_table(title, rows, sizes=2, second="non-square size"):
    columns = {1: ", native size", 2: f", native / {second}", 3: f", native / {second} / exported back, native"}
    print(f"\n{title}: max |Δ| / max |source|" + columns[sizes])
    print("| source | parity |")
    print("| --- | --- |")
    for label, errors in rows:
        print(f"| {label} | " + " / ".join(f"{e:.1e}" for e in errors) + " |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only",
        choices=(
            "timm",
            "timm-families",
            "transformers",
            "transformers-towers",
            "naflex",
            "jax",
            "torchvision",
            "pytorch",
            "export-timm",
        ),
        default=None,
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--family", default="", help="with --only timm-families: the families whose label has this")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.only in (None, "timm"):
            import timm

            print(f"timm {timm.__version__}")
            print_table("timm", [timm_row(family, root) for family in FAMILIES])
        if args.only in (None, "transformers"):
            print_table("transformers", [transformers_row(a, headless, root) for a, headless in CASES])
        if args.only in (None, "jax"):
            print_table("JAX", [jax_row(*case, root) for case in JAX_CASES], sizes=1)
        if args.only in (None, "torchvision"):
            rows = [
                torchvision_row("vit_b_16", root),
                torchvision_row("vit_b_16 with heads.pre_logits", root, representation_size=768),
                torchvision_row("vit_b_16, --image-size 384 from a 224 table", root, image_size=384),
            ]
            print_table("torchvision", rows, second="64 px larger (torchvision via interpolate_embeddings)")
        if args.only in (None, "pytorch"):
            print_table("plain PyTorch", [pytorch_row(root)])
        if args.only in (None, "timm-families"):
            rows = [modern_family_row(*case, root) for case in MODERN_FAMILIES if args.family in case[0]]
            print("\nnan: timm's class runs at its native size only (no dynamic_img_size)")
            print_table("timm families, converted and exported back", rows, sizes=3)
        if args.only in (None, "transformers-towers"):
            rows = [tower_row(*case, root) for case in TOWER_CASES]
            print(
                "\nnan: the class runs at its native size only (AIMv2), or a dual encoder (exported as its tower's class)"
            )
            print_table("transformers towers, converted and exported back", rows, sizes=3, second="256 px")
        if args.only in (None, "naflex"):
            print("\nSigLIP 2 NaFlex: converted on a mixed batch / each image alone, unpadded / exported back")
            print_table("SigLIP 2 NaFlex", [siglip2_naflex_row(root)], sizes=1)
            print("\nbig_vision NaFlex: converted, against Flax on a mixed batch / each image alone, unpadded")
            print_table("big_vision NaFlex", [big_vision_naflex_row(root)], sizes=1)
        if args.only in (None, "export-timm"):
            print_table("export timm (timm against hubvit)", [export_timm_row(*c, root) for c in EXPORT_TIMM_CASES])


if __name__ == "__main__":
    main()
