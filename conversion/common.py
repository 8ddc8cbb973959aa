"""What every converter shares: safe reading of weight files and one strict key mapper.

The mapper is the single place that decides whether a conversion is complete: every source tensor is mapped or
dropped with a reason, every target tensor is filled with the right shape, or nothing is converted at all.
"""

import re
import zipfile
from pathlib import Path

import numpy as np
import torch


class ConversionError(ValueError):
    """A checkpoint that cannot be converted faithfully; the message says what did not match."""


def listing(items, limit=40):
    """Sorted items one per indented line, the tail counted rather than printed."""
    items = sorted(items)
    more = f"\n    ... and {len(items) - limit} more" if len(items) > limit else ""
    return "\n".join(f"    {item}" for item in items[:limit]) + more


def _list(title, items):
    return f"  {title} ({len(items)}):\n{listing(items)}"


def read_weights(path):
    """Tensors of a `.safetensors`, `.pth`/`.bin`/`.pt` or `.npz` file, never running pickled code.

    Torch pickles are read with `weights_only=True` and numpy archives with `allow_pickle=False`; a truncated or
    malicious file raises `ConversionError` naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"{path}: no such file")
    suffix = path.suffix.lower()
    try:
        if suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        if suffix in (".pth", ".pt", ".bin", ".ckpt"):
            loaded = torch.load(str(path), map_location="cpu", weights_only=True)
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
        if suffix == ".npz":
            with np.load(str(path), allow_pickle=False) as archive:
                return {key: archive[key] for key in archive.files}
    except ConversionError:
        raise
    except (RuntimeError, ValueError, OSError, EOFError, zipfile.BadZipFile, Exception) as error:
        text = str(error).splitlines()[0] if str(error) else type(error).__name__
        if "weights_only" in str(error) or "Unsupported global" in str(error) or "pickle" in str(error).lower():
            raise ConversionError(
                f"{path}: refused to unpickle it: the file holds objects other than tensors (possibly executable "
                f"code), and hubvit only reads weights ({text})"
            ) from None
        raise ConversionError(f"{path}: not a readable {suffix} weights file (truncated or corrupt?): {text}") from None
    raise ConversionError(f"{path}: unknown weights format {suffix!r}; expected .safetensors, .pth, .bin, .pt or .npz")


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

    def has(self, key):
        return key in self.source

    def get(self, key):
        """Read a source tensor without consuming it (for reading the architecture)."""
        return to_tensor(self.source[key])

    def map(self, target, key, transform=None):
        self.combine(target, [key], transform)

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
        lines = [f"mapped {len(self.used)} source tensors onto {len(self.target)} hubvit tensors"]
        for reason, keys in by_reason.items():
            lines.append(f"dropped {len(keys)} tensors ({reason}): " + ", ".join(keys[:6]) + (" ..." if len(keys) > 6 else ""))
        return lines
