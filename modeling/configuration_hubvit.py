"""Configuration of HubViT, a Vision Transformer (Dosovitskiy et al., 2021).

This file travels to the Hub next to every checkpoint: no I/O, no imports of
hubvit itself. Field names follow transformers' `ViTConfig` where it has one.

Every field is declared once, as a typed class annotation with its default
(`hidden_size: int = 768`), and nothing else repeats a name or a default. What
each transformers release does with the declarations (measured, 4.46.3, 4.57.6,
5.0.0, 5.10.4, 5.24.0, 5.25.0):

- 5.10 and later: `PreTrainedConfig` is a dataclass whose `__init_subclass__`
  turns `HubViTConfig` into one too (`dataclasses.fields` lists the fields with
  their types) and, as the class defines no `__init__`, gives it transformers'
  keyword-only `__init__`: declared fields are set from the arguments or their
  defaults, every other argument (`num_labels`, `out_indices`, `auto_map`, ...)
  goes to `__post_init__`.
- 4.46 to 5.0: `PretrainedConfig` is a plain class and reads no annotations;
  `HubViTConfig` defines that same keyword-only `__init__` itself, reading the
  names and defaults from the annotations (and giving `inspect.signature` the
  typed parameters 5.10+ shows), and calls the same `__post_init__`.

Keyword arguments only, on every release (positional ones are refused with the
`ValueError` 5.10+ raises). `out_features=` / `out_indices=` are properties, so
their stored fields are `_out_features` / `_out_indices`, as transformers'
`Dinov2Config` declares them.

`__post_init__` finishes the base class's setup (on 5.10+ its `__post_init__`
and its `validate()`, as the earlier `__init__` did through it; before, its
`__init__`), then `validate_architecture` checks every field's value against
its annotation, a `ValueError` naming field, value and expected type
(`hidden_size='768' has type str; expected int`), then the combinations, then
the backbone stages are set. The class is not decorated with transformers'
`@strict`: it exists on 5.10+ only, and its errors are huggingface_hub's
`StrictDataclassFieldValidationError`, no `ValueError` (which hubvit's callers
catch); hubvit's check gives the same error on every release.

`save_pretrained` writes every field on every release, exactly the config.json
the earlier `__init__` wrote (compared key by key on each release above): every
release leaves out only keys that the bare base config also has at the same
value (5.24+ also compares them with `default_config_fields`), and no hubvit
field is such a key. A folder saved on 5.25 loads with the same values on 4.46.
"""

import dataclasses
import inspect

from transformers import PretrainedConfig
from transformers.utils import logging

try:
    from transformers.backbone_utils import BackboneConfigMixin  # 5.25
except ImportError:  # 4.46 to 5.24
    from transformers.utils.backbone_utils import BackboneConfigMixin

# transformers before 5.10 copies into its module cache only the files a loaded module imports itself, then imports
# them with everything they import: so this file imports every modeling file it reaches, directly.
from .compat_hubvit import check_kwargs  # noqa: F401
from .fields_hubvit import check_types, to_2tuple
from .heads_hubvit import POOLING_KINDS, HubViTNeck
from .layers_hubvit import MLP_KINDS, NORM_KINDS, NORM_PLACEMENTS, check_key_value_heads
from .patch_resize_hubvit import patch_pair  # noqa: F401
from .positions_hubvit import POSITION_KINDS
from .rotary_hubvit import ROTARY_KINDS, check_rope_settings
from .resize_hubvit import resize_as_configured  # noqa: F401
from .windows_hubvit import check_window_settings

logger = logging.get_logger(__name__)


HIDDEN_ACTS = ("gelu", "gelu_pytorch_tanh", "quick_gelu", "relu", "silu")
INTERPOLATION_MODES = ("bicubic", "bilinear", "nearest")


# transformers 5.10 and later make every config class a dataclass (see the module's docstring); before, a plain class.
DATACLASS_CONFIGS = dataclasses.is_dataclass(PretrainedConfig)


class HubViTConfig(BackboneConfigMixin, PretrainedConfig):
    r"""Every option exists for a checkpoint family (named in brackets); defaults are ViT-B/16 at 224 as in the paper.

    Args:
        image_size (`int` or `(h, w)`): native resolution; the position table covers its grid of whole patches
            (sides that do not divide by the patch lose their last pixels, as a stride-P convolution does). Other
            sizes are resized on the fly.
        patch_size (`int` or `(h, w)`): side of the square patches (16 ViT, 32 ViT-B/32, 14 DINOv2 / CLIP-L).
        num_channels, hidden_size, num_hidden_layers, num_attention_heads, intermediate_size: the usual sizes.
        hidden_act: `gelu` (erf; timm, transformers), `gelu_pytorch_tanh` (Flax `nn.gelu`, the original JAX
            checkpoints), `quick_gelu` (OpenAI CLIP).
        layer_norm_eps: 1e-6 (JAX, timm), 1e-5 (OpenAI CLIP, OpenCLIP), 1e-12 (transformers' ViT default).
        final_layer_norm_eps: eps of the final norm (or `fc_norm`) when it differs from the blocks' (`None`: the
            same). The reference ViT of "ViT from First Principles" on `nn.TransformerEncoder` uses 1e-5 in its blocks (PyTorch's
            default) and 1e-6 in its final norm.
        qkv_bias: biases on the query/key/value projections (all but a few research variants).
        key_bias: with `qkv_bias`, the key projection has one too; False: queries and values only (EVA, BEiT,
            DINOv3 `_qkvb`), stored as `q_bias` / `v_bias` beside a fused `qkv`.
        qkv_fused: one `qkv` projection (the paper, timm); False: separate `q`, `k`, `v` (transformers, EVA-02).
        num_key_value_heads: key/value heads shared by groups of query heads (grouped-query attention, with
            separate projections): one count for every block, or one per block (Sapiens2 groups its middle blocks
            only); None: one per query head.
        qk_norm: a norm over each head's queries and keys before the product (timm `qk_norm`).
        proj_bias, mlp_bias: biases on the attention output projection and the MLP's layers (AIMv2 has none).
        norm_type: every norm's kind (`modeling/layers_hubvit.py` `NORM_KINDS`): `layer_norm` (the paper),
            `rms_norm` (AIMv2).
        norm_placement: `pre` (the paper: each sub-layer reads a normed input) or `residual_post` (each
            sub-layer's output is normed before the residual sum: Swin v2, timm `ResPostBlock`, EVA-02 enormous).
        mlp_type: the MLP's kind (`MLP_KINDS`): `mlp` (fc1, activation, fc2) or `gated` (activation(gate) * value;
            SwiGLU with `hidden_act="silu"`: EVA-02, DINOv2 giant, AIMv2, DINOv3).
        mlp_inner_norm: a norm over the MLP's hidden vector before fc2 (EVA-02's `scale_mlp`, NormFormer).
        attention_inner_norm: a norm over the attended heads before the output projection (EVA-CLIP's
            `scale_attn_inner`).
        rope_type: rotary position embeddings beside the position kind (`ROTARY_KINDS`; None: none): `axial`
            (timm `RotaryEmbeddingCat`: EVA-02, Perception Encoder, RoPE-ViT) or `dinov3` (DINOv3).
        rope_temperature: base of the rotation frequencies (None: the kind's, 10000 axial, 100 DINOv3).
        rope_rotate_half: pair channel i with i + d/2 (DINOv3) instead of neighbours 2i, 2i+1 (EVA); None: the
            kind's.
        rope_grid_offset, rope_grid_indexing: added to every patch coordinate (PE: 1); `ij` puts the row angles in
            the first half of each head's pairs, `xy` the column angles (PE, RoPE-ViT).
        rope_reference_grid: `axial` coordinates are scaled onto this grid (EVA's `ref_feat_shape`).
        rope_normalize_coords: `dinov3` coordinates are divided by each axis's size (`separate`) or by the
            smaller or larger side (`min`, `max`).
        rope_shift_coords, rope_jitter_coords, rope_rescale_coords: DINOv3's coordinate augmentations, applied
            while training only (a shift in [-s, s], a per-axis and a shared scale in [1/J, J]).
        patch_bias: bias on the patch embedding (False for CLIP).
        patch_norm: a norm over each patch embedding before the position table (AIMv2's `embed_norm_layer`).
        final_norm: the norm after the encoder (False: none, as RADIO; `fc_norm` moves it after pooling).
        hidden_dropout_prob, attention_probs_dropout_prob, drop_path_rate: regularisation for training (DeiT uses
            stochastic depth, `drop_path_rate`, growing linearly with depth).
        layer_scale_init_value: per-channel residual scaling, `None` for none (DeiT-III, DINOv2).
        scale_attention_branch_only: the layer scale on the attention branch only (Sapiens2); not named
            `layer_scale_*`, which transformers' common tests set to 1e-10 as an initialiser scale.
        attention_window_size, global_attention_blocks, decomposed_relative_position: blocks attend within windows of
            this side (0: none) except the global ones listed; decomposed relative positions in every block (SAM).
        pre_norm: LayerNorm on the embeddings before the encoder (CLIP).
        class_token: prepend a learned [CLS] token (paper; False for SigLIP and big_vision `gap`).
        num_register_tokens: learned register tokens after [CLS] (DINOv2 with registers).
        distillation_token: DeiT's distillation token after [CLS], read by a second head.
        distillation_head: with a distillation token, classify with two heads averaged (DeiT, timm, transformers'
            `DeiTForImageClassificationWithTeacher`); False classifies from [CLS] alone (transformers'
            `DeiTForImageClassification`), and `pooler_output` is then the [CLS] token.
        position_embedding_type: the position kind (`modeling/positions_hubvit.py` `POSITION_KINDS`): `learned`
            (paper, 1D table), `learned_2d` (row and column tables concatenated), `relative_2d` (learned per-head
            bias over (dy, dx) offsets in every block), `relative_2d_class` (the same plus the class token's, BEiT),
            `relative_2d_mlp` (the bias from an MLP of the offsets, timm relpos ViT), `sincos_2d` (fixed, big_vision
            `posemb="sincos2d"`), `none`.
        relative_position_hidden_size: the hidden width of `relative_2d_mlp`'s bias MLP (timm `rel_pos_dim`).
        position_embedding_includes_prefix: the learned table also has rows for the prefix tokens ([CLS],
            registers, distillation); False is timm's `no_embed_class` (big_vision, DeiT-III, DINOv2 registers).
        interpolation_mode, interpolation_antialias, interpolation_align_corners: how position tables are resized
            to a new grid. timm: bicubic + antialias; original JAX fine-tuning: bilinear + align_corners; `nearest`
            (antialias and align_corners ignored) for the resolution experiment's comparison of modes.
        interpolation_keep_aspect: resize the table to a square of the new grid's longer side and keep its first rows
            and columns (timm NaFlexVit's `pos_embed_ar_preserving`: RADIO), instead of to the grid itself.
        pooling: `cls` (paper), `mean` over patch tokens (big_vision `gap`, timm `avg`), `map` attention pooling
            (SigLIP, big_vision `map`), `first` token without a class token (big_vision `0`), `cls_mean`: [CLS]
            concatenated with the mean of the patch tokens, 2 x hidden_size wide (transformers'
            `Dinov2ForImageClassification`, DINOv2's linear probes), `none`.
        fc_norm: apply the final norm to the pooled vector instead of the tokens: after mean pooling (timm
            `fc_norm`, BEiT) or to the [CLS] token alone (transformers' CLIP, whose `post_layernorm` leaves
            `last_hidden_state` un-normed).
        map_num_heads, map_intermediate_size: the MAP head's own head count and MLP width (Perception Encoder);
            None: the blocks'.
        neck_size: SAM's convolutional neck to this many channels, pooled by its mean (`modeling/heads_hubvit.py`).
        representation_size: Dense + tanh before the head (ImageNet-21k checkpoints of the original repo).
        patch_resize: set by `resize_patch_embeddings`: the patch size the kernel was trained at and how it was
            resized (`from_patch_size`, `method`, `interpolation`, `antialias`); None for a kernel as trained.
        decode_head_pixels: the segmentation head classifies every pixel of each patch (`HubViTForSemanticSegmentation`)
            instead of the patch as a whole.
        semantic_loss_ignore_index: the label the segmentation loss leaves out (transformers' convention, 255).
        dynamic_img_pad: pad inputs on the bottom/right to a multiple of the patch instead of refusing them (timm).
        initializer_range: std of the learned position table and tokens at initialisation.
        out_features, out_indices: which stages `HubViTBackbone` returns, as transformers' backbones name them:
            `stem` (the encoder input) and `stage1` ... `stageN` (each block's output); the last stage by default.
        apply_layernorm: the backbone applies the final norm to each returned stage (as `Dinov2Config`).
        reshape_hidden_states: the backbone returns (batch, hidden_size, rows, columns) maps without the prefix
            tokens; False returns (batch, tokens, hidden_size) with them (what Depth Anything's and DPT's necks read).
    """

    model_type = "hubvit"

    # The fields: name, type and default, declared here only (the docstring above says what each is for).
    image_size: int | list[int] | tuple[int, int] = 224
    patch_size: int | list[int] | tuple[int, int] = 16
    num_channels: int = 3
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-6
    final_layer_norm_eps: float | None = None
    qkv_bias: bool = True
    key_bias: bool = True
    qkv_fused: bool = True
    num_key_value_heads: int | list[int] | None = None
    qk_norm: bool = False
    proj_bias: bool = True
    mlp_bias: bool = True
    norm_type: str = "layer_norm"
    norm_placement: str = "pre"
    mlp_type: str = "mlp"
    mlp_inner_norm: bool = False
    attention_inner_norm: bool = False
    rope_type: str | None = None
    rope_temperature: float | None = None
    rope_rotate_half: bool | None = None
    rope_grid_offset: float = 0.0
    rope_grid_indexing: str = "ij"
    rope_reference_grid: list[int] | None = None
    rope_normalize_coords: str = "separate"
    rope_shift_coords: float | None = None
    rope_jitter_coords: float | None = None
    rope_rescale_coords: float | None = None
    patch_bias: bool = True
    patch_norm: bool = False
    final_norm: bool = True
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    drop_path_rate: float = 0.0
    layer_scale_init_value: float | None = None
    scale_attention_branch_only: bool = False
    attention_window_size: int = 0
    global_attention_blocks: list[int] | None = None
    decomposed_relative_position: bool = False
    pre_norm: bool = False
    class_token: bool = True
    num_register_tokens: int = 0
    distillation_token: bool = False
    distillation_head: bool = True
    position_embedding_type: str = "learned"
    position_embedding_includes_prefix: bool = True
    relative_position_hidden_size: int = 128
    interpolation_mode: str = "bicubic"
    interpolation_antialias: bool = True
    interpolation_align_corners: bool = False
    interpolation_keep_aspect: bool = False
    pooling: str = "cls"
    fc_norm: bool = False
    map_num_heads: int | None = None
    map_intermediate_size: int | None = None
    neck_size: int | None = None
    representation_size: int | None = None
    dynamic_img_pad: bool = False
    initializer_range: float = 0.02
    patch_resize: dict | None = None
    decode_head_pixels: bool = False
    semantic_loss_ignore_index: int = 255
    # `out_features=` and `out_indices=` (properties below, so not fields of their own name, as in transformers'
    # Dinov2Config): both None means the last stage; `__post_init__` aligns them into these two.
    _out_features: list[str] | None = None
    _out_indices: list[int] | None = None
    apply_layernorm: bool = True
    reshape_hidden_states: bool = True

    if not DATACLASS_CONFIGS:  # 4.46 to 5.0 (5.10 and later write this `__init__` themselves)

        def __init__(self, *args, **kwargs):
            """Keyword arguments only: the declared fields (their class defaults where not given), then
            `__post_init__` with everything else, as transformers 5.10 and later do."""
            if args:
                raise ValueError(
                    f"{type(self).__name__} accepts only keyword arguments, but found `{len(args)}` positional args."
                )
            for name in HubViTConfig.__annotations__:
                setattr(self, name, kwargs.pop(name, getattr(type(self), name)))
            self.__post_init__(**kwargs)

    def __post_init__(self, **kwargs):
        if not isinstance(self.image_size, int):
            self.image_size = list(to_2tuple(self.image_size, "image_size"))
        if not isinstance(self.patch_size, int):
            self.patch_size = list(to_2tuple(self.patch_size, "patch_size"))
        out_features, out_indices = kwargs.pop("out_features", None), kwargs.pop("out_indices", None)
        kwargs.pop("stage_names", None)  # derived from num_hidden_layers (written by transformers' own backbones)
        kwargs.setdefault(
            "auto_map",
            {
                "AutoConfig": "configuration_hubvit.HubViTConfig",
                "AutoModel": "modeling_hubvit.HubViTModel",
                "AutoModelForImageClassification": "modeling_hubvit.HubViTForImageClassification",
                "AutoBackbone": "modeling_hubvit.HubViTBackbone",
            },
        )
        auto_map = kwargs["auto_map"]
        model = auto_map.get("AutoModel") if isinstance(auto_map, dict) else None
        if isinstance(model, str) and model.endswith(".HubViTModel") and "AutoBackbone" not in auto_map:
            # a folder saved before the backbone existed: saved again by this code, it gains it
            kwargs["auto_map"] = {**auto_map, "AutoBackbone": model[: -len("HubViTModel")] + "HubViTBackbone"}
        if DATACLASS_CONFIGS:
            super().__post_init__(**kwargs)
            if hasattr(self, "validate"):  # transformers' own checks (`@strict`), which its `__init__` ran here before
                self.validate()
        else:
            super().__init__(**kwargs)
        self.validate_architecture()
        self.set_output_features_output_indices(out_features, out_indices)

    # --- backbone stages (transformers' `BackboneConfigMixin`, checked the same way on every release) -------------

    @property
    def stage_names(self):
        """`stem` (the encoder input) then `stage1` ... `stageN`: one per block, so it follows `num_hidden_layers`."""
        return ["stem"] + [f"stage{i}" for i in range(1, self.num_hidden_layers + 1)]

    def __setattr__(self, name, value):
        depth = self.__dict__.get("num_hidden_layers")
        super().__setattr__(name, value)
        if name == "num_hidden_layers" and "_out_indices" in self.__dict__ and value != depth:
            self.follow_depth(depth)

    def follow_depth(self, old_depth):
        """After a change of depth (`from_pretrained(folder, num_hidden_layers=6)`, pruning) the stages still name
        existing blocks: the last stage stays the last, a choice that names removed blocks falls back to it (logged),
        so the config saves and loads again."""
        indices = None if self._out_indices == [old_depth] else self._out_indices
        try:
            self.set_output_features_output_indices(None, indices)
        except ValueError:
            logger.warning(
                f"num_hidden_layers changed from {old_depth} to {self.num_hidden_layers}: out_indices={indices} name "
                f"removed blocks; the backbone returns the last stage, stage{self.num_hidden_layers}"
            )
            self.set_output_features_output_indices(None, None)

    def set_output_features_output_indices(self, out_features, out_indices):
        """Align `out_features` and `out_indices` (either may be None; both None: the last stage), refusing
        unknown, repeated or unordered stages with the value and the stages named."""
        stages = self.stage_names
        if out_indices is not None:
            if isinstance(out_indices, int) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in out_indices
            ):
                raise ValueError(f"out_indices must be a list of ints, got {out_indices!r}")
            out_indices = list(out_indices)
            bad = [i for i in out_indices if not -len(stages) <= i < len(stages)]
            if bad:
                raise ValueError(
                    f"out_indices={out_indices} has {bad} outside the {len(stages)} stages of this "
                    f"{self.num_hidden_layers}-block model: expected indices in [{-len(stages)}, {len(stages) - 1}] "
                    f"over {stages}"
                )
        if out_features is not None:
            if isinstance(out_features, str) or not all(isinstance(f, str) for f in out_features):
                raise ValueError(f"out_features must be a list of stage names, got {out_features!r}")
            out_features = list(out_features)
            bad = [f for f in out_features if f not in stages]
            if bad:
                raise ValueError(f"out_features={out_features} has unknown stages {bad}; expected names from {stages}")
        if out_indices is None and out_features is None:
            out_indices = [len(stages) - 1]
        positions = (
            [stages.index(f) for f in out_features] if out_indices is None else [i % len(stages) for i in out_indices]
        )
        if out_features is not None and out_indices is not None and out_features != [stages[i] for i in positions]:
            raise ValueError(
                f"out_features={out_features} and out_indices={out_indices} name different stages "
                f"({[stages[i] for i in positions]}); pass one of them"
            )
        if positions != sorted(set(positions)):
            given = out_indices if out_indices is not None else out_features
            raise ValueError(f"stages must be given once each in the order of {stages}, got {given}")
        self._out_features = [stages[i] for i in positions]
        self._out_indices = list(out_indices) if out_indices is not None else positions

    def verify_out_features_out_indices(self):
        self.set_output_features_output_indices(self._out_features, self._out_indices)

    @property
    def out_features(self):
        return self._out_features

    @out_features.setter
    def out_features(self, out_features):
        self.set_output_features_output_indices(out_features, None)

    @property
    def out_indices(self):
        return self._out_indices

    @out_indices.setter
    def out_indices(self, out_indices):
        self.set_output_features_output_indices(None, out_indices)

    def to_dict(self):
        output = super().to_dict()
        for name in ("out_features", "out_indices"):
            output.pop(f"_{name}", None)
            value = getattr(self, f"_{name}", None)  # None while `__post_init__` runs transformers' validators
            if value is not None:
                output[name] = list(value)
        return output

    @property
    def image_size_2d(self):
        return to_2tuple(self.image_size, "image_size")

    @property
    def patch_size_2d(self):
        return to_2tuple(self.patch_size, "patch_size")

    @property
    def grid_size(self):
        """Patches along (height, width) at the native resolution: floored, as a stride-P convolution sees them."""
        (h, w), (ph, pw) = self.image_size_2d, self.patch_size_2d
        return h // ph, w // pw

    @property
    def pooled_size(self):
        """Width of `pooler_output`: what the representation layer or the head reads."""
        return self.neck_size or self.pooling_kind.width_factor * self.hidden_size

    # --- defaulted fields, resolved once: what the model and the converters read --------------------------------

    @property
    def final_norm_eps(self):
        """The final norm's eps: `final_layer_norm_eps` where set, else the blocks' `layer_norm_eps`."""
        return self.layer_norm_eps if self.final_layer_norm_eps is None else self.final_layer_norm_eps

    @property
    def map_heads(self):
        """The MAP head's head count: `map_num_heads` where set, else the blocks'."""
        return self.num_attention_heads if self.map_num_heads is None else self.map_num_heads

    @property
    def map_width(self):
        """The MAP head's MLP width: `map_intermediate_size` where set, else the blocks'."""
        return self.intermediate_size if self.map_intermediate_size is None else self.map_intermediate_size

    @property
    def rope_base(self):
        """The rotation frequencies' base: `rope_temperature` where set, else the rotary kind's; None without one."""
        kind = self.rotary_kind
        if kind is None:
            return None
        return float(kind.default_temperature if self.rope_temperature is None else self.rope_temperature)

    @property
    def rope_pairs_halves(self):
        """Whether rotary pairs are (x_i, x_{i + d/2}): `rope_rotate_half` where set, else the rotary kind's; None
        without one."""
        kind = self.rotary_kind
        if kind is None:
            return None
        return kind.default_rotate_half if self.rope_rotate_half is None else self.rope_rotate_half

    @property
    def position_kind(self):
        """The class of the configured position kind (`POSITION_KINDS`): what readers of a config ask instead of
        comparing `position_embedding_type` with a name."""
        return POSITION_KINDS[self.position_embedding_type]

    @property
    def rotary_kind(self):
        """The class of the configured rotary kind (`ROTARY_KINDS`), or None without `rope_type`."""
        return None if self.rope_type is None else ROTARY_KINDS[self.rope_type]

    @property
    def pooling_kind(self):
        """The class of the configured pooling kind (`modeling/heads_hubvit.py` `POOLING_KINDS`)."""
        return POOLING_KINDS[self.pooling]

    @property
    def mlp_kind(self):
        """The class of the configured MLP kind (`MLP_KINDS`)."""
        return MLP_KINDS[self.mlp_type]

    @property
    def norm_kind(self):
        """The configured norm kind (`NORM_KINDS`)."""
        return NORM_KINDS[self.norm_type]

    @property
    def norm_placement_kind(self):
        """The class of the configured norm placement (`NORM_PLACEMENTS`)."""
        return NORM_PLACEMENTS[self.norm_placement]

    @property
    def num_prefix_tokens(self):
        return int(self.class_token) + int(self.distillation_token) + self.num_register_tokens

    def key_value_heads(self, index):
        """The key/value head count of block `index`."""
        counts = self.num_key_value_heads
        return self.num_attention_heads if counts is None else counts if isinstance(counts, int) else counts[index]

    def validate_architecture(self):
        """Refuse values of the wrong type and combinations no model can run, naming the fields involved."""
        # `_out_features` / `_out_indices` are checked, with the stages named, by `set_output_features_output_indices`
        check_types(self, {name: kind for name, kind in HubViTConfig.__annotations__.items() if name[0] != "_"})

        def choice(name, allowed):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not supported; expected one of {list(allowed)}")

        choice("position_embedding_type", POSITION_KINDS)
        choice("rope_type", [None, *ROTARY_KINDS])
        choice("rope_grid_indexing", ("ij", "xy"))
        choice("rope_normalize_coords", ("separate", "min", "max"))
        choice("norm_type", NORM_KINDS)
        choice("norm_placement", NORM_PLACEMENTS)
        choice("mlp_type", MLP_KINDS)
        choice("pooling", POOLING_KINDS)
        choice("hidden_act", HIDDEN_ACTS)
        choice("interpolation_mode", INTERPOLATION_MODES)
        sizes = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "num_channels")
        for name in (*sizes, "relative_position_hidden_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(self.num_register_tokens, int) or self.num_register_tokens < 0:
            raise ValueError(f"num_register_tokens must be an int >= 0, got {self.num_register_tokens!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}"
            )
        check_key_value_heads(self)
        (h, w), (ph, pw) = self.image_size_2d, self.patch_size_2d
        if h < ph or w < pw:
            raise ValueError(
                f"image_size={self.image_size!r} is smaller than one patch of patch_size={self.patch_size!r}"
            )
        pooling = self.pooling_kind
        if pooling.needs_class_token and not self.class_token:
            raise ValueError(
                f"pooling={self.pooling!r} needs class_token=True; use pooling='mean', 'map' or 'first' without it"
            )
        if self.distillation_token and not self.class_token:
            raise ValueError("distillation_token=True needs class_token=True (DeiT puts it after [CLS])")
        if self.distillation_token and not pooling.reads_distillation_token:
            raise ValueError(
                f"distillation_token=True reads the [CLS] and distillation tokens; needs pooling='cls', got pooling={self.pooling!r}"
            )
        for kind in POOLING_KINDS.values():
            for name in kind.own_fields:
                value = getattr(self, name)
                if value is not None and (value <= 0 or kind is not pooling):
                    raise ValueError(
                        f"{name}={value!r} is read by pooling={kind.name!r} only; expected a positive int with it"
                    )
        if self.map_num_heads is not None and self.hidden_size % self.map_num_heads:
            raise ValueError(f"map_num_heads={self.map_num_heads} does not divide hidden_size={self.hidden_size}")
        if self.fc_norm and not self.final_norm:
            raise ValueError("fc_norm=True is the final norm applied after pooling; it needs final_norm=True")
        if self.fc_norm and not pooling.takes_fc_norm:
            takers = tuple(name for name, kind in POOLING_KINDS.items() if kind.takes_fc_norm)
            raise ValueError(
                f"fc_norm=True norms the pooled vector of pooling in {takers}, got pooling={self.pooling!r}"
            )
        self.position_kind.check(self)
        if self.rotary_kind is not None:
            self.rotary_kind.check(self)
        rope_fields = [
            name for name in HubViTConfig.__annotations__ if name.startswith("rope_") and name != "rope_type"
        ]
        check_rope_settings(self, {name: getattr(HubViTConfig, name) for name in rope_fields})
        check_window_settings(self)
        HubViTNeck.check(self)
        if self.scale_attention_branch_only and self.layer_scale_init_value is None:
            raise ValueError(
                "scale_attention_branch_only=True scales the attention branch; needs layer_scale_init_value"
            )
        if self.layer_scale_init_value is not None and not self.layer_scale_init_value > 0:
            raise ValueError(f"layer_scale_init_value must be > 0 or None, got {self.layer_scale_init_value!r}")
        if self.representation_size is not None and (
            not isinstance(self.representation_size, int) or self.representation_size <= 0
        ):
            raise ValueError(f"representation_size must be a positive int or None, got {self.representation_size!r}")
        if self.representation_size is not None and self.distillation_token and self.distillation_head:
            raise ValueError(
                f"representation_size={self.representation_size} with DeiT's two heads (distillation_token=True, "
                "distillation_head=True): no checkpoint family has both; set distillation_head=False or drop "
                "representation_size"
            )
        for name in ("layer_norm_eps", "final_layer_norm_eps"):
            value = getattr(self, name)
            if value is None and name == "final_layer_norm_eps":
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 < value < float("inf"):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "drop_path_rate"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1), got {value!r}")


if not DATACLASS_CONFIGS:  # what `inspect.signature` and `help` show on 5.10+ (from the dataclass), before 5.10 too
    HubViTConfig.__init__.__signature__ = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=getattr(HubViTConfig, name), annotation=kind
            )
            for name, kind in HubViTConfig.__annotations__.items()
        ]
        + [inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)]
    )

__all__ = ["HubViTConfig"]
