"""Every `hubvit` command is a Python function: keyword options, a result record, `HubViTError` for bad input.

Tolerance: 1e-5 relative to the output scale for float32 parity with timm (the same operations in both libraries).
"""

import dataclasses
import importlib
import inspect
import json
import logging
import subprocess
import sys

import pytest
import torch

import hubvit
from hubvit.cli import build_parser, main
from hubvit.commands import CONVERTERS, TABLE, TRAINERS
from hubvit.conversion.publish import keyword_arguments

TINY_TIMM = dict(depth=2, embed_dim=48, num_heads=4, img_size=32, patch_size=8, num_classes=5)

# function -> the arguments it takes by position; every other argument is keyword-only
POSITIONAL = {
    "convert_timm": ("src", "out"),
    "convert_jax": ("src", "out"),
    "convert_transformers": ("src", "out"),
    "convert_torchvision": ("src", "out"),
    "convert_pytorch": ("src", "out"),
    "export_onnx": ("src", "out"),
    "export_timm": ("src", "out"),
    "export_transformers": ("src", "out"),
    "push": ("folder", "repo_id"),
    "publish": ("manifest",),
    "info": ("src",),
    "analyze_attention_distance": ("src",),
    "analyze_position_similarity": ("src",),
    "analyze_attention_map": ("src", "image"),
}


def relative_error(ours, reference):
    return ((ours - reference).abs().max() / reference.abs().max()).item()


@pytest.fixture
def timm_folder(tmp_path):
    timm = pytest.importorskip("timm")
    from timm.models import save_for_hf

    torch.manual_seed(0)
    model = timm.create_model("vit_base_patch16_224.augreg_in1k", pretrained=False, **TINY_TIMM).eval()
    with torch.no_grad():
        for parameter in model.parameters():  # timm starts biases at 0 and norms at 1, which would hide a swap
            parameter.add_(0.1 * torch.randn_like(parameter))
    save_for_hf(model, tmp_path / "timm")
    return tmp_path / "timm", model


def test_the_command_table_lists_every_command_once():
    assert sorted(command.function for command in TABLE) == sorted(POSITIONAL)


@pytest.mark.parametrize("name", list(POSITIONAL))
def test_each_command_is_a_function_with_keyword_only_options(name):
    function = getattr(hubvit, name)
    parameters = inspect.signature(function).parameters.values()
    positional = tuple(p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD)
    assert positional == POSITIONAL[name]
    assert all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in parameters)
    assert dataclasses.is_dataclass(inspect.signature(function).return_annotation)


def test_every_flag_of_the_command_line_is_a_keyword_argument_of_its_function():
    """The CLI builds the command's options from its parsed flags by name, so a flag without a parameter would
    break it; only where the result goes (--push-to-hub, --json) belongs to the command line alone."""

    def subcommands(parser):
        for action in parser._actions:
            if isinstance(action, type(parser._subparsers._group_actions[0])):
                for sub in action.choices.values():
                    yield from subcommands(sub) if sub._subparsers else [sub]

    checked = 0
    for sub in subcommands(build_parser()):
        entry = sub.get_default("entry")
        if entry is None:  # a subcommand with a parser of its own
            continue
        names = set(inspect.signature(getattr(hubvit, entry.function)).parameters)
        flags = {action.dest for action in sub._actions if action.dest != "help"} - {"push_to_hub", "json"}
        assert flags == names, (sub.prog, sorted(flags ^ names))
        checked += 1
    assert checked == len(POSITIONAL)


def test_convert_timm_converts_a_folder_and_returns_the_record(timm_folder, tmp_path):
    folder, source = timm_folder
    result = hubvit.convert_timm(folder, tmp_path / "out")

    assert isinstance(result, hubvit.ConversionResult) and result.folder == tmp_path / "out"
    assert "max |Δlogits|" in result.verification
    model = hubvit.HubViTForImageClassification.from_pretrained(result.folder).eval()
    pixels = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = source(pixels)
        assert relative_error(model(pixel_values=pixels).logits, expected) <= 1e-5
    assert 0 <= result.max_abs_diff < 1e-4  # logits of order 1; the check refuses more than 1e-5 of their scale
    card = (result.folder / "README.md").read_text()
    assert f"{result.max_abs_diff:.2e}" in card


def test_a_missing_source_raises_a_value_error_naming_it(tmp_path):
    missing = tmp_path / "no-such-checkpoint"
    with pytest.raises(hubvit.HubViTError, match="no-such-checkpoint") as error:
        hubvit.convert_timm(missing, tmp_path / "out")
    assert isinstance(error.value, ValueError) and str(missing) in str(error.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda src, out: hubvit.convert_timm(src, out, tolerance=0), "tolerance=0; expected a positive"),
        (lambda src, out: hubvit.convert_jax(src, out, gelu="fast"), "gelu='fast'; expected one of tanh, erf"),
        (lambda src, out: hubvit.convert_jax(src, out, num_labels="ten"), "num_labels='ten'; expected an integer"),
        (lambda src, out: hubvit.convert_torchvision(src, out), "give exactly one"),
        (lambda src, out: hubvit.convert_pytorch(src, out, num_heads=4, activation="tanh"), "activation='tanh'"),
        (lambda src, out: hubvit.convert_transformers(src, out, verify="yes"), "verify='yes'; expected True or False"),
        (lambda src, out: hubvit.export_onnx(src, out, tolerance=float("nan")), "tolerance=nan"),
        (lambda src, out: hubvit.info("b/16", image_size="big"), "image size 'big'"),
        (lambda src, out: hubvit.analyze_attention_map("b/16", src, method="gradcam"), "method='gradcam'"),
        (lambda src, out: hubvit.convert_timm("", out), "src=''; expected a path"),
        (lambda src, out: hubvit.info(None), "src=None; expected a path"),
        (lambda src, out: hubvit.push(src, "me/x", endpoint="not a url"), "endpoint='not a url'; expected an http"),
        (lambda src, out: hubvit.push(src, None), "repo_id=None; expected a string"),
        (
            lambda src, out: hubvit.convert_timm(src, out, model_args=[1, 2]),
            "expected a dict of timm kwargs or its JSON",
        ),
        (lambda src, out: hubvit.convert_timm(src, out, patch_size="²"), "patch_size='²'; expected a positive int"),
        (lambda src, out: hubvit.convert_timm(src, out + "/" + "n" * 300), "is longer than 255 bytes"),
        (
            lambda src, out: hubvit.train(output_dir=out, recipe="deit", per_device_train_batch_size="32"),
            "--per_device_train_batch_size '32': expected int, got str",
        ),
        (
            lambda src, out: hubvit.train(output_dir=out, torch_compile="no_such_backend"),
            "--torch_compile 'no_such_backend': expected a torch.compile backend, one of eager",
        ),
    ],
)
def test_bad_keyword_values_raise_hubvit_errors_naming_them(tmp_path, call, message):
    with pytest.raises(hubvit.HubViTError, match=message.replace("(", r"\(").replace("|", r"\|")):
        call(str(tmp_path / "src"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_recipe_refuses_a_world_size_that_is_not_a_count(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(hubvit.HubViTError, match="WORLD_SIZE='two': expected a whole number of processes"):
        hubvit.train(output_dir=str(tmp_path / "out"), recipe="deit")
    assert not (tmp_path / "out").exists()


def test_an_existing_output_is_refused_as_a_hubvit_error(timm_folder, tmp_path):
    folder, _ = timm_folder
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(hubvit.OutputExistsError, match="overwrite=True") as error:
        hubvit.convert_timm(folder, tmp_path / "out")
    assert isinstance(error.value, hubvit.HubViTError) and isinstance(error.value, FileExistsError)
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_export_transformers_reads_the_folder_with_from_pretrained(tmp_path):
    """A folder saved in bfloat16 with sharded weights: what `from_pretrained` reads is what is exported."""
    from transformers import ViTForImageClassification

    from utils import randomize_, tiny_config

    model = randomize_(hubvit.HubViTForImageClassification(tiny_config(num_labels=3))).eval()
    model.to(torch.bfloat16).save_pretrained(tmp_path / "hubvit", max_shard_size="20KB")
    assert (tmp_path / "hubvit" / "model.safetensors.index.json").is_file()

    result = hubvit.export_transformers(tmp_path / "hubvit", tmp_path / "vit")
    assert isinstance(result, hubvit.ExportResult) and result.path == tmp_path / "vit"
    vit = ViTForImageClassification.from_pretrained(tmp_path / "vit").eval()
    loaded = hubvit.HubViTForImageClassification.from_pretrained(tmp_path / "hubvit", dtype=torch.float32).eval()
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert relative_error(vit(pixel_values=pixels).logits, loaded(pixel_values=pixels).logits) <= 1e-5


def test_manifest_flags_become_the_converters_keyword_arguments():
    timm, jax = CONVERTERS["timm"], CONVERTERS["jax"]
    words = ["--tolerance", "1e-4", "--no-verify", '--model-args={"img_size": 48}', "--revision", "v1"]
    assert keyword_arguments(words, timm, "entry") == {
        "tolerance": 1e-4,
        "verify": False,
        "model_args": '{"img_size": 48}',
        "revision": "v1",
    }
    assert keyword_arguments(["--num-labels", "10", "--drop-pre-logits"], jax, "entry") == {
        "num_labels": 10,
        "drop_pre_logits": True,
    }
    with pytest.raises(hubvit.HubViTError, match="'--archtecture' is not an option of convert_timm; expected"):
        keyword_arguments(["--archtecture", "vit"], timm, "entry")
    with pytest.raises(hubvit.HubViTError, match="--num-labels 'ten'; expected int"):
        keyword_arguments(["--num-labels", "ten"], jax, "entry")


def test_importing_hubvit_and_its_functions_stays_light():
    """`import hubvit` and touching every function imports none of timm, ONNX, JAX, datasets, nor the CLI."""
    code = (
        "import sys, json, hubvit\n"
        "functions = [getattr(hubvit, name) for name in " + json.dumps(list(POSITIONAL)) + "]\n"
        "heavy = ('timm', 'onnx', 'onnxruntime', 'jax', 'flax', 'datasets', 'scripts', 'hubvit.cli')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(heavy))))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def logging_state():
    """What a library must not change: the root logger's level and handlers, and hubvit's own."""
    root, ours = logging.getLogger(), logging.getLogger("hubvit")
    return root.level, list(root.handlers), ours.level, list(ours.handlers)


def test_a_conversion_prints_nothing_and_leaves_logging_as_it_was(timm_folder, tmp_path, capfd):
    """Only the command line prints; the record carries what the conversion has to say."""
    before = logging_state()
    result = hubvit.convert_timm(timm_folder[0], tmp_path / "out")
    assert capfd.readouterr().out == ""
    assert logging_state() == before
    assert any(line.startswith("verify: ") for line in result.lines)


def test_training_prints_nothing_and_leaves_logging_as_it_was(tmp_path, capfd):
    """`hubvit.train` from Python: the metrics come back in the record; the root logger is the caller's."""
    before = logging_state()
    result = hubvit.train(
        output_dir=str(tmp_path / "out"),
        image_size=16,
        config_overrides="patch_size=4,hidden_size=32,num_hidden_layers=2,intermediate_size=64",
        max_train_samples=32,
        max_eval_samples=16,
        per_device_train_batch_size=8,
        num_train_epochs=1,
        dataloader_num_workers=0,
    )
    assert capfd.readouterr().out == ""
    assert logging_state() == before
    assert 0 <= result.metrics["eval_accuracy"] <= 1


def test_info_takes_patch_sizes_as_text_or_a_list():
    as_text, as_list = hubvit.info("b/16", patch_sizes="16,8"), hubvit.info("b/16", patch_sizes=[16, 8])
    assert [row["patch_size"] for row in as_text.patch_sizes] == [16, 8]
    assert as_text == as_list


def test_a_mistyped_flag_gets_the_subcommands_usage_and_a_suggestion(capsys):
    with pytest.raises(SystemExit) as error:
        main(["info", "b/16", "--batch", "2"])
    err = capsys.readouterr().err
    assert error.value.code == 2 and err.startswith("usage: hubvit info ")
    assert "unrecognized arguments: --batch 2; did you mean --batch_size or --batch-size?" in err


@pytest.mark.parametrize("spelling", ["--output_dir", "--output-dir"])
def test_every_option_takes_both_spellings(tmp_path, spelling):
    assert main(["analyze", "position-similarity", "s/16", "--image-size", "32", spelling, str(tmp_path)]) == 0
    assert (tmp_path / "position_similarity.png").is_file()


@pytest.mark.parametrize("trainer", TRAINERS, ids=lambda trainer: trainer.name)
def test_each_trainer_is_a_command_and_its_librarys_function(trainer, tmp_path, capsys):
    """`hubvit train` and `hubvit train-segmentation` parse their script's flags and refuse a bad value in one line
    with status 2; `hubvit.train` / `hubvit.train_segmentation` are the library functions themselves."""
    assert getattr(hubvit, trainer.run) is getattr(importlib.import_module(trainer.module), trainer.run)
    argv = [trainer.name, "--output_dir", str(tmp_path / "out"), "--per_device_train_batch_size", "0"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"hubvit {trainer.name}: error: --per_device_train_batch_size") and len(err) == 1
    assert not (tmp_path / "out").exists()
