"""Publishing hubvit folders to the Hugging Face Hub: `hubvit push LOCAL_DIR REPO_ID`.

Nothing is uploaded until the folder has proven it works the way users will load it: the required files are
there, and a fresh Python in which `hubvit` cannot be imported loads it with `trust_remote_code=True` (so the
modeling files in the folder, not the installed package, do the work), fills every weight and runs a forward pass
through the folder's own image processor. That check runs the folder's own `modeling_hubvit.py`: a folder written by
someone else is code, so `--no-load-check` skips it. Token and endpoint come from huggingface_hub's usual places
(`HF_TOKEN` or `hf auth login`; `HF_ENDPOINT`). Every request waits at most `--timeout` seconds for the network.
"""

import json
import logging
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .card import REPO_PLACEHOLDER, set_repo_id
from .errors import HubViTError
from .network import bounded
from .options import argument, flag, nonempty_path, option, positive, settle, text
from .folder import REQUIRED_FILES

logger = logging.getLogger(__name__)

WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "pytorch_model*.bin.index.json")

LOAD_CHECK = r"""
import json, sys
sys.modules["hubvit"] = None
folder = sys.argv[1]
import numpy as np
import torch
from transformers import AutoConfig, AutoImageProcessor, AutoModel, AutoModelForImageClassification

config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
auto = AutoModelForImageClassification if config.num_labels else AutoModel
model, info = auto.from_pretrained(folder, trust_remote_code=True, output_loading_info=True)
problems = {key: sorted(map(str, value)) for key, value in info.items() if value}
if problems:
    sys.exit(f"the weights do not fit the model: {problems}")
model.eval()
height, width = config.image_size_2d
image = np.random.default_rng(0).integers(0, 256, (height + 5, width + 3, 3), dtype=np.uint8)
try:
    processor = AutoImageProcessor.from_pretrained(folder)
except OSError:
    processor = None
if processor is None:
    pixel_values = torch.randn(1, config.num_channels, height, width)
else:
    pixel_values = processor(images=image, return_tensors="pt")["pixel_values"]
with torch.no_grad():
    outputs = model(pixel_values=pixel_values)
name = "logits" if config.num_labels else "pooler_output"
output = getattr(outputs, name)
if output is None:
    name, output = "last_hidden_state", outputs.last_hidden_state
if not torch.isfinite(output).all():
    sys.exit(f"the forward pass gave non-finite {name}")
print(json.dumps({"class": type(model).__name__, "module": type(model).__module__, "output": name,
                  "shape": list(output.shape), "processor": type(processor).__name__ if processor else None}))
"""


DEFAULT_TIMEOUT = 60.0


class PushError(HubViTError):
    """A folder or a Hub request that cannot be published; nothing was uploaded."""


def bound_network_timeouts(seconds):
    """Make every request of huggingface_hub's shared HTTP client give up after `seconds` without progress.

    The client has no timeout by default, so an endpoint that accepts the connection and never answers would hang a
    push forever. The bound applies to connecting and to each read and write (not to a whole transfer);
    huggingface_hub retries a timed-out upload request a few times before giving up. Xet transfers (hf_xet) keep their
    own timeouts.
    """
    from huggingface_hub.utils import get_session

    get_session().timeout = seconds


def network_error(error, endpoint):
    """A one-line PushError for a connection failure or timeout of huggingface_hub's HTTP client, else None."""
    from huggingface_hub.utils import httpx

    if isinstance(error, httpx.TimeoutException):
        return PushError(
            f"the Hub at {endpoint} did not answer in time ({type(error).__name__}: {error}); "
            "check the endpoint or raise --timeout"
        )
    if isinstance(error, httpx.TransportError):
        return PushError(f"cannot reach the Hub at {endpoint} ({type(error).__name__}: {error})")
    return None


@dataclass(frozen=True)
class PushResult:
    """Where a push went: the folder, the repo, and the commit (or pull request) it made."""

    folder: Path
    repo_id: str
    commit: str
    url: str


@dataclass(frozen=True)
class Options:
    """Publish the hubvit folder to the Hub repo `repo_id` as one commit (or pull request with `create_pr`), after
    checking that it loads with `trust_remote_code=True` where hubvit is not installed (`load_check=False` skips
    running the folder's code: use it for a folder you did not write). Each request gives up after `timeout` s."""

    folder: str = argument("LOCAL_DIR", "a hubvit folder (written by `hubvit convert` ...)")
    repo_id: str = argument("REPO_ID", "the Hub repo, `namespace/name` (or `name` for yours)")
    private: bool = option(False, "create the repo private (refused if it is public)")
    revision: str | None = option(None, "push to this branch, created from main if new", metavar="BRANCH")
    create_pr: bool = option(False, "open a pull request instead of committing")
    commit_message: str | None = option(None, "the commit (or pull request) title", metavar="MSG")
    timeout: float = option(
        DEFAULT_TIMEOUT,
        f"give up on a Hub request that makes no progress for this long (default: {DEFAULT_TIMEOUT:g} s; applies to "
        "connecting and to each read or write; huggingface_hub retries a timed-out upload a few times)",
        metavar="SECONDS",
    )
    load_check: bool = option(
        True,
        "load the folder with trust_remote_code=True in a child Python before uploading, which RUNS the folder's "
        "own modeling_hubvit.py: turn it off (--no-load-check) for a folder you did not write yourself",
    )
    token: str | None = option(None, "a Hugging Face token (default: HF_TOKEN or the one `hf auth login` saved)")
    endpoint: str | None = option(None, "the Hub's address (default: HF_ENDPOINT or huggingface.co)", metavar="URL")

    def __post_init__(self):
        settle(
            self,
            folder=nonempty_path(self.folder, "folder"),
            repo_id=text(self.repo_id, "repo_id", optional=False),
            private=flag(self.private, "private"),
            revision=text(self.revision, "revision"),
            create_pr=flag(self.create_pr, "create_pr"),
            commit_message=text(self.commit_message, "commit_message"),
            timeout=positive(self.timeout, "timeout"),
            load_check=flag(self.load_check, "load_check"),
            token=text(self.token, "token"),
            endpoint=check_endpoint(self.endpoint),
        )


def check_endpoint(value):
    """None, or an http(s) address with a host: anything else would send the token somewhere unintended."""
    if value is None:
        return None
    from urllib.parse import urlsplit

    parts = urlsplit(value) if isinstance(value, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise HubViTError(f"endpoint={value!r}; expected an http(s) address such as https://huggingface.co")
    return value.rstrip("/")


def run(options: Options) -> PushResult:
    folder = Path(options.folder)
    info = push_folder(
        folder,
        options.repo_id,
        private=options.private,
        revision=options.revision,
        create_pr=options.create_pr,
        commit_message=options.commit_message,
        token=options.token,
        endpoint=options.endpoint,
        timeout=options.timeout,
        load_check=options.load_check,
    )
    return PushResult(folder, info.repo_url.repo_id, info.oid, info.pr_url or info.commit_url)


def outside_links(folder):
    """Symbolic links under `folder` that point outside it (an upload would publish the content they point at)."""
    import os

    folder = Path(folder)
    root = folder.resolve()
    found = []
    for directory, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(directory) / name
            if path.is_symlink():
                target = path.resolve()
                if target != root and root not in target.parents:
                    found.append(f"{path.relative_to(folder).as_posix()} -> {os.readlink(path)}")
    return sorted(found)


def check_files(folder):
    """The files a hubvit folder needs, and a config that points the Auto classes at its own code."""
    folder = Path(folder)
    if not folder.is_dir():
        raise PushError(f"{folder} is not a folder")
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if "model.safetensors" in missing and (folder / "model.safetensors.index.json").is_file():
        missing.remove("model.safetensors")
    if missing:
        raise PushError(f"{folder} is missing {', '.join(missing)}; a hubvit folder needs {', '.join(REQUIRED_FILES)}")
    links = outside_links(folder)
    if links:
        raise PushError(
            f"{folder} holds symbolic links that leave it; refusing to upload what they point at:\n"
            + "\n".join(f"    {link}" for link in links)
        )
    try:
        config = json.loads((folder / "config.json").read_text())
    except ValueError as error:
        raise PushError(f"{folder / 'config.json'} is not valid JSON: {error}") from None
    if not isinstance(config, dict):
        raise PushError(
            f"{folder / 'config.json'}: expected a JSON object of config fields, got a JSON {type(config).__name__}"
        )
    if config.get("model_type") != "hubvit":
        raise PushError(f"{folder / 'config.json'} has model_type {config.get('model_type')!r}, expected 'hubvit'")
    auto_map = config.get("auto_map") or {}
    for auto in ("AutoConfig", "AutoModel", "AutoModelForImageClassification"):
        if auto not in auto_map:
            raise PushError(f"{folder / 'config.json'} has no auto_map entry for {auto}; trust_remote_code needs it")
    readme = folder / "README.md"
    if readme.is_file():
        from huggingface_hub import ModelCard

        try:
            ModelCard(readme.read_text(encoding="utf-8"))
        except Exception as error:
            raise PushError(f"{readme} has unreadable YAML metadata: {error}") from None


# Digests of folders that loaded in this process: pushing the same bytes again (another branch, a pull request, a
# private copy) does not start another Python to prove it again.
_LOADED: dict[str, dict] = {}


def loadable_digest(folder):
    """sha256 over every file the loader can read (the card aside): their relative paths and their own digests."""
    import hashlib

    from .limits import file_sha256

    folder = Path(folder)
    entries = [
        f"{path.relative_to(folder).as_posix()}\0{file_sha256(path)}"
        for path in sorted(upload_files(folder))
        if path.relative_to(folder).as_posix() != "README.md"
    ]
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()


def check_loads(folder, timeout=1800):
    """Load `folder` with `trust_remote_code=True` in a Python where hubvit is hidden and run one forward pass.

    Returns what loaded (class, module, output name and shape); raises PushError with the loader's own error. A
    folder whose files this process already saw load is not loaded again.
    """
    folder = Path(folder).resolve()
    key = loadable_digest(folder)
    if key in _LOADED:
        return _LOADED[key]
    with tempfile.TemporaryDirectory(prefix="hubvit-check-") as scratch:
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "HF_MODULES_CACHE": str(Path(scratch) / "modules"),
            "TRANSFORMERS_VERBOSITY": "error",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        try:
            result = subprocess.run(
                [sys.executable, "-c", LOAD_CHECK, str(folder)],
                cwd=scratch,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise PushError(f"{folder} did not load and run within {timeout} s") from None
    if result.returncode != 0:
        lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
        raise PushError(
            f"{folder} does not load and run with trust_remote_code=True where hubvit is not installed, so it would "
            "not work from the Hub:\n  " + "\n  ".join(lines[-12:])
        )
    _LOADED[key] = json.loads(result.stdout.strip().splitlines()[-1])
    return _LOADED[key]


def upload_files(folder):
    """Every file of `folder` except hidden ones (.git, .cache, editor files) and Python caches."""
    folder = Path(folder)
    return [
        path
        for path in folder.rglob("*")
        if path.is_file()
        and not any(part.startswith(".") or part == "__pycache__" for part in path.relative_to(folder).parts)
    ]


def require_token(api):
    """The user's write token, or a PushError saying how to provide one."""
    from huggingface_hub import get_token
    from huggingface_hub.errors import HfHubHTTPError

    token = api.token or get_token()
    if not token:
        raise PushError(
            "no Hugging Face token: set HF_TOKEN or run `hf auth login` (a token with write access) before pushing"
        )
    try:
        who = api.whoami(token=token)
    except HfHubHTTPError as error:
        response = getattr(error, "response", None)
        status = getattr(response, "status_code", None)
        if status is not None and status >= 500:
            raise  # the server failed; `bounded` names the status
        check = f"the token check (GET {api.endpoint}/api/whoami-v2)"
        if status == 429:
            from .network import rate_limit_wait

            wait = rate_limit_wait(response.headers)
            asked = f"; it asks to wait {wait[0]:.0f} s ({wait[1]})" if wait else ""
            raise PushError(
                f"the Hub at {api.endpoint} rate-limited {check}: HTTP 429{asked}; the token was not judged, "
                "try again later"
            ) from None
        if status is not None and status not in (401, 403):
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise PushError(f"the Hub at {api.endpoint} answered {check} with HTTP {status}: {first}") from None
        raise PushError(f"the token was refused by {api.endpoint}: {error}") from None
    role = token_role(who, api.endpoint)
    if role == "read":
        raise PushError(f"the token of {who.get('name')} is read-only; pushing needs a token with write access")
    return token


def token_role(who, endpoint):
    """The role (`read`, `write`, ...) of the token in a whoami answer, None if it names none; a PushError if the
    answer is not the JSON object the Hub sends."""
    if not isinstance(who, dict):
        raise PushError(
            f"the Hub at {endpoint} answered the token check (GET /api/whoami-v2) with a JSON "
            f"{type(who).__name__}; expected a JSON object with the user's name and the token's role"
        )
    auth = who.get("auth")
    access = auth.get("accessToken") if isinstance(auth, dict) else None
    role = access.get("role") if isinstance(access, dict) else None
    return role if isinstance(role, str) else None


def push_folder(
    folder,
    repo_id,
    *,
    private=False,
    revision=None,
    create_pr=False,
    commit_message=None,
    token=None,
    endpoint=None,
    timeout=DEFAULT_TIMEOUT,
    load_check=True,
):
    """Check `folder`, then publish it to `repo_id` as one commit (or pull request); returns the `CommitInfo`.

    The card's usage snippets get the real repo id (in the uploaded copy; the local README keeps its text). Weight
    files left in the repo by an earlier push but absent from the folder are deleted in the same commit, so a
    stale shard or index never shadows the new weights. Each request gives up after `timeout` seconds without
    progress; `load_check=False` skips running the folder's code (for folders from someone else).
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HFValidationError, HfHubHTTPError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise PushError(f"repo id {repo_id!r} is not valid: {error}") from None
    folder = Path(folder)
    check_files(folder)
    api = HfApi(endpoint=endpoint, token=token)
    try:
        size = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
        with bounded(f"push to {repo_id}", endpoint=api.endpoint, kind="transfer", error=PushError, size=size):
            bound_network_timeouts(timeout)
            return _push(api, folder, repo_id, private, revision, create_pr, commit_message, load_check)
    except HfHubHTTPError as error:
        raise PushError(f"the Hub at {api.endpoint} refused the push to {repo_id}: {error}") from None
    except Exception as error:
        failure = network_error(error, api.endpoint)
        if failure is None:
            raise
        raise failure from None


def _push(api, folder, repo_id, private, revision, create_pr, commit_message, load_check):
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    token = require_token(api)
    if load_check:
        check = check_loads(folder)
        summary = (
            f"{check['class']} loads with trust_remote_code=True where hubvit is not installed and runs a forward "
            f"pass ({check['output']} {tuple(check['shape'])})"
        )
    else:
        summary = "files and config only; the load check was skipped (--no-load-check)"
    logger.info("checked %s: %s", folder, summary)

    repo_id = api.create_repo(repo_id, private=private, exist_ok=True, token=token).repo_id
    if private and not api.model_info(repo_id, token=token).private:
        raise PushError(
            f"{repo_id} exists and is public; --private does not change an existing repo. Make it private on the "
            "Hub (settings, or HfApi().update_repo_settings(repo_id, private=True)) or push without --private"
        )
    if revision and not revision.startswith("refs/"):
        api.create_branch(repo_id, branch=revision, exist_ok=True, token=token)

    files = {path.relative_to(folder).as_posix(): path for path in upload_files(folder)}
    operations = []
    for name, path in sorted(files.items()):
        content = path
        if name == "README.md":
            text = path.read_text(encoding="utf-8")
            if f'"{REPO_PLACEHOLDER}"' in text:
                content = set_repo_id(text, repo_id).encode("utf-8")
        operations.append(CommitOperationAdd(path_in_repo=name, path_or_fileobj=content))
    operations += [
        CommitOperationDelete(path_in_repo=name) for name in stale_weights(api, repo_id, revision, files, token)
    ]
    info = api.create_commit(
        repo_id,
        operations,
        commit_message=commit_message or f"Upload hubvit model from {folder.resolve().name}",
        commit_description=f"Checked before upload: {summary}.",
        revision=revision,
        create_pr=create_pr,
        token=token,
    )
    logger.info("pushed %s to %s", folder, info.pr_url or info.commit_url)
    return info


def stale_weights(api, repo_id, revision, files, token):
    from fnmatch import fnmatch

    from huggingface_hub.errors import EntryNotFoundError, RevisionNotFoundError

    try:
        present = api.list_repo_files(repo_id, revision=revision, token=token)
    except (EntryNotFoundError, RevisionNotFoundError):
        return []
    return [
        name
        for name in present
        if name not in files and "/" not in name and any(fnmatch(name, pattern) for pattern in WEIGHT_PATTERNS)
    ]
