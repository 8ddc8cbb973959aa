"""Other transformers releases side by side with the installed one, for the compatibility test.

`ensure_release("4.57.6")` installs that release, with the huggingface_hub and tokenizers it needs, into its own
folder under the tests' cache (`~/.cache/hubvit-tests`, or `HUBVIT_TESTS_CACHE`; the same cache as
`transformers_sources.py`) with `pip install --target --no-deps`, written whole under a temporary name and then
renamed, so a run that is killed leaves nothing half-installed. Every other dependency (torch, numpy, safetensors,
requests, ...) comes from the running environment: the folder goes first on a child interpreter's `sys.path`, and
torch is the one the suite itself runs.

The pins are the newest huggingface_hub and tokenizers each release's own metadata admits (read from its wheel):
4.46 wants `huggingface-hub<1.0` and `tokenizers<0.21`, 4.57 `tokenizers<=0.23`, 5.0 to 5.10 `huggingface-hub>=1.3,<2`,
whose HTTP client (httpx) the environment's huggingface_hub 2 does not use, and 5.24 `huggingface-hub<3` and
`tokenizers<0.24`.

If the registry cannot be reached and nothing is cached, the install fails with pip's reason: the compatibility
test is part of the suite, and a skip would report a green run that never ran.
"""

import os
import shutil
import subprocess
import sys

from transformers_sources import cache_root

HTTPX = ("httpx==0.28.1", "httpcore==1.0.9")  # huggingface_hub 1.x's client; 2.x (the environment's) uses httpx2
RELEASES = {
    "4.46.3": ("huggingface_hub==0.36.2", "tokenizers==0.20.3"),
    "4.57.6": ("huggingface_hub==0.36.2", "tokenizers==0.22.2"),
    "5.0.0": ("huggingface_hub==1.33.0", "tokenizers==0.22.2", *HTTPX),
    "5.10.4": ("huggingface_hub==1.33.0", "tokenizers==0.22.2", *HTTPX),
    "5.24.0": ("huggingface_hub==2.4.0", "tokenizers==0.23.3"),  # the oldest release setup.py accepts
}


# optimum's ONNX exporter pins transformers < 4.58: `optimum-cli export onnx` runs from this folder
OPTIMUM = ("optimum==2.1.0", "optimum-onnx==0.1.0", "transformers==4.57.6", *RELEASES["4.57.6"])


class ReleaseInstallError(RuntimeError):
    pass


def ensure_release(version):
    """Folder holding transformers==`version` and its hub/tokenizers pins, installed once and then reused."""
    if version not in RELEASES:
        raise ReleaseInstallError(
            f"no huggingface_hub/tokenizers pins for transformers {version}; add them to RELEASES"
        )
    return ensure_folder(f"transformers-{version}", (f"transformers=={version}", *RELEASES[version]))


def ensure_optimum():
    return ensure_folder("optimum-onnx-0.1.0", OPTIMUM)


def ensure_folder(name, requirements):
    target = cache_root() / name
    if (target / "transformers" / "__init__.py").is_file():
        return target
    staging = target.with_name(target.name + f".partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-compile",
        "--target",
        str(staging),
        *requirements,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise ReleaseInstallError(f"cannot install {' '.join(requirements)} into {target}:\n{result.stderr[-2000:]}")
    shutil.rmtree(staging / "bin", ignore_errors=True)
    try:
        staging.rename(target)
    except OSError:  # another process finished first
        if not (target / "transformers" / "__init__.py").is_file():
            raise
        shutil.rmtree(staging, ignore_errors=True)
    return target
