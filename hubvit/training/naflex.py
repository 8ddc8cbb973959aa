"""Training on images at their own aspect ratios (NaFlex, `--max_num_patches N`), as SigLIP 2 and timm's NaFlexVit.

Each image keeps its aspect ratio: it is resized to the largest size whose sides are whole patches and whose patch
count is at most N (SigLIP 2's rule: transformers' `get_image_size_for_max_num_patches`), normalised, and cut into
a sequence of patches in (row, column, channel) order (transformers' `convert_image_to_patches`). A batch pads its
sequences to the longest one; the model reads the mask and each image's grid (`PatchSequences`), so padding
changes nothing it computes. With no data option the run trains on the embedded digits, each placed on a canvas of
one of several aspect ratios (`digits_on_canvases`).
"""

import numpy as np
import torch
from torchvision.transforms import v2

ASPECTS = ((28, 56), (28, 42), (28, 28), (42, 28), (56, 28))
"""The canvases (height, width) of the embedded NaFlex default: 1:2, 2:3, square, 3:2 and 2:1."""


class PatchSequences:
    """A batch of images as patch sequences, the model's NaFlex input: `patches` (B, N, P * P * C) padded to the
    batch's longest sequence, `mask` (B, N) marking each image's own patches, `shapes` (B, 2) each image's rows and
    columns of patches."""

    def __init__(self, patches, mask, shapes):
        self.patches, self.mask, self.shapes = patches, mask, shapes

    @property
    def shape(self):
        return self.patches.shape

    def __len__(self):
        return len(self.patches)

    def __getitem__(self, index):
        """Images `index` of the batch (an int or a slice keeps a batch axis: rows of one batch)."""
        index = slice(index, index + 1) if isinstance(index, int) else index
        return PatchSequences(self.patches[index], self.mask[index], self.shapes[index])

    def to(self, device, non_blocking=False):
        return PatchSequences(
            *(t.to(device, non_blocking=non_blocking) for t in (self.patches, self.mask, self.shapes))
        )

    def inputs(self):
        return {"pixel_values": self.patches, "pixel_attention_mask": self.mask, "spatial_shapes": self.shapes}

    def padding_share(self):
        """The share of the batch's positions that are padding."""
        return 1.0 - self.mask.float().mean().item()


def model_inputs(pixels):
    """The model's keyword arguments for a batch: whole images, or patch sequences."""
    return pixels.inputs() if isinstance(pixels, PatchSequences) else {"pixel_values": pixels}


class ResizeToPatchBudget(torch.nn.Module):
    """Resize an image to the largest size of whole patches within `max_num_patches`, keeping its aspect ratio."""

    def __init__(self, patch_size, max_num_patches, interpolation):
        super().__init__()
        self.patch_size, self.max_num_patches, self.interpolation = patch_size, max_num_patches, interpolation

    def forward(self, image):
        from transformers.models.siglip2.image_processing_siglip2 import get_image_size_for_max_num_patches

        height, width = image.shape[-2:]
        size = get_image_size_for_max_num_patches(height, width, self.patch_size, self.max_num_patches)
        return v2.functional.resize(image, list(size), interpolation=self.interpolation, antialias=True)


class RandomCropKeepingAspect(torch.nn.Module):
    """The crop of Inception's random-resized-crop (area 8-100%, aspect ratio 3/4-4/3) without its resize to a
    square: the budget resize after it keeps the crop's own aspect ratio."""

    def forward(self, image):
        from torchvision.transforms import RandomResizedCrop

        top, left, height, width = RandomResizedCrop.get_params(image, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))
        return v2.functional.crop(image, top, left, height, width)


class Patchified:
    """An image pipeline followed by the cut into patches: (patches (n, P * P * C), (rows, columns))."""

    def __init__(self, transform, patch_size):
        self.transform, self.patch_size = transform, patch_size

    def __call__(self, image):
        from transformers.models.siglip2.image_processing_siglip2 import convert_image_to_patches

        pixels = self.transform(image)
        rows, columns = pixels.shape[-2] // self.patch_size, pixels.shape[-1] // self.patch_size
        return convert_image_to_patches(torch.as_tensor(pixels), self.patch_size), (rows, columns)


def patch_count(height, width, patch_size, max_num_patches):
    """How many patches an image of `height` x `width` becomes under SigLIP 2's budget rule."""
    from transformers.models.siglip2.image_processing_siglip2 import get_image_size_for_max_num_patches

    rows, columns = get_image_size_for_max_num_patches(height, width, patch_size, max_num_patches)
    return (rows // patch_size) * (columns // patch_size)


def natural_patch_counts(dataset, image_column, patch_size, max_num_patches):
    """Each image's patch count at its own size under the budget, from its size alone (files' headers are read,
    their pixels are not decoded)."""
    import io

    import datasets
    from PIL import Image

    counts = []
    for raw in dataset.cast_column(image_column, datasets.Image(decode=False))[image_column]:
        source = raw["path"] if raw.get("bytes") is None else io.BytesIO(raw["bytes"])
        with Image.open(source) as image:
            counts.append(patch_count(image.height, image.width, patch_size, max_num_patches))
    return counts


class PatchCountBatches(torch.utils.data.Sampler):
    """Batches of images of one patch count (at their own size under the budget), so that a batch is nearly all
    image and little of it padding. Each epoch, every count's images are shuffled and cut into batches, the
    remainders are pooled in order of count and cut likewise, and the order of the batches is shuffled. The draw
    is a function of (seed, the images' epoch) only: the same on every process, replayed by a resumed run.
    Augmentation that changes an image's aspect ratio (`inception`) moves it off its count; its batch still pads
    to its longest."""

    def __init__(self, counts, batch_size, images, seed=0):
        self.counts, self.batch_size, self.images, self.seed = np.asarray(counts), batch_size, images, seed
        self.drop_last = False

    def __len__(self):
        """Every count's whole batches and the pooled remainders' batches: as many as `len(counts) / batch_size`
        rounded up, as random batches give."""
        return -(-len(self.counts) // self.batch_size)

    def epoch_batches(self, epoch):
        rng = np.random.default_rng([self.seed, epoch])
        batches, rest = [], []
        for count in np.unique(self.counts):
            members = rng.permutation(np.flatnonzero(self.counts == count)).tolist()
            whole = len(members) - len(members) % self.batch_size
            batches += [members[i : i + self.batch_size] for i in range(0, whole, self.batch_size)]
            rest += members[whole:]
        batches += [rest[i : i + self.batch_size] for i in range(0, len(rest), self.batch_size)]
        return [batches[i] for i in rng.permutation(len(batches))]

    def __iter__(self):
        return iter(self.epoch_batches(getattr(self.images, "epoch", 0)))


def collate_sequences(batch):
    """(PatchSequences padded to the batch's longest sequence, labels)."""
    sequences, labels = zip(*batch)
    length = max(patches.shape[0] for patches, _ in sequences)
    width = sequences[0][0].shape[1]
    patches = torch.zeros(len(sequences), length, width)
    mask = torch.zeros(len(sequences), length, dtype=torch.long)
    for row, (image, _) in enumerate(sequences):
        patches[row, : image.shape[0]] = image
        mask[row, : image.shape[0]] = 1
    shapes = torch.tensor([grid for _, grid in sequences], dtype=torch.long)
    return PatchSequences(patches, mask, shapes), torch.tensor(labels, dtype=torch.long)


def naflex_transforms(patch_size, max_num_patches, interpolation, augment, randaugment, magnitude, tail):
    """(train, eval) image pipelines of a NaFlex run, before the cut into patches: the augmentation that keeps each
    image's aspect ratio, the budget resize, then `tail` (rescale and normalise)."""
    resize = ResizeToPatchBudget(patch_size, max_num_patches, interpolation)
    if augment == "inception":
        geometry = [RandomCropKeepingAspect(), v2.RandomHorizontalFlip()]
    elif augment == "affine":
        geometry = [
            v2.RandomAffine(
                degrees=10, translate=(0.1, 0.1), scale=(0.9, 1.1), interpolation=v2.InterpolationMode.BILINEAR
            )
        ]
    else:
        geometry = []
    policy = [v2.RandAugment(num_ops=randaugment, magnitude=magnitude)] if randaugment else []
    head = [v2.ToImage()]
    return v2.Compose(head + geometry + policy + [resize] + tail), v2.Compose(head + [resize] + tail)


def digits_on_canvases(digits, seed=0):
    """The embedded digits, each on a black canvas of one of `ASPECTS` at a random place (seeded): the same
    classes, now at five aspect ratios."""
    import datasets
    from PIL import Image

    rng = np.random.default_rng(seed)
    images, labels = [], []
    for example in digits:
        height, width = ASPECTS[rng.integers(len(ASPECTS))]
        canvas = np.zeros((height, width), dtype=np.uint8)
        top, left = rng.integers(height - 27), rng.integers(width - 27)
        canvas[top : top + 28, left : left + 28] = np.asarray(example["image"].convert("L"))
        images.append(Image.fromarray(canvas, mode="L"))
        labels.append(example["label"])
    return datasets.Dataset.from_dict({"image": images, "label": labels}, features=digits.features)
