"""Fine-tune (or train from scratch) a hubvit image classifier with Accelerate over `datasets`.

    accelerate launch scripts/finetune.py --output_dir OUT      # embedded MNIST digits, no network
    python scripts/finetune.py --help                            # the same options as `hubvit train --help`

The library is `hubvit.training` (`hubvit.train` from Python); this entry parses the command line, runs it, then
draws the analysis pictures of the trained model into OUT/analysis (training itself never imports the analysis).
"""

import os
import shlex
import sys


def command_line(prog, argv):
    """The line the model card cites, as a reader would retype it."""
    if prog != "finetune.py":
        return shlex.join([*prog.split(), *argv])
    launched = "ACCELERATE_MIXED_PRECISION" in os.environ and "ACCELERATE_DYNAMO_BACKEND" in os.environ
    return ("accelerate launch " if launched else "python ") + shlex.join(["scripts/finetune.py", *argv])


def is_main_process():
    from accelerate import PartialState

    return PartialState().is_main_process


def draw_figures(result, image_column):
    if not is_main_process():
        return
    from ..analysis.commands import training_figures

    images = result.eval_dataset[:128][image_column]
    training_figures(result.model_dir, images, result.output_dir / "analysis")


def show_logs():
    """The command line's logging: the library's INFO records with a time stamp on stderr; processes other than
    the first on each machine keep datasets' progress quiet, so it is printed once."""
    import logging

    import datasets

    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", level=logging.INFO)
    if os.environ.get("LOCAL_RANK", "0") != "0":  # set by `accelerate launch` for every process
        datasets.utils.logging.set_verbosity_error()


def main(argv=None, prog="finetune.py"):
    """Console entry: returns 0, or exits with status 2 and a one-line message on bad arguments."""
    from ..errors import HubViTError
    from ..training import parse_args, train
    from ..training.checks import worker_error_line

    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    args = parse_args(argv, prog)
    show_logs()
    try:
        result = train(args, command=command_line(prog, argv))
        draw_figures(result, args.image_column_name)
    except HubViTError as error:
        sys.stderr.write(f"{prog}: error: {worker_error_line(error)}\n")  # one write: processes' lines stay whole
        raise SystemExit(2)
    except OSError as error:
        paths = " -> ".join(str(p) for p in (error.filename, error.filename2) if p is not None)
        print(f"{prog}: error: {error.strerror or error}" + (f": {paths}" if paths else ""), file=sys.stderr)
        raise SystemExit(2)
    if is_main_process():
        print(f"model: {result.model_dir}")
        print("metrics: " + ", ".join(f"{k} {v}" for k, v in result.metrics.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
