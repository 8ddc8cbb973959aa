"""Conversion of other ViT checkpoints into hubvit folders, and the one writer of those folders."""
