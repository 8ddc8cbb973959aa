"""What every converter shares: the `Conversion` record, safe reading of weight files, one strict key mapper and
one verification against the source implementation.

A converter module reads its source and returns a `Conversion` (weights, config fields, preprocessing, labels, a
reference forward of the source); `folder.write_conversion` then builds the model, runs `verify` and writes the folder.
The mapper is the single place that decides whether a conversion is complete: every source tensor is mapped or
dropped with a reason, every target tensor is filled with the right shape, or nothing is converted at all.
"""

import argparse
import json
import os
import re
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
import zlib
from pathlib import Path

import numpy as np
import torch

from ..errors import HubViTError
from ..limits import check_config_sizes, check_weights_file


TOLERANCE = 1e-5
RESAMPLE_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}
"""PIL's resample ids (what `ViTImageProcessor.resample` holds) by the names timm and the CLI use."""
RESAMPLE_IDS = {name: index for index, name in RESAMPLE_NAMES.items()}


class ConversionError(HubViTError):
    """A checkpoint that cannot be converted faithfully; the message says what did not match."""


def resample_name(value, where="resample"):
    """The name ('bicubic', ...) of a PIL resample id or name, or `ConversionError` naming `where`."""
    name = RESAMPLE_NAMES.get(value) if isinstance(value, int) else str(value).lower()
    if name not in RESAMPLE_IDS:
        raise ConversionError(f"{where}={value!r}; expected one of {sorted(RESAMPLE_IDS)} (or PIL ids 0-3)")
    return name


@dataclass
class Preprocessing:
    """How the source feeds images to the model at evaluation; `preprocessing.processor_for` turns it into the
    folder's image processor (the one place that builds it).

    `size` (height, width) is what the model sees, by default its resolution. `crop_pct` None: the whole image is
    resized to `size` (the original JAX fine-tuning); otherwise timm's eval transform: resize to size / crop_pct
    (`crop_mode` 'center': the shorter side, 'squash': both sides; 'border' as timm names it), then centre crop
    `size`. `processor`: the source's own transformers image processor, saved as it is (a transformers SRC that has
    one). `notes` say where the folder's processor differs from the source's.
    """

    mean: tuple = (0.5, 0.5, 0.5)
    std: tuple = (0.5, 0.5, 0.5)
    resample: str = "bilinear"
    size: tuple | None = None
    crop_pct: float | None = None
    crop_mode: str = "center"
    processor: object | None = None
    notes: list = field(default_factory=list)


@dataclass
class Reference:
    """The SOURCE implementation's forward pass, which the converted model must reproduce.

    `forward(pixel_values)` takes an NCHW float32 batch and returns a dict of outputs named as hubvit names them
    (`logits`, `pooler_output`, `last_hidden_state`); `verify` runs it on a seeded random batch of `batch` images at
    each of `sizes` (None: the model's resolution). With `forward=None`, `reason` says why the file was not verified.
    """

    description: str
    forward: Callable | None = None
    sizes: tuple = (None,)
    batch: int = 2
    tolerance: float = TOLERANCE
    reason: str | None = None

    @classmethod
    def unavailable(cls, reason):
        return cls(description="none", reason=reason)


@dataclass
class Conversion:
    """Everything a converter learns from its source; `folder.write_conversion` turns it into a hubvit folder.

    `weights`: the hubvit state dict (keys without the `hubvit.` prefix where the body holds them); `config`:
    HubViTConfig fields other than the labels; `labels`: id2label ({} for a headless model); `dropped`: the mapper's
    lines about tensors not carried over. The card texts (`provenance`, `command`, `family`, `license`,
    `citation_key`, `title`) say where the weights came from; `source` where SRC itself came from
    (`sources.Source.record()`: Hub repo id and resolved commit, or address and sha256; {} for a local path).
    """

    weights: dict
    config: dict
    preprocessing: Preprocessing
    labels: dict
    reference: Reference
    provenance: str
    command: str
    family: str
    dropped: list = field(default_factory=list)
    license: str | None = None
    citation_key: str | list | None = None
    title: str | None = None
    source: dict = field(default_factory=dict)


def make_config(conversion):
    """The HubViTConfig of `conversion`: its fields plus the labels (a headless model has none)."""
    from ..modeling import HubViTConfig

    check_config_sizes(conversion.config, "the converted config")
    labels = {int(k): str(v) for k, v in conversion.labels.items()}
    if sorted(labels) != list(range(len(labels))):
        raise ConversionError(f"labels must be numbered 0..{len(labels) - 1}, got ids {sorted(labels)[:10]}")
    config = HubViTConfig(
        **conversion.config,
        num_labels=len(labels),
        id2label=labels or None,
        label2id={name: i for i, name in labels.items()} or None,
    )
    if not labels:
        config.id2label, config.label2id = {}, {}
    return config


def add_verify_arguments(parser):
    """`--verify/--no-verify` and `--tolerance`, the same for every converter."""
    parser.add_argument(
        "--verify", action=argparse.BooleanOptionalAction, default=True,
        help="run the source implementation and the converted model on the same input and fail above tolerance "
        "(default: on)",
    )
    parser.add_argument(
        "--tolerance", type=positive_number, default=TOLERANCE,
        help=f"relative tolerance of the check: max |difference| <= tolerance x max |source output| ({TOLERANCE:g})",
    )


@dataclass
class Verification:
    """What `verify` measured: the worst max |difference| and one line per output and size."""

    max_abs_diff: float
    lines: list

    def text(self, reference):
        return (
            f"{reference.description} and this model, same weights, seeded random float32 batches of "
            f"{reference.batch} images: " + "; ".join(self.lines) + f". Tolerance {reference.tolerance:g} relative "
            "to the output scale."
        )


def hubvit_outputs(model, pixel_values, names):
    """The outputs `names` of a HubViTForImageClassification, named as `Reference.forward` names them."""
    outputs = {}
    if "logits" in names:
        outputs["logits"] = model(pixel_values=pixel_values).logits
    if {"pooler_output", "last_hidden_state"} & set(names):
        body = model.hubvit(pixel_values=pixel_values)
        outputs["pooler_output"], outputs["last_hidden_state"] = body.pooler_output, body.last_hidden_state
    return {name: outputs[name] for name in names}


@torch.no_grad()
def verify(reference, model):
    """Run `reference.forward` and the hubvit `model` on the same inputs; `Verification`, None when there is no
    forward, or `ConversionError` listing every output beyond `reference.tolerance` x its scale."""
    if reference.forward is None:
        return None
    config = model.config
    lines, failed, worst = [], [], 0.0
    for size in reference.sizes:
        height, width = size or config.image_size_2d
        pixels = torch.randn(
            reference.batch, config.num_channels, height, width, generator=torch.Generator().manual_seed(0)
        )
        theirs = reference.forward(pixels)
        ours = hubvit_outputs(model, pixels, list(theirs))
        for name, expected in theirs.items():
            expected = torch.as_tensor(np.asarray(expected) if not isinstance(expected, torch.Tensor) else expected)
            diff = (expected.float() - ours[name]).abs().max().item()
            scale = expected.abs().max().item()
            worst = max(worst, diff)
            lines.append(f"{height}x{width} max |Δ{name}| = {diff:.2e} (max |{name}| = {scale:.3g})")
            if not diff <= reference.tolerance * scale:
                failed.append(
                    f"{name} at {height}x{width}: max |difference| {diff:.3g} > {reference.tolerance:g} x {scale:.3g}"
                )
    if failed:
        raise ConversionError(
            f"the converted model does not reproduce {reference.description}; nothing was written.\n"
            + "\n".join(f"    {line}" for line in failed)
        )
    return Verification(worst, lines)


def listing(items, limit=40):
    """Sorted items one per indented line, the tail counted rather than printed."""
    items = sorted(items)
    more = f"\n    ... and {len(items) - limit} more" if len(items) > limit else ""
    return "\n".join(f"    {item}" for item in items[:limit]) + more


def _list(title, items):
    return f"  {title} ({len(items)}):\n{listing(items)}"


# What torch's and numpy's readers raise on a truncated or bit-flipped file (found by fuzzing, tests/test_reliability.py).
CORRUPT_FILE_ERRORS = (
    OSError, EOFError, ValueError, RuntimeError, IndexError, KeyError, TypeError, NotImplementedError,
    struct.error, zlib.error, zipfile.BadZipFile,
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
        raise ConversionError(f"{path}: unknown weights format {suffix!r}; expected one of {', '.join(WEIGHT_SUFFIXES)}")
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
        raise ConversionError(f"{path}: not a readable safetensors file (truncated or corrupt?): {_first_line(error)}") from None


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
        raise ConversionError(f"{path}: not a readable .npz archive (truncated or corrupt?): {_first_line(error)}") from None
    except CORRUPT_FILE_ERRORS as error:
        raise ConversionError(f"{path}: not a readable .npz archive (truncated or corrupt?): {_first_line(error)}") from None


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
        raise ConversionError(f"{path}: not a readable torch weights file (truncated or corrupt?): {_first_line(error)}") from None
    for wrapper in ("state_dict", "model", "module"):
        if isinstance(loaded, dict) and isinstance(loaded.get(wrapper), dict):
            others = sorted(str(key) for key in loaded if key != wrapper)
            if others:
                print(f"{path.name}: weights read from its '{wrapper}' entry; dropped the other top-level "
                      f"entries {others} (training state beside the weights)")
            loaded = loaded[wrapper]
    if not isinstance(loaded, dict):
        raise ConversionError(f"{path}: expected a dict of tensors, found {type(loaded).__name__}")
    return loaded


def check_finite(weights, path):
    """Refuse tensors holding NaN or infinity, naming them: they convert to a model whose outputs are NaN."""
    bad = []
    for key, value in weights.items():
        if not isinstance(value, (torch.Tensor, np.ndarray)):
            continue
        try:
            tensor = to_tensor(value)
        except ConversionError:
            continue
        if tensor.is_floating_point() or tensor.is_complex():
            finite = torch.isfinite(tensor)
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


def positive_number(text):
    """argparse type for --tolerance and --timeout: a positive finite number (NaN, inf, 0 or less would make a check
    always pass or fail, or a request never end)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value


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


class StrictMapping:
    """Source tensors to a hubvit state dict, accounting for every tensor on both sides.

    Converters call `map`/`combine` for what they translate and `drop` for what they knowingly discard (with a
    reason that is printed); `finish` then refuses the conversion, listing keys, if anything is left over,
    missing or mis-shaped.
    """

    def __init__(self, source, description="checkpoint"):
        self.source = dict(source)
        self.description = description
        self.used = set()
        self.dropped = {}
        self.missing = set()
        self.target = {}
        self.created = {}

    def has(self, key):
        return key in self.source

    def get(self, key):
        """Read a source tensor without consuming it (for reading the architecture)."""
        return to_tensor(self.source[key])

    def create(self, target, tensor, reason):
        """Fill `target` with a tensor the source does not have (a fresh head, a zero bias), saying why."""
        self.target[target] = tensor.detach().to(torch.float32).contiguous()
        self.created[target] = reason

    def map(self, target, key, transform=None):
        self.combine(target, [key], transform)

    def rename(self, renames):
        """`map` every source key not dropped by the first (pattern, target) of `renames` it matches in full; keys
        no pattern matches stay unused, so `finish` lists them."""
        for key in self.source:
            if key in self.dropped:
                continue
            for pattern, target in renames:
                if re.fullmatch(pattern, key):
                    self.map(re.sub(pattern, target, key), key)
                    break

    def combine(self, target, keys, transform=None):
        """Fill `target` from several source tensors (e.g. JAX q, k, v into one qkv)."""
        absent = [key for key in keys if key not in self.source]
        if absent:
            self.missing.update(absent)
            return
        self.used.update(keys)
        values = [to_tensor(self.source[key]) for key in keys]
        value = transform(*values) if transform is not None else values[0]
        self.target[target] = value.detach().to(torch.float32).contiguous()

    def drop(self, pattern, reason):
        """Discard every not-yet-used source key fully matching the regex `pattern`, recording why."""
        regex = re.compile(pattern)
        for key in self.source:
            if key not in self.used and regex.fullmatch(key):
                self.dropped[key] = reason

    def finish(self, expected_shapes):
        """The converted state dict, or `ConversionError` listing unmatched, missing and mis-shaped keys."""
        unmatched = set(self.source) - self.used - set(self.dropped)
        unfilled = set(expected_shapes) - set(self.target)
        unexpected = set(self.target) - set(expected_shapes)
        wrong = [
            f"{key}: got {tuple(self.target[key].shape)}, expected {tuple(expected_shapes[key])}"
            for key in sorted(set(self.target) & set(expected_shapes))
            if tuple(self.target[key].shape) != tuple(expected_shapes[key])
        ]
        problems = []
        if unmatched:
            problems.append(_list("source tensors nothing maps", unmatched))
        if self.missing:
            problems.append(_list("source tensors the layout needs but the file lacks", self.missing))
        if unfilled:
            problems.append(_list("hubvit tensors left unfilled", unfilled))
        if unexpected:
            problems.append(_list("mapped tensors hubvit does not have", unexpected))
        if wrong:
            problems.append(_list("shape mismatches", wrong))
        if problems:
            raise ConversionError(
                f"cannot convert this {self.description} faithfully; nothing was written.\n" + "\n".join(problems)
            )
        return dict(self.target)

    def report(self):
        """Lines describing what was dropped and why, for the user and the model card."""
        by_reason = {}
        for key, reason in sorted(self.dropped.items()):
            by_reason.setdefault(reason, []).append(key)
        lines = [f"mapped {len(self.used)} source tensors onto {len(self.target) - len(self.created)} target tensors"]
        for reason, keys in by_reason.items():
            lines.append(f"dropped {len(keys)} tensors ({reason}): " + ", ".join(keys[:6]) + (" ..." if len(keys) > 6 else ""))
        for key, reason in sorted(self.created.items()):
            lines.append(f"created {key} ({reason})")
        return lines


def read_hubvit_config(src):
    """(HubViTConfig, raw config.json) of the hubvit folder SRC that an export reads; one clear error otherwise."""
    from ..modeling import HubViTConfig

    src = Path(src)
    if not src.is_dir():
        raise ConversionError(f"{src}: no such folder" if not src.exists() else f"{src}: not a folder")
    path = src / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConversionError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(raw, dict):
        raise ConversionError(f"{path}: expected a JSON object of config fields, got a JSON {type(raw).__name__}")
    if raw.get("model_type") != HubViTConfig.model_type:
        raise ConversionError(
            f"{src}: not a hubvit folder (config.json model_type={raw.get('model_type')!r}, expected 'hubvit')"
        )
    check_config_sizes(raw, str(path))
    return HubViTConfig.from_pretrained(str(src)), raw
