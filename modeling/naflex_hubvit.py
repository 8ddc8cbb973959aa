"""Native resolution: a batch of images at their own sizes and aspect ratios, each cut into its own grid of patches
and padded to one sequence length (NaFlex: SigLIP 2's `Siglip2VisionModel` interface).

The input is transformers SigLIP 2's: `pixel_values` (B, N, P * P * C), each patch's pixels in (row, column,
channel) order; `pixel_attention_mask` (B, N), 1 for the image's patches, 0 for padding; `spatial_shapes` (B, 2),
each image's grid (rows, columns), its patches first in row-major order. The patches are embedded by the same
stride-P kernel as whole images (`HubViTEmbeddings.patch_embedding`), each image's position table is the kind's table
at that image's grid (resized by the configured rule: SigLIP 2's bilinear with antialias), padding gets none, the
prefix tokens come first, and every attention layer and pooler ignores the padding (`attention_mask`), so an image
gives the same outputs in any batch.

This file travels to the Hub next to every checkpoint: flat, no I/O, imported relatively.
"""

import torch
import torch.nn.functional as F

from .resize_hubvit import is_tracing


def sequence_problem(config):
    """Why a model cannot take patch sequences (its blocks read one grid for the whole batch), or None."""
    kind = config.position_kind
    if kind.attention_bias or kind.rotates:
        return (
            f"patch sequences (spatial_shapes) take position tables and rotary kinds; position_embedding_type="
            f"{config.position_embedding_type!r} reads one grid for the whole batch"
        )
    grid_readers = ("attention_window_size", "decomposed_relative_position", "neck_size")
    if any(getattr(config, name) for name in grid_readers):
        settings = ", ".join(f"{name}={getattr(config, name)!r}" for name in grid_readers)
        return f"patch sequences (spatial_shapes) need one grid per image; {settings} read one per batch"
    return None


def check_patch_sequence(pixel_values, pixel_attention_mask, spatial_shapes, config):
    """Clear errors for a patch-sequence batch that does not fit the model or does not agree with itself."""
    problem = sequence_problem(config)
    if problem is not None:
        raise ValueError(problem)
    ph, pw = config.patch_size_2d
    width = ph * pw * config.num_channels
    if not isinstance(pixel_values, torch.Tensor) or pixel_values.ndim != 3 or pixel_values.shape[-1] != width:
        shape = tuple(pixel_values.shape) if isinstance(pixel_values, torch.Tensor) else type(pixel_values).__name__
        raise ValueError(
            f"with spatial_shapes, pixel_values must be (batch, patches, {width}) ({ph}x{pw} patches of "
            f"{config.num_channels} channels, as the NaFlex image processor writes them), got {shape}"
        )
    batch_size, length = pixel_values.shape[0], pixel_values.shape[1]
    if tuple(spatial_shapes.shape) != (batch_size, 2):
        raise ValueError(f"spatial_shapes must be (batch, 2) = ({batch_size}, 2), got {tuple(spatial_shapes.shape)}")
    if pixel_attention_mask is None or tuple(pixel_attention_mask.shape) != (batch_size, length):
        shape = None if pixel_attention_mask is None else tuple(pixel_attention_mask.shape)
        raise ValueError(f"pixel_attention_mask must be (batch, patches) = ({batch_size}, {length}), got {shape}")
    if is_tracing():  # the checks below read the values, which an exported graph cannot
        return
    counts = spatial_shapes.prod(-1)
    if (spatial_shapes <= 0).any() or (counts > length).any():
        raise ValueError(f"spatial_shapes {spatial_shapes.tolist()} must be positive grids of at most {length} patches")
    if not torch.equal(pixel_attention_mask.long().sum(-1), counts.long()):
        raise ValueError(
            f"pixel_attention_mask marks {pixel_attention_mask.long().sum(-1).tolist()} patches per image, "
            f"spatial_shapes {counts.tolist()}"
        )
    expected = torch.arange(length, device=counts.device)[None] < counts[:, None]
    holes = pixel_attention_mask.bool() != expected
    if holes.any():
        image, position = (int(index) for index in holes.nonzero()[0])
        raise ValueError(
            f"pixel_attention_mask of image {image} has a hole at position {position}: a patch's place is read from "
            f"its index, so expected its {int(counts[image])} patches first, then the padding (as the NaFlex image "
            "processor writes them)"
        )


def embed_patch_sequence(embeddings, pixel_values, pixel_attention_mask, spatial_shapes):
    """The encoder input for a patch-sequence batch, and the additive attention mask (B, 1, 1, prefix + N) that
    keeps every query from the padding."""
    dim = embeddings.config.hidden_size
    kernel = embeddings.patch_embedding.weight
    weight = kernel.permute(0, 2, 3, 1).reshape(dim, -1)
    patches = F.linear(pixel_values.to(kernel.dtype), weight, embeddings.patch_embedding.bias)
    if embeddings.patch_norm is not None:
        patches = embeddings.patch_norm(patches)
    prefix = embeddings.prefix_tokens(patches.shape[0])
    hidden_states = torch.cat(prefix + [patches], dim=1) if prefix else patches
    tables = embeddings.position.sequence_tables(embeddings, spatial_shapes, patches.shape[1])
    if tables is not None:
        hidden_states = hidden_states + tables.to(hidden_states.dtype)
    prefix_kept = torch.ones_like(pixel_attention_mask[:, :1]).expand(-1, embeddings.num_prefix_tokens)
    keep = torch.cat([prefix_kept, pixel_attention_mask], dim=1).bool()
    mask = torch.zeros(keep.shape, dtype=hidden_states.dtype, device=hidden_states.device)
    mask = mask.masked_fill(~keep, torch.finfo(hidden_states.dtype).min)[:, None, None, :]
    return embeddings.dropout(hidden_states), mask


def from_timm_naflex(batch):
    """timm's NaFlex dict (`patches`, `patch_coord` (B, N, 2) rows and columns, `patch_valid`) as SigLIP 2's
    (pixel_values, pixel_attention_mask, spatial_shapes): the same patches, which must come first in each image and
    in row-major order, as timm's NaFlex loader writes them."""
    patches, coord = batch["patches"], batch["patch_coord"]
    valid = batch.get("patch_valid")
    valid = torch.ones(coord.shape[:2], dtype=torch.bool, device=coord.device) if valid is None else valid.bool()
    shapes = torch.where(valid[..., None], coord, torch.zeros_like(coord)).amax(dim=1) + 1
    position = torch.arange(coord.shape[1], device=coord.device)[None]
    expected = torch.stack([position // shapes[:, 1:], position % shapes[:, 1:]], dim=-1)
    first = position < shapes.prod(-1, keepdim=True)
    if not torch.equal(valid, first) or not torch.equal(coord[first], expected[first]):
        raise ValueError(
            "patch_coord must list each image's patches first, in row-major order (as timm's NaFlex loader does)"
        )
    return patches, valid.long(), shapes
