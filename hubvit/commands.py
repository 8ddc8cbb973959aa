"""The one table of hubvit's commands. Each entry names the module that holds its `Options` (a frozen, typed
dataclass: the only place its flags are declared and checked) and its `run(options)`, which returns a typed record.

Everything else is derived from this table: the Python functions of `hubvit` (`hubvit.convert_timm(src, out,
...)`), the `hubvit` command line (`hubvit.cli`), the converters a `publish` manifest may name, and the API tests.
Adding a converter is one module (with `Options` and `run`) and one line here.
"""

import dataclasses
import functools
import importlib
import inspect
import typing
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """One command: its words on the command line, the module holding `Options` and `run`, and its one-line help.

    `record`: the name of the record type `run` returns (importable from `hubvit` too). `options` and `run` name
    other attributes where one module holds several commands. `script`: for a trainer, the runnable script in
    `scripts/` whose option groups (`hubvit.options`) are its options."""

    words: tuple
    module: str
    help: str
    record: str
    options: str = "Options"
    run: str = "run"
    script: str = ""

    @property
    def name(self) -> str:
        return " ".join(self.words)

    @property
    def function(self) -> str:
        """The name of its Python function in `hubvit`: the words joined by underscores."""
        return "_".join(self.words).replace("-", "_")

    def load(self):
        """(Options class, run function), importing the module."""
        module = importlib.import_module(self.module)
        return getattr(module, self.options), getattr(module, self.run)


GROUPS = {
    "convert": "turn another checkpoint format into a hubvit folder",
    "export": "turn a hubvit folder into another library's format",
    "analyze": "attention distance, position similarity, attention maps",
}

_ANALYSIS = "hubvit.analysis.commands"

TABLE = (
    Command(
        ("convert", "timm"),
        "hubvit.conversion.timm",
        "a timm checkpoint (Hub-layout folder, weights file or Hub repo id)",
        "ConversionResult",
    ),
    Command(
        ("convert", "jax"),
        "hubvit.conversion.jax",
        "an original JAX .npz (vision_transformer or big_vision), a file or https://",
        "ConversionResult",
    ),
    Command(
        ("convert", "transformers"),
        "hubvit.conversion.transformers",
        "a transformers folder or Hub repo id (ViT, DeiT, DINOv2)",
        "ConversionResult",
    ),
    Command(
        ("convert", "torchvision"),
        "hubvit.conversion.torchvision",
        "a state dict of torchvision's VisionTransformer (vit_b_16 ...)",
        "ConversionResult",
    ),
    Command(
        ("convert", "pytorch"),
        "hubvit.conversion.pytorch",
        "a plain PyTorch ViT on nn.TransformerEncoder (norm_first=True)",
        "ConversionResult",
    ),
    Command(
        ("export", "transformers"),
        "hubvit.conversion.export_transformers",
        "a folder transformers' built-in ViT loads",
        "ExportResult",
    ),
    Command(
        ("export", "timm"),
        "hubvit.conversion.export_timm",
        "a timm Hub-layout folder timm.create_model loads",
        "ExportResult",
    ),
    Command(
        ("export", "onnx"),
        "hubvit.conversion.export_onnx",
        "an ONNX graph with dynamic batch, height and width (onnxruntime-verified)",
        "ExportResult",
    ),
    Command(("push",), "hubvit.hub", "publish a hubvit folder to the Hub", "PushResult"),
    Command(
        ("publish",),
        "hubvit.conversion.publish",
        "convert and push every entry of a manifest (a model zoo)",
        "PublishResult",
    ),
    Command(
        ("info",),
        _ANALYSIS,
        "tokens, attention memory, parameters and FLOPs of a model",
        "InfoResult",
        options="InfoOptions",
        run="run_info",
    ),
    Command(
        ("analyze", "attention-distance"),
        _ANALYSIS,
        "mean attention distance per layer and head",
        "AnalysisResult",
        options="AttentionDistanceOptions",
        run="run_attention_distance",
    ),
    Command(
        ("analyze", "position-similarity"),
        _ANALYSIS,
        "cosine similarity of the position embeddings",
        "AnalysisResult",
        options="PositionSimilarityOptions",
        run="run_position_similarity",
    ),
    Command(
        ("analyze", "attention-map"),
        _ANALYSIS,
        "attention rollout or one head's map over an image",
        "AnalysisResult",
        options="AttentionMapOptions",
        run="run_attention_map",
    ),
)

TRAIN = Command(
    ("train",),
    "hubvit.training",
    "fine-tune or train a classifier (`hubvit train --help`)",
    "TrainingResult",
    run="train",
    script="finetune",
)
SEGMENT = Command(
    ("train-segmentation",),
    "hubvit.training.segmentation",
    "fine-tune or train a semantic segmentation model (`hubvit train-segmentation --help`)",
    "TrainingResult",
    run="train_segmentation",
    script="finetune_segmentation",
)
TRAINERS = (TRAIN, SEGMENT)
"""The trainers keep the options of their script (`scripts/finetune.py`, `scripts/finetune_segmentation.py`:
option groups parsed by `hubvit.options`, as the commands' `Options` are), so each one's function is the library's own
(`hubvit.training.train`, `hubvit.training.segmentation.train_segmentation`) and its command line that parser."""

BY_FUNCTION = {command.function: command for command in TABLE}
CONVERTERS = {command.words[1]: command for command in TABLE if command.words[0] == "convert"}


def lazy_names():
    """Every name `hubvit` imports on first use -> the module it comes from (command functions and records)."""
    names = {command.function: None for command in TABLE}
    names.update({command.record: command.module for command in (*TABLE, *TRAINERS)})
    names.update({command.run: command.module for command in TRAINERS})
    return names


@functools.cache
def function(name):
    """The Python function of the command `name` (`convert_timm`, ...): its parameters are the fields of the
    command's `Options` (the positional arguments first, the options keyword-only), it checks them as `Options`
    does and returns `run`'s record."""
    command = BY_FUNCTION[name]
    options_class, run = command.load()

    def call(*args, **kwargs):
        return run(options_class(*args, **kwargs))

    hints = typing.get_type_hints(options_class)
    parameters = [
        inspect.Parameter(
            field.name,
            inspect.Parameter.KEYWORD_ONLY if field.kw_only else inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default,
            annotation=hints.get(field.name, inspect.Parameter.empty),
        )
        for field in dataclasses.fields(options_class)
    ]
    returns = typing.get_type_hints(run).get("return", inspect.Signature.empty)
    call.__signature__ = inspect.Signature(parameters, return_annotation=returns)
    call.__name__ = call.__qualname__ = name
    call.__module__ = "hubvit"
    call.__doc__ = options_class.__doc__
    return call
