"""The hubvit folder: the one writer and the one strict loader of checkpoint folders, whatever produced the weights
(conversion, fine-tuning, export) and whatever reads them (analysis, export, training, push).

A folder holds config.json (with `auto_map`), model.safetensors, the modeling files, preprocessor_config.json
(built by `hubvit.preprocessing.processor_for`) and a model card. It is written to a temporary sibling and renamed
into place, so a failure never leaves a half-written folder; it is read with every tensor accounted for, so a
missing or unexpected tensor is refused by name instead of being initialised at random.
"""

import ctypes
import errno
import logging
import os
import shutil
import signal
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from .card import CardInfo, render_card
from .errors import ConversionError, HubViTError, OutputExistsError, listing
from .limits import check_folder_weights, require_safetensors
from . import modeling
from .modeling import HubViTConfig, HubViTForImageClassification, HubViTModel
from .preprocessing import Preprocessing, processor_for

logger = logging.getLogger(__name__)

REQUIRED_FILES = ("config.json", "model.safetensors", "configuration_hubvit.py", "modeling_hubvit.py")
"""What every hubvit folder holds, this version's and the earlier single-file ones alike."""
MODELING_FILES = tuple(sorted(path.name for path in Path(modeling.__file__).parent.glob("*_hubvit.py")))
"""The modeling files this version writes into a folder: every flat `*_hubvit.py` of `modeling/`."""
ACCURACY_FILE = "patch_size_accuracy.json"
"""Measured accuracy per patch side, written beside a model trained with `--patch_sizes` (`hubvit info` reads it)."""


def make_image_processor(config, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), resample="bilinear", size=None):
    """The image processor of a folder whose model sees whole images resized to `size` (default its resolution)."""
    return processor_for(Preprocessing(mean=tuple(mean), std=tuple(std), resample=resample, size=size), config)


def build_model(config: HubViTConfig, state_dict):
    """A `HubViTForImageClassification` holding exactly `state_dict` (keys without the `hubvit.` prefix allowed)."""
    model = HubViTForImageClassification(config)
    expected = model.state_dict()
    prefixed = {key if key in expected else f"hubvit.{key}": value for key, value in state_dict.items()}
    missing, unexpected = model.load_state_dict(prefixed, strict=False)
    if missing or unexpected:
        raise ConversionError(
            f"state dict does not fit the config: missing {sorted(missing)}, unexpected {sorted(unexpected)}"
        )
    return model.eval()


def expected_shapes(config: HubViTConfig):
    """Target tensor names (without the `hubvit.` prefix) and shapes for `config`, built on the meta device."""
    import torch

    with torch.device("meta"):
        model = HubViTForImageClassification(config)
    return {key.removeprefix("hubvit."): tuple(value.shape) for key, value in model.state_dict().items()}


def check_output_path(out_dir, src=None, is_file=False):
    """Refuse an OUT whose replacement would delete something else: the current folder or one above it, the root,
    SRC itself or a folder holding SRC, a link, or a file where a folder is written (a folder where a file is, with
    `is_file`). Called before anything is read."""
    text = str(out_dir)
    if not text.strip():
        raise ConversionError(f"OUT is {text!r}: give the folder to write (an unset shell variable?)")
    out = Path(out_dir)
    name_max, path_max = 255, 4096  # Linux's NAME_MAX and PATH_MAX, in bytes
    long_name = next((part for part in out.parts if len(os.fsencode(part)) > name_max), None)
    if long_name is not None:
        raise ConversionError(f"OUT {text[:80]!r}...: the name {long_name[:40]!r}... is longer than {name_max} bytes")
    if len(os.fsencode(os.path.abspath(out))) > path_max:
        raise ConversionError(f"OUT {text[:80]!r}...: the path is longer than {path_max} bytes")
    if out.is_symlink():
        raise ConversionError(f"OUT {out} is a symbolic link; give the real folder, hubvit does not replace links")
    if is_file and out.is_dir():
        raise ConversionError(f"OUT {out} is a folder; give the path of the file to write")
    if not is_file and out.exists() and not out.is_dir():
        raise ConversionError(f"OUT {out} exists and is a file, not a folder")
    resolved = out.resolve()
    if resolved == Path(resolved.anchor):
        raise ConversionError(f"OUT {text!r} is the root of the file system")
    cwd = Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents:
        raise ConversionError(f"OUT {text!r} is the current folder or one above it ({resolved}); give a new folder")
    if resolved == Path(os.path.expanduser("~")).resolve():
        raise ConversionError(f"OUT {text!r} is the home folder")
    if src is not None and str(src).strip() and Path(src).exists():  # not a Hub repo id or an address
        source = Path(src).resolve()
        if resolved == source or resolved in source.parents:
            raise ConversionError(f"OUT {text!r} is SRC or holds SRC ({source}); replacing it would delete the source")
    return out


STAGING_MARK = "hubvit-staging"
ASIDE_MARK = "hubvit-old"
RENAME_EXCHANGE = 2


def _exchange(first, second):
    """Swap two paths in one atomic step (Linux `renameat2(RENAME_EXCHANGE)`); False where the system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(second))


@contextmanager
def _signals_deferred():
    """Hold Ctrl-C and SIGTERM for the few system calls of a swap, so an interrupt never lands between them."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def replace_folder(new, out):
    """Put the complete folder `new` at `out`; an existing `out` is swapped out whole and deleted afterwards.

    At every instant `out` is the complete old folder or the complete new one: an atomic exchange where the system
    has one, else rename aside, rename in, and rename back on failure (a kill between the two renames leaves the old
    folder aside, where the next run puts it back).
    """
    new, out = Path(new), Path(out)
    if not out.exists():
        os.rename(new, out)
        return
    with _signals_deferred():
        if _exchange(new, out):
            old = new
        else:
            old = Path(tempfile.mkdtemp(prefix=f".{hidden_stem(out)}.{ASIDE_MARK}-{os.getpid()}-", dir=out.parent))
            os.rename(out, old)
            try:
                os.rename(new, out)
            except BaseException:
                os.rename(old, out)
                raise
    shutil.rmtree(old, ignore_errors=True)


def hidden_stem(out):
    """OUT's name in its hidden sibling folders, short enough that the sibling's name stays under NAME_MAX (255)
    for any legal OUT: long names keep 100 characters and a hash of the rest."""
    import hashlib

    name = Path(out).name
    if len(name.encode()) <= 120:
        return name
    return name.encode()[:100].decode(errors="ignore") + "-" + hashlib.sha256(name.encode()).hexdigest()[:12]


def glob_escape(text):
    import glob

    return glob.escape(text)


def _owner_alive(path):
    """Whether the process that named this hidden folder (`...-PID-random`) still runs (then it is not stale)."""
    try:
        pid = int(path.name.rsplit("-", 2)[-2])
    except (IndexError, ValueError):
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(out):
    """Remove the hidden folders a killed run left beside `out`; an old folder set aside comes back if `out` is gone."""
    out = Path(out)
    if not out.parent.is_dir():
        return
    for path in sorted(out.parent.glob(f".{glob_escape(hidden_stem(out))}.*")):
        if not path.is_dir() or _owner_alive(path):
            continue
        if ASIDE_MARK in path.name and not out.exists():
            path.rename(out)
        elif STAGING_MARK in path.name or ASIDE_MARK in path.name:
            shutil.rmtree(path, ignore_errors=True)


CHECKPOINT_MARKERS = ("config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def check_replaceable(out):
    """Refuse to replace a non-empty OUT that holds no checkpoint (no config.json or weights): --overwrite is for
    replacing an earlier output, not for deleting an unrelated folder."""
    if out.is_dir() and any(out.iterdir()) and not any((out / name).exists() for name in CHECKPOINT_MARKERS):
        raise ConversionError(
            f"OUT {out} holds files but no checkpoint ({', '.join(CHECKPOINT_MARKERS[:2])}); --overwrite replaces an "
            "earlier output only, so this folder was left untouched: remove it yourself or choose another OUT"
        )


def same_modes(folder):
    """Every file the mode the umask gives (0644 usually) and folders 0755: safetensors writes its files 0600."""
    umask = os.umask(0)
    os.umask(umask)
    Path(folder).chmod(0o777 & ~umask)
    for path in Path(folder).rglob("*"):
        if not path.is_symlink():
            path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


@contextmanager
def staged_folder(out_dir, overwrite=False):
    """Yield a temporary sibling of `out_dir` to write into; it replaces `out_dir` only if the block succeeds."""
    out = check_output_path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(out)
    if out.exists() and not overwrite and any(out.iterdir()):
        raise OutputExistsError(f"{out} exists and is not empty; pass overwrite=True (--overwrite) to replace it")
    check_replaceable(out)
    staging = Path(tempfile.mkdtemp(prefix=f".{hidden_stem(out)}.{STAGING_MARK}-{os.getpid()}-", dir=out.parent))
    try:
        yield staging
        same_modes(staging)
        replace_folder(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def load(src, *, classifier=None, what="SRC", **kwargs):
    """The model of the hubvit folder (or Hub repo) `src` in eval mode: `HubViTForImageClassification`, or
    `HubViTModel` for a folder saved without a head (`classifier` True or False decides instead; `kwargs` go to
    `from_pretrained`). Every tensor of the file must fill a tensor of the model and
    every tensor of the model must come from the file: `HubViTError` lists the missing, unexpected and mismatched
    ones (`from_pretrained` alone would initialise the missing ones at random and say nothing)."""
    from transformers import AutoConfig

    require_safetensors(src, what)
    check_folder_weights(src)
    try:
        config = AutoConfig.from_pretrained(str(src))
    except (OSError, ValueError) as error:
        raise HubViTError(f"{what} {str(src)!r}: cannot read a hubvit config ({str(error).splitlines()[0]})") from None
    if config.model_type != HubViTConfig.model_type:
        raise HubViTError(f"{what} {str(src)!r} is a {config.model_type!r} checkpoint, not a hubvit folder")
    if classifier is None:
        architectures = getattr(config, "architectures", None) or []
        classifier = architectures != [HubViTModel.__name__] and bool(config.num_labels or architectures)
    model_class = HubViTForImageClassification if classifier else HubViTModel
    try:
        model, info = model_class.from_pretrained(str(src), config=config, output_loading_info=True, **kwargs)
    except (OSError, ValueError, RuntimeError) as error:
        raise HubViTError(f"{what} {str(src)!r}: cannot load its weights ({str(error).splitlines()[0]})") from None
    problems = [
        f"{kind.replace('_', ' ')}:\n{listing(map(str, info[kind]))}"
        for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")
        if info.get(kind)
    ]
    if problems:
        raise HubViTError(
            f"{what} {str(src)!r}: its weights do not fit its config.json, and the model would run with tensors "
            "initialised at random; " + "\n".join(problems)
        )
    return model.eval()


def write_folder(model, out_dir, image_processor=None, card: CardInfo | None = None, overwrite=False):
    """Write `model` as a hubvit checkpoint folder at `out_dir`, atomically; returns the path."""
    image_processor = image_processor or make_image_processor(model.config)
    with staged_folder(out_dir, overwrite) as staging:
        model.save_pretrained(staging)
        image_processor.save_pretrained(staging)
        if card is not None:
            render_card(model, card, image_processor).save(staging / "README.md")
        missing = [name for name in REQUIRED_FILES + MODELING_FILES if not (staging / name).is_file()]
        if missing:
            raise RuntimeError(f"save_pretrained did not write {missing}")
    return Path(out_dir)
