"""The model a run starts from (a hubvit checkpoint or a preset), its preprocessing, and its optimizer."""

import re

import torch

from ..preprocessing import Preprocessing, resample_name

from . import checks
from .arguments import PRESETS, UsageError

HEAD_PREFIXES = ("classifier.", "distillation_classifier.")


def load_model(args, label_names, config_fields=None):
    """(model, Preprocessing) from a hubvit checkpoint (new head if the labels differ) or from a preset.

    `config_fields` (a dict) changes preset fields for a model trained from scratch, before `--config_overrides`.
    """
    model, preprocessing = build_start_model(args, label_names, config_fields)
    rate = getattr(args, "drop_path_rate", None)
    if rate is not None:
        from .recipes import set_drop_path_rate

        set_drop_path_rate(model, rate)
    return model, preprocessing


def build_start_model(args, label_names, config_fields=None):
    id2label = dict(enumerate(label_names))
    label2id = {name: i for i, name in id2label.items()}
    if args.model_name_or_path:
        return load_checkpoint_model(args, id2label, label2id)
    from .. import HubViTConfig, HubViTForImageClassification

    try:
        config = HubViTConfig(
            **{**PRESETS[args.model_size], **(config_fields or {})},
            num_labels=len(label_names),
            id2label=id2label,
            label2id=label2id,
        )
        if args.config_overrides:
            config.update_from_string(args.config_overrides)
            config.validate_architecture()
    except (ValueError, TypeError) as error:
        raise UsageError(f"bad --config_overrides {args.config_overrides!r} or fields {config_fields!r}: {error}")
    checks.check_config(config, args.image_size, batch_size=args.per_device_train_batch_size)
    check_image_size(args.image_size, config)
    if args.image_size:
        config.image_size = args.image_size
    return HubViTForImageClassification(config), Preprocessing()


def load_checkpoint_model(args, id2label, label2id):
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(args.model_name_or_path, trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot load a config from --model_name_or_path {args.model_name_or_path!r}: {error}")
    if config.model_type != "hubvit":
        raise UsageError(
            f"--model_name_or_path {args.model_name_or_path!r} is a {config.model_type!r} "
            "checkpoint; convert it first (`hubvit convert ...`)"
        )
    checks.check_source_model(args.model_name_or_path, config.num_channels)
    checks.check_config(config, args.image_size, batch_size=args.per_device_train_batch_size)
    check_image_size(args.image_size, config)
    model = load_pretrained(args.model_name_or_path, config, id2label, label2id)
    if args.image_size:
        model.resize_position_embeddings(args.image_size)
    return model, checkpoint_preprocessing(args.model_name_or_path)


def checkpoint_preprocessing(path):
    """The normalisation and resample filter of the checkpoint's image processor (the JAX default without one);
    training resizes the whole image to the model's resolution, as the folder it writes does."""
    from transformers import AutoImageProcessor

    try:
        processor = AutoImageProcessor.from_pretrained(path)
        return Preprocessing(
            mean=tuple(processor.image_mean),
            std=tuple(processor.image_std),
            resample=resample_name(int(processor.resample)),
        )
    except (OSError, ValueError):
        return Preprocessing()


def load_pretrained(path, config, id2label, label2id):
    """Every tensor of `path` into the model, or UsageError naming what does not fit.

    Only the classifier head may be replaced, and only when the label count differs: a config that does not match
    its weights would otherwise re-initialise those layers and train them from scratch, silently.
    """
    from .. import HubViTForImageClassification

    new_head = config.num_labels != len(id2label)
    try:
        model, info = HubViTForImageClassification.from_pretrained(
            path,
            id2label=id2label,
            label2id=label2id,
            ignore_mismatched_sizes=True,
            output_loading_info=True,
        )
    except (OSError, ValueError, RuntimeError) as error:
        raise UsageError(f"cannot load the weights of --model_name_or_path {path!r}: {str(error).splitlines()[0]}")
    replaceable = (lambda key: key.startswith(HEAD_PREFIXES)) if new_head else (lambda key: False)
    problems = []
    for kind in ("missing_keys", "unexpected_keys"):
        keys = sorted(key for key in info.get(kind, ()) if not replaceable(key))
        if keys:
            problems.append(f"{kind.replace('_', ' ')}: {', '.join(keys)}")
    wrong = sorted(
        f"{key} {tuple(saved)} vs {tuple(model_shape)}"
        for key, saved, model_shape in info.get("mismatched_keys", ())
        if not replaceable(key)
    )
    if wrong:
        problems.append(f"shapes that differ from the config: {', '.join(wrong)}")
    if problems:
        raise UsageError(
            f"--model_name_or_path {path!r}: the weights do not fit its config, and training would start from "
            "randomly initialised layers; " + "; ".join(problems)
        )
    return model


def check_image_size(image_size, config):
    """--image_size (or the config's own) divisible by the patch size, and few enough tokens for the model to fit
    (`checks.check_sizes`), before the model and its position table are allocated."""
    if image_size is not None:
        ph, pw = config.patch_size_2d
        if image_size <= 0 or image_size % ph or image_size % pw:
            raise UsageError(f"--image_size {image_size} is not divisible by the patch size {config.patch_size!r}")
    checks.check_sizes(config, image_size)


def layer_id(name, depth):
    """0 for the embeddings, i + 1 for encoder block i, depth + 1 for the final norm, pooler and head (BEiT)."""
    if name.startswith(("hubvit.embeddings.", "hubvit.pre_norm.")):
        return 0
    match = re.match(r"hubvit\.encoder\.layers\.(\d+)\.", name)
    return int(match.group(1)) + 1 if match else depth + 1


def parameter_groups(model, learning_rate, weight_decay, layer_decay=1.0):
    """Optimizer groups: no weight decay on norms, biases, tokens, position tables and layer scales; per-layer lr."""
    depth = model.config.num_hidden_layers
    groups = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        no_decay = param.ndim <= 1 or any(key in name for key in ("token", "position", "probe"))
        layer = layer_id(name, depth)
        scale = layer_decay ** (depth + 1 - layer)
        group = groups.setdefault(
            (layer, no_decay),
            {
                "params": [],
                "names": [],
                "lr": learning_rate * scale,
                "weight_decay": 0.0 if no_decay else weight_decay,
            },
        )
        group["params"].append(param)
        group["names"].append(name)
    return list(groups.values())


def scale_learning_rates(groups, lr_scale):
    """Split off the parameters whose name contains a key of `lr_scale` into groups at `value` x their rate
    (e.g. a zero-initialised relative position bias that must move further than the base rate allows)."""
    out = []
    for group in groups:
        for key, scale in lr_scale.items():
            picked = [i for i, name in enumerate(group["names"]) if key in name]
            if picked:
                out.append(
                    dict(
                        group,
                        params=[group["params"][i] for i in picked],
                        names=[group["names"][i] for i in picked],
                        lr=group["lr"] * scale,
                    )
                )
                group["params"] = [p for i, p in enumerate(group["params"]) if i not in picked]
                group["names"] = [n for i, n in enumerate(group["names"]) if i not in picked]
        out.append(group)
    return [group for group in out if group["params"]]


def make_optimizer(args, model, lr_scale=None):
    groups = parameter_groups(model, args.learning_rate, args.weight_decay, args.layer_decay)
    if lr_scale:
        groups = scale_learning_rates(groups, lr_scale)
    for group in groups:
        group.pop("names")
    if args.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=args.learning_rate, momentum=args.momentum)
    return torch.optim.AdamW(groups, lr=args.learning_rate)


def enable_activation_checkpointing(model):
    """transformers' own checkpointing of every encoder block (`activation_checkpointing_enable` from 5.25, the
    older `gradient_checkpointing_enable` before), non-reentrant as PyTorch recommends (4.x defaults to reentrant)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
