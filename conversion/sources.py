"""Where a converter's SRC comes from: a local path, a Hub repo id, or an http(s) address of a published `.npz`.

Repo ids (`timm/vit_base_patch16_224.augreg2_in21k_ft_in1k`, `google/vit-base-patch16-224`) are fetched with
huggingface_hub's `snapshot_download`, so its cache, `HF_ENDPOINT`, token and `HF_HUB_OFFLINE` all apply; only the
config files and one weights format are downloaded. Addresses are downloaded into hubvit's cache (`HUBVIT_CACHE`,
default `$HF_HOME/hubvit`) through a `.part` file that an interrupted run resumes with an HTTP Range request. Either
way the `Source` says what was converted (repo id and resolved commit, or address and sha256) for the model card.
"""

import logging
import hashlib
import http.client
import json
import os
import re
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..deadlines import _env_float
from ..limits import file_sha256
from ..network import NetworkError, connect_timeout, describe, read_bounded
from .common import ConversionError

DISK_RESERVE_BYTES = 1 << 30

logger = logging.getLogger(__name__)

REPO_ID = re.compile(r"(?:hf-hub:)?([A-Za-z0-9][\w.-]*/[\w.-]+)")
COMMIT = re.compile(r"[0-9a-f]{40}")
# One weights format per download: safetensors when the repo has it, else PyTorch pickles (read weights_only).
PATTERNS = (["*.json", "*.safetensors"], ["*.json", "pytorch_model*.bin"])
CHUNK = 1 << 16


@dataclass
class Source:
    """A local path to convert, and where it came from (nothing but `path` for a local SRC)."""

    path: Path
    repo_id: str | None = None
    revision: str | None = None
    url: str | None = None
    sha256: str | None = None

    def record(self):
        """What the model card records: {} for a local path."""
        if self.repo_id:
            return {"repo_id": self.repo_id, "revision": self.revision}
        if self.url:
            return {"url": self.url, "sha256": self.sha256}
        return {}


REVISION_HELP = "branch, tag or commit of a Hub repo SRC (default: main)"
SHA256_HELP = "expected sha256 of the file at an http(s) SRC; refused if it differs"


def resolve(src, kind="hub", *, revision=None, sha256=None):
    """The `Source` of SRC: an existing local path, a Hub repo id at `revision` (`kind="hub"`) or an address whose
    file must have `sha256` ("url")."""
    src = str(src)
    if kind == "url" and src.startswith(("https://", "http://")):
        return fetch(src, sha256)
    if Path(src).exists():
        if revision:
            raise ConversionError(f"--revision {revision} is for a Hub repo id, but {src} is a local path")
        return Source(Path(src))
    match = REPO_ID.fullmatch(src)
    if kind == "hub" and match:
        return download_repo(match[1], revision)
    expected = (
        "a local file or folder, or a Hub repo id namespace/name"
        if kind == "hub"
        else ("a local .npz file or an https:// address of one")
    )
    raise ConversionError(f"{src}: no such file or folder; expected {expected}")


def download_repo(repo_id, revision=None):
    """Snapshot of `repo_id` at `revision` in huggingface_hub's cache, config files and one weights format."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    from ..network import bounded

    where = f"{repo_id}" + (f" at revision {revision}" if revision else "")
    local = f"; there is no local path {repo_id} either" if not Path(repo_id.split("/", 1)[0]).exists() else ""
    try:
        with bounded(f"download of {where}{local}", kind="transfer"):
            for patterns in PATTERNS:
                path = Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns))
                if any(path.glob(patterns[1])):
                    break
    except GatedRepoError:
        raise ConversionError(f"{repo_id}: gated repo; accept its terms on the Hub, then hf auth login") from None
    except RepositoryNotFoundError:
        raise ConversionError(
            f"{repo_id}: no such repo on {constants.ENDPOINT} (or it is private and no token with access is set)"
        ) from None
    except RevisionNotFoundError:
        raise ConversionError(f"{repo_id}: no revision {revision!r}") from None
    except LocalEntryNotFoundError:
        reason = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else f"{constants.ENDPOINT} cannot be reached"
        raise ConversionError(
            f"{where}: not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {reason}; "
            f"download it once online{local}"
        ) from None
    except (HfHubHTTPError, OSError) as error:
        raise ConversionError(f"{where}: download failed: {str(error).splitlines()[0]}") from None
    commit = path.name if COMMIT.fullmatch(path.name) else revision
    logger.info("%s: commit %s (%s)", repo_id, commit, path)
    return Source(path, repo_id=repo_id, revision=commit)


# ---------------------------------------------------------------------------------------------------- addresses


def cache_dir():
    from huggingface_hub import constants

    return Path(os.environ.get("HUBVIT_CACHE") or Path(constants.HF_HOME) / "hubvit")


def fetch(url, expected_sha256=None):
    """The file at `url` in hubvit's cache (downloaded, or resumed from its `.part`), checked against its sha256."""
    from huggingface_hub import constants

    name = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    if not name.endswith(".npz"):
        raise ConversionError(f"{url}: expected the address of a .npz checkpoint")
    folder = cache_dir() / "downloads" / hashlib.sha256(url.encode()).hexdigest()[:16]
    final, record = folder / name, folder / "source.json"
    if not (final.is_file() and record.is_file()):
        if constants.HF_HUB_OFFLINE:
            raise ConversionError(f"{url}: not in hubvit's cache ({folder}) and HF_HUB_OFFLINE is set")
        folder.mkdir(parents=True, exist_ok=True)
        download(url, final)
        record.write_text(json.dumps({"url": url, "sha256": file_sha256(final)}))
    digest = file_sha256(final)
    if digest != json.loads(record.read_text())["sha256"]:
        record.unlink()
        raise ConversionError(f"{final}: cached file changed since it was downloaded; run again to download it afresh")
    if expected_sha256 and digest != expected_sha256.lower():
        raise ConversionError(f"{url}: sha256 {digest}, expected {expected_sha256} (--sha256)")
    logger.info("%s: sha256 %s", name, digest)
    return Source(final, url=url, sha256=digest)


def usable_disk(folder):
    """(bytes a download may write in `folder`, bytes kept free): a body of unknown size stops while the disk still
    has HUBVIT_DISK_RESERVE_BYTES free, by default the larger of 1 GiB and 5% of the disk."""
    usage = shutil.disk_usage(folder)
    reserve = int(_env_float("HUBVIT_DISK_RESERVE_BYTES", max(DISK_RESERVE_BYTES, usage.total // 20)))
    return usage.free - reserve, reserve


def download(url, final):
    """Download `url` to `final` through `final.part`, resuming a partial file when the server honours Range."""
    from tqdm.auto import tqdm

    part, validator = final.with_name(final.name + ".part"), final.with_name(final.name + ".part.etag")
    start = part.stat().st_size if part.is_file() else 0
    headers = {"User-Agent": "hubvit"}
    if start:
        headers["Range"] = f"bytes={start}-"
        if validator.is_file():
            headers["If-Range"] = validator.read_text()
    try:
        response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=connect_timeout())
    except urllib.error.HTTPError as error:
        if error.code == 416 and start:  # the partial file is not a prefix of this one: start over
            part.unlink()
            return download(url, final)
        raise NetworkError(describe("status", url, status=error.code, reason=str(error.reason))) from None
    except TimeoutError:
        raise NetworkError(describe("silent", url, seconds=connect_timeout())) from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        if isinstance(reason, TimeoutError):
            raise NetworkError(describe("silent", url, seconds=connect_timeout())) from None
        raise NetworkError(describe("refused", url, reason=str(reason))) from None
    with response:
        resumed = response.status == 206 and response.headers.get("Content-Range", "").startswith(f"bytes {start}-")
        start = start if resumed else 0
        length = response.headers.get("Content-Length")
        length = length.strip() if length is not None and length.strip().isdecimal() else None
        total = start + int(length) if length is not None else None
        usable, reserve = usable_disk(part.parent)
        if (length is not None and int(length) > usable) or usable <= 0:
            size = f"the file is {int(length)} bytes (Content-Length)" if length is not None else "the file's size"
            raise ConversionError(
                f"{url}: {size} but {part.parent} has only {usable + reserve} bytes free, {reserve} of which are "
                "kept free (HUBVIT_DISK_RESERVE_BYTES); free some space or point HUBVIT_CACHE at a larger disk"
            )
        etag = response.headers.get("ETag") or response.headers.get("Last-Modified")
        if etag:
            validator.write_text(etag)
        received = start
        try:
            with (
                open(part, "ab" if resumed else "wb") as file,
                tqdm(total=total, initial=start, unit="B", unit_scale=True, desc=final.name) as bar,
            ):

                def write(chunk):
                    nonlocal received
                    file.write(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))

                read_bounded(
                    response,
                    url,
                    write,
                    expected=int(length) if length is not None else None,
                    cap=usable,
                    cap_place=f"{part.parent} less the {reserve} bytes kept free",
                )
        except NetworkError:
            raise
        except (OSError, http.client.HTTPException) as error:
            raise ConversionError(
                f"{url}: download interrupted at {received} of {total} bytes ({type(error).__name__}); "
                "run the same command again to resume"
            ) from None
    if total is not None and received != total:
        raise ConversionError(
            f"{url}: download interrupted at {received} of {total} bytes; run the same command again to resume"
        )
    part.rename(final)
    validator.unlink(missing_ok=True)
