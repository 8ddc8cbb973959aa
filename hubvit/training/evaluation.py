"""Scoring with `evaluate`, from metric scripts shipped inside the package (no Hub download)."""

from pathlib import Path

import torch
import torch.nn.functional as F

from .naflex import model_inputs

METRICS_DIR = Path(__file__).resolve().parent / "metrics"


def load_metric(name):
    import evaluate

    return evaluate.load(str(METRICS_DIR / name / f"{name}.py"), keep_in_memory=True)


@torch.no_grad()
def evaluate_model(accelerator, model, loader, patch_size=None):
    """Top-1 and top-5 accuracy and mean loss, every example counted once across processes; `patch_size`: the model
    run at that patch size (its kernel resized on the fly, `--patch_sizes`)."""
    accuracy, top5 = load_metric("accuracy"), load_metric("top5_accuracy")
    at_size = {} if patch_size is None else {"patch_size": patch_size}
    model.eval()
    total_loss, count = 0.0, 0
    for pixels, labels in loader:
        logits = model(**model_inputs(pixels), **at_size).logits.float()
        logits, labels = accelerator.gather_for_metrics((logits, labels))
        total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
        count += labels.numel()
        k = min(5, logits.shape[-1])
        accuracy.add_batch(predictions=logits.argmax(-1).tolist(), references=labels.tolist())
        top5.add_batch(predictions=logits.topk(k, dim=-1).indices.tolist(), references=labels.tolist())
    model.train()
    return {
        "eval_accuracy": accuracy.compute()["accuracy"],
        "eval_top5_accuracy": top5.compute()["top5_accuracy"],
        "eval_loss": total_loss / max(count, 1),
        "eval_samples": count,
    }


def evaluate_each_patch_size(accelerator, model, loader, patch_sizes):
    """{patch size (as text, a JSON key): `evaluate_model` at that size}; {} without sizes or an eval split."""
    if not patch_sizes or loader is None:
        return {}
    return {str(size): evaluate_model(accelerator, model, loader, patch_size=size) for size in patch_sizes}
