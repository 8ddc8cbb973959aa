"""Original JAX ViT checkpoints (`.npz`) to hubvit folders.

Two layouts, told apart by their keys (google-research/vision_transformer and google-research/big_vision; see
jax_layout.py, which reads the layout and the architecture from the array shapes). Here the Flax arrays are mapped
onto hubvit's names and the Flax reference is built. Numerics follow Flax by default: tanh GELU (`nn.gelu`),
LayerNorm eps 1e-6, inputs scaled to [-1, 1].
"""

import re
import shlex
from dataclasses import dataclass

import numpy as np
import torch

from ..modeling import HubViTConfig
from ..modeling.positions_hubvit import POSITION_KINDS
from . import sources
from ..options import argument, choice, flag, option, settle, text, whole
from ..preprocessing import Preprocessing, patch_budget_processor
from .common import (
    ConversionError,
    Conversion,
    ConversionOptions,
    ConversionResult,
    Reference,
    StrictMapping,
    linear_patch_kernel,
    read_weights,
    to_tensor,
)
from ..folder import build_model, expected_shapes
from .folder import run_conversion
from .jax_layout import BLOCK_NAMES, POOL_TYPES, detect_layout, read_config
from .kinds import ABSOLUTE_TABLES, BIG_VISION_NAFLEX_POOL_TYPE, BIG_VISION_POOL_TYPE, BIG_VISION_POSEMB

# For files without a position table: the kinds that need no learned weights.
POSITION_EMBEDDINGS = tuple(name for name, kind in POSITION_KINDS.items() if not kind.learned)
GELUS = ("tanh", "erf")


@dataclass(frozen=True)
class Options(ConversionOptions):
    """Convert an original JAX `.npz` (vision_transformer or big_vision; a path, or an https:// address checked
    against `sha256`) into a hubvit folder at OUT, after checking it against the Flax model of its own codebase
    (`verify`, within `tolerance`; skipped with a reason when jax/flax are not installed)."""

    src: str = argument("SRC", "the .npz checkpoint (vision_transformer or big_vision): a path or an https:// address")
    out: str = argument("OUT", "folder to write")
    image_size: int | None = option(
        None,
        "convert for this resolution: the position grid is resized as the original fine-tuning code does "
        "([CLS] row kept, bilinear on corners); with no position table, the native resolution (default 224)",
        metavar="S",
    )
    position_embedding: str | None = option(
        None,
        "for checkpoints without a position table: big_vision posemb='sincos2d', or none",
        choices=POSITION_EMBEDDINGS,
    )
    pool_type: str | None = option(
        None,
        "big_vision pool_type; only needed for '0' (first token), which the keys cannot tell from 'gap'",
        choices=tuple(POOL_TYPES),
    )
    gelu: str = option(
        "tanh",
        "tanh (default): Flax nn.gelu, as trained; erf: what timm and transformers use with these weights",
        choices=GELUS,
    )
    drop_pre_logits: bool = option(
        False,
        "drop the representation layer (pre_logits) and the head behind it, as the original fine-tuning does",
    )
    num_labels: int | None = option(
        None, "replace the head with a fresh zero-initialised one over N labels (0: headless)", metavar="N"
    )
    sha256: str | None = option(None, sources.SHA256_HELP)

    def __post_init__(self):
        super().__post_init__()
        settle(
            self,
            image_size=whole(self.image_size, "image_size"),
            position_embedding=choice(
                self.position_embedding, POSITION_EMBEDDINGS, "position_embedding", optional=True
            ),
            pool_type=choice(self.pool_type, tuple(POOL_TYPES), "pool_type", optional=True),
            gelu=choice(self.gelu, GELUS, "gelu"),
            drop_pre_logits=flag(self.drop_pre_logits, "drop_pre_logits"),
            num_labels=whole(self.num_labels, "num_labels"),
            sha256=text(self.sha256, "sha256"),
        )


def run(options: Options) -> ConversionResult:
    return run_conversion(convert, options)


def dense(kernel):
    """Flax Dense kernel (in, out) to a torch Linear weight (out, in)."""
    return kernel.t()


def heads_in(kernel):
    """Flax attention input kernel (D, H, D/H) to (D, D) Linear weight, heads major."""
    return kernel.reshape(kernel.shape[0], -1).t()


def heads_out(kernel):
    """Flax attention output kernel (H, D/H, D) to a (D, D) Linear weight."""
    return kernel.reshape(-1, kernel.shape[-1]).t()


def stacked(*parts):
    return lambda *tensors: torch.cat([part(t) for part, t in zip(parts, tensors)], dim=0)


def flat(tensor):
    return tensor.reshape(-1)


def at(index, transform=None):
    """Select one block from a scanned array before `transform`."""
    transform = transform or (lambda t: t)
    if index is None:
        return lambda *tensors: transform(*tensors)
    return lambda *tensors: transform(*(t[index] for t in tensors))


def map_attention(mapping, target, source_prefix, fused_qkv, index=None):
    """Flax MultiHeadDotProductAttention (separate query/key/value/out) onto hubvit's fused projections."""
    k = lambda name, kind: f"{source_prefix}/{name}/{kind}"  # noqa: E731
    if fused_qkv:
        mapping.combine(
            f"{target}.qkv.weight",
            [k(n, "kernel") for n in ("query", "key", "value")],
            at(index, stacked(heads_in, heads_in, heads_in)),
        )
        mapping.combine(
            f"{target}.qkv.bias",
            [k(n, "bias") for n in ("query", "key", "value")],
            at(index, stacked(flat, flat, flat)),
        )
    else:
        mapping.map(f"{target}.q.weight", k("query", "kernel"), at(index, heads_in))
        mapping.map(f"{target}.q.bias", k("query", "bias"), at(index, flat))
        mapping.combine(
            f"{target}.kv.weight", [k(n, "kernel") for n in ("key", "value")], at(index, stacked(heads_in, heads_in))
        )
        mapping.combine(f"{target}.kv.bias", [k(n, "bias") for n in ("key", "value")], at(index, stacked(flat, flat)))
    mapping.map(f"{target}.proj.weight", k("out", "kernel"), at(index, heads_out))
    mapping.map(f"{target}.proj.bias", k("out", "bias"), at(index))


def map_norm(mapping, target, key, index=None):
    mapping.map(f"{target}.weight", f"{key}/scale", at(index))
    mapping.map(f"{target}.bias", f"{key}/bias", at(index))


def map_dense(mapping, target, key, index=None):
    mapping.map(f"{target}.weight", f"{key}/kernel", at(index, dense))
    mapping.map(f"{target}.bias", f"{key}/bias", at(index))


def map_mlp(mapping, target, key, index=None):
    map_dense(mapping, f"{target}.fc1", f"{key}/Dense_0", index)
    map_dense(mapping, f"{target}.fc2", f"{key}/Dense_1", index)


def map_weights(source, layout, config, args, path):
    """The strict mapper holding the archive translated to hubvit names (call `finish` for the state dict)."""
    p = layout.prefix
    mapping = StrictMapping(source, f"{layout.name} checkpoint {path}")
    if p:
        mapping.drop(f"(?!{re.escape(p)}).*", f"outside the image tower under '{p}'")
    if layout.naflex:
        size, channels = config.patch_size_2d, config.num_channels
        kernel = lambda t: linear_patch_kernel(t.t(), size, channels)  # noqa: E731
        mapping.map("embeddings.patch_embedding.weight", f"{p}embedding/kernel", kernel)
        mapping.map("embeddings.position_embedding", f"{p}pos_embedding", lambda t: t.reshape(1, -1, t.shape[-1]))
        if config.patch_norm:
            map_norm(mapping, "embeddings.patch_norm", f"{p}patchln_post")
    else:
        mapping.map("embeddings.patch_embedding.weight", f"{p}embedding/kernel", lambda t: t.permute(3, 2, 0, 1))
    mapping.map("embeddings.patch_embedding.bias", f"{p}embedding/bias")
    if config.class_token:
        mapping.map("embeddings.class_token", f"{p}cls")
    if config.position_kind in ABSOLUTE_TABLES and not layout.naflex:
        table = "Transformer/posembed_input/pos_embedding" if layout.name == "vision_transformer" else "pos_embedding"
        mapping.map("embeddings.position_embedding", f"{p}{table}")
    ln1, attention, ln2, mlp = BLOCK_NAMES[layout.name]
    for i in range(layout.depth):
        target = f"encoder.layers.{i}"
        key, index = layout.block(i)
        map_norm(mapping, f"{target}.norm1", f"{key}/{ln1}", index)
        map_attention(mapping, f"{target}.attention", f"{key}/{attention}", True, index)
        map_norm(mapping, f"{target}.norm2", f"{key}/{ln2}", index)
        map_mlp(mapping, f"{target}.mlp", f"{key}/{mlp}", index)
    map_norm(mapping, "norm", f"{p}Transformer/encoder_norm")
    if config.pooling_kind.attention_pool:
        head = f"{p}MAPHead_0"
        mapping.map("pooler.map_head.probe", f"{head}/probe")
        map_attention(mapping, "pooler.map_head", f"{head}/MultiHeadDotProductAttention_0", False)
        map_norm(mapping, "pooler.map_head.norm", f"{head}/LayerNorm_0")
        map_mlp(mapping, "pooler.map_head.mlp", f"{head}/MlpBlock_0")
    dropped_pre_logits = args.drop_pre_logits and mapping.has(f"{p}pre_logits/kernel")
    if dropped_pre_logits:
        mapping.drop(f"{re.escape(p)}pre_logits/.*", "representation layer dropped (--drop-pre-logits)")
    elif config.representation_size:
        map_dense(mapping, "pre_logits.0", f"{p}pre_logits")
    features = config.representation_size or config.hidden_size
    if args.num_labels is not None or dropped_pre_logits:
        reason = (
            "head replaced by a fresh zero-initialised one (--num-labels)"
            if args.num_labels is not None
            else ("head sat on the dropped representation layer (--drop-pre-logits)")
        )
        mapping.drop(f"{re.escape(p)}head/.*", reason)
        if config.num_labels:
            fresh = f"fresh zero-initialised head over {config.num_labels} labels (--num-labels)"
            mapping.create("classifier.weight", torch.zeros(config.num_labels, features), fresh)
            mapping.create("classifier.bias", torch.zeros(config.num_labels), fresh)
    elif config.num_labels:
        map_dense(mapping, "classifier", f"{p}head")
    return mapping


def command_line(args):
    parts = ["hubvit", "convert", "jax", str(args.src), str(args.out)]
    for name in ("image_size", "position_embedding", "pool_type", "num_labels"):
        value = getattr(args, name, None)
        if value is not None:
            parts += [f"--{name.replace('_', '-')}", str(value)]
    if args.gelu != "tanh":
        parts += ["--gelu", args.gelu]
    if args.drop_pre_logits:
        parts.append("--drop-pre-logits")
    return shlex.join(parts)


def flax_reference(source, layout, config, args):
    """The Flax model of the file's own codebase (hubvit.conversion.flax_vit) on the file's arrays, at the
    converted resolution (the table resized as the original fine-tuning code does); unavailable without jax/flax."""
    if not args.verify:
        return Reference.unavailable("skipped (--no-verify)")
    if config.position_kind not in BIG_VISION_POSEMB:
        return Reference.unavailable(
            f"big_vision has no ViT with {config.position_kind.description!r} position embeddings to run it with"
        )
    try:
        from flax import traverse_util

        from . import flax_vit
    except ImportError as error:
        return Reference.unavailable(
            f"the Flax models need jax, flax and scipy (pip install 'hubvit[jax]'); importing them failed ({error})"
        )
    p = layout.prefix
    flat = {
        tuple(key[len(p) :].split("/")): to_tensor(value).float().numpy()
        for key, value in source.items()
        if key.startswith(p)
    }
    params = traverse_util.unflatten_dict(flat)
    head = source.get(f"{p}head/kernel")
    num_classes = head.shape[-1] if head is not None else None
    representation = source[f"{p}pre_logits/kernel"].shape[-1] if f"{p}pre_logits/kernel" in source else None
    ph, pw = config.patch_size_2d
    common = dict(
        num_classes=num_classes,
        patch_size=(ph, pw),
        num_heads=config.num_attention_heads,
        mlp_dim=config.intermediate_size,
        approximate_gelu=args.gelu == "tanh",
    )
    grid = (config.image_size_2d[0] // ph, config.image_size_2d[1] // pw)
    head_kept = bool(args.num_labels is None and not args.drop_pre_logits and num_classes)
    if layout.naflex:
        return naflex_reference(params, layout, config, args, common, head_kept)
    if layout.name == "vision_transformer":
        classifier = "token" if config.class_token else "gap"
        model = flax_vit.VisionTransformerOrig(
            hidden_size=config.hidden_size,
            num_layers=config.num_hidden_layers,
            classifier=classifier,
            representation_size=representation,
            **common,
        )
        table = params["Transformer"]["posembed_input"]
        if table["pos_embedding"].shape[1] != grid[0] * grid[1] + config.class_token:
            table["pos_embedding"] = flax_vit.resize_posemb_orig(table["pos_embedding"], grid, config.class_token)
    else:
        pool_type = BIG_VISION_POOL_TYPE[config.pooling_kind]
        posemb = BIG_VISION_POSEMB[config.position_kind]
        learned = posemb == "learn"
        model = flax_vit.VisionTransformerBV(
            width=config.hidden_size,
            depth=config.num_hidden_layers,
            posemb=posemb,
            rep_size=representation or False,
            pool_type=pool_type,
            scan=layout.scanned,
            **common,
        )
        if learned and params["pos_embedding"].shape[1] != grid[0] * grid[1]:
            params["pos_embedding"] = flax_vit.resize_posemb_bv(params["pos_embedding"], grid)

    def forward(pixels):
        logits, _, pooled = flax_vit.run(model, params, pixels.permute(0, 2, 3, 1).numpy(), intermediates=True)
        return reference_outputs(logits, pooled, head_kept)

    import flax

    gelu = "" if args.gelu == "tanh" else " with exact-erf GELU as converted (the original uses tanh)"
    return Reference(
        f"Flax {flax.__version__} `{type(model).__name__}` (hubvit.conversion.flax_vit, the {layout.name} module "
        f"layout) on this file's arrays{gelu}",
        forward,
        tolerance=args.tolerance,
    )


def reference_outputs(logits, pooled, head_kept):
    """The Flax model's outputs the converted folder is compared on: pooled features, and logits where the head
    was converted as it is."""
    outputs = {"pooler_output": torch.tensor(np.asarray(pooled))}
    if head_kept:
        outputs["logits"] = torch.tensor(np.asarray(logits))
    return outputs


def naflex_reference(params, layout, config, args, common, head_kept):
    """big_vision's NaFlex ViT (hubvit.conversion.flax_vit.VisionTransformerNaFlex) on the file's arrays, given
    whole images as patch sequences of their full grids."""
    import flax

    from . import flax_vit

    pool_type = BIG_VISION_NAFLEX_POOL_TYPE[config.pooling_kind]
    patch = config.patch_size_2d[0]
    model = flax_vit.VisionTransformerNaFlex(
        num_classes=common["num_classes"],
        width=config.hidden_size,
        depth=config.num_hidden_layers,
        mlp_dim=config.intermediate_size,
        num_heads=config.num_attention_heads,
        posemb_side=params["pos_embedding"].shape[0],
        pool_type=pool_type,
        rep_size=config.representation_size or False,
        scan=layout.scanned,
        patchln_post=config.patch_norm,
        approximate_gelu=args.gelu == "tanh",
    )

    def forward(pixels):
        grid = max(pixels.shape[-2:]) // patch
        inputs = flax_vit.naflex_inputs(pixels.permute(0, 2, 3, 1).numpy(), patch)
        logits, _, pooled = flax_vit.run(model.clone(canvas=max(64, grid)), params, inputs, intermediates=True)
        return reference_outputs(logits, pooled, head_kept)

    return Reference(
        f"Flax {flax.__version__} `VisionTransformerNaFlex` (hubvit.conversion.flax_vit, big_vision's NaFlex module "
        "layout) on this file's arrays, each image one patch sequence of its whole grid",
        forward,
        tolerance=args.tolerance,
    )


def convert(args):
    """The `Conversion` of a vision_transformer or big_vision `.npz`; `args` is an `Options`."""
    origin = sources.resolve(args.src, "url", sha256=args.sha256)
    path = origin.path
    if args.num_labels is not None and args.num_labels < 0:
        raise ConversionError(f"--num-labels must be >= 0, got {args.num_labels}")
    if args.image_size is not None and args.image_size <= 0:
        raise ConversionError(f"--image-size must be a positive number of pixels, got {args.image_size}")
    source = read_weights(path)
    layout = detect_layout(source, path)
    fields, num_labels = read_config(source, layout, args, path)
    config = HubViTConfig(**fields, num_labels=num_labels)
    mapping = map_weights(source, layout, config, args, path)
    state_dict, report = mapping.finish(expected_shapes(config)), mapping.report()
    if args.image_size and config.position_kind.learned:
        model = build_model(config, state_dict).resize_position_embeddings(args.image_size)
        state_dict, fields["image_size"] = model.state_dict(), model.config.image_size
        config = model.config
    dtypes = sorted(
        {
            "bfloat16 (stored as 2-byte void)" if v.dtype.kind == "V" else str(v.dtype)
            for k, v in source.items()
            if k.startswith(layout.prefix)
        }
    )
    blocks = "scanned" if layout.scanned else "looped"
    provenance = (
        f"Converted from the original JAX checkpoint `{path.name}` ({layout.name}{' NaFlex' * layout.naflex} layout, prefix "
        f"'{layout.prefix or '(none)'}', {blocks} blocks, {', '.join(dtypes)}), pooling {config.pooling}. "
        f"GELU: {'tanh approximation, as Flax nn.gelu' if args.gelu == 'tanh' else 'exact erf (not the original)'}; "
        f"{report[0]}."
    )
    preprocessing = Preprocessing(mean=(0.5,) * 3, std=(0.5,) * 3, resample="bilinear")
    if layout.naflex:  # each image at its own aspect ratio within the table's patch count, as SigLIP 2 serves it
        (rows, columns), (patch, _) = config.grid_size, config.patch_size_2d
        budget = rows * columns
        preprocessing.processor = patch_budget_processor(patch, budget, "bilinear", (0.5,) * 3, (0.5,) * 3)
        preprocessing.notes.append(f"SigLIP 2's NaFlex processor: at most {budget} patches of {patch} pixels")
    return Conversion(
        weights=state_dict,
        config=fields,
        preprocessing=preprocessing,
        labels={i: f"LABEL_{i}" for i in range(num_labels)},
        reference=flax_reference(source, layout, config, args),
        provenance=provenance,
        command=command_line(args),
        family=layout.name,
        citation_key=["big_vision", "siglip2"] if layout.naflex else None,
        dropped=report,
        source=origin.record(),
    )
