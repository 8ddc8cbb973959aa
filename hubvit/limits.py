"""Bounds on what hubvit reads from outside besides the network (that is `hubvit.network`): output paths, sizes,
manifests.

- Paths: side files (OUT.verification.json ...) are never written through a symbolic link nor replaced without
  `overwrite`; OUT is checked against SRC on routes that write.
- Sizes: weight-file headers (.npz, .safetensors), config sizes and image pixel counts are checked against a
  budget before anything is allocated; decompression bombs are refused by name.
- Manifests: YAML read without alias expansion, CSV rows with extra cells refused by line number.

The numbers come from environment variables so tests (and users with other machines) can set them:
HUBVIT_CONNECT_TIMEOUT, HUBVIT_READ_TIMEOUT, HUBVIT_DEADLINE (seconds); HUBVIT_MAX_DOWNLOAD_BYTES,
HUBVIT_MAX_WEIGHT_BYTES, HUBVIT_MAX_IMAGE_PIXELS, HUBVIT_MAX_MODEL_BYTES.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import stat
import struct
import zipfile
from pathlib import Path

from .errors import HubViTError, OutputExistsError

from .deadlines import _env_float
from .memory import available_memory

logger = logging.getLogger(__name__)

MAX_IMAGE_PIXELS = 64_000_000
MAX_YAML_BYTES = 1 << 20
MAX_TOKENS = 65_536
# Copies of a weight file's tensors a load holds at once: what the reader returns (or maps) and the model built
# from them (conversions measured 1.1x without verification, 2.5x with the reference model beside it).
LOAD_COPIES = 2


class UnsafePathError(HubViTError):
    """An output path that would follow a link, replace a file without --overwrite, or overwrite the source."""


class SizeError(HubViTError):
    """An input whose declared size exceeds what this machine can hold; refused before allocating it."""


class ManifestError(HubViTError):
    """A manifest (YAML or CSV) that cannot be read safely."""


# ---------------------------------------------------------------------------------------------------- paths


def check_side_file(path, overwrite=False, what="side file"):
    """Refuse to write `path` through a symbolic link, onto a non-file, or over an existing file without overwrite
    (`OutputExistsError`, as for OUT)."""
    path = Path(path)
    if path.is_symlink():
        raise UnsafePathError(f"{what} {path} is a symbolic link; hubvit does not write through links (remove it)")
    if path.exists() and not path.is_file():
        raise UnsafePathError(f"{what} {path} exists and is not a regular file")
    if path.exists() and not overwrite:
        raise OutputExistsError(f"{what} {path} exists; pass overwrite=True (--overwrite) to replace it")
    return path


def write_text_atomic(path, text):
    """Write `text` to a temporary sibling and rename it onto `path` (a rename replaces a link, never its target)."""
    import tempfile

    path = Path(path)
    handle, staging = tempfile.mkstemp(prefix=f".{path.name[:100]}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o666 & ~umask)
        os.replace(staging, path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise


def check_out_is_not_source(out, src, what="OUT", source_name="SRC"):
    """Refuse an output folder that is the source, holds it, or lies inside it (a local `src` only)."""
    if src is None or not str(src).strip() or not Path(src).exists():
        return
    target, source = Path(out).resolve(), Path(src).resolve()
    if target == source or target in source.parents:
        raise UnsafePathError(
            f"{what} {out} is {source_name} or holds it ({source}); writing it would delete the source"
        )


def require_safetensors(folder, flag="SRC"):
    """Refuse a local folder whose weights are only a pickle (pytorch_model.bin): hubvit reads safetensors, and
    transformers' own error would advise weights_only=False, which runs whatever the pickle holds."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    has_safetensors = any(folder.glob("*.safetensors")) or (folder / "model.safetensors.index.json").exists()
    pickles = sorted(p.name for p in folder.glob("pytorch_model*.bin"))
    if pickles and not has_safetensors:
        raise HubViTError(
            f"{flag} {folder} holds {pickles[0]} (a pickle) and no model.safetensors; hubvit does not unpickle "
            "weights here. Convert it first (`hubvit convert transformers ...` reads it with weights_only=True)"
        )


def file_sha256(path, chunk=1 << 20):
    """The sha256 of a file, read a chunk at a time."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def regular_files(paths):
    """The regular files among `paths`; anything else (a named pipe, a device, a socket) is skipped with a warning."""
    kept = []
    for path in paths:
        try:
            mode = os.stat(path).st_mode
        except OSError as error:
            logger.warning("skipped %s: %s", path, error.strerror)
            continue
        if stat.S_ISREG(mode):
            kept.append(path)
        elif not stat.S_ISDIR(mode):
            logger.warning("skipped %s: not a regular file (%s)", path, _kind(mode))
    return kept


def _kind(mode):
    for test, name in (
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
    ):
        if test(mode):
            return name
    return "a special file"


# ---------------------------------------------------------------------------------------------------- sizes


def memory_budget(with_source=False):
    """Bytes one input may occupy in memory: HUBVIT_MAX_WEIGHT_BYTES, else `available_memory()`; with `with_source`
    (bytes, what sets it)."""
    explicit = os.environ.get("HUBVIT_MAX_WEIGHT_BYTES")
    budget = (
        (int(_env_float("HUBVIT_MAX_WEIGHT_BYTES", 0)), "HUBVIT_MAX_WEIGHT_BYTES") if explicit else available_memory()
    )
    return budget if with_source else budget[0]


def _human(size):
    for unit in ("bytes", "KB", "MB", "GB", "TB", "PB"):
        if size < 1000 or unit == "PB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1000
    return str(size)


def check_budget(nbytes, where, budget=None, copies=1, detail=""):
    """Refuse `nbytes` (times the `copies` a route holds at once) beyond the memory budget, naming what sets it."""
    budget, source = memory_budget(with_source=True) if budget is None else (budget, "budget")
    if nbytes * copies > budget:
        needs = f", and reading it takes at least {copies}x that ({_human(nbytes * copies)})" if copies > 1 else ""
        raise SizeError(
            f"{where} declares {_human(nbytes)}{detail}{needs}, more than the {_human(budget)} this process can "
            f"hold ({source}; HUBVIT_MAX_WEIGHT_BYTES sets the budget); refused before reading it"
        )


def check_npz(path, copies=None):
    """Read the .npy headers inside an .npz archive and refuse arrays larger than their zip entries or the budget."""
    import numpy as np

    path = Path(path)
    total = 0
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with archive.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    reader = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
                    if version not in reader:
                        continue
                    shape, _, dtype = reader[version](member, max_header_size=10_000)
                    header = member.tell() if hasattr(member, "tell") else 0
                count = 1
                for dim in shape:
                    count *= int(dim)
                nbytes = count * dtype.itemsize
                name = info.filename[:-4]
                if dtype.hasobject:
                    continue
                if nbytes > info.file_size - header + 1:
                    raise SizeError(
                        f"{path}: array {name!r} declares shape {tuple(shape)} ({_human(nbytes)}) but its entry holds "
                        f"{_human(info.file_size)}; the header is corrupt or hostile, refused before reading it"
                    )
                total += nbytes
    except SizeError:
        raise
    except Exception:  # noqa: BLE001  (damage: the reader reports it in its own words)
        return
    check_budget(total, f"{path}: its arrays together", copies=LOAD_COPIES if copies is None else copies)


def check_safetensors(path, copies=None):
    """Check a safetensors header against the file: offsets inside it, and the total (held `copies` times, default
    LOAD_COPIES) against the budget, naming the largest tensor."""
    path = Path(path)
    size = path.stat().st_size
    try:
        with open(path, "rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            if length > min(size - 8, 100 << 20):
                raise SizeError(
                    f"{path}: header length {length} bytes exceeds the file ({size} bytes); truncated or corrupt"
                )
            header = json.loads(file.read(length))
    except SizeError:
        raise
    except Exception:  # noqa: BLE001  (damage: the reader reports it in its own words)
        return
    if not isinstance(header, dict):
        return
    end, largest = 0, (0, "")
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        offsets = entry.get("data_offsets")
        if isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets):
            end = max(end, offsets[1])
            largest = max(largest, (offsets[1] - offsets[0], name))
    if 8 + length + end > size:
        raise SizeError(
            f"{path}: the header declares {_human(end)} of tensors but the file holds {_human(size - 8 - length)}; "
            "truncated or corrupt, refused before reading it"
        )
    detail = f" of tensors (the largest, {largest[1]!r}, {_human(largest[0])})" if largest[1] else ""
    check_budget(end, f"{path}", copies=LOAD_COPIES if copies is None else copies, detail=detail)


def check_weights_file(path, copies=None):
    """The size checks that apply to `path` by its suffix (before any reader allocates)."""
    copies = LOAD_COPIES if copies is None else copies
    suffix = Path(path).suffix.lower()
    if suffix == ".npz":
        check_npz(path, copies)
    elif suffix == ".safetensors":
        check_safetensors(path, copies)
    elif Path(path).is_file():
        check_budget(Path(path).stat().st_size, f"{path}", copies=copies)


def check_folder_weights(folder):
    """The size check of every safetensors file of a local folder, before a loader maps and copies them."""
    folder = Path(folder)
    if folder.is_dir():
        for file in sorted(folder.glob("*.safetensors")):
            check_safetensors(file)


def parameters_lower_bound(hidden_size, num_layers, intermediate_size, num_heads=1, num_key_value_heads=None):
    """A lower bound of the encoder's parameters from a source's size fields, before anything is built: the query
    and output projections, keys and values at their head count, two MLP matrices per block (a gated MLP's third
    and every bias and norm left out)."""
    kv_width = hidden_size * (num_key_value_heads or num_heads) // num_heads
    return num_layers * (2 * hidden_size * (hidden_size + kv_width) + 2 * hidden_size * intermediate_size)


def counted_parameters(config):
    """A hubvit config's parameters, exact: counted on the model built on the meta device (`hubvit info`)."""
    from .meta import meta_model

    return sum(parameter.numel() for parameter in meta_model(config, head=False).parameters())


def estimated_model_bytes(parameters, hidden_size, intermediate_size, tokens, num_heads=1):
    """float32 bytes of the parameters plus one image's attention scores: a lower bound of what it needs."""
    activations = num_heads * tokens * tokens + tokens * max(hidden_size, intermediate_size)
    return 4 * (parameters + activations)


def _int_field(config, name, default=None):
    value = config.get(name, default) if isinstance(config, dict) else getattr(config, name, default)
    return value


def _pair(value):
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return int(value[0]), int(value[1])
    return int(value), int(value)


def estimated_training_bytes(parameters, hidden_size, num_layers, intermediate_size, tokens, batch_size):
    """What a training step adds to `estimated_model_bytes`, a lower bound: gradients and two Adam moments of the
    float32 parameters, and per image each layer's product inputs kept for the backward pass (no attention matrix:
    SDPA keeps none; measured 2.4x this bound at 4096 tokens)."""
    return 4 * (3 * parameters + batch_size * num_layers * tokens * (4 * hidden_size + intermediate_size))


def check_config_sizes(config, where="config.json", image_size=None, batch_size=None, num_patches=None):
    """Refuse a config whose model (or one image's attention at `image_size`, or of `num_patches` patches: a patch
    sequence, or with `batch_size` a training step on that many images) cannot fit this machine, naming the field,
    before anything is built. A source's config (a dict) is bounded from its size fields, unset ones at hubvit's
    defaults; a hubvit config is counted exactly."""
    from .modeling.configuration_hubvit import HubViTConfig

    fields = {}
    for name in ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "num_channels"):
        value = _int_field(config, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise SizeError(f"{where}: {name}={value!r}; expected a positive integer")
        fields[name] = value
    try:
        height, width = _pair(image_size if image_size is not None else _int_field(config, "image_size", 224))
        ph, pw = _pair(_int_field(config, "patch_size", 16))
    except (TypeError, ValueError):
        return
    if min(height, width, ph, pw) <= 0:
        raise SizeError(f"{where}: image_size {height}x{width} and patch_size {ph}x{pw} must be positive")
    tokens = (height // ph) * (width // pw) + 1 if num_patches is None else num_patches + 1
    shape = f"image_size {height}x{width}" if num_patches is None else f"{num_patches} patches per image"
    smaller = "image_size" if num_patches is None else "patch budget"
    if tokens > MAX_TOKENS:
        given = f"image_size {height}x{width} with patch_size {ph}x{pw}" if num_patches is None else shape
        raise SizeError(
            f"{where}: {given} gives {tokens} tokens, more than {MAX_TOKENS} (attention grows with their square); "
            f"expected a smaller {smaller}"
        )
    hidden = fields.get("hidden_size", HubViTConfig.hidden_size)
    layers = fields.get("num_hidden_layers", HubViTConfig.num_hidden_layers)
    intermediate = fields.get("intermediate_size", 4 * hidden)
    heads = fields.get("num_attention_heads", HubViTConfig.num_attention_heads)
    kv_heads = _int_field(config, "num_key_value_heads")
    kv_heads = kv_heads if isinstance(kv_heads, int) and not isinstance(kv_heads, bool) and kv_heads > 0 else None
    budget, source = (int(_env_float("HUBVIT_MAX_MODEL_BYTES", 0)), "HUBVIT_MAX_MODEL_BYTES")
    budget, source = (budget, source) if budget else memory_budget(with_source=True)

    def needed(parameters):
        nbytes = estimated_model_bytes(parameters, hidden, intermediate, tokens, heads)
        if batch_size:
            nbytes += estimated_training_bytes(parameters, hidden, layers, intermediate, tokens, batch_size)
        return nbytes

    parameters = parameters_lower_bound(hidden, layers, intermediate, heads, kv_heads)
    # the bound first: building an absurd config, even on the meta device, overflows before it can be refused
    if isinstance(config, HubViTConfig) and needed(parameters) <= budget:
        parameters = counted_parameters(config)
    nbytes = needed(parameters)
    if nbytes > budget:
        largest = max(("hidden_size", "intermediate_size", "num_hidden_layers"), key=lambda n: fields.get(n, 0))
        step = f" (a training step on {batch_size} images)" if batch_size else ""
        weights = 4 * parameters * (4 if batch_size else 1)
        hint = f"check {largest}" if weights * 2 > nbytes else f"expected a smaller {smaller}"
        raise SizeError(
            f"{where}: hidden_size={hidden}, intermediate_size={intermediate}, num_hidden_layers={layers}, "
            f"{tokens} tokens at {shape} need at least {_human(nbytes)}{step}, more than the "
            f"{_human(budget)} available ({source}); {hint}"
            + (" or batch size" if batch_size and "smaller" in hint else "")
        )


def check_image_size(height, width, flag="--image-size", patch=16):
    """A requested resolution: positive, and few enough tokens for attention to fit."""
    if height <= 0 or width <= 0:
        raise SizeError(f"{flag} {height}x{width}; expected positive sizes")
    tokens = (height // patch) * (width // patch)
    if tokens > MAX_TOKENS:
        raise SizeError(
            f"{flag} {height}x{width} gives {tokens} patches of {patch}, more than {MAX_TOKENS}; "
            "expected a smaller size"
        )


def check_preprocessing(preprocessing):
    """Refuse a source's evaluation transform that no image could go through: a size, crop size or shortest edge
    of 0 or less (a source's preprocessor_config.json), or a crop_pct outside (0, 1] (timm)."""
    import math

    crop_pct = getattr(preprocessing, "crop_pct", None)
    if crop_pct is not None and not (
        isinstance(crop_pct, (int, float)) and math.isfinite(crop_pct) and 0 < crop_pct <= 1
    ):
        raise HubViTError(f"crop_pct={crop_pct!r} in the source's pretrained_cfg; expected a number in (0, 1]")
    size = getattr(preprocessing, "size", None)
    if size is not None and any(not isinstance(s, int) or s <= 0 for s in size):
        raise HubViTError(f"preprocessing size {tuple(size)}; expected positive pixel counts")
    processor = getattr(preprocessing, "processor", None)
    for name in ("size", "crop_size"):
        value = getattr(processor, name, None)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = {k: v for k, v in dataclasses.asdict(value).items() if v is not None}
        values = value.values() if isinstance(value, dict) else [value] if isinstance(value, int) else []
        bad = [v for v in values if isinstance(v, (int, float)) and v <= 0]
        if bad:
            raise HubViTError(f"preprocessor_config.json: {name}={value!r}; expected positive pixel counts")


def max_image_pixels():
    return int(_env_float("HUBVIT_MAX_IMAGE_PIXELS", MAX_IMAGE_PIXELS))


def open_image(path, where=None):
    """A decoded PIL image from a regular file, its pixel count checked before decoding (decompression bombs are
    refused by name)."""
    from PIL import Image, UnidentifiedImageError

    where = where or str(path)
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise SizeError(f"{where}: not a regular file ({_kind(mode)}); refused")
    try:
        with Image.open(path) as image:
            check_pixels(image.size, where)
            image.load()
            return image
    except Image.DecompressionBombError as error:
        raise SizeError(f"{where}: a decompression bomb ({error})") from None
    except (UnidentifiedImageError, OSError) as error:
        raise HubViTError(f"cannot read {where} as an image: {error}") from None


def check_pixels(size, where):
    width, height = size
    budget = max_image_pixels()
    if width * height > budget:
        raise SizeError(
            f"{where}: {width}x{height} = {width * height} pixels, more than the {budget} allowed "
            "(a decompression bomb?; HUBVIT_MAX_IMAGE_PIXELS)"
        )


# ---------------------------------------------------------------------------------------------------- manifests


def load_yaml(text, where):
    """YAML through a safe loader that refuses aliases (`*name`), so a small file cannot expand to a huge one."""
    import yaml

    if len(text) > MAX_YAML_BYTES:
        raise ManifestError(f"{where}: {len(text)} characters, more than the {MAX_YAML_BYTES} a manifest may have")

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise ManifestError(
                    f"{where}: line {event.start_mark.line + 1}: YAML alias *{event.anchor} refused (aliases can "
                    "expand a small file to billions of values; write the values out)"
                )
            return super().compose_node(parent, index)

    loader = NoAliasLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_csv(text, where):
    """Rows of a CSV with a header row, as dicts; a row with more cells than the header is refused by line."""
    import csv
    import io

    reader = csv.DictReader(io.StringIO(text), restkey=_EXTRA)
    rows = []
    for row in reader:
        if _EXTRA in row:
            raise ManifestError(
                f"{where}: line {reader.line_num}: {len(reader.fieldnames) + len(row[_EXTRA])} cells, but the header "
                f"has {len(reader.fieldnames)} ({', '.join(reader.fieldnames)}); quote cells that hold commas"
            )
        rows.append(row)
    return rows


_EXTRA = "\0extra"
