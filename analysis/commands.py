"""`info` and the analyses as Python functions (`hubvit.info`, `hubvit.analyze_attention_distance`,
`hubvit.analyze_position_similarity`, `hubvit.analyze_attention_map`), each returning a small record, and the
`hubvit info` / `hubvit analyze ...` flags that map onto them (`add_commands`) and print what they return."""

import argparse
import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import HubViTError
from ..limits import check_config_sizes
from . import attention, info as counts, plots, position, source

SRC_HELP = "a hubvit folder, a Hub repo id, or a preset SIZE/PATCH (ti, s, b, l, h; e.g. b/16, h/14, b/32)"
DISTANCE_HELP = """Mean attention distance (Dosovitskiy et al., 2021, Figure 7): for each layer and head, the
attention-weighted distance in pixels between a query patch and the patches it attends to, averaged over query
patches and images. Prefix tokens ([CLS], registers, distillation) have no place in the image: queries and keys are
restricted to patch tokens and each query's weights over patches are renormalised to sum to 1, so the number is the
distance of the attention a patch pays to other patches. The attention mass left on prefix tokens is written beside
it (prefix_attention). Images are streamed in batches and reduced as they go: memory does not grow with their
number. Writes attention_distance.json, .csv (layer x head) and .png."""


def add_commands(commands):
    """Adds `info` and `analyze` to the `hubvit` command's subparsers."""
    parser = commands.add_parser(
        "info",
        help="tokens, attention memory, parameters and FLOPs of a model",
        description="The arithmetic of 'Vision Transformer (ViT) from First Principles' for a model: patch "
        "grid, sequence "
        "length, attention-score memory beside pixel-level tokens, parameters and "
        "multiply-accumulates by part.",
    )
    parser.add_argument("src", metavar="SRC", help=SRC_HELP)
    parser.add_argument("--image-size", type=counts.parse_image_size, help="int or HxW (default: the model's)")
    parser.add_argument("--batch-size", type=int, default=1, help="for the attention memory (default 1)")
    parser.add_argument("--dtype", default="float32", help="of the attention scores: float32, float16, bfloat16, ...")
    parser.add_argument("--patch-sizes", type=int_list, help="comma-separated patch sides, one row each: 32,16,14,8")
    parser.add_argument(
        "--accuracy",
        metavar="JSON",
        help="measured accuracy per patch side for the --patch-sizes "
        f"rows (default: SRC/{counts.PATCH_ACCURACY_FILE} when SRC is a folder that has one)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.set_defaults(run=info, show=show_info)

    analyze = commands.add_parser("analyze", help="attention distance, position similarity, attention maps")
    kinds = analyze.add_subparsers(dest="analysis", required=True)

    distance = kinds.add_parser(
        "attention-distance", help="mean attention distance per layer and head", description=DISTANCE_HELP
    )
    distance.add_argument("src", metavar="SRC", help=SRC_HELP)
    data = distance.add_mutually_exclusive_group(required=True)
    data.add_argument("--images", metavar="DIR", help="a folder of image files (searched recursively)")
    data.add_argument(
        "--dataset", metavar="NAME_OR_PATH", help="a `datasets` Hub id, local folder or save_to_disk folder"
    )
    distance.add_argument("--split", help="dataset split (default: validation, else test, else the first)")
    distance.add_argument("--image-column", default="image")
    distance.add_argument("--max-images", type=int, default=128, help="default 128, as in the paper")
    distance.add_argument("--batch-size", type=int, default=16)
    common(distance)
    distance.set_defaults(run=analyze_attention_distance, show=show_analysis)

    similarity = kinds.add_parser(
        "position-similarity",
        help="cosine similarity of the position embeddings",
        description="Cosine similarity of each patch's position vector with every other "
        "patch's, as G x G tiles (learned, learned_2d, sincos_2d); each head's bias over "
        "(dy, dx) for relative_2d. Prints the stripe score: mean similarity of same-row or "
        "same-column pairs minus that of other pairs at the same distance.",
    )
    similarity.add_argument("src", metavar="SRC", help=SRC_HELP)
    similarity.add_argument("--layer", type=int, default=0, help="block whose relative bias to draw (relative_2d)")
    common(similarity)
    similarity.set_defaults(run=analyze_position_similarity, show=show_analysis)

    attention_map = kinds.add_parser(
        "attention-map",
        help="attention rollout or one head's map over an image",
        description="Attention rollout (Abnar and Zuidema, 2020: heads averaged, "
        "identity added, rows renormalised, multiplied through the layers) from [CLS], "
        "or from the mean of the patch queries without [CLS]; or the last layer's "
        "attention (--method last-layer, one --head or their mean).",
    )
    attention_map.add_argument("src", metavar="SRC", help=SRC_HELP)
    attention_map.add_argument("image", metavar="IMAGE", help="an image file")
    attention_map.add_argument("--method", choices=["rollout", "last-layer"], default="rollout")
    attention_map.add_argument("--head", type=int, help="with last-layer: the head (default: mean of all heads)")
    common(attention_map)
    attention_map.set_defaults(run=analyze_attention_map, show=show_analysis)


def common(parser):
    parser.add_argument(
        "--image-size",
        type=counts.parse_image_size,
        help="int or HxW; the position tables are resized as the model does (default: native)",
    )
    parser.add_argument("--output-dir", default="analysis", help="where the files go (default: ./analysis)")


def int_list(text):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints such as 32,16,14,8, got {text!r}")
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive ints such as 32,16,14,8, got {text!r}")
    return values


def output_folder(output_dir):
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def image_size_of(value):
    """None, an int, an (height, width) pair or 'HxW' text as an (h, w) pair (None stays None)."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)) and len(value) == 2:
        value = "x".join(str(v) for v in value)
    return counts.parse_image_size(value)


def positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise HubViTError(f"{name}={value!r}; expected a positive integer")
    return value


def check_size(config, image_size):
    if image_size is not None:
        counts.grid_of(config, image_size)
        check_config_sizes(config, "--image-size", image_size)


@dataclass(frozen=True)
class InfoResult:
    """The arithmetic of a model: `summary` (patch grid, tokens, attention memory, parameters and MACs by part), and
    one row per patch size asked for (`patch_sizes`)."""

    summary: dict
    patch_sizes: list | None = None


def info(
    src, *, image_size=None, batch_size: int = 1, dtype: str = "float32", patch_sizes: list | None = None, accuracy=None
) -> InfoResult:
    """Tokens, attention memory (for `batch_size` images, scores in `dtype`), parameters and multiply-accumulates of
    SRC (a hubvit folder, a Hub repo id or a preset such as 'b/16') at `image_size` (int, (h, w) or 'HxW'; default
    the model's), counted from the config alone; `patch_sizes` adds one row per patch side, with the accuracy measured
    at that side where `accuracy` (a `patch_size_accuracy.json`; default SRC's own, when SRC is a folder with one)
    records it."""
    image_size = image_size_of(image_size)
    batch_size = positive_int(batch_size, "batch_size")
    counts.dtype_bytes(dtype)
    if patch_sizes is not None:
        patch_sizes = [positive_int(patch, "patch_sizes") for patch in patch_sizes]
    config = source.load_config(src, image_size)
    head = source.has_head(config)
    summary = counts.summary(config, image_size, batch_size, dtype, head)
    rows = None
    if patch_sizes:
        found = Path(src) / counts.PATCH_ACCURACY_FILE
        path = accuracy if accuracy is not None else (found if found.is_file() else None)
        measured = counts.read_patch_accuracy(path)[0] if path is not None else None
        rows = counts.patch_size_rows(config, patch_sizes, image_size, batch_size, dtype, head, measured)
    return InfoResult(summary, rows)


def show_info(result, args):
    if args.json:
        print(
            json.dumps(
                {**result.summary, **({"patch_sizes": result.patch_sizes} if result.patch_sizes else {})}, indent=2
            )
        )
        return
    print(counts.format_summary(result.summary, args.src))
    if result.patch_sizes:
        print(f"\nBy patch size (attention memory at batch {args.batch_size}, {args.dtype}):")
        print(counts.format_patch_rows(result.patch_sizes))


@dataclass(frozen=True)
class AnalysisResult:
    """What an analysis wrote (`files`, first the picture) and its figures (`values`: e.g. the mean attention distance
    per layer and head, or the stripe score); `message` says it in one line."""

    files: list
    values: dict = field(default_factory=dict)
    message: str = ""


def show_analysis(result, args):
    print(result.message)


def write_distance(result, folder, title):
    (folder / "attention_distance.json").write_text(json.dumps(result, indent=2) + "\n")
    with open(folder / "attention_distance.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        heads = len(result["mean_distance"][0])
        writer.writerow(["layer"] + [f"head_{h}" for h in range(heads)])
        for layer, row in enumerate(result["mean_distance"]):
            writer.writerow([layer] + [f"{v:.4f}" for v in row])
    return plots.plot_attention_distance(result, folder / "attention_distance.png", title)


def analyze_attention_distance(
    src,
    *,
    images=None,
    dataset=None,
    split: str | None = None,
    image_column: str = "image",
    max_images: int = 128,
    batch_size: int = 16,
    image_size=None,
    output_dir="analysis",
) -> AnalysisResult:
    """Mean attention distance per layer and head (the paper's Figure 7) of SRC over `max_images` images from a
    folder (`images`) or a `datasets` dataset (`dataset`, `split`, `image_column`); writes attention_distance.json,
    .csv and .png into `output_dir`. See `hubvit analyze attention-distance --help` for the exact definition."""
    if (images is None) == (dataset is None):
        raise HubViTError(f"images={images!r}, dataset={dataset!r}; give exactly one: a folder of images or a dataset")
    max_images, batch_size = positive_int(max_images, "max_images"), positive_int(batch_size, "batch_size")
    image_size = image_size_of(image_size)
    model, processor = source.load_model(src, image_size if source.is_preset(src) else None)
    check_size(model.config, image_size)
    stream = source.iter_images(images, dataset, split, image_column, max_images)
    batches = source.pixel_batches(stream, processor, model.config, batch_size, image_size)
    result = attention.attention_distance(model, batches)
    path = write_distance(result, output_folder(output_dir), f"{src}")
    message = (
        f"{result['images']} images; mean attention distance per layer (pixels, mean of heads): "
        + ", ".join(f"{np.mean(row):.1f}" for row in result["mean_distance"])
        + f"\nwrote {path} and its .json/.csv"
    )
    files = [path, path.with_suffix(".json"), path.with_suffix(".csv")]
    return AnalysisResult(files, result, message)


def similarity_figures(model, folder, image_size=None, layer=0, title=""):
    """Writes the position figure for `model` into `folder`; returns (message, stripe score or None, files)."""
    config = attention.body(model).config
    grid = counts.grid_of(config, image_size) if image_size else config.grid_size
    kind = config.position_embedding_type
    if kind == "none":
        return "position_embedding_type='none': this model has no position table to draw", None, []
    if kind == "relative_2d":
        tables = position.relative_bias_tables(model, layer, grid)
        np.save(folder / "relative_position_bias.npy", tables.numpy())
        path = plots.plot_relative_bias(
            tables,
            folder / "relative_position_bias.png",
            f"{title} relative bias, layer {layer}, grid {grid[0]}x{grid[1]}",
        )
        return f"wrote {path} ({tables.shape[0]} heads over (dy, dx))", None, [path, path.with_suffix(".npy")]
    similarity = position.cosine_similarity_grid(position.position_table(model, grid), grid)
    np.save(folder / "position_similarity.npy", similarity.numpy())
    score = position.stripe_score(similarity)
    path = plots.plot_position_similarity(
        similarity, folder / "position_similarity.png", f"{title} {kind} position embeddings, grid {grid[0]}x{grid[1]}"
    )
    message = f"wrote {path}; stripe score {'n/a (grid too small)' if score is None else f'{score:.3f}'}"
    return message, score, [path, path.with_suffix(".npy")]


def analyze_position_similarity(src, *, layer: int = 0, image_size=None, output_dir="analysis") -> AnalysisResult:
    """Cosine similarity of the position embeddings of SRC as grid tiles (learned, learned_2d, sincos_2d), or each
    head's relative bias of block `layer` (relative_2d), drawn into `output_dir`; `values["stripe_score"]`: mean
    similarity of same-row or same-column pairs minus that of other pairs at the same distance."""
    image_size = image_size_of(image_size)
    model, _ = source.load_model(src, image_size if source.is_preset(src) else None)
    check_size(model.config, image_size)
    message, score, files = similarity_figures(model, output_folder(output_dir), image_size, layer, src)
    return AnalysisResult(files, {"stripe_score": score}, message)


def attention_map_figure(model, processor, image, path, method="rollout", head=None, image_size=None):
    config = attention.body(model).config
    image = source.to_model_mode(image, config)
    pixels = source.preprocess(processor, [image], tuple(image_size) if image_size else config.image_size_2d)
    attentions, grid = attention.attention_weights(model, pixels)
    if method == "rollout":
        values = attention.rollout(attentions, config.num_prefix_tokens, config.class_token)
        label = "attention rollout from " + ("[CLS]" if config.class_token else "the mean patch query")
    else:
        values = attention.last_layer_map(attentions, config.num_prefix_tokens, config.class_token, head)
        label = f"last layer, {'mean of heads' if head is None else f'head {head}'}"
    values = values[0].reshape(grid).numpy()
    plots.plot_attention_map(np.asarray(image), values, path, label)
    return values


def analyze_attention_map(
    src, image, *, method: str = "rollout", head: int | None = None, image_size=None, output_dir="analysis"
) -> AnalysisResult:
    """Attention rollout over IMAGE (Abnar and Zuidema, 2020) from [CLS] (or the mean patch query), or the last
    layer's attention (`method='last-layer'`, one `head` or their mean), drawn over the image into `output_dir`;
    `values["map"]` is the patch-grid array."""
    if method not in ("rollout", "last-layer"):
        raise HubViTError(f"method={method!r}; expected 'rollout' or 'last-layer'")
    if head is not None and method != "last-layer":
        raise HubViTError("--head applies to --method last-layer only")
    if not Path(image).is_file():
        raise HubViTError(f"IMAGE {str(image)!r} is not a file")
    image_size = image_size_of(image_size)
    model, processor = source.load_model(src, image_size if source.is_preset(src) else None)
    check_size(model.config, image_size)
    path = output_folder(output_dir) / f"attention_map_{Path(image).stem}_{method}.png"
    values = attention_map_figure(model, processor, source.open_image(image), path, method, head, image_size)
    np.save(path.with_suffix(".npy"), values)
    return AnalysisResult([path, path.with_suffix(".npy")], {"map": values}, f"wrote {path}")


def training_figures(src, images, folder, max_images=128, max_maps=4, batch_size=32):
    """The pictures the fine-tuning command leaves in OUT/analysis for its trained model (the folder `src`):
    position similarity, attention distance on (up to 128 of) the held-out images, rollout maps of the first few."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model, processor = source.load_model(str(src))
    images = list(images[:max_images])
    similarity_figures(model, folder, title="trained model:")
    batches = source.pixel_batches(iter(images), processor, model.config, batch_size)
    write_distance(attention.attention_distance(model, batches), folder, "trained model, held-out images")
    for index, image in enumerate(images[:max_maps]):
        attention_map_figure(model, processor, image, folder / f"attention_map_{index}.png")
    return folder
