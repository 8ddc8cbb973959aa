"""Attention analyses: mean attention distance per layer and head (Dosovitskiy et al., 2021, Figure 7), attention
rollout (Abnar and Zuidema, 2020) and single-head maps.

The weights are the model's own: `output_attentions=True`, which runs the eager attention of modeling_hubvit
(fused kernels return no weights); the tests check that its hidden states equal the default (sdpa) path's.
"""

import math

import torch

from ..errors import HubViTError


def body(model):
    """The `HubViTModel` inside a classifier, or the model itself."""
    return getattr(model, "hubvit", model)


@torch.no_grad()
def attention_weights(model, pixel_values):
    """One (B, heads, T, T) tensor per layer, rows summing to 1, and the patch grid the input gave."""
    model = body(model)
    outputs = model(pixel_values=pixel_values, output_attentions=True)
    ph, pw = model.config.patch_size_2d
    grid = (math.ceil(pixel_values.shape[-2] / ph), math.ceil(pixel_values.shape[-1] / pw))
    return tuple(a.float() for a in outputs.attentions), grid


def patch_distances(grid, patch_size):
    """(N, N) Euclidean distances in pixels between the centres of the patches of a row-major grid."""
    ys, xs = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    centres = torch.stack([ys.reshape(-1) * patch_size[0], xs.reshape(-1) * patch_size[1]], dim=1).double()
    return torch.cdist(centres, centres).float()


def mean_distance(attention, distances):
    """Per image and head: the attention-weighted distance from each query patch to the patches it attends to,
    averaged over query patches; and the attention mass the patches put on prefix tokens.

    `attention` is (B, H, T, T) with the prefix tokens first. Prefix tokens have no place in the image, so queries
    and keys are restricted to patches and each query's weights over patches are renormalised to sum to 1: the
    distance is that of the attention a patch pays to other patches. The mass left on the prefix tokens is
    returned beside it, so nothing is hidden.
    """
    n = distances.shape[0]
    patches = attention[:, :, -n:, -n:]
    mass = patches.sum(-1)
    per_query = (patches * distances).sum(-1) / mass.clamp_min(torch.finfo(mass.dtype).tiny)
    return per_query.mean(-1), 1.0 - mass.mean(-1)


def uniform_distance(grid, patch_size):
    """Closed form of `mean_distance` for uniform attention over a G_h x G_w grid: over all ordered pairs of patches,
    an offset (dy, dx) occurs (G_h - |dy|)(G_w - |dx|) times."""
    gh, gw = grid
    total = 0.0
    for dy in range(-gh + 1, gh):
        for dx in range(-gw + 1, gw):
            total += (gh - abs(dy)) * (gw - abs(dx)) * math.hypot(dy * patch_size[0], dx * patch_size[1])
    return total / (gh * gw) ** 2


class AttentionDistance:
    """Streaming mean attention distance: add batches, read (layers x heads) means; memory does not grow with the
    number of images."""

    def __init__(self):
        self.distance_sum = self.distance_square_sum = self.prefix_sum = None
        self.images = 0
        self.grid = self.patch_size = None

    def update(self, attentions, grid, patch_size):
        if self.grid is not None and tuple(grid) != self.grid:
            raise HubViTError(f"all images must give the same patch grid: got {tuple(grid)} after {self.grid}")
        self.grid, self.patch_size = tuple(grid), tuple(patch_size)
        distances = patch_distances(grid, patch_size).to(attentions[0].device)
        per_layer = [mean_distance(a, distances) for a in attentions]
        distance = torch.stack([d for d, _ in per_layer], dim=1).double()  # (B, L, H)
        prefix = torch.stack([p for _, p in per_layer], dim=1).double()
        if self.distance_sum is None:
            self.distance_sum = torch.zeros(distance.shape[1:], dtype=torch.float64)
            self.distance_square_sum = torch.zeros_like(self.distance_sum)
            self.prefix_sum = torch.zeros_like(self.distance_sum)
        self.distance_sum += distance.sum(0).cpu()
        self.distance_square_sum += distance.square().sum(0).cpu()
        self.prefix_sum += prefix.sum(0).cpu()
        self.images += distance.shape[0]

    def result(self):
        if not self.images:
            raise HubViTError("no images were analysed")
        mean = self.distance_sum / self.images
        std = (self.distance_square_sum / self.images - mean.square()).clamp_min(0).sqrt()
        return {
            "images": self.images,
            "grid": list(self.grid),
            "patch_size": list(self.patch_size),
            "image_size": [self.grid[0] * self.patch_size[0], self.grid[1] * self.patch_size[1]],
            "uniform_attention_distance": uniform_distance(self.grid, self.patch_size),
            "mean_distance": mean.tolist(),
            "std_over_images": std.tolist(),
            "prefix_attention": (self.prefix_sum / self.images).tolist(),
        }


def attention_distance(model, batches):
    """Mean attention distance of `model` over an iterable of pixel batches: the `AttentionDistance.result()` dict."""
    meter = AttentionDistance()
    for pixel_values in batches:
        attentions, grid = attention_weights(model, pixel_values)
        meter.update(attentions, grid, body(model).config.patch_size_2d)
    return meter.result()


def rollout(attentions, num_prefix, class_token=True):
    """Attention rollout: per layer, heads averaged, identity added, rows renormalised; multiplied from the first
    layer to the last. Returns (B, N) the rolled-out attention of [CLS] (or, without [CLS], the mean over patch
    queries) to the patches."""
    result = None
    for attention in attentions:
        mixed = attention.mean(1)
        mixed = mixed + torch.eye(mixed.shape[-1], device=mixed.device, dtype=mixed.dtype)
        mixed = mixed / mixed.sum(-1, keepdim=True)
        result = mixed if result is None else mixed @ result
    rows = result[:, 0] if class_token else result[:, num_prefix:].mean(1)
    return rows[:, num_prefix:]


def last_layer_map(attentions, num_prefix, class_token=True, head=None):
    """(B, N) attention of [CLS] (or the mean patch query) to the patches in the last layer, for one head or
    averaged over heads."""
    last = attentions[-1]
    if head is not None:
        if not 0 <= head < last.shape[1]:
            raise HubViTError(f"head {head} does not exist; the model has heads 0..{last.shape[1] - 1}")
        last = last[:, head : head + 1]
    last = last.mean(1)
    rows = last[:, 0] if class_token else last[:, num_prefix:].mean(1)
    return rows[:, num_prefix:]
