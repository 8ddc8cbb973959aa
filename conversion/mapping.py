"""The one strict key mapper: every source tensor is mapped or dropped with a reason, every target tensor is filled
with the right shape, or nothing is converted at all."""

import re

import torch

from ..errors import ConversionError, listing
from .weights import to_tensor


def _list(title, items):
    return f"  {title} ({len(items)}):\n{listing(items)}"


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
        self.malformed = {}
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
        try:
            value = transform(*values) if transform is not None else values[0]
        except (IndexError, RuntimeError, ValueError) as error:  # a tensor laid out for another model
            shapes = ", ".join(f"{key} {tuple(tensor.shape)}" for key, tensor in zip(keys, values))
            self.malformed[target] = f"{target} from {shapes}: {str(error).splitlines()[0]}"
            return
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
        unfilled = set(expected_shapes) - set(self.target) - set(self.malformed)
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
        if self.malformed:
            problems.append(_list("source tensors that cannot be laid out as their target", self.malformed.values()))
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
            lines.append(
                f"dropped {len(keys)} tensors ({reason}): " + ", ".join(keys[:6]) + (" ..." if len(keys) > 6 else "")
            )
        for key, reason in sorted(self.created.items()):
            lines.append(f"created {key} ({reason})")
        return lines


LABEL_BASE = 4096  # element positions travel as (position // base, position % base): float32 holds both exactly


def inverse(forward, source, target, description):
    """The source state dict that `forward` (source dict -> target dict, built from renames, slices,
    concatenations and reshapes, as every converter's mapping is) turns into `target`: an export by running the
    converter itself backwards. `forward` runs on source tensors whose elements are their own labels (tensor,
    position), so each target element says which source element it is; `source` (a state dict of the right
    shapes) keeps its values where nothing maps (buffers a converter drops). Refused, listing keys: a target
    element that is no label (arithmetic in `forward`), one source element given two different values."""
    names, result = list(source), {name: value.detach().clone() for name, value in source.items()}
    written = {name: torch.zeros(value.numel(), dtype=torch.bool) for name, value in source.items()}

    def labelled(label):
        return {
            name: label(index, value.numel()).reshape(value.shape) for index, (name, value) in enumerate(source.items())
        }

    ids = forward(labelled(lambda index, size: torch.full((size,), float(index + 1))))
    high = forward(labelled(lambda index, size: (torch.arange(size) // LABEL_BASE + 1).float()))
    low = forward(labelled(lambda index, size: (torch.arange(size) % LABEL_BASE + 1).float()))
    unlabelled, conflicting = [], set()
    for key, value in target.items():
        parts = [ids[key].flatten(), high[key].flatten(), low[key].flatten()]
        if any(((p != p.round()) | (p < 1)).any() for p in parts) or (parts[0] > len(names)).any():
            unlabelled.append(key)
            continue
        tensor_ids, positions = parts[0].long() - 1, (parts[1].long() - 1) * LABEL_BASE + parts[2].long() - 1
        values = value.detach().flatten()
        for index in tensor_ids.unique().tolist():
            name, chosen = names[index], tensor_ids == index
            flat = result[name].view(-1)
            where, new = positions[chosen], values[chosen].to(flat.dtype)
            again = written[name][where]
            if (flat[where][again] != new[again]).any():
                conflicting.add(name)
            flat[where] = new
            written[name][where] = True
    problems = []
    if unlabelled:
        problems.append(_list("tensors the mapping computes rather than moves", unlabelled))
    if conflicting:
        problems.append(_list("source tensors that would need two different values", conflicting))
    if problems:
        raise ConversionError(f"cannot write {description}; nothing was written.\n" + "\n".join(problems))
    filled = {name for name, mask in written.items() if mask.all()}
    return result, filled
