"""What other libraries call hubvit's kinds: one table per library and setting, keyed by the kind's class, so the
modeling files (which travel to the Hub) hold no converter's vocabulary and a converter asks the kind, never its
name. A reader turns a library's word into the hubvit name with `reading(table)`; a writer looks the configured
kind up (`config.position_kind`, `config.pooling_kind`, ...)."""

from ..modeling.heads_hubvit import AttentionPooling, ClassTokenPooling, FirstTokenPooling, MeanPooling, NoPooling
from ..modeling.positions_hubvit import LearnedTable, NoPosition, RelativeBias2DWithClass, SinCos2D
from ..modeling.rotary_hubvit import AxialRotary, DinoV3Rotary, MixedRotary

TIMM_POS_EMBED = {LearnedTable: "learn", NoPosition: "none"}
"""timm `VisionTransformer(pos_embed=...)` building the same position kind."""

BIG_VISION_POSEMB = {LearnedTable: "learn", SinCos2D: "sincos2d"}
"""big_vision `posemb=` naming the same position kind."""

ABSOLUTE_TABLES = (LearnedTable,)
"""The position kinds of a learned absolute table, one row per token: timm's `use_abs_pos_emb`, transformers' ViT
and BEiT `use_absolute_position_embeddings`."""

BEIT_RELATIVE_BIAS = (RelativeBias2DWithClass,)
"""BEiT's relative bias with its class-token rows (timm `Beit`, transformers' BEiT and Data2Vec)."""

TIMM_ROPE_TYPE = {AxialRotary: "cat", DinoV3Rotary: "dinov3", MixedRotary: "mixed"}
"""timm `Eva(rope_type=...)` for each rotary kind."""

TIMM_GLOBAL_POOL = {ClassTokenPooling: "token", MeanPooling: "avg", AttentionPooling: "map", NoPooling: ""}
"""timm `global_pool=` for each pooling kind it has."""

BIG_VISION_POOL_TYPE = {ClassTokenPooling: "tok", MeanPooling: "gap", AttentionPooling: "map", FirstTokenPooling: "0"}
"""big_vision `pool_type=` for each pooling kind it has (its ViT)."""

BIG_VISION_NAFLEX_POOL_TYPE = {MeanPooling: "gap", AttentionPooling: "map"}
"""big_vision NaFlex ViT's `pool_type=` (its `max` has no hubvit kind)."""


def reading(table):
    """A table's other direction: each library's word to the hubvit name of its kind."""
    return {word: kind.name for kind, word in table.items()}
