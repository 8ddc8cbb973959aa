"""Safe reading of weight files: safetensors, torch pickles (`weights_only=True`) and `.npz` (`allow_pickle=False`),
each with its own one-line error for a damaged or hostile file, and every tensor checked finite."""

import logging
import os
import re
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch

from ..errors import ConversionError, HubViTError, listing
from ..limits import check_weights_file

logger = logging.getLogger(__name__)


# What torch's and numpy's readers raise on a truncated or bit-flipped file (found by fuzzing, tests/test_reliability.py).
CORRUPT_FILE_ERRORS = (
    OSError,
    EOFError,
    ValueError,
    RuntimeError,
    IndexError,
    KeyError,
    TypeError,
    NotImplementedError,
    struct.error,
    zlib.error,
    zipfile.BadZipFile,
)
WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt", ".npz")


def read_weights(path):
    """Tensors of a `.safetensors`, `.pth`/`.bin`/`.pt` or `.npz` file, never running pickled code, all finite.

    Each format has its own reader and its own error: safetensors' header check, `torch.load(weights_only=True)`
    (which refuses any object other than tensors and plain containers), `np.load(allow_pickle=False)`.
    """
    path = Path(path)
    if not path.exists():
        raise ConversionError(f"{path}: no such file")
    if not path.is_file():
        raise ConversionError(f"{path}: not a file")
    suffix = path.suffix.lower()
    if suffix not in WEIGHT_SUFFIXES:
        raise ConversionError(
            f"{path}: unknown weights format {suffix!r}; expected one of {', '.join(WEIGHT_SUFFIXES)}"
        )
    if path.stat().st_size == 0:
        raise ConversionError(f"{path}: the file is empty (0 bytes)")
    if not os.access(path, os.R_OK):
        raise ConversionError(f"{path}: permission denied (the file exists but cannot be read)")
    try:
        check_weights_file(path)
    except HubViTError as error:
        raise ConversionError(str(error)) from None
    if suffix == ".safetensors":
        weights = _read_safetensors(path)
    elif suffix == ".npz":
        weights = _read_npz(path)
    else:
        weights = _read_torch(path)
    check_finite(weights, path)
    return weights


def _first_line(error):
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _read_safetensors(path):
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        raise ConversionError(
            f"{path}: not a readable safetensors file (truncated or corrupt?): {_first_line(error)}"
        ) from None


def _read_npz(path):
    with open(path, "rb") as handle:
        magic = handle.read(6)
    if magic == b"\x93NUMPY":
        raise ConversionError(f"{path}: a single .npy array, not an .npz archive of named arrays")
    if not magic.startswith(b"PK"):
        raise ConversionError(f"{path}: not an .npz archive (no zip header; corrupt, or another format renamed)")
    try:
        with np.load(str(path), allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    except ValueError as error:
        if "allow_pickle" in str(error):
            raise ConversionError(
                f"{path}: refused to unpickle it: an array holds Python objects (possibly executable code), and "
                "hubvit only reads numeric arrays"
            ) from None
        raise ConversionError(
            f"{path}: not a readable .npz archive (truncated or corrupt?): {_first_line(error)}"
        ) from None
    except CORRUPT_FILE_ERRORS as error:
        raise ConversionError(
            f"{path}: not a readable .npz archive (truncated or corrupt?): {_first_line(error)}"
        ) from None


def _unpickler_detail(error):
    """(refused an object, the line that says what torch's weights-only unpickler met); its other lines are advice
    for trusted files. A GLOBAL (or class) it will not import is an object other than tensors; anything else is
    damage."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if re.search(r"\bGLOBAL\b|[Uu]nsupported class", line):
            return True, line.split("WeightsUnpickler error:")[-1].strip().split(". Please use")[0]
    for index, line in enumerate(lines):
        if "WeightsUnpickler error:" in line:
            rest = line.split("WeightsUnpickler error:", 1)[1].strip()
            return False, rest or (lines[index + 1] if index + 1 < len(lines) else "")
    return False, lines[-1] if lines else type(error).__name__


def _read_torch(path):
    import pickle

    try:
        loaded = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        refused, detail = _unpickler_detail(error)
        if refused:
            raise ConversionError(
                f"{path}: refused to unpickle it: the file holds objects other than tensors (possibly executable "
                f"code), and hubvit only reads weights ({detail})"
            ) from None
        raise ConversionError(
            f"{path}: not a torch.save weights file (corrupt, truncated, or a pickle that weights_only=True cannot "
            f"read): {detail}"
        ) from None
    except CORRUPT_FILE_ERRORS as error:
        raise ConversionError(
            f"{path}: not a readable torch weights file (truncated or corrupt?): {_first_line(error)}"
        ) from None
    for wrapper in ("state_dict", "model", "module"):
        if isinstance(loaded, dict) and isinstance(loaded.get(wrapper), dict):
            others = sorted(str(key) for key in loaded if key != wrapper)
            if others:
                logger.info(
                    "%s: weights read from its '%s' entry; dropped the other top-level entries %s (training state "
                    "beside the weights)",
                    path.name,
                    wrapper,
                    others,
                )
            loaded = loaded[wrapper]
    if not isinstance(loaded, dict):
        raise ConversionError(f"{path}: expected a dict of tensors, found {type(loaded).__name__}")
    return loaded


def is_clipping_bound(key):
    """A buffer bounding a clamp (`input_min`, `output_max`: timm's Gemma 4 tower), where -inf / inf mean no bound."""
    return re.search(r"(^|[._])(\w+_)?(min|max)$", key) is not None


def check_finite(weights, path):
    """Refuse tensors holding NaN or infinity, naming them: they convert to a model whose outputs are NaN. A
    clipping bound may be infinite (unbounded), never NaN."""
    bad = []
    for key, value in weights.items():
        if not isinstance(value, (torch.Tensor, np.ndarray)):
            continue
        try:
            tensor = to_tensor(value)
        except ConversionError:
            continue
        if tensor.is_floating_point() or tensor.is_complex():
            finite = ~torch.isnan(tensor) if is_clipping_bound(key) else torch.isfinite(tensor)
            if not bool(finite.all()):
                bad.append(f"{key} ({int((~finite).sum())} of {finite.numel()} values)")
    if bad:
        raise ConversionError(f"{path}: {len(bad)} tensors hold NaN or infinite values:\n{listing(bad)}")


def shard_files(index_path):
    """The shard files a sharded-weights index names, each inside the index's folder (a path leaving it is refused)."""
    import json

    index_path = Path(index_path)
    folder = index_path.parent.resolve()
    try:
        weight_map = json.loads(index_path.read_text()).get("weight_map")
    except (ValueError, AttributeError) as error:
        raise ConversionError(f"{index_path}: not a valid sharded-weights index ({_first_line(error)})") from None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ConversionError(f"{index_path}: no 'weight_map' of tensor names to shard files")
    names = sorted({str(name) for name in weight_map.values()})
    outside = [name for name in names if Path(name).is_absolute() or folder not in (folder / name).resolve().parents]
    if outside:
        raise ConversionError(f"{index_path}: shard paths leave the folder {folder}, refused:\n{listing(outside)}")
    return [folder / name for name in names]


def to_tensor(value):
    """A float32/float64/bfloat16 numpy array (bfloat16 stored as 2-byte void included) or tensor as a tensor."""
    if isinstance(value, torch.Tensor):
        return value
    array = np.asarray(value)
    if array.dtype.kind == "V" and array.dtype.itemsize == 2:
        bits = torch.from_numpy(array.view(np.int16).copy())
        return bits.view(torch.bfloat16).float()
    if array.dtype.kind not in "fiub":
        raise ConversionError(f"cannot read an array of dtype {array.dtype} as weights")
    return torch.from_numpy(np.ascontiguousarray(array))
