"""Checks of fine-tuning inputs (folders, labels, images, source model, resume state) that raise one line.

The arguments, data, model, loop and checkpoint modules each call these where the input is first seen; errors are
`TrainingInputError`, a `HubViTError` (so a ValueError), reported before the first step where possible.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import traceback
from contextlib import contextmanager
from pathlib import Path

from ..errors import HubViTError
from ..limits import (
    SizeError,
    check_config_sizes,
    check_image_size,
    check_out_is_not_source,
    check_pixels,
    check_safetensors,
)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


class TrainingInputError(HubViTError):
    """A fine-tuning input that cannot be trained on; found before the first step where possible."""


def class_folders(folder):
    return sorted(p.name for p in Path(folder).iterdir() if p.is_dir() and not p.name.startswith("."))


def is_image(path):
    return path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES and not path.name.startswith(".")


def check_layout(flag, folder):
    """The image-folder layout `<folder>/<class>/<image>`: no image beside the class folders, none deeper than one
    level, no class folder without images; the first offending path named."""
    expected = f"expected {flag.lstrip('-')}/<class>/<image>"
    beside = sorted(p.name for p in folder.iterdir() if is_image(p))
    if beside and class_folders(folder):
        raise TrainingInputError(f"{flag} {folder}: image {beside[0]} sits beside the class folders; {expected}")
    for name in class_folders(folder):
        deeper = sorted(p for p in (folder / name).rglob("*") if is_image(p) and p.parent != folder / name)
        if deeper:
            raise TrainingInputError(
                f"{flag} {folder}: {deeper[0].relative_to(folder)} is in a subfolder of class {name!r}; {expected}"
            )
        if not any(is_image(p) for p in (folder / name).iterdir()):
            raise TrainingInputError(f"{flag} {folder}: class folder {name!r} holds no images; {expected}")


def check_image_folders(train_dir, validation_dir=None):
    """--train_dir (and --validation_dir) exist, hold image files in the layout `<split>/<class>/<image>`, at
    least two class folders, the same classes."""
    found = {}
    for flag, folder in (("--train_dir", train_dir), ("--validation_dir", validation_dir)):
        if folder is None:
            continue
        path = Path(folder)
        if not path.is_dir():
            raise TrainingInputError(f"{flag} {folder}: " + ("not a folder" if path.exists() else "no such folder"))
        if not any(p.suffix.lower() in IMAGE_SUFFIXES for p in path.rglob("*") if p.is_file()):
            raise TrainingInputError(
                f"{flag} {folder} holds no image files ({', '.join(IMAGE_SUFFIXES)}); expected one folder of "
                "images per class"
            )
        check_layout(flag, path)
        found[flag] = class_folders(path)
    classes = found.get("--train_dir", [])
    if len(classes) < 2:
        raise TrainingInputError(
            f"--train_dir {train_dir} has {len(classes)} class folder{'s' if len(classes) != 1 else ''} "
            f"({', '.join(classes) or 'images at the top level'}); classification needs at least 2, one per class"
        )
    if "--validation_dir" in found and found["--validation_dir"] != classes:
        only_train = sorted(set(classes) - set(found["--validation_dir"]))
        only_val = sorted(set(found["--validation_dir"]) - set(classes))
        raise TrainingInputError(
            f"--validation_dir {validation_dir} has other classes than --train_dir {train_dir}: only in training "
            f"{only_train}, only in validation {only_val}"
        )


def load_saved_dataset(path):
    """`datasets.load_from_disk`, with the IndexError it raises for a saved split of no rows named as such."""
    import datasets

    try:
        return datasets.load_from_disk(str(path))
    except IndexError:
        raise TrainingInputError(
            f"--dataset_name {path}: a saved dataset with an empty split (no rows); expected "
            "at least one image per split"
        ) from None


SCRIPTS_REFUSED = "Dataset scripts are no longer supported"


def dataset_script(name):
    """The datasets loading script `name` is or holds (a `.py` file, or a folder holding `<folder name>.py`, the
    name as given, as datasets looks for it)."""
    path = Path(str(name))
    if path.suffix == ".py" and path.is_file():
        return path
    parts = [part for part in str(name).replace(os.sep, "/").split("/") if part]
    script = path / f"{parts[-1]}.py" if parts else None
    return script if script is not None and path.is_dir() and script.is_file() else None


def script_refused(name, script, flag="--dataset_name"):
    import datasets

    return TrainingInputError(
        f"{flag} {name}: {script} is a datasets loading script, and the installed datasets "
        f"{datasets.__version__} does not run loading scripts. Give instead a folder of data files (parquet "
        "files, or images in one folder per class), the folder `Dataset.save_to_disk` wrote, or --train_dir"
    )


def load_dataset(name, *args, flag="--dataset_name", **kwargs):
    """`datasets.load_dataset(name, ...)`, a loading script (local, or in a Hub repo) refused in one line naming
    `flag`: datasets raises RuntimeError for it."""
    import datasets

    script = dataset_script(name)
    if script is not None:
        raise script_refused(name, script, flag)
    try:
        return datasets.load_dataset(name, *args, **kwargs)
    except RuntimeError as error:
        if SCRIPTS_REFUSED not in str(error):
            raise
        raise script_refused(name, str(error).rpartition("found ")[2] or "it", flag) from None


def check_split(dataset, label_column, name="train"):
    """A non-empty split whose labels are all class ids (datasets uses -1 for 'no label')."""
    if len(dataset) == 0:
        raise TrainingInputError(f"the {name} split is empty; expected at least one image")
    labels = dataset[label_column]
    bad = [index for index, label in enumerate(labels) if label is None or label < 0]
    if bad:
        raise TrainingInputError(
            f"the {name} split has {len(bad)} example(s) without a class (label {labels[bad[0]]!r} at index "
            f"{bad[0]}); expected class ids 0..{max(0, len(dataset.features[label_column].names) - 1)}"
        )


def checked_image(image, where=None):
    """`image` if it is a PIL image within the pixel budget; None or a bomb is refused (naming `where` if given)."""
    prefix = f"{where}: " if where else ""
    if image is None:
        raise TrainingInputError(f"{prefix}no image (None) in the image column")
    size = getattr(image, "size", None)
    if size is None:
        raise TrainingInputError(f"{prefix}expected an image, got {type(image).__name__}")
    try:
        check_pixels(size, where or "the image")
    except SizeError as error:
        raise TrainingInputError(str(error).removeprefix("the image: ")) from None
    return image


def decompression_bomb_errors():
    """The exception PIL raises for an image declaring too many pixels (caught with the other image errors)."""
    from PIL import Image

    return (Image.DecompressionBombError,)


def check_source_model(path, num_channels=None):
    """--model_name_or_path: a truncated safetensors file, or a model fine-tuning cannot feed, named up front."""
    folder = Path(path)
    if folder.is_dir():
        weights = folder / "model.safetensors"
        if weights.is_file():
            try:
                check_safetensors(weights)
            except SizeError as error:
                raise TrainingInputError(f"--model_name_or_path: {error}") from None
    if num_channels is not None and num_channels != 3:
        raise TrainingInputError(
            f"--model_name_or_path {path}: num_channels={num_channels}, but fine-tuning feeds RGB images; "
            "expected num_channels=3"
        )


def check_config(config, image_size=None, flag="--image_size", batch_size=None):
    """A model config fine-tuning can build and feed: RGB, and a size whose attention fits."""
    if getattr(config, "num_channels", 3) != 3:
        raise TrainingInputError(f"num_channels={config.num_channels}, but fine-tuning feeds RGB images; expected 3")
    check_sizes(config, image_size, flag, batch_size)


def check_sizes(config, image_size=None, flag="--image_size", batch_size=None):
    """The model at `image_size` (else its config's) fits this machine, and with `batch_size` a training step on that
    many images does (`hubvit.limits.check_config_sizes`, as `hubvit analyze` checks); before anything is allocated."""
    patch = config.patch_size_2d[0] if hasattr(config, "patch_size_2d") else 16
    where = flag if image_size else "the model's image_size"
    try:
        if image_size:
            check_image_size(image_size, image_size, flag, patch)
        check_config_sizes(config, where, image_size or None, batch_size)
    except SizeError as error:
        raise TrainingInputError(str(error)) from None


def check_model_folder(output_dir, model_name_or_path=None):
    """OUT/model must not be a link, nor the model training starts from (--overwrite_output_dir would delete it)."""
    model = Path(output_dir) / "model"
    if model.is_symlink():
        raise TrainingInputError(f"--output_dir: {model} is a symbolic link; hubvit does not write through links")
    if model_name_or_path:
        try:
            check_out_is_not_source(model, model_name_or_path, "--output_dir's model folder", "--model_name_or_path")
        except HubViTError as error:
            raise TrainingInputError(str(error)) from None
        source = Path(model_name_or_path)
        if source.exists() and Path(os.path.realpath(source)).is_relative_to(os.path.realpath(model)):
            raise TrainingInputError(
                f"--model_name_or_path {model_name_or_path} lies inside {model}, which the run replaces"
            )


def check_resume(global_step, max_steps, path):
    """A checkpoint beyond the run's last step would resume into no training at all and exit 0."""
    if global_step >= max_steps:
        raise TrainingInputError(
            f"--resume_from_checkpoint {path} is at step {global_step}, at or beyond this run's {max_steps} "
            "steps: nothing is left to train (raise --max_train_steps/--num_train_epochs or pick another checkpoint)"
        )


DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
# What torch's zip writer raises when a write fails midway: it finds its position short of what it wrote
# ("unexpected pos 704 vs 598") or its stream in a failed state; neither carries the errno (measured on /dev/full).
TORCH_WRITE_FAILURES = ("unexpected pos", "iostream error", "file write failed", "failed writing")


def write_failure(error):
    """Why writing a checkpoint failed, in words, when `error` is a failed write (ENOSPC, EFBIG, EDQUOT; torch and
    safetensors wrap them in their own errors); None for any other error."""
    text = str(error).splitlines()[0] if str(error).strip() else type(error).__name__
    code = getattr(error, "errno", None)
    match = re.search(r"os error (\d+)|code: (\d+)", text)
    code = code or (int(match[1] or match[2]) if match else None)
    if code in DISK_FULL:
        return os.strerror(code)
    if any(marker in text.lower() for marker in TORCH_WRITE_FAILURES) or "write" in text.lower():
        return f"torch could not write a file of it ({text})"
    return None


@contextmanager
def writing_checkpoint(staging):
    """A write that fails for lack of space becomes one line naming the checkpoint and the free space; the
    half-written checkpoint folder (`staging`, which has no trainer state yet) is removed, so none is left. A kill
    or Ctrl-C leaves it, without its trainer state, so it is never resumed (`checkpoints.list_checkpoints`)."""
    try:
        yield
    except Exception as error:  # torch raises RuntimeError, safetensors its own SafetensorError
        reason = write_failure(error)
        if reason is None:
            raise
        shutil.rmtree(staging, ignore_errors=True)
        try:
            free = f"; {shutil.disk_usage(Path(staging).parent).free / 1e6:.0f} MB free there"
        except OSError:
            free = ""
        raise TrainingInputError(
            f"cannot write the checkpoint {Path(staging).name} in {Path(staging).parent}: {reason} (disk "
            f"full?{free}); the incomplete {Path(staging).name} was removed, no partial checkpoint is left"
        ) from None


def worker_error_line(error):
    """The one line of an error raised in a DataLoader worker: torch re-raises it with the worker's traceback in
    the message; the last line is the original message."""
    text = str(error)
    if "DataLoader worker" not in text:
        return text
    last = [line for line in text.strip().splitlines() if line.strip()][-1]
    return last.split(": ", 1)[1] if ": " in last and last.split(": ", 1)[0].endswith("Error") else last


def release_worker_error(error: BaseException) -> None:
    """Clear the frames an error from a DataLoader worker passed through, so the loader's iterator, and its worker
    processes, go when the error goes. torch re-raises a worker's error from a frame that holds it in a local, a
    reference cycle through the traceback: the iterator then waited for some later garbage collection, whose
    finalizer spends seconds stopping the workers at whatever point, in whatever thread, it happens to run."""
    if "DataLoader worker" in str(error):
        traceback.clear_frames(error.__traceback__)
