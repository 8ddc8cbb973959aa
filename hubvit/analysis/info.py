"""The arithmetic of the blog post "Vision Transformer (ViT) from First Principles", from a config: tokens, attention memory, parameters and MACs by part.

Parameters and multiply-accumulates are counted on the model itself, built on the meta device (no memory, no
weights), so every component counts as it computes and none keeps a formula of its own: `sum(p.numel())` by part,
and `torch.utils.flop_counter.FlopCounterMode` over one forward (and one backward) pass. MACs are those of the
matrix products (linear layers, the patch convolution, the two attention products), FLOPs = 2 x MACs. Norms,
softmax, activations, biases and residual additions cost O(T x d) each and are left out, as in the paper's and
timm's counts.
"""

import re
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from .. import presets
from ..errors import HubViTError
from ..folder import ACCURACY_FILE
from ..meta import meta_model
from ..modeling.windows_hubvit import DecomposedRelativePositions

DTYPE_BYTES = {"float64": 8, "float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2}


def preset_config(name, image_size=224, num_labels=1000):
    """`b/16`-style names (size letter / patch side, `hubvit.presets`) as a `HubViTConfig` with the paper's
    1000-class head; a size the model cannot take is a `HubViTError` naming it."""
    from .. import HubViTConfig

    fields = presets.config_fields(name, image_size)
    try:
        return HubViTConfig(**fields, num_labels=num_labels)
    except ValueError as error:  # the config's own checks: bad input here, not a bug
        raise HubViTError(f"preset {name!r} at image size {image_size!r}: {error}") from None


def parse_image_size(value):
    """`224` or `224x320` (height x width) as an (h, w) pair."""
    parts = str(value).lower().split("x")
    if len(parts) not in (1, 2) or not all(p.strip().isdecimal() and int(p) > 0 for p in parts):
        raise HubViTError(f"image size {value!r} must be a positive int or HEIGHTxWIDTH, e.g. 224 or 224x320")
    sizes = [int(p) for p in parts]
    return (sizes[0], sizes[-1])


def dtype_bytes(dtype):
    if dtype not in DTYPE_BYTES:
        raise HubViTError(f"dtype {dtype!r} is not supported; expected one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def grid_of(config, image_size=None):
    (h, w) = tuple(image_size) if image_size is not None else config.image_size_2d
    ph, pw = config.patch_size_2d
    if h < ph or w < pw:
        raise HubViTError(f"image size {h}x{w} is smaller than one patch of {ph}x{pw}")
    return h // ph, w // pw


@dataclass
class Tokens:
    grid: tuple
    num_patches: int
    num_prefix: int

    @property
    def sequence_length(self):
        return self.num_patches + self.num_prefix


def tokens(config, image_size=None):
    grid = grid_of(config, image_size)
    return Tokens(grid, grid[0] * grid[1], config.num_prefix_tokens)


def attention_memory(config, image_size=None, batch_size=1, dtype="float32"):
    """Attention-score entries and bytes for patch tokens, beside the same image taken pixel by pixel.

    The pixel-level sequence has one token per pixel and no prefix token, as in the example of "ViT from First Principles"
    (224 x 224 pixels: 50,176 tokens, 50,176^2 / 197^2 = 64,872x more entries).
    """
    size = tuple(image_size) if image_size is not None else config.image_size_2d
    heads, depth, itemsize = config.num_attention_heads, config.num_hidden_layers, dtype_bytes(dtype)

    def side(sequence):
        entries = sequence * sequence
        layer = batch_size * heads * entries * itemsize
        return {
            "sequence_length": sequence,
            "entries_per_head": entries,
            "bytes_per_layer": layer,
            "bytes_all_layers": layer * depth,
        }

    patches = side(tokens(config, size).sequence_length)
    pixels = side(size[0] * size[1])
    return {
        "batch_size": batch_size,
        "dtype": dtype,
        "heads": heads,
        "layers": depth,
        "patches": patches,
        "pixels": pixels,
        "reduction": pixels["entries_per_head"] / patches["entries_per_head"],
    }


def part_name(path, depth, suffix=""):
    """A parameter's or module's path (and `suffix`) as a part of the model: the body's prefix dropped, each block's
    own parts merged across the `depth` blocks."""
    path = path.removeprefix("hubvit.")
    block = re.fullmatch(r"encoder\.layers\.\d+\.(.+)", path)
    return f"blocks.{block[1]}{suffix} (x{depth})" if block else path + suffix


def parameter_parts(config, head=True, model=None):
    """(part, parameters) in the model's order, each part a module's weight and bias together (or a parameter of its
    own: the class token, a position table); blocks are listed once, times the depth."""
    model = meta_model(config, head) if model is None else model
    parts = {}
    for name, parameter in model.named_parameters():
        part = part_name(re.sub(r"\.(weight|bias)$", "", name), config.num_hidden_layers)
        parts[part] = parts.get(part, 0) + parameter.numel()
    return list(parts.items())


def encoder_parameters(config, model=None):
    """Parameters of the encoder blocks alone: what stays the same when only the patch size changes."""
    model = meta_model(config, head=False) if model is None else model
    return sum(p.numel() for name, p in model.named_parameters() if re.match(r"(hubvit\.)?encoder\.layers\.", name))


def recorded_parent(name, recorded):
    """The nearest module enclosing `name` (a dotted path) among `recorded`, or None."""
    while "." in name:
        name = name.rsplit(".", 1)[0]
        if name in recorded:
            return name
    return None


def counted_macs(model, pixels, backward=False):
    """(part, multiply-accumulates) FlopCounterMode counts for `model` on `pixels` (FLOPs / 2): each module's products
    outside its submodules (an attention layer's own: QK^T and AV), in forward order."""
    with FlopCounterMode(display=False) as counter, torch.set_grad_enabled(backward):
        output = model(pixels)
        if backward:
            (output.logits if hasattr(output, "logits") else output.last_hidden_state).sum().backward()
    totals = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items() if name != "Global"}
    own, parents = dict(totals), set()
    for name, flops in totals.items():
        parent = recorded_parent(name, totals)
        if parent is not None:
            own[parent] -= flops
            parents.add(parent)
    root, parts = type(model).__name__, {}
    for name, flops in own.items():
        if flops:
            path = name.removeprefix(root).removeprefix(".") or "model"
            part = part_name(path, model.config.num_hidden_layers, " products" if name in parents else "")
            parts[part] = parts.get(part, 0) + flops // 2
    return list(parts.items())


def mac_parts(config, image_size=None, head=True, model=None):
    """(part, multiply-accumulates) of one image's forward pass (batch 1), as FlopCounterMode counts them on the
    model itself: matrix products and convolutions, FLOPs = 2 x MACs."""
    model = meta_model(config, head) if model is None else model
    height, width = tuple(image_size) if image_size is not None else config.image_size_2d
    grid_of(config, (height, width))
    return counted_macs(model.eval(), torch.empty(1, config.num_channels, height, width, device="meta"))


def training_step_macs(config, image_size=None, head=True, model=None):
    """One image's forward and backward, counted on the model in training mode: most products cost 3x their forward
    (the output and two gradients); the patch embedding 2x, as the pixels need no gradient."""
    model = meta_model(config, head) if model is None else model
    height, width = tuple(image_size) if image_size is not None else config.image_size_2d
    pixels = torch.empty(1, config.num_channels, height, width, device="meta")
    try:
        return sum(count for _, count in counted_macs(model.train(), pixels, backward=True))
    finally:
        model.eval()


def position_description(config):
    """What the model is told about where patches sit: its position kind, its rotary kind, or both."""
    kinds = [config.position_kind, config.rotary_kind]
    told = [kind.description for kind in kinds if kind is not None and kind.positional]
    if config.decomposed_relative_position:
        told.append(DecomposedRelativePositions.description)
    return " + ".join(told) or config.position_kind.description


def summary(config, image_size=None, batch_size=1, dtype="float32", head=True):
    """Everything `hubvit info` prints, as a JSON-able dict."""
    size = tuple(image_size) if image_size is not None else config.image_size_2d
    t = tokens(config, size)
    model = meta_model(config, head)
    params = parameter_parts(config, head, model)
    macs = mac_parts(config, size, head, model)
    forward = sum(count for _, count in macs)
    training_step = training_step_macs(config, size, head, model)
    return {
        "image_size": list(size),
        "patch_size": list(config.patch_size_2d),
        "grid": list(t.grid),
        "num_patches": t.num_patches,
        "num_prefix_tokens": t.num_prefix,
        "sequence_length": t.sequence_length,
        "position": position_description(config),
        "attention": attention_memory(config, size, batch_size, dtype),
        "parameters": {
            "parts": dict(params),
            "encoder": encoder_parameters(config, model),
            "total": sum(count for _, count in params),
        },
        "macs_per_image": {
            "parts": dict(macs),
            "forward": forward,
            "forward_flops": 2 * forward,
            "training_step": training_step,
            "training_step_flops": 2 * training_step,
        },
    }


PATCH_ACCURACY_FILE = ACCURACY_FILE


def read_patch_accuracy(path):
    """{patch side: accuracy} from a `patch_size_accuracy.json` (written by `finetune.py --patch_sizes`), and the
    split it was measured on; `HubViTError` naming the file when it is not one."""
    import json
    from pathlib import Path

    try:
        record = json.loads(Path(path).read_text())
        accuracy = {int(size): float(value) for size, value in record["accuracy"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise HubViTError(
            f"{path}: not a patch-size accuracy file ({{'accuracy': {{P: value}}}} expected): "
            f"{str(error).splitlines()[0] if str(error) else type(error).__name__}"
        ) from None
    return accuracy, record.get("split")


def patch_size_rows(config, patch_sizes, image_size=None, batch_size=1, dtype="float32", head=True, accuracy=None):
    """One row per patch side at the same image size: how N, attention memory and MACs grow while the encoder's
    parameters stay the same (only the patch embedding and the position table change). `accuracy` ({side: value},
    measured) fills the accuracy column where known; the other rows have None."""
    size = tuple(image_size) if image_size is not None else config.image_size_2d
    rows = []
    for patch in patch_sizes:
        if size[0] % patch or size[1] % patch:
            raise HubViTError(f"patch size {patch} does not divide the image size {size[0]}x{size[1]}")
        variant = config.__class__.from_dict(
            {**config.to_dict(), "patch_size": patch, "image_size": list(size) if size[0] != size[1] else size[0]}
        )
        info = summary(variant, size, batch_size, dtype, head)
        rows.append(
            {
                "patch_size": patch,
                "grid": info["grid"],
                "num_patches": info["num_patches"],
                "sequence_length": info["sequence_length"],
                "attention_entries_per_head": info["attention"]["patches"]["entries_per_head"],
                "attention_bytes_all_layers": info["attention"]["patches"]["bytes_all_layers"],
                "forward_macs": info["macs_per_image"]["forward"],
                "forward_flops": info["macs_per_image"]["forward_flops"],
                "accuracy": (accuracy or {}).get(patch),
                "encoder_parameters": info["parameters"]["encoder"],
                "total_parameters": info["parameters"]["total"],
            }
        )
    return rows


def human_bytes(count):
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def human_count(count):
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= scale:
            return f"{count / scale:.2f} {unit}"
    return str(count)


def table(rows, header):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]

    def line(row):
        return "  ".join(str(v).rjust(w) if i else str(v).ljust(w) for i, (v, w) in enumerate(zip(row, widths)))

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def format_summary(info, name="model"):
    att = info["attention"]
    p, x = att["patches"], att["pixels"]
    (h, w), (gh, gw) = info["image_size"], info["grid"]
    lines = [
        f"{name}: {h}x{w} image, {info['patch_size'][0]}x{info['patch_size'][1]} patches",
        f"  grid {gh} x {gw} = {info['num_patches']:,} patches, {info['num_prefix_tokens']} prefix token(s), "
        f"sequence length {info['sequence_length']:,}",
        f"  position: {info['position']}",
        "",
        f"Attention scores ({att['heads']} heads, {att['layers']} layers, batch {att['batch_size']}, {att['dtype']}):",
        table(
            [
                [
                    "patch tokens",
                    f"{p['sequence_length']:,}",
                    f"{p['entries_per_head']:,}",
                    human_bytes(p["bytes_per_layer"]),
                    human_bytes(p["bytes_all_layers"]),
                ],
                [
                    "pixel tokens",
                    f"{x['sequence_length']:,}",
                    f"{x['entries_per_head']:,}",
                    human_bytes(x["bytes_per_layer"]),
                    human_bytes(x["bytes_all_layers"]),
                ],
            ],
            ["tokens", "sequence", "entries / head", "memory / layer", "memory, all layers"],
        ),
        f"  pixel tokens need {att['reduction']:,.0f}x more attention entries than patches",
        "",
        "Parameters:",
        table(
            [[k, f"{v:,}"] for k, v in info["parameters"]["parts"].items()]
            + [["total", f"{info['parameters']['total']:,}"]],
            ["part", "parameters"],
        ),
        "",
        "Multiply-accumulates per image (FLOPs = 2 x MACs):",
        table(
            [[k, f"{v:,}", human_count(v)] for k, v in info["macs_per_image"]["parts"].items()]
            + [
                ["forward", f"{info['macs_per_image']['forward']:,}", human_count(info["macs_per_image"]["forward"])],
                [
                    "training step (fwd + bwd)",
                    f"{info['macs_per_image']['training_step']:,}",
                    human_count(info["macs_per_image"]["training_step"]),
                ],
            ],
            ["part", "MACs", ""],
        ),
    ]
    return "\n".join(lines)


def format_patch_rows(rows):
    measured = any(r.get("accuracy") is not None for r in rows)
    return table(
        [
            [
                r["patch_size"],
                f"{r['grid'][0]}x{r['grid'][1]}",
                f"{r['num_patches']:,}",
                f"{r['attention_entries_per_head']:,}",
                human_bytes(r["attention_bytes_all_layers"]),
                human_count(r["forward_macs"]) + "MAC",
                human_count(r["forward_flops"]) + "FLOP",
                f"{r['encoder_parameters']:,}",
                f"{r['total_parameters']:,}",
            ]
            + ([f"{100 * r['accuracy']:.2f}%" if r.get("accuracy") is not None else "-"] if measured else [])
            for r in rows
        ],
        [
            "patch",
            "grid",
            "N",
            "entries / head",
            "attention, all layers",
            "forward",
            "forward FLOPs",
            "encoder params",
            "total params",
        ]
        + (["accuracy (measured)"] if measured else []),
    )
