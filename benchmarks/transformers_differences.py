"""What changes when timm-like ViT weights run in transformers' ViT instead of hubvit: its default LayerNorm eps
and its position-table resizing (no antialias). The figures in README's "transformers' ViT" table come from

    python benchmarks/transformers_differences.py
"""

import torch

from hubvit.conversion.export_transformers import build_vit
from hubvit.modeling import HubViTConfig, HubViTForImageClassification


@torch.no_grad()
def measure_differences(image_size=224, patch_size=16, width=384, depth=12, heads=6, larger=384, seed=0):
    """Same timm-like weights (ViT-S/16, truncated normal 0.02, eps 1e-6, bicubic + antialias resizing) run by hubvit
    and by transformers' ViT: what transformers' default eps and its position-table resizing change."""
    config = HubViTConfig(
        image_size=image_size,
        patch_size=patch_size,
        hidden_size=width,
        num_hidden_layers=depth,
        num_attention_heads=heads,
        intermediate_size=4 * width,
        num_labels=1000,
    )
    model = HubViTForImageClassification(config).eval()
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if "norm" not in name:
            param.copy_(torch.randn(param.shape, generator=generator).mul_(0.02).clamp_(-0.04, 0.04))
    x = torch.randn(2, 3, image_size, image_size, generator=generator)
    big = torch.randn(2, 3, larger, larger, generator=generator)
    ours = model(pixel_values=x).logits
    vit, _ = build_vit(config, model.state_dict(), "measurement")
    results = {f"ViT eps=1e-6, {image_size}px": (vit(pixel_values=x).logits - ours).abs().max().item()}
    theirs = vit(pixel_values=big, interpolate_pos_encoding=True).logits
    for antialias in (True, False):
        config.interpolation_antialias = antialias
        difference = (model(pixel_values=big).logits - theirs).abs().max().item()
        results[f"ViT interpolate_pos_encoding vs hubvit antialias={antialias}, {larger}px"] = difference
    for module in vit.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.eps = 1e-12
    results[f"ViT eps=1e-12 (its default), {image_size}px"] = (vit(pixel_values=x).logits - ours).abs().max().item()
    return ours.abs().max().item(), results


def main():
    scale, results = measure_differences()
    print(f"same weights, max |logits| = {scale:.3g}")
    for what, diff in results.items():
        print(f"{what}: max |Δlogits| = {diff:.2e}")


if __name__ == "__main__":
    main()
