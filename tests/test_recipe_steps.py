"""The recipe flags that act in the training step, the optimizer and its schedule: what each one changes.

Every test builds a run with the package's own `loop.prepare` (the optimizer of `model.make_optimizer`, the
scheduler, Accelerate's wrappers) from one plain recipe, changes one flag, and drives `loop.train_step` (or `fit`)
on the same images. The plain recipe is SGD without momentum, weight decay, clipping, warmup or smoothing at a
constant learning rate, so that an update is -learning_rate x gradient and whatever a flag adds shows on its own.

The tiny model has no dropout or stochastic depth: the same weights and images give the same logits, so two runs
differ only by the flag. Tolerances are float32 round-off, justified where they are used; every test also checks
that the effect it measures is far larger than its tolerance, so that an ignored flag fails.
"""

import copy
from types import SimpleNamespace

import datasets
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from utils import randomize_, tiny_config

from hubvit.preprocessing import Preprocessing
from hubvit.training import Arguments, loop

NUM_LABELS = 3
PLAIN = dict(
    optimizer="sgd",
    momentum=0.0,
    learning_rate=0.5,
    weight_decay=0.0,
    layer_decay=1.0,
    lr_scheduler_type="constant",
    num_warmup_steps=0,
    max_grad_norm=0.0,
    label_smoothing=0.0,
    augment="none",
    mixup_alpha=0.0,
    cutmix_alpha=0.0,
    per_device_train_batch_size=4,
    max_train_steps=100,
    seed=0,
)
# Parameters of order 1 are stored to about 6e-8 (float32), so the difference of two of them (an update read as
# weights after minus weights before) carries that much error: absolute tolerance 1e-6 on updates.
UPDATE_ATOL = 1e-6


def reset_accelerate():
    """Accelerate keeps its state (the accumulation steps among it) in singletons; each run starts from none."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.fixture(autouse=True)
def fresh_accelerate(monkeypatch):
    # On the CPU wherever the tests run: the tolerances here are those of float32 CPU kernels (a GPU's TF32 is not).
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    reset_accelerate()
    yield
    reset_accelerate()


def tiny_model():
    from hubvit import HubViTForImageClassification

    torch.manual_seed(0)
    model = HubViTForImageClassification(tiny_config(num_labels=NUM_LABELS))
    randomize_(model)
    return model.train()


def images(n, seed=0):
    rng = np.random.default_rng(seed)
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=[f"c{i}" for i in range(NUM_LABELS)])}
    )
    pictures = [Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)) for _ in range(n)]
    return datasets.Dataset.from_dict({"image": pictures, "label": [i % NUM_LABELS for i in range(n)]}, features)


def arguments(tmp_path, **flags):
    return Arguments.build(output_dir=str(tmp_path), **{**PLAIN, **flags})


def prepared_run(tmp_path, **flags):
    """A `loop.Run` of the tiny model with the plain recipe and `flags`, prepared as `fit` prepares it."""
    reset_accelerate()
    args = arguments(tmp_path, **flags)
    return loop.prepare(args, loop.make_accelerator(args), images(8), None, tiny_model(), Preprocessing())


def batch(n, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 32, 32, generator=generator), torch.arange(n) % NUM_LABELS


def weights(run):
    return torch.cat([p.detach().flatten().clone() for p in run.accelerator.unwrap_model(run.model).parameters()])


def steps(run, batches):
    """The update that `batches` (pixels, labels) make through `loop.train_step`, and how often the optimizer stepped."""
    taken = []
    hook = run.optimizer.optimizer.register_step_post_hook(lambda *_: taken.append(1))
    before = weights(run)
    for step, (pixels, labels) in enumerate(batches):
        loop.train_step(run, pixels, labels, step)
    hook.remove()
    return weights(run) - before, len(taken)


# --- label_smoothing ----------------------------------------------------------------------------------------------


def test_label_smoothing_is_the_cross_entropy_the_training_step_minimises(tmp_path):
    eps = 0.2
    run = prepared_run(tmp_path, label_smoothing=eps)
    pixels, labels = batch(8)
    with torch.no_grad():
        logits = run.model(pixel_values=pixels).logits  # the weights the step's forward sees
    loss = loop.train_step(run, pixels, labels, 0).item()
    smoothed = F.cross_entropy(logits, labels, label_smoothing=eps).item()
    plain = F.cross_entropy(logits, labels).item()
    # The same float32 forward twice (with and without autograd): equal to round-off, 1e-6 relative.
    assert loss == pytest.approx(smoothed, rel=1e-6)
    assert abs(smoothed - plain) > 1e-3, "smoothing must change this loss by far more than the tolerance"


def test_label_smoothing_changes_the_update(tmp_path):
    pixels, labels = batch(8)
    plain, _ = steps(prepared_run(tmp_path), [(pixels, labels)])
    smoothed, _ = steps(prepared_run(tmp_path, label_smoothing=0.2), [(pixels, labels)])
    assert (smoothed - plain).abs().max() > 1000 * UPDATE_ATOL


# --- gradient_accumulation_steps ----------------------------------------------------------------------------------


def test_accumulating_k_micro_batches_is_one_update_on_their_union(tmp_path):
    k, b = 4, 3
    pixels, labels = batch(k * b)
    micro = [(pixels[i * b : (i + 1) * b], labels[i * b : (i + 1) * b]) for i in range(k)]
    accumulated, accumulated_steps = steps(
        prepared_run(tmp_path, gradient_accumulation_steps=k, per_device_train_batch_size=b), micro
    )
    whole, whole_steps = steps(prepared_run(tmp_path, per_device_train_batch_size=k * b), [(pixels, labels)])
    assert (accumulated_steps, whole_steps) == (1, 1)
    assert whole.abs().max() > 1000 * UPDATE_ATOL
    # The two gradients sum the same 12 per-image terms grouped differently (4 means of 3, scaled by 1/4, against one
    # mean of 12): float32 round-off, 1e-4 relative, on top of the update's own UPDATE_ATOL.
    torch.testing.assert_close(accumulated, whole, rtol=1e-4, atol=UPDATE_ATOL)


def test_accumulation_steps_the_optimizer_every_k_batches_and_at_the_end_of_the_epoch(tmp_path):
    """`fit` over one epoch of 5 batches steps the optimizer after batches 1, 2, 3, 4, 5 without accumulation, and
    after batches 2, 4 and 5 with 2 (Accelerate steps on the last batch of an epoch even when its accumulation is
    short); the run counts those updates, ceil(5 / 2) = 3."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    forwards, stepped_after = [], []
    hook = register_optimizer_step_post_hook(lambda *_: stepped_after.append(len(forwards)))
    try:
        seen = {}
        for k in (1, 2):
            reset_accelerate()
            args = arguments(tmp_path / str(k), gradient_accumulation_steps=k, max_train_steps=None, num_train_epochs=1)
            model = tiny_model()
            model.register_forward_hook(lambda *_: forwards.append(1))
            forwards.clear()
            stepped_after.clear()
            _, results = loop.fit(args, loop.make_accelerator(args), images(20), None, model, Preprocessing())
            seen[k] = (list(stepped_after), results["global_step"])
    finally:
        hook.remove()
    assert seen == {1: ([1, 2, 3, 4, 5], 5), 2: ([2, 4, 5], 3)}


# --- gradient_checkpointing ---------------------------------------------------------------------------------------


def test_gradient_checkpointing_recomputes_every_block_and_keeps_the_update(tmp_path, monkeypatch):
    pixels, labels = batch(8)
    plain, _ = steps(prepared_run(tmp_path), [(pixels, labels)])
    run = prepared_run(tmp_path, gradient_checkpointing=True)
    blocks = run.accelerator.unwrap_model(run.model).hubvit.encoder.layers
    mlp_class, calls = type(blocks[0].mlp), []
    forward = mlp_class.forward
    # Counted where the MLP's forward starts: in this block (no layer scale, no drop path) torch stops recomputing
    # inside fc2, once it has every tensor the backward needs, so a hook on the MLP's return would miss it.
    monkeypatch.setattr(mlp_class, "forward", lambda module, x: calls.append(module) or forward(module, x))
    checkpointed, _ = steps(run, [(pixels, labels)])
    assert all(block.gradient_checkpointing for block in blocks)
    assert len(calls) == 2 * len(blocks), "each block's MLP runs in the forward pass and again in the backward pass"
    assert plain.abs().max() > 1000 * UPDATE_ATOL
    # The recomputation runs the same float32 kernels on the same inputs: the update matches to UPDATE_ATOL.
    torch.testing.assert_close(checkpointed, plain, rtol=0, atol=UPDATE_ATOL)


def test_gradient_checkpointing_under_fsdp_points_to_fsdps_own(caplog):
    from accelerate.utils import DistributedType

    model = tiny_model()
    with caplog.at_level("WARNING", logger="hubvit.finetune"):
        loop.enable_checkpointing(SimpleNamespace(distributed_type=DistributedType.FSDP), model)
    assert "fsdp_activation_checkpointing: true" in caplog.text
    assert all(block.gradient_checkpointing for block in model.hubvit.encoder.layers)


# --- max_grad_norm ------------------------------------------------------------------------------------------------


def test_max_grad_norm_clips_the_update_to_that_global_norm(tmp_path):
    pixels, labels = batch(8)
    lr, max_norm = PLAIN["learning_rate"], 0.05
    free, _ = steps(prepared_run(tmp_path), [(pixels, labels)])
    clipped, _ = steps(prepared_run(tmp_path, max_grad_norm=max_norm), [(pixels, labels)])
    assert free.norm() / lr > 10 * max_norm, "the gradient must be well over the limit for the test to clip"
    # torch scales the gradient by max_norm / (norm + 1e-6): the clipped norm is max_norm to 1e-6 / norm relative;
    # reading the update back from float32 weights adds UPDATE_ATOL per weight, 1e-4 relative to this norm at most.
    assert (clipped.norm() / lr).item() == pytest.approx(max_norm, rel=1e-4)
    # Clipping rescales the whole gradient: the direction is unchanged.
    torch.testing.assert_close(clipped, free * (clipped.norm() / free.norm()), rtol=0, atol=UPDATE_ATOL)


# --- optimizer, learning_rate, momentum, weight_decay -------------------------------------------------------------


def test_sgd_update_scales_with_the_learning_rate(tmp_path):
    pixels, labels = batch(8)
    slow, _ = steps(prepared_run(tmp_path, learning_rate=0.1), [(pixels, labels)])
    fast, _ = steps(prepared_run(tmp_path, learning_rate=0.4), [(pixels, labels)])
    assert slow.abs().max() > 1000 * UPDATE_ATOL
    torch.testing.assert_close(fast, 4 * slow, rtol=1e-5, atol=4 * UPDATE_ATOL)


def test_adamw_first_update_moves_every_weight_by_the_learning_rate(tmp_path):
    """Adam's first step is lr * g / (|g| + 1e-8): lr in size for every weight whose gradient is not tiny, where SGD's
    update is lr * g and varies with the gradient."""
    pixels, labels = batch(8)
    lr = 0.01
    adamw, _ = steps(prepared_run(tmp_path, optimizer="adamw", learning_rate=lr), [(pixels, labels)])
    sgd, _ = steps(prepared_run(tmp_path, optimizer="sgd", learning_rate=lr), [(pixels, labels)])
    moved = adamw[adamw != 0].abs() / lr
    # 1e-3: float32 reading of updates of size 1e-2 (UPDATE_ATOL / lr = 1e-4) with margin for |g| near 1e-5.
    assert ((moved - 1).abs() < 1e-3).float().mean() > 0.99
    assert ((sgd[sgd != 0].abs() / lr - 1).abs() < 1e-3).float().mean() < 0.5


def test_momentum_adds_that_fraction_of_the_previous_update(tmp_path):
    """torch SGD: buffer = momentum * buffer + g. Two steps on one batch: the first updates agree, and the second
    differs between momentum m and 0 by m times the first update (the gradients agree, taken at the same weights)."""
    pixels, labels = batch(8)
    m = 0.9
    updates = {}
    for momentum in (0.0, m):
        run = prepared_run(tmp_path, momentum=momentum)
        first, _ = steps(run, [(pixels, labels)])
        second, _ = steps(run, [(pixels, labels)])
        updates[momentum] = first, second
    torch.testing.assert_close(updates[m][0], updates[0.0][0], rtol=0, atol=UPDATE_ATOL)
    extra = updates[m][1] - updates[0.0][1]
    assert extra.abs().max() > 1000 * UPDATE_ATOL
    torch.testing.assert_close(extra, m * updates[0.0][0], rtol=1e-4, atol=2 * UPDATE_ATOL)


def test_weight_decay_shrinks_matrices_and_leaves_norms_and_biases(tmp_path):
    """SGD weight decay adds wd * w to the gradient: the update gains -lr * wd * w on decayed weights, nothing on
    the parameters `parameter_groups` exempts (biases, norms, tokens, position tables)."""
    pixels, labels = batch(8)
    lr, wd = PLAIN["learning_rate"], 0.1
    plain_run = prepared_run(tmp_path)
    start = weights(plain_run)
    plain, _ = steps(plain_run, [(pixels, labels)])
    decayed, _ = steps(prepared_run(tmp_path, weight_decay=wd), [(pixels, labels)])
    names = [n for n, p in tiny_model().named_parameters() for _ in range(p.numel())]
    exempt = torch.tensor([n.endswith("bias") or "norm" in n or "position" in n or "token" in n for n in names])
    torch.testing.assert_close(decayed[exempt], plain[exempt], rtol=0, atol=UPDATE_ATOL)
    torch.testing.assert_close(decayed[~exempt] - plain[~exempt], -lr * wd * start[~exempt], rtol=1e-4, atol=2e-6)


def test_layer_decay_scales_each_blocks_update_by_its_depth(tmp_path):
    """BEiT's layer-wise decay (the flag's help): block i (1-based) of L moves at lr * decay ** (L + 1 - i), the
    embeddings at lr * decay ** (L + 1), the final norm and head at lr."""
    pixels, labels = batch(8)
    decay, depth = 0.5, tiny_model().config.num_hidden_layers
    plain, _ = steps(prepared_run(tmp_path), [(pixels, labels)])
    decayed, _ = steps(prepared_run(tmp_path, layer_decay=decay), [(pixels, labels)])

    def power(name):
        if name.startswith("hubvit.embeddings."):
            return depth + 1
        if name.startswith("hubvit.encoder.layers."):
            return depth - int(name.split(".")[3])  # 0-based index j is block j + 1
        return 0

    scale = torch.cat([torch.full((p.numel(),), decay ** power(n)) for n, p in tiny_model().named_parameters()])
    assert scale.min() == decay ** (depth + 1) and (plain * (1 - scale)).abs().max() > 1000 * UPDATE_ATOL
    torch.testing.assert_close(decayed, scale * plain, rtol=1e-5, atol=UPDATE_ATOL)


# --- lr_scheduler_type, num_warmup_steps, warmup_ratio ------------------------------------------------------------


def learning_rates(tmp_path, n, **flags):
    """The learning rate of each of `n` consecutive updates."""
    run = prepared_run(tmp_path, **flags)
    pixels, labels = batch(4)
    rates = []
    for step in range(n):
        rates.append(run.optimizer.param_groups[0]["lr"])
        loop.train_step(run, pixels, labels, step)
    return rates


def test_linear_schedule_warms_up_then_decays_to_zero_at_the_last_update(tmp_path):
    """transformers' linear schedule: lr * s / w for the w warmup updates, then lr * (n - s) / (n - w)."""
    lr, n, w = 0.5, 6, 2
    rates = learning_rates(tmp_path, n, lr_scheduler_type="linear", num_warmup_steps=w, max_train_steps=n)
    expected = [lr * s / w if s < w else lr * (n - s) / (n - w) for s in range(n)]
    assert rates == pytest.approx(expected, abs=1e-12)


def test_cosine_schedule_follows_half_a_cosine_after_warmup(tmp_path):
    lr, n, w = 0.5, 6, 1
    rates = learning_rates(tmp_path, n, lr_scheduler_type="cosine", num_warmup_steps=w, max_train_steps=n)
    expected = [lr * s / w if s < w else lr * 0.5 * (1 + np.cos(np.pi * (s - w) / (n - w))) for s in range(n)]
    assert rates == pytest.approx(expected, abs=1e-12)


def test_warmup_ratio_is_that_fraction_of_the_updates_when_no_step_count_is_given(tmp_path):
    n = 8
    by_ratio = learning_rates(
        tmp_path, n, lr_scheduler_type="linear", num_warmup_steps=None, warmup_ratio=0.25, max_train_steps=n
    )
    by_count = learning_rates(tmp_path, n, lr_scheduler_type="linear", num_warmup_steps=2, max_train_steps=n)
    assert by_ratio == by_count and by_ratio[:3] == pytest.approx([0.0, 0.25, 0.5])


# --- num_train_epochs, max_train_steps ----------------------------------------------------------------------------


@pytest.mark.parametrize("epochs, max_steps, updates", [(2, None, 10), (3, 7, 7)], ids=["epochs", "max_train_steps"])
def test_the_run_makes_the_updates_its_length_flags_ask_for(tmp_path, epochs, max_steps, updates):
    """Five batches an epoch: two epochs are ten updates; --max_train_steps 7 stops a three-epoch run at seven."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    taken = []
    hook = register_optimizer_step_post_hook(lambda *_: taken.append(1))
    try:
        args = arguments(tmp_path, num_train_epochs=epochs, max_train_steps=max_steps)
        _, results = loop.fit(args, loop.make_accelerator(args), images(20), None, tiny_model(), Preprocessing())
    finally:
        hook.remove()
    assert (len(taken), results["global_step"]) == (updates, updates)


# --- mixup_alpha, cutmix_alpha ------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["mixup_alpha", "cutmix_alpha"])
def test_the_step_trains_on_what_the_mixer_makes_of_the_batch(tmp_path, flag):
    """The step's loss is the cross entropy of the mixed images against the mixed (soft) labels; what MixUp and
    CutMix make of a batch is tested in test_recipe.py."""
    run = prepared_run(tmp_path, **{flag: 1.0})
    mixer, made = run.task.mixer, []

    def recorded(pixels, labels):
        made.append(mixer(pixels, labels))
        return made[-1]

    run.task.mixer = recorded
    pixels, labels = batch(8)
    before = copy.deepcopy(run.accelerator.unwrap_model(run.model))  # the weights the step's forward sees
    loss = loop.train_step(run, pixels, labels, 0).item()
    ((mixed_pixels, soft_labels),) = made
    with torch.no_grad():
        expected = F.cross_entropy(before(pixel_values=mixed_pixels).logits, soft_labels).item()
        unmixed = F.cross_entropy(before(pixel_values=pixels).logits, labels).item()
    assert soft_labels.shape == (8, NUM_LABELS) and not torch.equal(mixed_pixels, pixels)
    # The same float32 forward twice (with and without autograd): 1e-6 relative.
    assert loss == pytest.approx(expected, rel=1e-6)
    assert abs(loss - unmixed) > 1e-3


# --- mixed_precision ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("no", torch.float32)])
def test_mixed_precision_sets_the_dtype_of_the_training_forward(tmp_path, precision, dtype):
    run = prepared_run(tmp_path, mixed_precision=precision)
    seen = []
    model = run.accelerator.unwrap_model(run.model)
    model.hubvit.encoder.layers[0].mlp.register_forward_hook(lambda module, inputs, out: seen.append(out.dtype))
    loss = loop.train_step(run, *batch(4), 0)
    assert seen == [dtype] and loss.dtype == torch.float32  # the loss is taken on float32 logits
