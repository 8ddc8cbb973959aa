"""A fit's state on disk: the per-epoch checkpoint of a campaign unit (tensors, plain values and numpy's RNG state,
read back with torch's weights-only loader), the RNG states it restores, and files written atomically (a temporary
file in the same folder, then a rename: a reader never sees half a file)."""

import json
import os
from pathlib import Path

import numpy as np
import torch


def save_atomically(obj, path):
    """`torch.save` to a temporary file in the same folder, then a rename: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(obj, temporary)
    os.replace(temporary, path)


# What a fit's checkpoint holds besides tensors and plain Python values: numpy's RNG state (an array).
NUMPY_STATE = [np._core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def load_checkpoint(path):
    """A fit's checkpoint, unpickled with torch's weights-only loader (tensors, plain values and numpy's RNG state
    only: no code runs from the file)."""
    with torch.serialization.safe_globals(NUMPY_STATE):
        return torch.load(path, weights_only=True, map_location="cpu")


def rng_states():
    import random

    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_states(states):
    import random

    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])


def write_json_atomically(path, data):
    """JSON through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(temporary, path)
