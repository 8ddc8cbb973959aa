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


def command_line(argv):
    """The line the model card cites, as a reader would retype it."""
    launched = "ACCELERATE_MIXED_PRECISION" in os.environ and "ACCELERATE_DYNAMO_BACKEND" in os.environ
    return ("accelerate launch " if launched else "python ") + shlex.join(["scripts/finetune_segmentation.py", *argv])


def show_logs():
    import logging

    import datasets

    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", level=logging.INFO)
    if os.environ.get("LOCAL_RANK", "0") != "0":
        datasets.utils.logging.set_verbosity_error()


def main(argv=None, prog="finetune_segmentation.py"):
    """Console entry: returns 0, or exits with status 2 and a one-line message on bad arguments or data."""
    from accelerate import PartialState

    from hubvit.errors import HubViTError
    from hubvit.training.checks import worker_error_line
    from hubvit.training.segmentation import train_segmentation
    from hubvit.training.segmentation_arguments import parse_segmentation_args

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
        print(f"model: {result.model_dir}")
        print(
            f"metrics: eval_mean_iou {metrics['eval_mean_iou']:.4f}, eval_overall_accuracy "
            f"{metrics['eval_overall_accuracy']:.4f}, train_runtime_s {metrics['train_runtime_s']}, "
            f"total_runtime_s {metrics['total_runtime_s']}, seed {metrics['seed']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
