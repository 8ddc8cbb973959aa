"""An imagefolder of crops of scikit-image's photographs, one class per photograph, for the figures in this folder.

Which photograph does a crop come from? A small task on real photographs that trains a ViT from scratch in
minutes on a CPU, so the analysis figures show a model that learned something, offline.

    python docs/analysis/photo_crops.py /tmp/photo_crops      # writes train/ and validation/, one folder per photo
"""

import sys
from pathlib import Path

import numpy as np
import skimage.data
from PIL import Image

PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry")


def crops(photo, count, size, rng):
    image = Image.fromarray(photo).convert("RGB")
    width, height = image.size
    for _ in range(count):
        side = int(rng.uniform(0.25, 0.6) * min(width, height))
        left, top = rng.integers(0, width - side + 1), rng.integers(0, height - side + 1)
        yield image.crop((left, top, left + side, top + side)).resize((size, size), Image.BICUBIC)


def main(root, train=300, validation=60, size=64, seed=0):
    rng = np.random.default_rng(seed)
    for name in PHOTOS:
        photo = getattr(skimage.data, name)()
        for split, count in (("train", train), ("validation", validation)):
            folder = Path(root) / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for index, crop in enumerate(crops(photo, count, size, rng)):
                crop.save(folder / f"{index}.png")


if __name__ == "__main__":
    main(sys.argv[1])
