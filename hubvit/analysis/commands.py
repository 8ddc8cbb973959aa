"""`info` and the analyses: for each, its options (`InfoOptions`, ...) and its run function, which returns a small
record. The command table (`hubvit.commands`) makes them `hubvit.info`, `hubvit.analyze_attention_distance`, ... and
`hubvit info` / `hubvit analyze ...`."""

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import HubViTError
from ..limits import check_config_sizes
from ..options import argument, choice, nonempty_path, option, path_text, settle, text
from . import attention, info as counts, plots, position, source

SRC_HELP = "a hubvit folder, a Hub repo id, or a preset SIZE/PATCH (ti, s, b, l, h; e.g. b/16, h/14, b/32)"


def parse_patch_sizes(value):
    """`patch_sizes`: comma-separated text ('32,16,14,8') or a list of positive ints; a list of ints."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = [int(part) for part in value.split(",") if part.strip()]
        except ValueError:
            raise HubViTError(f"patch_sizes={value!r}; expected comma-separated ints such as 32,16,14,8") from None
        if not value:
            raise HubViTError("patch_sizes=''; expected comma-separated ints such as 32,16,14,8")
    if not isinstance(value, (list, tuple)):
        raise HubViTError(f"patch_sizes={value!r}; expected a list of positive ints or text such as '32,16,14,8'")
    return [positive_int(patch, "patch_sizes") for patch in value]


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


IMAGE_SIZE_HELP = "int or HxW; the position tables are resized as the model does (default: native)"
OUTPUT_HELP = "where the files go (default: ./analysis)"


@dataclass(frozen=True)
class InfoOptions:
    """The arithmetic of 'Vision Transformer (ViT) from First Principles' for a model: tokens, attention memory (for
    `batch_size` images, scores in `dtype`), parameters and multiply-accumulates by part of SRC (a hubvit folder, a
    Hub repo id or a preset such as 'b/16') at `image_size` (int, (h, w) or 'HxW'; default the model's), counted
    from the config alone; `patch_sizes` adds one row per patch side, with the accuracy measured at that side where
    `accuracy` (a `patch_size_accuracy.json`; default SRC's own, when SRC is a folder with one) records it."""

    src: str = argument("SRC", SRC_HELP)
    image_size: int | tuple | str | None = option(None, "int or HxW (default: the model's)")
    batch_size: int = option(1, "for the attention memory (default 1)")
    dtype: str = option("float32", "of the attention scores: float32, float16, bfloat16, ...")
    patch_sizes: list | str | None = option(None, "comma-separated patch sides, one row each: 32,16,14,8")
    accuracy: str | None = option(
        None,
        "measured accuracy per patch side for the --patch-sizes rows (default: SRC/"
        f"{counts.PATCH_ACCURACY_FILE} when SRC is a folder that has one)",
        metavar="JSON",
    )

    def __post_init__(self):
        counts.dtype_bytes(self.dtype)
        settle(
            self,
            src=nonempty_path(self.src, "src"),
            image_size=image_size_of(self.image_size),
            batch_size=positive_int(self.batch_size, "batch_size"),
            patch_sizes=parse_patch_sizes(self.patch_sizes),
            accuracy=None if self.accuracy is None else path_text(self.accuracy, "accuracy"),
        )


def run_info(options: InfoOptions) -> InfoResult:
    src, image_size, batch_size, dtype = options.src, options.image_size, options.batch_size, options.dtype
    config = source.load_config(src, image_size)
    head = source.has_head(config)
    summary = counts.summary(config, image_size, batch_size, dtype, head)
    rows = None
    if options.patch_sizes:
        found = Path(src) / counts.PATCH_ACCURACY_FILE
        path = options.accuracy if options.accuracy is not None else (found if found.is_file() else None)
        measured = counts.read_patch_accuracy(path)[0] if path is not None else None
        rows = counts.patch_size_rows(config, options.patch_sizes, image_size, batch_size, dtype, head, measured)
    return InfoResult(summary, rows)


@dataclass(frozen=True)
class AnalysisResult:
    """What an analysis wrote (`files`, first the picture; none when there was nothing to draw) and its figures
    (`values`: e.g. the mean attention distance per layer and head, or the stripe score)."""

    files: list
    values: dict = field(default_factory=dict)


def write_distance(result, folder, title):
    (folder / "attention_distance.json").write_text(json.dumps(result, indent=2) + "\n")
    with open(folder / "attention_distance.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        heads = len(result["mean_distance"][0])
        writer.writerow(["layer"] + [f"head_{h}" for h in range(heads)])
        for layer, row in enumerate(result["mean_distance"]):
            writer.writerow([layer] + [f"{v:.4f}" for v in row])
    return plots.plot_attention_distance(result, folder / "attention_distance.png", title)


@dataclass(frozen=True)
class AttentionDistanceOptions:
    """Mean attention distance per layer and head (Dosovitskiy et al., 2021, Figure 7) of SRC over `max_images`
    images from a folder (`images`) or a `datasets` dataset (`dataset`, `split`, `image_column`); writes
    attention_distance.json, .csv (layer x head) and .png into `output_dir`.

    For each layer and head: the attention-weighted distance in pixels between a query patch and the patches it
    attends to, averaged over query patches and images. Prefix tokens ([CLS], registers, distillation) have no place
    in the image: queries and keys are restricted to patch tokens and each query's weights over patches are
    renormalised to sum to 1, so the number is the distance of the attention a patch pays to other patches. The
    attention mass left on prefix tokens is written beside it (prefix_attention). Images are streamed in batches and
    reduced as they go: memory does not grow with their number."""

    src: str = argument("SRC", SRC_HELP)
    images: str | None = option(None, "a folder of image files (searched recursively); or --dataset", metavar="DIR")
    dataset: str | None = option(
        None, "a `datasets` Hub id, local folder or save_to_disk folder; or --images", metavar="NAME_OR_PATH"
    )
    split: str | None = option(None, "dataset split (default: validation, else test, else the first)")
    image_column: str = option("image", "the dataset's image column")
    max_images: int = option(128, "default 128, as in the paper")
    batch_size: int = option(16, "images per forward pass")
    image_size: int | tuple | str | None = option(None, IMAGE_SIZE_HELP)
    output_dir: str = option("analysis", OUTPUT_HELP)

    def __post_init__(self):
        if (self.images is None) == (self.dataset is None):
            raise HubViTError(
                f"images={self.images!r}, dataset={self.dataset!r}; give exactly one: a folder of images or a dataset"
            )
        settle(
            self,
            src=nonempty_path(self.src, "src"),
            images=None if self.images is None else path_text(self.images, "images"),
            dataset=text(self.dataset, "dataset"),
            split=text(self.split, "split"),
            image_column=text(self.image_column, "image_column", optional=False),
            max_images=positive_int(self.max_images, "max_images"),
            batch_size=positive_int(self.batch_size, "batch_size"),
            image_size=image_size_of(self.image_size),
            output_dir=nonempty_path(self.output_dir, "output_dir"),
        )


def run_attention_distance(options: AttentionDistanceOptions) -> AnalysisResult:
    src, image_size = options.src, options.image_size
    model, processor = source.load_model(src, image_size if source.is_preset(src) else None)
    check_size(model.config, image_size)
    stream = source.iter_images(
        options.images, options.dataset, options.split, options.image_column, options.max_images
    )
    batches = source.pixel_batches(stream, processor, model.config, options.batch_size, image_size)
    result = attention.attention_distance(model, batches)
    path = write_distance(result, output_folder(options.output_dir), f"{src}")
    return AnalysisResult([path, path.with_suffix(".json"), path.with_suffix(".csv")], result)


def similarity_figures(model, folder, image_size=None, layer=0, title=""):
    """Writes the position figure for `model` into `folder`; returns its values (position kind, stripe score or
    None, heads of a relative bias; with `rope_type`, the rotation's figure too) and the files written (none for a
    model without position embeddings)."""
    config = attention.body(model).config
    grid = counts.grid_of(config, image_size) if image_size else config.grid_size
    kind = config.position_embedding_type
    values = {"position_embedding_type": kind, "stripe_score": None}
    described, files = config.position_kind, []
    if config.rotary_kind is not None:
        values, files = rotary_figure(model, folder, grid, title, values)
    if not (described.adds_table or described.attention_bias):
        return values, files
    if described.attention_bias:
        tables = position.relative_bias_tables(model, layer, grid)
        np.save(folder / "relative_position_bias.npy", tables.numpy())
        path = plots.plot_relative_bias(
            tables,
            folder / "relative_position_bias.png",
            f"{title} relative bias, layer {layer}, grid {grid[0]}x{grid[1]}",
        )
        return {**values, "heads": tables.shape[0]}, files + [path, path.with_suffix(".npy")]
    similarity = position.cosine_similarity_grid(position.position_table(model, grid), grid)
    np.save(folder / "position_similarity.npy", similarity.numpy())
    score = position.stripe_score(similarity)
    path = plots.plot_position_similarity(
        similarity, folder / "position_similarity.png", f"{title} {kind} position embeddings, grid {grid[0]}x{grid[1]}"
    )
    return {**values, "stripe_score": score}, files + [path, path.with_suffix(".npy")]


def rotary_figure(model, folder, grid, title, values):
    """The rotary counterpart of the table figure: each patch's rotation against every other's (mean cos of the
    angle differences, `position.rotary_table`), with its stripe score as `values["rotary_stripe_score"]`."""
    config = attention.body(model).config
    similarity = position.cosine_similarity_grid(position.rotary_table(model, grid), grid)
    np.save(folder / "rotary_similarity.npy", similarity.numpy())
    path = plots.plot_position_similarity(
        similarity, folder / "rotary_similarity.png", f"{title} {config.rope_type} rotation, grid {grid[0]}x{grid[1]}"
    )
    return {**values, "rotary_stripe_score": position.stripe_score(similarity)}, [path, path.with_suffix(".npy")]


@dataclass(frozen=True)
class PositionSimilarityOptions:
    """Cosine similarity of each patch's position vector with every other patch's, as G x G tiles (learned,
    learned_2d, sincos_2d), or each head's relative bias over (dy, dx) of block `layer` (relative_2d), drawn into
    `output_dir`; `values["stripe_score"]`: mean similarity of same-row or same-column pairs minus that of other
    pairs at the same distance."""

    src: str = argument("SRC", SRC_HELP)
    layer: int = option(0, "block whose relative bias to draw (relative_2d)")
    image_size: int | tuple | str | None = option(None, IMAGE_SIZE_HELP)
    output_dir: str = option("analysis", OUTPUT_HELP)

    def __post_init__(self):
        if isinstance(self.layer, bool) or not isinstance(self.layer, int) or self.layer < 0:
            raise HubViTError(f"layer={self.layer!r}; expected a block index >= 0")
        settle(
            self,
            src=nonempty_path(self.src, "src"),
            image_size=image_size_of(self.image_size),
            output_dir=nonempty_path(self.output_dir, "output_dir"),
        )


def run_position_similarity(options: PositionSimilarityOptions) -> AnalysisResult:
    src, image_size = options.src, options.image_size
    model, _ = source.load_model(src, image_size if source.is_preset(src) else None)
    check_size(model.config, image_size)
    values, files = similarity_figures(model, output_folder(options.output_dir), image_size, options.layer, src)
    return AnalysisResult(files, values)


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


METHODS = ("rollout", "last-layer")


@dataclass(frozen=True)
class AttentionMapOptions:
    """Attention rollout over IMAGE (Abnar and Zuidema, 2020: heads averaged, identity added, rows renormalised,
    multiplied through the layers) from [CLS] (or the mean of the patch queries without [CLS]), or the last layer's
    attention (`method='last-layer'`, one `head` or their mean), drawn over the image into `output_dir`;
    `values["map"]` is the patch-grid array."""

    src: str = argument("SRC", SRC_HELP)
    image: str = argument("IMAGE", "an image file")
    method: str = option("rollout", "rollout or last-layer", choices=METHODS)
    head: int | None = option(None, "with last-layer: the head (default: mean of all heads)")
    image_size: int | tuple | str | None = option(None, IMAGE_SIZE_HELP)
    output_dir: str = option("analysis", OUTPUT_HELP)

    def __post_init__(self):
        choice(self.method, METHODS, "method")
        if self.head is not None and self.method != "last-layer":
            raise HubViTError("--head applies to --method last-layer only")
        image = path_text(self.image, "image")
        if not Path(image).is_file():
            raise HubViTError(f"IMAGE {image!r} is not a file")
        settle(
            self,
            src=nonempty_path(self.src, "src"),
            image=image,
            image_size=image_size_of(self.image_size),
            output_dir=nonempty_path(self.output_dir, "output_dir"),
        )


def run_attention_map(options: AttentionMapOptions) -> AnalysisResult:
    src, image, image_size = options.src, options.image, options.image_size
    model, processor = source.load_model(src, image_size if source.is_preset(src) else None)
    check_size(model.config, image_size)
    path = output_folder(options.output_dir) / f"attention_map_{Path(image).stem}_{options.method}.png"
    values = attention_map_figure(
        model, processor, source.open_image(image), path, options.method, options.head, image_size
    )
    np.save(path.with_suffix(".npy"), values)
    return AnalysisResult([path, path.with_suffix(".npy")], {"map": values})


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
