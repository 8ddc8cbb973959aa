"""The registry of ViT sizes: the one table of the paper's model sizes (Table 1; Ti from DeiT), read wherever a size
is named (`hubvit info b/16`, `--model_size base`, the model card's "ViT-B/16", the benchmarks).

A preset is a size and a patch side, written as the paper does (`b/16`, `h/14`); `config_fields` turns it into
`HubViTConfig` fields.
"""

from dataclasses import dataclass

from .errors import HubViTError


@dataclass(frozen=True)
class Size:
    """One row of the ViT paper's Table 1: encoder width, depth, heads and MLP width."""

    letter: str
    name: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int

    def fields(self) -> dict:
        return dict(
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size,
        )


SIZES = {
    size.letter: size
    for size in (
        Size("ti", "tiny", 192, 12, 3, 768),
        Size("s", "small", 384, 12, 6, 1536),
        Size("b", "base", 768, 12, 12, 3072),
        Size("l", "large", 1024, 24, 16, 4096),
        Size("h", "huge", 1280, 32, 16, 5120),
    )
}
BY_NAME = {size.name: size for size in SIZES.values()}


def size_of(hidden_size, num_hidden_layers):
    """The registry's size with this width and depth (None for another shape)."""
    return next(
        (s for s in SIZES.values() if (s.hidden_size, s.num_hidden_layers) == (hidden_size, num_hidden_layers)), None
    )


def parse(name):
    """(Size, patch side) of `b/16`-style text, or `HubViTError` naming it."""
    letter, slash, patch = str(name).lower().partition("/")
    if not slash or letter not in SIZES or not patch.isdecimal() or int(patch) <= 0:
        raise HubViTError(f"unknown preset {name!r}; expected SIZE/PATCH with SIZE in {sorted(SIZES)}, e.g. 'b/16'")
    return SIZES[letter], int(patch)


def is_preset_name(name) -> bool:
    letter, slash, patch = str(name).lower().partition("/")
    return bool(slash) and letter in SIZES and patch.isdecimal()


def config_fields(name, image_size=224) -> dict:
    """`HubViTConfig` fields of the preset `name` (`b/16`) at `image_size`."""
    size, patch = parse(name)
    return dict(size.fields(), image_size=image_size, patch_size=patch)
