"""transformers' own common test modules, for the installed transformers version, fetched from the package registry.

The source distribution of a transformers release carries `tests/test_modeling_common.py`,
`tests/test_configuration_common.py`, `tests/test_pipeline_mixin.py` and the other top-level test modules, but not
the subfolders they import from (`tests/exporters`, `tests/generation`, `tests/utils`, `tests/pipelines`) nor the
per-model tests. Nothing of it is copied into this repository: `import_common_tests()` downloads the sdist of exactly
`transformers.__version__` through pip's index (checked against the index's sha256), unpacks the top-level test
modules into a cache (`~/.cache/hubvit-tests`, or `HUBVIT_TESTS_CACHE`), and imports them as the package
`transformers_tests`. `HUBVIT_TRANSFORMERS_SDIST=/path/to/transformers-X.tar.gz` uses a local copy instead.

The three names the modules import from the missing subfolders are supplied here, and what that costs is stated:
- `exporters.test_export.ExportTesterMixin` (a base of ModelTesterMixin holding its export tests, which need
  transformers' exporter test harness): an empty class, so those export tests do not run here; hubvit's own
  export tests cover torch.export, ONNX and tracing.
- `generation.test_utils.GenerationTesterMixin` (only checked with `issubclass`): an empty class, which a ViT tester
  must not inherit, as a model that cannot `generate` must not.
- `utils.test_configuration_utils.config_common_kwargs` (ConfigTester's non-default values for every attribute a
  bare `PretrainedConfig` sets): built below from the installed `PretrainedConfig`, so it follows the version (no
  sdist carries `tests/utils/`: seen for 4.46.3 and 5.25.0).

If the registry cannot be reached and nothing is cached, the import fails with the reason: the common tests are part
of the suite, and a skip would report a green run that never ran them.
"""

import hashlib
import importlib
import io
import json
import os
import shutil
import sys
import tarfile
import types
import urllib.request
from pathlib import Path

import transformers

PACKAGE = "transformers_tests"
MODULES = ("test_modeling_common", "test_configuration_common")
DEFAULT_INDEX = "https://pypi.org/simple"


class TransformersSourcesError(RuntimeError):
    pass


def cache_root():
    return Path(os.environ.get("HUBVIT_TESTS_CACHE") or Path.home() / ".cache" / "hubvit-tests")


def index_url():
    """pip's own index: PIP_INDEX_URL, else `pip config`'s global.index-url, else PyPI (pip's default)."""
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"].rstrip("/")
    try:
        from pip._internal.configuration import Configuration

        configuration = Configuration(isolated=False)
        configuration.load()
        return configuration.get_value("global.index-url").rstrip("/")
    except Exception:
        return DEFAULT_INDEX


def sdist_link(version):
    """(url, sha256) of `transformers-VERSION.tar.gz` from the index's JSON simple API (PEP 691)."""
    url = f"{index_url()}/transformers/"
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    for entry in files:
        if entry["filename"] == f"transformers-{version}.tar.gz":
            return entry["url"], entry["hashes"]["sha256"]
    raise TransformersSourcesError(f"{url} lists no source distribution transformers-{version}.tar.gz")


def download_sdist(version):
    url, sha256 = sdist_link(version)
    with urllib.request.urlopen(url, timeout=300) as response:
        data = response.read()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise TransformersSourcesError(f"{url}: sha256 differs from the one the index lists ({sha256})")
    return data


def extract_tests(data, version, target):
    """The top-level `tests/*.py` of the sdist into target/transformers_tests (written whole, then renamed)."""
    staging = target.with_name(target.name + f".partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    package = staging / PACKAGE
    package.mkdir(parents=True, exist_ok=True)
    prefix = f"transformers-{version}/tests/"
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        for member in archive.getmembers():
            relative = member.name[len(prefix) :] if member.name.startswith(prefix) else ""
            if member.isfile() and relative.endswith(".py") and "/" not in relative:
                (package / relative).write_bytes(archive.extractfile(member).read())
    for name in MODULES:
        if not (package / f"{name}.py").is_file():
            raise TransformersSourcesError(f"the transformers {version} sdist has no tests/{name}.py")
    (package / "__init__.py").touch()
    try:
        staging.rename(target)
    except OSError:  # another process finished first
        if not (target / PACKAGE / "__init__.py").is_file():
            raise
        shutil.rmtree(staging, ignore_errors=True)


def ensure_sources(version=None):
    """Folder holding the `transformers_tests` package for `version` (the installed one by default)."""
    version = version or transformers.__version__
    target = cache_root() / f"{PACKAGE}-{version}"
    if (target / PACKAGE / "__init__.py").is_file():
        return target
    local = os.environ.get("HUBVIT_TRANSFORMERS_SDIST")
    try:
        data = Path(local).read_bytes() if local else download_sdist(version)
    except (OSError, ValueError, KeyError) as error:
        raise TransformersSourcesError(
            f"cannot fetch the transformers {version} source distribution from {index_url()} ({error}); "
            f"transformers' common tests need it: allow access to the package index, or set "
            f"HUBVIT_TRANSFORMERS_SDIST to a local transformers-{version}.tar.gz"
        ) from error
    target.parent.mkdir(parents=True, exist_ok=True)
    extract_tests(data, version, target)
    return target


def common_config_kwargs():
    """A non-default value for every attribute a bare PretrainedConfig sets, for ConfigTester's
    `check_config_arguments_init` (which builds the config with them and reads each back): the rule of the release's
    own `test_config_common_kwargs_is_complete` (the list itself is in `tests/utils/`, which no sdist carries). An
    attribute of no known kind stops the suite, naming it."""
    from transformers import PretrainedConfig

    base = PretrainedConfig()
    special = {
        "dtype": "float16",  # the check compares with torch.float16
        "id2label": {0: "only"},
        "label2id": {"only": 0},
        "architectures": ["HubViTForImageClassification"],
        "problem_type": "regression",
        "tie_word_embeddings": not getattr(base, "tie_word_embeddings", True),
        # the attributes 4.x sets to None (generation and tokenizer settings), each given a value of its kind
        "torch_dtype": "float16",
        "cross_attention_hidden_size": 128,
        "bad_words_ids": [1, 2, 3],
        "suppress_tokens": [0, 1],
        "begin_suppress_tokens": 2,
        "exponential_decay_length_penalty": (5, 1.01),
        "finetuning_task": "translation",
        "tokenizer_class": "BertTokenizerFast",
        "prefix": "prefix",
        "task_specific_params": {"translation": "some_params"},
    }
    token_ids = ("forced_bos", "forced_eos", "bos", "pad", "eos", "sep", "decoder_start")
    special.update({f"{name}_token_id": index + 2 for index, name in enumerate(token_ids)})
    skipped = {
        "_name_or_path",
        "_commit_hash",
        "_attn_implementation_internal",
        "_experts_implementation_internal",
        "transformers_version",
    }
    kwargs = {}
    for key, value in vars(base).items():
        if key == "_output_attentions":  # stored behind the `output_attentions` property
            kwargs["output_attentions"] = not value
            continue
        if key in skipped or key.startswith("_"):
            continue
        if key in special:
            kwargs[key] = special[key]
        elif isinstance(value, bool):
            kwargs[key] = not value
        elif isinstance(value, int):
            kwargs[key] = value + 3
        elif isinstance(value, float):
            kwargs[key] = value + 0.5
        elif value is None or isinstance(value, str):
            raise TransformersSourcesError(
                f"PretrainedConfig of transformers {transformers.__version__} sets {key}={value!r}: give it a "
                "non-default value in common_config_kwargs, as the release's own completeness test asks"
            )
        elif isinstance(value, dict):
            kwargs[key] = {"some_task": "some_params"} if not value else {}
    return kwargs


def install_missing_modules():
    def module(name, **attributes):
        created = types.ModuleType(f"{PACKAGE}.{name}")
        created.__dict__.update(attributes)
        sys.modules[created.__name__] = created
        return created

    for folder in ("exporters", "generation", "utils"):
        module(folder, __path__=[])
    module("exporters.test_export", ExportTesterMixin=type("ExportTesterMixin", (), {}))
    module("generation.test_utils", GenerationTesterMixin=type("GenerationTesterMixin", (), {}))
    module("utils.test_configuration_utils", config_common_kwargs=common_config_kwargs())


def import_common_tests(modules=MODULES):
    """The common test `modules` of the installed transformers: (test_modeling_common, test_configuration_common)."""
    root = str(ensure_sources())
    if root not in sys.path:
        sys.path.insert(0, root)
    install_missing_modules()
    return tuple(importlib.import_module(f"{PACKAGE}.{name}") for name in modules)


def run_config_tester(config_class):
    """transformers' own `ConfigTester(...).run_common_tests()` of the installed release on `config_class`, as
    tests/test_transformers_common.py runs it, then each check it calls alone (so one failing check does not hide the
    others): {"run_common_tests": traceback or None, "checks": {check: last line of its error or None},
    "common_kwargs": the names `check_config_arguments_init` passes}."""
    import inspect
    import re
    import unittest

    (configuration_common,) = import_common_tests(("test_configuration_common",))
    ConfigTester = configuration_common.ConfigTester
    checks = re.findall(r"self\.(\w+)\(", inspect.getsource(ConfigTester.run_common_tests))

    def outcome(call):
        class ConfigTest(unittest.TestCase):
            def test_config(self):
                tester = ConfigTester(
                    self, config_class=config_class, has_text_modality=False, hidden_size=36, num_attention_heads=6
                )
                call(tester)

        runner = unittest.TextTestRunner(stream=io.StringIO())
        result = runner.run(unittest.defaultTestLoader.loadTestsFromTestCase(ConfigTest))
        errors = [text for _, text in result.errors + result.failures]
        return errors[0] if errors else None

    def last_line(error):
        return error.strip().splitlines()[-1] if error else None

    return {
        "run_common_tests": outcome(lambda tester: tester.run_common_tests()),
        "checks": {name: last_line(outcome(lambda tester, name=name: getattr(tester, name)())) for name in checks},
        "common_kwargs": sorted(configuration_common.config_common_kwargs),
    }
