"""Fine-tune (or train from scratch) a hubvit semantic segmentation model with Accelerate over `datasets`.

    accelerate launch scripts/finetune_segmentation.py --output_dir OUT    # embedded MNIST digit canvases, no network
    python scripts/finetune_segmentation.py --help

The library is `hubvit.training.segmentation` (`train_segmentation` from Python); this entry parses the command line,
runs it and prints where the model went and its held-out metrics. OUT/model serves
`pipeline("image-segmentation", model="OUT/model", trust_remote_code=True)`, hubvit installed or not.
"""

import os
import shlex
import sys

from .finetune import show_logs


def command_line(argv):
    """The line the model card cites, as a reader would retype it."""
    launched = "ACCELERATE_MIXED_PRECISION" in os.environ and "ACCELERATE_DYNAMO_BACKEND" in os.environ
    return ("accelerate launch " if launched else "python ") + shlex.join(["scripts/finetune_segmentation.py", *argv])


def draw_predictions(model_dir, dataset, image_column, mask_column, path, count=6):
    """The first `count` held-out images (top), their true masks (middle) and the masks the folder predicts through
    `pipeline("image-segmentation", trust_remote_code=True)` (bottom), coloured by class; saved to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap
    from transformers import AutoConfig, pipeline

    label2id = AutoConfig.from_pretrained(model_dir, trust_remote_code=True).label2id
    colours = ListedColormap(["black", *plt.get_cmap("tab20").colors[: max(1, len(label2id) - 1)]])
    segmenter = pipeline("image-segmentation", model=str(model_dir), trust_remote_code=True)
    rows = dataset.select(range(min(count, len(dataset))))
    figure, axes = plt.subplots(3, len(rows), figsize=(1.6 * len(rows), 5.0), squeeze=False)
    for column, row in enumerate(rows):
        image = row[image_column]
        predicted = np.zeros(np.asarray(row[mask_column]).shape[:2], dtype=np.int64)
        for segment in segmenter(image):
            predicted[np.asarray(segment["mask"]) > 0] = label2id[segment["label"]]
        pictures = (np.asarray(image.convert("L")), np.asarray(row[mask_column]), predicted)
        for axis, picture, colour in zip(axes[:, column], pictures, ("gray", colours, colours)):
            axis.imshow(picture, cmap=colour, vmin=0, vmax=None if colour == "gray" else len(label2id) - 1)
            axis.set_xticks([]), axis.set_yticks([])
    for axis, title in zip(axes[:, 0], ("image", "true mask", "predicted")):
        axis.set_ylabel(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv=None, prog="finetune_segmentation.py"):
    """Console entry: returns 0, or exits with status 2 and a one-line message on bad arguments or data."""
    from accelerate import PartialState

    from ..errors import HubViTError
    from ..training.checks import worker_error_line
    from ..training.segmentation import train_segmentation
    from ..training.segmentation_arguments import parse_segmentation_args

    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    args = parse_segmentation_args(argv, prog)
    show_logs()
    try:
        result = train_segmentation(args, command=command_line(argv))
    except HubViTError as error:
        sys.stderr.write(f"{prog}: error: {worker_error_line(error)}\n")
        raise SystemExit(2)
    except OSError as error:
        paths = " -> ".join(str(p) for p in (error.filename, error.filename2) if p is not None)
        print(f"{prog}: error: {error.strerror or error}" + (f": {paths}" if paths else ""), file=sys.stderr)
        raise SystemExit(2)
    if PartialState().is_main_process:
        metrics = result.metrics
        pictures = result.output_dir / "predictions.png"
        draw_predictions(result.model_dir, result.eval_dataset, args.image_column_name, args.mask_column_name, pictures)
        print(f"model: {result.model_dir}")
        print(f"predictions: {pictures}")
        print(
            f"metrics: eval_mean_iou {metrics['eval_mean_iou']:.4f}, eval_overall_accuracy "
            f"{metrics['eval_overall_accuracy']:.4f}, train_runtime_s {metrics['train_runtime_s']}, "
            f"total_runtime_s {metrics['total_runtime_s']}, seed {metrics['seed']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
