"""`hubvit info` and `hubvit analyze ...`: argument parsing and file writing around info, attention and position."""

import argparse
import csv
import json
from pathlib import Path

import numpy as np

from . import attention, info, plots, position, source

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
    parser = commands.add_parser("info", help="tokens, attention memory, parameters and FLOPs of a model",
                                 description="The design document's arithmetic for a model: patch grid, sequence "
                                 "length, attention-score memory beside pixel-level tokens, parameters and "
                                 "multiply-accumulates by part.")
    parser.add_argument("src", metavar="SRC", help=SRC_HELP)
    parser.add_argument("--image-size", type=info.parse_image_size, help="int or HxW (default: the model's)")
    parser.add_argument("--batch-size", type=int, default=1, help="for the attention memory (default 1)")
    parser.add_argument("--dtype", default="float32", help="of the attention scores: float32, float16, bfloat16, ...")
    parser.add_argument("--patch-sizes", type=int_list, help="comma-separated patch sides, one row each: 32,16,14,8")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.set_defaults(run=run_info)

    analyze = commands.add_parser("analyze", help="attention distance, position similarity, attention maps")
    kinds = analyze.add_subparsers(dest="analysis", required=True)

    distance = kinds.add_parser("attention-distance", help="mean attention distance per layer and head",
                                description=DISTANCE_HELP)
    distance.add_argument("src", metavar="SRC", help=SRC_HELP)
    data = distance.add_mutually_exclusive_group(required=True)
    data.add_argument("--images", metavar="DIR", help="a folder of image files (searched recursively)")
    data.add_argument("--dataset", metavar="NAME_OR_PATH",
                      help="a `datasets` Hub id, local folder or save_to_disk folder")
    distance.add_argument("--split", help="dataset split (default: validation, else test, else the first)")
    distance.add_argument("--image-column", default="image")
    distance.add_argument("--max-images", type=int, default=128, help="default 128, as in the paper")
    distance.add_argument("--batch-size", type=int, default=16)
    common(distance)
    distance.set_defaults(run=run_attention_distance)

    similarity = kinds.add_parser("position-similarity", help="cosine similarity of the position embeddings",
                                  description="Cosine similarity of each patch's position vector with every other "
                                  "patch's, as G x G tiles (learned, learned_2d, sincos_2d); each head's bias over "
                                  "(dy, dx) for relative_2d. Prints the stripe score: mean similarity of same-row or "
                                  "same-column pairs minus that of other pairs at the same distance.")
    similarity.add_argument("src", metavar="SRC", help=SRC_HELP)
    similarity.add_argument("--layer", type=int, default=0, help="block whose relative bias to draw (relative_2d)")
    common(similarity)
    similarity.set_defaults(run=run_position_similarity)

    attention_map = kinds.add_parser("attention-map", help="attention rollout or one head's map over an image",
                                     description="Attention rollout (Abnar and Zuidema, 2020: heads averaged, "
                                     "identity added, rows renormalised, multiplied through the layers) from [CLS], "
                                     "or from the mean of the patch queries without [CLS]; or the last layer's "
                                     "attention (--method last-layer, one --head or their mean).")
    attention_map.add_argument("src", metavar="SRC", help=SRC_HELP)
    attention_map.add_argument("image", metavar="IMAGE", help="an image file")
    attention_map.add_argument("--method", choices=["rollout", "last-layer"], default="rollout")
    attention_map.add_argument("--head", type=int, help="with last-layer: the head (default: mean of all heads)")
    common(attention_map)
    attention_map.set_defaults(run=run_attention_map)


def common(parser):
    parser.add_argument("--image-size", type=info.parse_image_size,
                        help="int or HxW; the position tables are resized as the model does (default: native)")
    parser.add_argument("--output-dir", default="analysis", help="where the files go (default: ./analysis)")


def int_list(text):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints such as 32,16,14,8, got {text!r}")
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive ints such as 32,16,14,8, got {text!r}")
    return values


def output_dir(args):
    folder = Path(args.output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def check_size(config, image_size):
    if image_size is not None:
        info.grid_of(config, image_size)
        from hubvit.limits import check_config_sizes

        check_config_sizes(config, "--image-size", image_size)


def run_info(args):
    if args.batch_size <= 0:
        raise ValueError(f"--batch-size must be positive, got {args.batch_size}")
    info.dtype_bytes(args.dtype)
    config = source.load_config(args.src, args.image_size)
    head = source.has_head(config)
    summary = info.summary(config, args.image_size, args.batch_size, args.dtype, head)
    rows = None
    if args.patch_sizes:
        rows = info.patch_size_rows(config, args.patch_sizes, args.image_size, args.batch_size, args.dtype, head)
    if args.json:
        print(json.dumps({**summary, **({"patch_sizes": rows} if rows else {})}, indent=2))
    else:
        print(info.format_summary(summary, args.src))
        if rows:
            print(f"\nBy patch size (attention memory at batch {args.batch_size}, {args.dtype}):")
            print(info.format_patch_rows(rows))


def write_distance(result, folder, title):
    (folder / "attention_distance.json").write_text(json.dumps(result, indent=2) + "\n")
    with open(folder / "attention_distance.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        heads = len(result["mean_distance"][0])
        writer.writerow(["layer"] + [f"head_{h}" for h in range(heads)])
        for layer, row in enumerate(result["mean_distance"]):
            writer.writerow([layer] + [f"{v:.4f}" for v in row])
    return plots.plot_attention_distance(result, folder / "attention_distance.png", title)


def run_attention_distance(args):
    if args.max_images <= 0 or args.batch_size <= 0:
        raise ValueError(f"--max-images and --batch-size must be positive, got {args.max_images}, {args.batch_size}")
    model, processor = source.load_model(args.src, args.image_size if source.is_preset(args.src) else None)
    check_size(model.config, args.image_size)
    images = source.iter_images(args.images, args.dataset, args.split, args.image_column, args.max_images)
    batches = source.pixel_batches(images, processor, model.config, args.batch_size, args.image_size)
    result = attention.attention_distance(model, batches)
    path = write_distance(result, output_dir(args), f"{args.src}")
    print(f"{result['images']} images; mean attention distance per layer (pixels, mean of heads): "
          + ", ".join(f"{np.mean(row):.1f}" for row in result["mean_distance"]))
    print(f"wrote {path} and its .json/.csv")


def similarity_figures(model, folder, image_size=None, layer=0, title=""):
    """Writes the position figure for `model` into `folder`; returns (message, stripe score or None)."""
    config = attention.body(model).config
    grid = info.grid_of(config, image_size) if image_size else config.grid_size
    kind = config.position_embedding_type
    if kind == "none":
        return "position_embedding_type='none': this model has no position table to draw", None
    if kind == "relative_2d":
        tables = position.relative_bias_tables(model, layer, grid)
        np.save(folder / "relative_position_bias.npy", tables.numpy())
        path = plots.plot_relative_bias(tables, folder / "relative_position_bias.png",
                                        f"{title} relative bias, layer {layer}, grid {grid[0]}x{grid[1]}")
        return f"wrote {path} ({tables.shape[0]} heads over (dy, dx))", None
    similarity = position.cosine_similarity_grid(position.position_table(model, grid), grid)
    np.save(folder / "position_similarity.npy", similarity.numpy())
    score = position.stripe_score(similarity)
    path = plots.plot_position_similarity(similarity, folder / "position_similarity.png",
                                          f"{title} {kind} position embeddings, grid {grid[0]}x{grid[1]}")
    return f"wrote {path}; stripe score {'n/a (grid too small)' if score is None else f'{score:.3f}'}", score


def run_position_similarity(args):
    model, _ = source.load_model(args.src, args.image_size if source.is_preset(args.src) else None)
    check_size(model.config, args.image_size)
    message, _ = similarity_figures(model, output_dir(args), args.image_size, args.layer, args.src)
    print(message)


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


def run_attention_map(args):
    if args.head is not None and args.method != "last-layer":
        raise ValueError("--head applies to --method last-layer only")
    if not Path(args.image).is_file():
        raise FileNotFoundError(f"IMAGE {args.image!r} is not a file")
    model, processor = source.load_model(args.src, args.image_size if source.is_preset(args.src) else None)
    check_size(model.config, args.image_size)
    folder = output_dir(args)
    path = folder / f"attention_map_{Path(args.image).stem}_{args.method}.png"
    values = attention_map_figure(model, processor, source.open_image(args.image), path, args.method, args.head,
                                  args.image_size)
    np.save(path.with_suffix(".npy"), values)
    print(f"wrote {path}")


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
