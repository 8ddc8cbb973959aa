"""hubvit's commands as Python functions: `convert_*`, `export_*`, `push`, `publish` (the analyses and `info` live in
`hubvit.analysis.commands`). Each takes keyword arguments named as the command's flags, returns a small record, and
raises a `HubViTError` (a ValueError) for bad input; the `hubvit` command only maps flags to these arguments.

Every function here is importable from `hubvit` itself (`hubvit.convert_timm(...)`). Every `convert_*` also takes
`patch_size` (an int, an (h, w) pair or 'HxW' text): the model is verified at the source's patch size, then its patch
embedding is PI-resized to that size (FlexiViT) and the card says how (docs/patch-size.md).
"""

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import HubViTError
from . import export_onnx as onnx_export
from . import export_timm as timm_export
from . import export_transformers as transformers_export
from . import hub, jax, publish as zoo, pytorch, timm, torchvision, transformers
from .arguments import TOLERANCE, choice, flag, path_text, positive, whole
from .common import ConversionResult, ExportResult
from .folder import check_output_path, write_conversion
from .patch_size import check_patch_size
from .publish import Outcome

# ------------------------------------------------------------------------------------------------------- conversion


def convert_timm(
    src,
    out,
    *,
    overwrite: bool = False,
    verify: bool = True,
    tolerance: float = TOLERANCE,
    patch_size: int | tuple | str | None = None,
    revision: str | None = None,
    architecture: str | None = None,
    model_args: dict | str | None = None,
) -> ConversionResult:
    """Convert the timm checkpoint SRC (a folder written by `timm.models.save_for_hf`, a weights file with
    `architecture`, or a Hub repo id at `revision`) into a hubvit folder at OUT, after checking the converted model
    against timm's own forward on the same weights (`verify`, within `tolerance` of the output scale).

    `model_args`: timm model kwargs (a dict or its JSON text) on top of the folder's own.
    """
    options = timm.Options(
        src=path_text(src, "src"),
        out=path_text(out, "out"),
        architecture=architecture,
        model_args=json.dumps(model_args) if isinstance(model_args, dict) else model_args,
        verify=flag(verify, "verify"),
        tolerance=positive(tolerance, "tolerance"),
        patch_size=check_patch_size(patch_size),
        revision=revision,
    )
    check_output_path(options.out, options.src)
    return write_conversion(
        timm.convert(options), options.out, overwrite=flag(overwrite, "overwrite"), patch_size=options.patch_size
    )


def convert_jax(
    src,
    out,
    *,
    overwrite: bool = False,
    verify: bool = True,
    tolerance: float = TOLERANCE,
    patch_size: int | tuple | str | None = None,
    sha256: str | None = None,
    image_size: int | None = None,
    position_embedding: str | None = None,
    pool_type: str | None = None,
    gelu: str = "tanh",
    drop_pre_logits: bool = False,
    num_labels: int | None = None,
) -> ConversionResult:
    """Convert an original JAX `.npz` (vision_transformer or big_vision; a path, or an https:// address checked
    against `sha256`) into a hubvit folder at OUT, after checking it against the Flax model of its own codebase
    (`verify`, within `tolerance`; skipped with a reason when jax/flax are not installed).

    `image_size`: resize the position grid as the original fine-tuning does. `position_embedding` ('sincos_2d',
    'none'): for files without a table. `pool_type`: big_vision's, needed only for '0'. `gelu`: 'tanh' (Flax, as
    trained) or 'erf'. `drop_pre_logits`: drop the representation layer and its head. `num_labels`: a fresh
    zero-initialised head over N labels (0: headless).
    """
    options = jax.Options(
        src=path_text(src, "src"),
        out=path_text(out, "out"),
        image_size=whole(image_size, "image_size"),
        position_embedding=choice(position_embedding, jax.POSITION_EMBEDDINGS, "position_embedding", optional=True),
        pool_type=choice(pool_type, tuple(jax.POOL_TYPES), "pool_type", optional=True),
        gelu=choice(gelu, jax.GELUS, "gelu"),
        drop_pre_logits=flag(drop_pre_logits, "drop_pre_logits"),
        num_labels=whole(num_labels, "num_labels"),
        verify=flag(verify, "verify"),
        tolerance=positive(tolerance, "tolerance"),
        patch_size=check_patch_size(patch_size),
        sha256=sha256,
    )
    check_output_path(options.out, options.src)
    return write_conversion(
        jax.convert(options), options.out, overwrite=flag(overwrite, "overwrite"), patch_size=options.patch_size
    )


def convert_transformers(
    src,
    out,
    *,
    overwrite: bool = False,
    verify: bool = True,
    tolerance: float = TOLERANCE,
    patch_size: int | tuple | str | None = None,
    revision: str | None = None,
    drop_head: bool = False,
) -> ConversionResult:
    """Convert a folder written by transformers' ViT, DeiT or DINOv2 `save_pretrained` (or a Hub repo id at
    `revision`) into a hubvit folder at OUT, after checking it against transformers' own forward (`verify`, within
    `tolerance` of the output scale). `drop_head`: convert only the body of a classifier."""
    options = transformers.Options(
        src=path_text(src, "src"),
        out=path_text(out, "out"),
        drop_head=flag(drop_head, "drop_head"),
        verify=flag(verify, "verify"),
        tolerance=positive(tolerance, "tolerance"),
        patch_size=check_patch_size(patch_size),
        revision=revision,
    )
    check_output_path(options.out, options.src)
    return write_conversion(
        transformers.convert(options),
        options.out,
        overwrite=flag(overwrite, "overwrite"),
        patch_size=options.patch_size,
    )


def convert_torchvision(
    src,
    out,
    *,
    overwrite: bool = False,
    verify: bool = True,
    tolerance: float = TOLERANCE,
    patch_size: int | tuple | str | None = None,
    architecture: str | None = None,
    num_heads: int | None = None,
    image_size: int | None = None,
    weights: str | None = None,
) -> ConversionResult:
    """Convert a state dict of torchvision's `VisionTransformer` into a hubvit folder at OUT, after checking it
    against torchvision's own forward (`verify`, within `tolerance` of the output scale).

    Exactly one of `architecture` (the torchvision builder, `vit_b_16` ...) or `num_heads` (a VisionTransformer
    built with other sizes). `image_size`: the native resolution, resized with torchvision's
    `interpolate_embeddings` (default: the table's). `weights`: the torchvision weights enum whose transforms become
    the preprocessing.
    """
    if (architecture is None) == (num_heads is None):
        raise HubViTError(
            f"architecture={architecture!r}, num_heads={num_heads!r}; give exactly one: the torchvision builder "
            f"({', '.join(torchvision.ARCHITECTURES)}) or the head count"
        )
    options = torchvision.Options(
        src=path_text(src, "src"),
        out=path_text(out, "out"),
        architecture=choice(architecture, torchvision.ARCHITECTURES, "architecture", optional=True),
        num_heads=whole(num_heads, "num_heads", minimum=1),
        image_size=whole(image_size, "image_size", minimum=1),
        weights=weights,
        verify=flag(verify, "verify"),
        tolerance=positive(tolerance, "tolerance"),
        patch_size=check_patch_size(patch_size),
    )
    check_output_path(options.out, options.src)
    return write_conversion(
        torchvision.convert(options), options.out, overwrite=flag(overwrite, "overwrite"), patch_size=options.patch_size
    )


def convert_pytorch(
    src,
    out,
    *,
    num_heads: int,
    overwrite: bool = False,
    verify: bool = True,
    tolerance: float = TOLERANCE,
    patch_size: int | tuple | str | None = None,
    activation: str = "gelu",
    layer_norm_eps: float = 1e-5,
    final_layer_norm_eps: float = 1e-6,
) -> ConversionResult:
    """Convert the state dict of a plain PyTorch ViT on `nn.TransformerEncoder(norm_first=True)` into a hubvit folder
    at OUT, after checking it against that PyTorch model's forward (`verify`, within `tolerance`). `num_heads`,
    `activation` and the two LayerNorm eps values cannot be read from the weights."""
    options = pytorch.Options(
        src=path_text(src, "src"),
        out=path_text(out, "out"),
        num_heads=whole(num_heads, "num_heads", minimum=1, optional=False),
        activation=choice(activation, pytorch.ACTIVATIONS, "activation"),
        layer_norm_eps=positive(layer_norm_eps, "layer_norm_eps"),
        final_layer_norm_eps=positive(final_layer_norm_eps, "final_layer_norm_eps"),
        verify=flag(verify, "verify"),
        tolerance=positive(tolerance, "tolerance"),
        patch_size=check_patch_size(patch_size),
    )
    check_output_path(options.out, options.src)
    return write_conversion(
        pytorch.convert(options), options.out, overwrite=flag(overwrite, "overwrite"), patch_size=options.patch_size
    )


# ----------------------------------------------------------------------------------------------------------- export


def export_transformers(src, out, *, overwrite: bool = False, tolerance: float = TOLERANCE) -> ExportResult:
    """Write the hubvit folder SRC as transformers' built-in `ViTForImageClassification` (`ViTModel` when headless)
    at OUT, after both agree within `tolerance`; settings ViT cannot express are refused, all listed."""
    options = transformers_export.Options(
        path_text(src, "src"), path_text(out, "out"), positive(tolerance, "tolerance"), flag(overwrite, "overwrite")
    )
    check_output_path(options.out, options.src)
    return transformers_export.export(options)


def export_timm(src, out, *, overwrite: bool = False, tolerance: float = TOLERANCE) -> ExportResult:
    """Write the hubvit folder SRC as a timm Hub-layout folder (`timm.create_model("local-dir:OUT")` loads it with
    no hubvit installed), after both agree within `tolerance`; settings timm cannot express are refused."""
    options = timm_export.Options(
        path_text(src, "src"), path_text(out, "out"), positive(tolerance, "tolerance"), flag(overwrite, "overwrite")
    )
    check_output_path(options.out, options.src)
    return timm_export.export(options)


def export_onnx(
    src,
    out,
    *,
    overwrite: bool = False,
    opset: int = onnx_export.OPSET,
    tolerance: float = onnx_export.TOLERANCE,
    int8: bool = False,
    onnxruntime_fusion: bool = False,
) -> ExportResult:
    """Write the hubvit folder SRC as one ONNX graph OUT (`.onnx`) with dynamic batch, height and width, after
    onnxruntime reproduces PyTorch within `tolerance` at three sizes (the figures also go to OUT.verification.json).
    `onnxruntime_fusion` writes attention and GELU as onnxruntime's fused operators (a graph for onnxruntime only);
    `int8` fuses them too, then quantizes the encoder projections (dynamic, onnxruntime) and records their agreement
    in that file."""
    options = onnx_export.Options(
        path_text(src, "src"),
        path_text(out, "out"),
        whole(opset, "opset", minimum=7, optional=False),
        positive(tolerance, "tolerance"),
        flag(overwrite, "overwrite"),
        flag(int8, "int8"),
        flag(onnxruntime_fusion, "onnxruntime_fusion"),
    )
    check_output_path(options.out, options.src, is_file=True)
    return onnx_export.export(options)


# ------------------------------------------------------------------------------------------------------------- Hub


@dataclass(frozen=True)
class PushResult:
    """Where a push went: the folder, the repo, and the commit (or pull request) it made."""

    folder: Path
    repo_id: str
    commit: str
    url: str


def push(
    folder,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    create_pr: bool = False,
    commit_message: str | None = None,
    timeout: float = hub.DEFAULT_TIMEOUT,
    load_check: bool = True,
    token: str | None = None,
    endpoint: str | None = None,
) -> PushResult:
    """Publish the hubvit folder to the Hub repo `repo_id` as one commit (or pull request with `create_pr`), after
    checking that it loads with `trust_remote_code=True` where hubvit is not installed (`load_check=False` skips
    running the folder's code: use it for a folder you did not write). Each request gives up after `timeout` s."""
    folder = Path(path_text(folder, "folder"))
    info = hub.push_folder(
        folder,
        repo_id,
        private=flag(private, "private"),
        revision=revision,
        create_pr=flag(create_pr, "create_pr"),
        commit_message=commit_message,
        token=token,
        endpoint=endpoint,
        timeout=positive(timeout, "timeout"),
        load_check=flag(load_check, "load_check"),
    )
    return PushResult(folder, info.repo_url.repo_id, info.oid, info.pr_url or info.commit_url)


@dataclass(frozen=True)
class PublishResult:
    """One `Outcome` per manifest entry (result pushed, skipped, checked or failed; parity figure; repo commit)."""

    outcomes: tuple

    @property
    def failed(self) -> list:
        return [outcome for outcome in self.outcomes if outcome.result == "failed"]

    def table(self) -> str:
        return zoo.summary(self.outcomes)


def publish(manifest, *, dry_run: bool = False, force: bool = False, work_dir=None) -> PublishResult:
    """Convert and push every entry of a YAML or CSV manifest (a model zoo), each through its converter's function;
    an entry whose repo card already records the same source revision and hubvit version is skipped (`force` redoes
    it), `dry_run` converts and load-checks without uploading. A failed entry does not stop the others: the
    result lists every outcome (see `PublishResult.failed`)."""
    outcomes = zoo.publish_all(
        path_text(manifest, "manifest"),
        dry_run=flag(dry_run, "dry_run"),
        force=flag(force, "force"),
        work_dir=None if work_dir is None else path_text(work_dir, "work_dir"),
    )
    return PublishResult(tuple(outcomes))


__all__ = [
    "ConversionResult",
    "ExportResult",
    "Outcome",
    "PublishResult",
    "PushResult",
    "convert_jax",
    "convert_pytorch",
    "convert_timm",
    "convert_torchvision",
    "convert_transformers",
    "export_onnx",
    "export_timm",
    "export_transformers",
    "HubViTError",
    "publish",
    "push",
]
