"""Model cards rendered from `model_cards/` with huggingface_hub's `ModelCard` and `ModelCardData`."""

from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

from . import presets
from .preprocessing import RESAMPLE_NAMES, describe as describe_processor


CITATIONS = {
    "deit": "@inproceedings{touvron2021training,\n  title = {Training data-efficient image transformers & distillation "
    "through attention},\n  author = {Touvron, Hugo and Cord, Matthieu and Douze, Matthijs and Massa, Francisco and "
    "Sablayrolles, Alexandre and J{\\'e}gou, Herv{\\'e}},\n  booktitle = {ICML},\n  year = {2021}\n}",
    "dino": "@inproceedings{caron2021emerging,\n  title = {Emerging Properties in Self-Supervised Vision "
    "Transformers},\n  author = {Caron, Mathilde and Touvron, Hugo and Misra, Ishan and J{\\'e}gou, Herv{\\'e} and "
    "Mairal, Julien and Bojanowski, Piotr and Joulin, Armand},\n  booktitle = {ICCV},\n  year = {2021}\n}",
    "dinov2": "@article{oquab2024dinov2,\n  title = {DINOv2: Learning Robust Visual Features without Supervision},\n"
    "  author = {Oquab, Maxime and others},\n  journal = {TMLR},\n  year = {2024}\n}",
    "clip": "@inproceedings{radford2021learning,\n  title = {Learning Transferable Visual Models From Natural Language "
    "Supervision},\n  author = {Radford, Alec and others},\n  booktitle = {ICML},\n  year = {2021}\n}",
    "siglip": "@inproceedings{zhai2023sigmoid,\n  title = {Sigmoid Loss for Language Image Pre-Training},\n  author = "
    "{Zhai, Xiaohua and Mustafa, Basil and Kolesnikov, Alexander and Beyer, Lucas},\n  booktitle = {ICCV},\n"
    "  year = {2023}\n}",
    "augreg": "@article{steiner2022how,\n  title = {How to train your ViT? Data, Augmentation, and Regularization in "
    "Vision Transformers},\n  author = {Steiner, Andreas and Kolesnikov, Alexander and Zhai, Xiaohua and Wightman, "
    "Ross and Uszkoreit, Jakob and Beyer, Lucas},\n  journal = {TMLR},\n  year = {2022}\n}",
    "deit3": "@inproceedings{touvron2022deit,\n  title = {DeiT III: Revenge of the ViT},\n  author = {Touvron, Hugo and "
    "Cord, Matthieu and J{\\'e}gou, Herv{\\'e}},\n  booktitle = {ECCV},\n  year = {2022}\n}",
    "registers": "@inproceedings{darcet2024vision,\n  title = {Vision Transformers Need Registers},\n  author = "
    "{Darcet, Timoth{\\'e}e and Oquab, Maxime and Mairal, Julien and Bojanowski, Piotr},\n  booktitle = {ICLR},\n"
    "  year = {2024}\n}",
    "openclip": "@inproceedings{cherti2023reproducible,\n  title = {Reproducible Scaling Laws for Contrastive "
    "Language-Image Learning},\n  author = {Cherti, Mehdi and others},\n  booktitle = {CVPR},\n  year = {2023}\n}",
    "ijepa": "@inproceedings{assran2023self,\n  title = {Self-Supervised Learning from Images with a Joint-Embedding "
    "Predictive Architecture},\n  author = {Assran, Mahmoud and others},\n  booktitle = {CVPR},\n  year = {2023}\n}",
    "data2vec": "@inproceedings{baevski2022data2vec,\n  title = {data2vec: A General Framework for Self-supervised "
    "Learning in Speech, Vision and Language},\n  author = {Baevski, Alexei and others},\n  booktitle = {ICML},\n"
    "  year = {2022}\n}",
    "siglip2": "@article{tschannen2025siglip,\n  title = {SigLIP 2: Multilingual Vision-Language Encoders with Improved "
    "Semantic Understanding, Localization, and Dense Features},\n  author = {Tschannen, Michael and others},\n  "
    "journal = {arXiv preprint arXiv:2502.14786},\n  year = {2025}\n}",
    "big_vision": "@article{beyer2022better,\n  title = {Better plain ViT baselines for ImageNet-1k},\n  author = "
    "{Beyer, Lucas and Zhai, Xiaohua and Kolesnikov, Alexander},\n  journal = {arXiv preprint arXiv:2205.01580},\n"
    "  year = {2022}\n}",
    "eva02": "@article{fang2024eva02,\n  title = {EVA-02: A Visual Representation for Neon Genesis},\n  author = "
    "{Fang, Yuxin and Sun, Quan and Wang, Xinggang and Huang, Tiejun and Wang, Xinlong and Cao, Yue},\n  journal = "
    "{Image and Vision Computing},\n  year = {2024}\n}",
    "eva_clip": "@article{sun2023evaclip,\n  title = {EVA-CLIP: Improved Training Techniques for CLIP at Scale},\n"
    "  author = {Sun, Quan and Fang, Yuxin and Wu, Ledell and Wang, Xinlong and Cao, Yue},\n  journal = {arXiv "
    "preprint arXiv:2303.15389},\n  year = {2023}\n}",
    "dinov3": "@article{simeoni2025dinov3,\n  title = {DINOv3},\n  author = {Sim{\\'e}oni, Oriane and others},\n"
    "  journal = {arXiv preprint arXiv:2508.10104},\n  year = {2025}\n}",
    "perception_encoder": "@article{bolya2025perception,\n  title = {Perception Encoder: The best visual embeddings "
    "are not at the output of the network},\n  author = {Bolya, Daniel and others},\n  journal = {arXiv preprint "
    "arXiv:2504.13181},\n  year = {2025}\n}",
    "rope_vit": "@inproceedings{heo2024rotary,\n  title = {Rotary Position Embedding for Vision Transformer},\n"
    "  author = {Heo, Byeongho and Park, Song and Han, Dongyoon and Yun, Sangdoo},\n  booktitle = {ECCV},\n"
    "  year = {2024}\n}",
    "beit": "@inproceedings{bao2022beit,\n  title = {BEiT: BERT Pre-Training of Image Transformers},\n  author = "
    "{Bao, Hangbo and Dong, Li and Piao, Songhao and Wei, Furu},\n  booktitle = {ICLR},\n  year = {2022}\n}",
    "beitv2": "@article{peng2022beitv2,\n  title = {BEiT v2: Masked Image Modeling with Vector-Quantized Visual "
    "Tokenizers},\n  author = {Peng, Zhiliang and Dong, Li and Bao, Hangbo and Ye, Qixiang and Wei, Furu},\n"
    "  journal = {arXiv preprint arXiv:2208.06366},\n  year = {2022}\n}",
    "sam": "@inproceedings{kirillov2023segment,\n  title = {Segment Anything},\n  author = {Kirillov, Alexander and "
    "Mintun, Eric and Ravi, Nikhila and Mao, Hanzi and Rolland, Chloe and Gustafson, Laura and Xiao, Tete and "
    "Whitehead, Spencer and Berg, Alexander C. and Lo, Wan-Yen and Doll{\\'a}r, Piotr and Girshick, Ross},\n"
    "  booktitle = {ICCV},\n  year = {2023}\n}",
    "beit3": "@inproceedings{wang2023image,\n  title = {Image as a Foreign Language: BEiT Pretraining for Vision and "
    "Vision-Language Tasks},\n  author = {Wang, Wenhui and others},\n  booktitle = {CVPR},\n  year = {2023}\n}",
    "aimv2": "@article{fini2024multimodal,\n  title = {Multimodal Autoregressive Pre-training of Large Vision "
    "Encoders},\n  author = {Fini, Enrico and others},\n  journal = {arXiv preprint arXiv:2411.14402},\n"
    "  year = {2024}\n}",
    "timm": "@misc{rw2019timm,\n  title = {PyTorch Image Models},\n  author = {Wightman, Ross},\n  year = {2019},\n"
    "  publisher = {GitHub},\n  howpublished = {\\url{https://github.com/huggingface/pytorch-image-models}}\n}",
}


REPO_PLACEHOLDER = "REPO_ID"


@dataclass
class CardInfo:
    """What a card says beyond the config: where the weights came from and how they were checked.

    `max_abs_diff` is the figure measured at conversion against the source library (`verification` says how);
    `eval_results` ({metric: value}) the metrics of a fine-tuned model, on `eval_split` of `datasets[0]`.
    `citation_key` (a key of CITATIONS, or a list of them) defaults to `family`.
    """

    provenance: str
    command: str
    family: str = "hubvit"
    verification: str | None = None
    max_abs_diff: float | None = None
    eval_results: dict = field(default_factory=dict)
    dropped: list = field(default_factory=list)
    license: str | None = None
    datasets: list = field(default_factory=list)
    base_model: str | None = None
    citation_key: str | list | None = None
    repo_id: str = REPO_PLACEHOLDER
    title: str | None = None
    eval_split: str | None = None
    source: dict = field(default_factory=dict)  # where SRC came from: hubvit.conversion.sources.Source.record()


def templates_folder():
    """model_cards/: beside the subpackages both in a source checkout (the repository's folders) and in an installed
    wheel (hubvit/model_cards), so found next to `hubvit.modeling`'s folder."""
    from . import modeling

    return Path(modeling.__file__).resolve().parent.parent / "model_cards"


def count_parameters(model):
    total = sum(p.numel() for p in model.parameters())
    return f"{total / 1e6:.1f}M" if total >= 1e5 else f"{total / 1e3:.1f}K"


def model_name(config, family):
    """ViT-B/16 style name when the width and depth are a standard size, else ViT-{width}d{depth}/{patch}."""
    width, depth, (patch, _) = config.hidden_size, config.num_hidden_layers, config.patch_size_2d
    known = presets.size_of(width, depth)
    size = known.letter.capitalize() if known else f"{width}d{depth}"
    return f"hubvit ViT-{size}/{patch} ({family})"


def citations(info: CardInfo):
    keys = info.citation_key if info.citation_key is not None else info.family
    keys = [keys] if isinstance(keys, str) else list(keys or [])
    return [CITATIONS[key] for key in dict.fromkeys(keys) if key in CITATIONS]


def eval_metadata(info: CardInfo, name):
    """`model-index` entries for numeric eval results, which need a dataset to be named."""
    from huggingface_hub import EvalResult

    if not info.eval_results or not info.datasets:
        return None
    dataset = info.datasets[0]
    results = [
        EvalResult(
            task_type="image-classification",
            dataset_type=dataset,
            dataset_name=dataset,
            dataset_split=info.eval_split,
            metric_type=metric.removeprefix("eval_"),
            metric_value=float(value),
        )
        for metric, value in info.eval_results.items()
        if is_metric(metric, value)
    ]
    return results or None


def is_metric(name, value):
    """An `eval_*` quality figure (not the run's speed or size), as transformers and `evaluate` name them."""
    speed = ("runtime", "_runtime_s", "per_second", "_samples", "_steps", "_epoch")
    return (
        name.startswith("eval_")
        and not name.endswith(speed)
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
    )


def format_value(value):
    if isinstance(value, float):
        return f"{value:.4f}" if value == 0 or 1e-3 <= abs(value) < 1e4 else f"{value:.3e}"
    return str(value)


def format_diff(value):
    """How a verification figure is written in the card (and searched for by tests)."""
    return f"{value:.2e}"


def set_repo_id(text, repo_id):
    """A rendered card's text with its usage snippets pointing at `repo_id` instead of the placeholder."""
    return text.replace(f'"{REPO_PLACEHOLDER}"', f'"{repo_id}"')


def provenance_metadata(info: CardInfo):
    """The card's machine-readable record: hubvit's version, the source, the parity figure (`hubvit publish`)."""
    from . import __version__

    record = {"version": __version__, "source": dict(info.source) or None, "max_abs_diff": info.max_abs_diff}
    return {key: value for key, value in record.items() if value is not None}


def source_line(source):
    if not source:
        return None
    if source.get("repo_id"):
        return f"Source: Hub repo `{source['repo_id']}` at commit `{source['revision']}`."
    return f"Source: <{source['url']}>, sha256 `{source['sha256']}`."


def render_card(model, info: CardInfo, image_processor=None):
    """A `ModelCard` for `model` (a hubvit model) with `info`; its YAML metadata follows the Hub's schema."""
    config = model.config
    headless = not config.num_labels
    pipeline_tag = "image-feature-extraction" if headless else "image-classification"
    tags = ["vision", "vit", "hubvit", "image-classification" if not headless else "feature-extraction"]
    if info.family and info.family not in tags:
        tags.append(info.family)
    title = info.title or model_name(config, info.family)
    eval_results = eval_metadata(info, title)
    metadata = {
        "library_name": "transformers",
        "pipeline_tag": pipeline_tag,
        "tags": tags,
        "license": info.license,
        "datasets": info.datasets or None,
        "base_model": info.base_model,
        "eval_results": eval_results,
        "model_name": title if eval_results else None,
        "hubvit": provenance_metadata(info),
    }
    card_data = ModelCardData(**{k: v for k, v in metadata.items() if v is not None})
    (h, w), (ph, pw) = config.image_size_2d, config.patch_size_2d
    tokens = ["[CLS]"] if config.class_token else []
    if config.distillation_token:
        tokens.append("distillation")
    if config.num_register_tokens:
        tokens.append(f"{config.num_register_tokens} registers")
    extras = []
    if config.layer_scale_init_value is not None:
        extras.append("layer scale")
    if config.pre_norm:
        extras.append("pre-norm")
    if not config.patch_bias:
        extras.append("no patch bias")
    if config.fc_norm:
        extras.append("norm after pooling")
    if config.representation_size:
        extras.append(f"representation layer {config.representation_size}")
    eval_table = None
    if info.eval_results:
        split = f" ({info.eval_split})" if info.eval_split else ""
        rows = "\n".join(
            f"| {k}{split if k.startswith('eval_') else ''} | {format_value(v)} |" for k, v in info.eval_results.items()
        )
        eval_table = "| metric | value |\n| --- | --- |\n" + rows
    mean = getattr(image_processor, "image_mean", None)
    std = getattr(image_processor, "image_std", None)
    resample = getattr(image_processor, "resample", None)
    template = templates_folder() / "hubvit.md"
    return ModelCard.from_template(
        card_data,
        template_path=str(template),
        title=title,
        summary=info.provenance.split("\n")[0],
        patch=f"{ph}x{pw}",
        width=config.hidden_size,
        depth=config.num_hidden_layers,
        heads=config.num_attention_heads,
        mlp=config.intermediate_size,
        params=count_parameters(model),
        resolution=f"{h}x{w}",
        tokens=", ".join(tokens) or "none",
        position=config.position_embedding_type,
        pooling=config.pooling,
        activation=config.hidden_act,
        eps=config.layer_norm_eps,
        extras=", ".join(extras),
        num_labels=config.num_labels,
        provenance=info.provenance,
        command=info.command,
        dropped=info.dropped,
        verification=info.verification,
        max_abs_diff=format_diff(info.max_abs_diff) if info.max_abs_diff is not None else None,
        eval_table=eval_table,
        resample=RESAMPLE_NAMES.get(resample, str(resample)) if resample is not None else "bilinear",
        mean=[round(float(m), 4) for m in mean] if mean is not None else "n/a",
        std=[round(float(s), 4) for s in std] if std is not None else "n/a",
        auto_class="AutoModel" if headless else "AutoModelForImageClassification",
        pipeline_tag=pipeline_tag,
        repo_id=info.repo_id,
        family_citations=citations(info),
        preprocessing=describe_processor(image_processor) if image_processor is not None else None,
        source=source_line(info.source),
    )
