"""Model cards rendered from `model_cards/` with huggingface_hub's `ModelCard` and `ModelCardData`."""

from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

TEMPLATES = Path(__file__).resolve().parent.parent / "model_cards"

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
}


@dataclass
class CardInfo:
    """What a card says beyond the config: where the weights came from and how they were checked."""

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
    citation_key: str | None = None
    repo_id: str = "REPO_ID"
    title: str | None = None


def count_parameters(model):
    total = sum(p.numel() for p in model.parameters())
    return f"{total / 1e6:.1f}M" if total >= 1e5 else f"{total / 1e3:.1f}K"


def render_card(model, info: CardInfo, image_processor=None):
    """A `ModelCard` for `model` (a hubvit model) with `info`; its YAML metadata follows the Hub's schema."""
    config = model.config
    headless = not config.num_labels
    pipeline_tag = "image-feature-extraction" if headless else "image-classification"
    tags = ["vision", "vit", "hubvit", "image-classification" if not headless else "feature-extraction"]
    if info.family and info.family not in tags:
        tags.append(info.family)
    metadata = {
        "library_name": "transformers",
        "pipeline_tag": pipeline_tag,
        "tags": tags,
        "license": info.license,
        "datasets": info.datasets or None,
        "base_model": info.base_model,
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
        rows = "\n".join(f"| {k} | {v:.4f} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in info.eval_results.items())
        eval_table = "| metric | value |\n| --- | --- |\n" + rows
    mean = getattr(image_processor, "image_mean", None)
    std = getattr(image_processor, "image_std", None)
    resample = getattr(image_processor, "resample", None)
    return ModelCard.from_template(
        card_data,
        template_path=str(TEMPLATES / "hubvit.md"),
        title=info.title or f"hubvit ViT-{config.hidden_size}/{ph} ({info.family})",
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
        eval_table=eval_table,
        resample=getattr(resample, "name", str(resample)).lower() if resample is not None else "bilinear",
        mean=[round(float(m), 4) for m in mean] if mean is not None else "n/a",
        std=[round(float(s), 4) for s in std] if std is not None else "n/a",
        auto_class="AutoModel" if headless else "AutoModelForImageClassification",
        pipeline_tag=pipeline_tag,
        repo_id=info.repo_id,
        family_citation=CITATIONS.get(info.citation_key) if info.citation_key else None,
    )
