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
"""

import argparse
import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import AutoModel, AutoModelForImageClassification

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_convert_timm import FAMILIES, randomize_timm_  # noqa: E402
from test_transformers_interop import CASES  # noqa: E402
from utils import randomize_  # noqa: E402

from hubvit.scripts.cli import main as cli  # noqa: E402

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
    source = randomize_timm_(timm.create_model(name, pretrained=False, **args), seed=len(family))
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
    assert quietly(cli, ["convert", "transformers", str(root / architecture), str(root / f"{architecture}-hubvit")]) == 0
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
    ("vision_transformer ViT-S/16, classifier=token", "VisionTransformerOrig",
     dict(hidden_size=384, num_layers=12, num_heads=6, mlp_dim=1536, classifier="token")),
    ("vision_transformer ViT-B/16, classifier=token, pre_logits", "VisionTransformerOrig",
     dict(classifier="token", representation_size=768)),
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


def print_table(title, rows, sizes=2):
    print(f"\n{title}: max |Δ| / max |source|" + (", native / non-square size" if sizes == 2 else ", native size"))
    print("| source | parity |")
    print("| --- | --- |")
    for label, errors in rows:
        print(f"| {label} | " + " / ".join(f"{e:.1e}" for e in errors) + " |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("timm", "transformers", "jax"), default=None)
    parser.add_argument("--threads", type=int, default=2)
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


if __name__ == "__main__":
    main()
