"""A small in-process fake of the Hugging Face Hub HTTP API, for offline tests.

`HubServer` is a stdlib (``http.server`` + ``threading``) server on 127.0.0.1 (random free port) that speaks
enough of the Hub's HTTP API for the *real* ``huggingface_hub`` client (2.4) and ``transformers`` (5.x)
``push_to_hub`` / ``from_pretrained`` to run end to end against it. Nothing reaches the network.

Routes served: the calls hubvit makes (push, publish, download of sources) and the client makes for them::

    GET    /api/whoami-v2                              token check (401 without a valid Bearer token)
    POST   /api/repos/create                           409 (+ "url") when the repo exists (exist_ok semantics)
    POST   /api/validate-yaml                          YAML front matter of README.md (400 on invalid YAML)
    GET    /api/models/{ns}/{name}[/revision/{rev}]    sha, siblings (+ size/blobId/lfs with ?blobs=1), private...
    GET    /api/models/{ns}/{name}/tree/{rev}[/{path}] list_repo_files / list_repo_tree (recursive)
    POST   /api/models/{ns}/{name}/preupload/{rev}     uploadMode "lfs" (size >= lfs_threshold or LFS suffix) / "regular"
    POST   /api/models/{ns}/{name}/commit/{rev}        NDJSON: header, file (base64), lfsFile, deletedFile, deletedFolder;
                                                       ?create_pr=1 creates refs/pr/N and returns pullRequestUrl
    POST   /api/models/{ns}/{name}/branch/{branch}     create_branch (startingPoint), 409 if it exists; DELETE too
    POST   /{ns}/{name}.git/info/lfs/objects/batch     LFS batch API, "basic" transfer, with a verify action
    PUT    /_lfs/upload/{sha256}?sig=...               the LFS "basic" upload target (no auth, like a signed URL)
    POST   /{ns}/{name}.git/info/lfs/objects/verify
    HEAD/GET /{ns}/{name}/resolve/{rev}/{path}         X-Repo-Commit, ETag, Content-Length, Range; LFS files answer
                                                       302 to a "CDN" URL (see below) with X-Linked-Etag/X-Linked-Size
    HEAD/GET /_cdn/{sha256}                            LFS object bytes (the "CDN")
    GET    /api/agent-harnesses, /api/telemetry/*      harmless answers so the client's side calls stay local

Dataset and Space repos, tags, refs, commit listings, paths-info, settings and deletion are not served (hubvit
calls none of them); such a request answers 404 and is recorded in ``server.unhandled``.

Errors carry ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``) and
``X-Error-Message``, which is how ``huggingface_hub`` maps them to its exception classes. Private repos answer
404 ``RepoNotFound`` to requests without a valid token. A request with an *invalid* token answers 401
"Invalid credentials in Authorization header", as the real Hub does. Xet routes answer 501: set
``HF_HUB_DISABLE_XET=1`` (the fixture does).

Like the real Hub, a new repo starts with one commit ("initial commit") holding ``.gitattributes``; so after
one ``upload_folder`` a repo has 2 commits and ``list_repo_files`` includes ``.gitattributes``. Like the real
client, ``create_commit`` skips files whose content is unchanged (``preupload`` returns their ``oid``), and
makes no commit at all when nothing changed.

LFS files are served like the real Hub: ``resolve`` answers ``302`` with ``Location`` on another origin
(``http://localhost:PORT/_cdn/<sha256>``, a different *host* than ``127.0.0.1``), so the client stops following
redirects in its HEAD call, reads ``X-Linked-Etag`` / ``X-Linked-Size`` and downloads from the "CDN" without
the Authorization header. ``HubServer(lfs_redirect=False)`` serves LFS files directly with ``200`` instead.

In-memory store (inspect it in tests)::

    server.repos["user/name"]              -> Repo
    repo.branches / repo.pulls             -> name -> commit oid  (pulls: N -> oid, ref "refs/pr/N")
    repo.commits[oid]                      -> Commit(oid, parent, title, message, author, date, files, lfs)
    commit.files                           -> {path: bytes}, a full snapshot;  commit.lfs -> {path: sha256}
    server.commits(repo_id, rev="main")    -> [Commit, ...] newest first (first-parent chain, initial commit last)
    server.files(repo_id, rev="main")      -> {path: bytes} at that revision
    server.lfs_uploads / lfs_verifies      -> number of LFS PUTs stored / verify calls
    server.lfs_objects                     -> {sha256: bytes}
    server.requests                        -> [(method, path, status), ...]; server.unhandled: routes not served
    server.add_token(token, user), server.create_repo(...), server.commit(...)  to seed state without the client

GOTCHA (why the fixture patches module globals, not only environment variables): ``huggingface_hub`` reads
``HF_ENDPOINT``, ``HF_HUB_DISABLE_XET``, ``HF_HUB_OFFLINE``, ``HF_HOME``/``HF_HUB_CACHE``, ``HF_TOKEN_PATH`` ... ONCE,
at import time, into ``huggingface_hub.constants`` (``ENDPOINT``, ``HUGGINGFACE_CO_URL_TEMPLATE``, ...). Setting
the environment variables inside a running test process changes nothing. Moreover:

* the module-level functions (``huggingface_hub.create_repo``, ``upload_folder``, ``whoami``, ...) are bound
  methods of ``huggingface_hub.hf_api.api``, an ``HfApi()`` built at import time whose ``.endpoint`` was
  copied from ``constants.ENDPOINT`` then: it must be patched too;
* ``hf_hub_download`` builds its URL from ``constants.HUGGINGFACE_CO_URL_TEMPLATE`` (not ``ENDPOINT``);
* ``ModelCard.validate`` posts to ``constants.ENDPOINT`` directly;
* ``transformers.utils.hub.hf_api()`` caches one ``HfApi`` (used by ``push_to_hub`` and revision
  resolution) in ``transformers.utils.hub._hf_api`` at first use: reset it to ``None``;
* ``transformers`` computes ``HF_MODULES_CACHE`` (remote code) at import, in ``transformers.utils.hub`` and
  ``transformers.dynamic_module_utils``;
* the first HTTP call of a process fetches ``{constants.ENDPOINT}/api/agent-harnesses`` (user agent
  detection); served here.

``configure_hf_client(monkeypatch, endpoint, token, home)`` does all of this (env vars for subprocesses,
constants and cached instances for this process) and the ``hub_server`` fixture calls it. An explicit
``HfApi(endpoint=server.endpoint, token=...)`` (``server.api()``) alone is NOT enough: Xet stays on (the fake
answers 501) and the first request of the process still fetches ``huggingface.co/api/agent-harnesses``.
Subprocesses (``subprocess``, ``accelerate launch``) only need the environment variables, which the fixture
sets (``HF_HUB_OFFLINE=0`` included, so a CI-wide ``HF_HUB_OFFLINE=1`` does not get in the way).

Fixture ``hub_server`` (tests/conftest.py imports it): yields a started ``HubServer``; ``HF_TOKEN`` =
``server.token`` (write token of ``server.user`` = "test-user"; ``READ_TOKEN`` is read-only), caches in
``tmp_path/hf_home`` (``HF_HOME``, ``HF_HUB_CACHE``, transformers' ``HF_MODULES_CACHE`` for remote code). It also
refuses every socket connection to a non-loopback address and fails the test at teardown if one was tried
(``server.blocked_connections``). Cosmetic: transformers' remote-code warning prints a hard-coded
"downloaded from https://huggingface.co/..." URL; the bytes did come from the fake.
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import hashlib
import json
import os
import re
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs, quote, unquote, urlsplit

try:  # the fixture needs pytest; the server itself does not
    import pytest
except ImportError:  # pragma: no cover
    pytest = None  # type: ignore[assignment]


VALID_TOKEN = "hf_fake_valid_write_token_0123456789"
READ_TOKEN = "hf_fake_valid_read_token_0123456789"
DEFAULT_USER = "test-user"

# Suffixes that the default HF `.gitattributes` sends to LFS (subset of the real list).
LFS_PATTERNS = (
    "*.7z",
    "*.arrow",
    "*.bin",
    "*.bz2",
    "*.ckpt",
    "*.ftz",
    "*.gguf",
    "*.gz",
    "*.h5",
    "*.joblib",
    "*.lfs.*",
    "*.mlmodel",
    "*.model",
    "*.msgpack",
    "*.npy",
    "*.npz",
    "*.onnx",
    "*.ot",
    "*.parquet",
    "*.pb",
    "*.pickle",
    "*.pkl",
    "*.pt",
    "*.pth",
    "*.rar",
    "*.safetensors",
    "*.tar",
    "*.tflite",
    "*.tgz",
    "*.wasm",
    "*.xz",
    "*.zip",
    "*.zst",
    "*tfevents*",
)
GITATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in LFS_PATTERNS).encode()

# hubvit pushes and pulls models only: dataset and Space repos are not served.
_TYPE_FROM_PLURAL = {"models": "model"}
_URL_PREFIX = {"model": ""}
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_INVALID_CREDENTIALS = "Invalid credentials in Authorization header"


# ----------------------------------------------------------------------------------------------------------------------
# Store
# ----------------------------------------------------------------------------------------------------------------------


def git_blob_oid(data: bytes) -> str:
    """Git's SHA-1 of a blob, the `oid`/`blobId`/ETag of a regular file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def _iso(dt: datetime) -> str:
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


@dataclass
class Commit:
    oid: str
    parent: str | None
    title: str
    message: str
    author: str
    date: datetime
    files: dict[str, bytes]  # full snapshot: path -> content
    lfs: dict[str, str]  # path -> sha256, for the files stored through LFS

    def is_lfs(self, path: str) -> bool:
        return path in self.lfs

    def blob_oid(self, path: str) -> str:
        data = self.files[path]
        if path in self.lfs:
            return git_blob_oid(lfs_pointer(self.lfs[path], len(data)))
        return git_blob_oid(data)


@dataclass
class Repo:
    repo_id: str
    repo_type: str
    private: bool
    owner: str
    created_at: datetime
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)  # name -> oid
    pulls: dict[int, str] = field(default_factory=dict)  # N -> oid  (ref "refs/pr/N")
    pull_targets: dict[int, str] = field(default_factory=dict)  # N -> target branch

    @property
    def key(self) -> str:
        return _URL_PREFIX[self.repo_type] + self.repo_id

    def resolve(self, rev: str | None) -> str | None:
        """Branch, refs/heads/x, refs/pr/N, full or >=7-char short commit oid -> commit oid."""
        rev = rev or "main"
        if rev in self.branches:
            return self.branches[rev]
        if rev.startswith("refs/heads/") and rev[len("refs/heads/") :] in self.branches:
            return self.branches[rev[len("refs/heads/") :]]
        m = re.fullmatch(r"refs/pr/(\d+)", rev)
        if m and int(m[1]) in self.pulls:
            return self.pulls[int(m[1])]
        if rev in self.commits:
            return rev
        if re.fullmatch(r"[0-9a-f]{7,40}", rev):
            matches = [oid for oid in self.commits if oid.startswith(rev)]
            if len(matches) == 1:
                return matches[0]
        return None

    def head(self, rev: str = "main") -> Commit:
        oid = self.resolve(rev)
        if oid is None:
            raise KeyError(f"revision {rev!r} not found in {self.key}")
        return self.commits[oid]

    def history(self, rev: str = "main") -> list[Commit]:
        out, commit = [], self.head(rev)
        while commit is not None:
            out.append(commit)
            commit = self.commits.get(commit.parent) if commit.parent else None
        return out


class HTTPError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}


# ----------------------------------------------------------------------------------------------------------------------
# Server
# ----------------------------------------------------------------------------------------------------------------------


class HubServer:
    """In-memory fake Hub. Use as a context manager, or `start()` / `stop()`.

    Args:
        tokens: token -> user name. Defaults to ``{VALID_TOKEN: "test-user"}``. ``READ_TOKEN`` is always added as a
            read-only token of the same user (it can read private repos but every write answers 403).
        lfs_threshold: files of at least this many bytes are uploaded through LFS (the Hub uses 10 MiB).
        lfs_patterns: file name globs that always go through LFS (the default `.gitattributes` list); ``()`` for none.
        lfs_redirect: serve LFS files with a 302 to the "CDN" on ``localhost`` (True, like the Hub) or with 200.
        enforce_namespace: if True, a token can only write to repos of its user or its `orgs`.
        orgs: organisations the users belong to (shown by whoami and used with `enforce_namespace`).
    """

    def __init__(
        self,
        tokens: dict[str, str] | None = None,
        *,
        lfs_threshold: int = 10 * 1024 * 1024,
        lfs_patterns: tuple[str, ...] = LFS_PATTERNS,
        lfs_redirect: bool = True,
        enforce_namespace: bool = False,
        orgs: tuple[str, ...] = ("test-org",),
    ):
        self.tokens: dict[str, str] = dict(tokens) if tokens is not None else {VALID_TOKEN: DEFAULT_USER}
        self.read_only_tokens: set[str] = set()
        self.add_token(READ_TOKEN, next(iter(self.tokens.values()), DEFAULT_USER), write=False)
        self.token = next(iter(t for t in self.tokens if t not in self.read_only_tokens))
        self.user = self.tokens[self.token]
        self.orgs = tuple(orgs)
        self.lfs_threshold = lfs_threshold
        self.lfs_patterns = tuple(lfs_patterns)
        self.lfs_redirect = lfs_redirect
        self.enforce_namespace = enforce_namespace

        self.repos: dict[str, Repo] = {}
        self.lfs_objects: dict[str, bytes] = {}
        self.lfs_uploads = 0
        self.lfs_verifies = 0
        self.requests: list[tuple[str, str, int]] = []
        self.unhandled: list[tuple[str, str]] = []
        self.lock = threading.RLock()
        self._upload_sigs: dict[str, str] = {}  # sha256 -> signature of the upload URL handed out
        self._counter = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.blocked_connections: list = []  # filled by the fixture's network guard

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def start(self) -> "HubServer":
        server = self

        class Handler(_Handler):
            hub = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="fake-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def cdn_endpoint(self) -> str:
        # Same socket, other host name => another origin for the client (it drops the auth header there).
        return f"http://localhost:{self.port}"

    def api(self, token: str | bool | None = None):
        """An `HfApi` bound to this server (explicit endpoint: immune to the import-time constants)."""
        from huggingface_hub import HfApi

        return HfApi(endpoint=self.endpoint, token=self.token if token is None else token)

    # -- helpers for tests -----------------------------------------------------------------------------------------

    def add_token(self, token: str, user: str, write: bool = True) -> None:
        self.tokens[token] = user
        if not write:
            self.read_only_tokens.add(token)

    def repo(self, repo_id: str, repo_type: str = "model") -> Repo:
        return self.repos[_URL_PREFIX[repo_type or "model"] + repo_id]

    def commits(self, repo_id: str, rev: str = "main", repo_type: str = "model") -> list[Commit]:
        """Commits reachable from `rev` (first-parent chain), newest first; the initial commit is last."""
        with self.lock:
            return self.repo(repo_id, repo_type).history(rev)

    def files(self, repo_id: str, rev: str = "main", repo_type: str = "model") -> dict[str, bytes]:
        with self.lock:
            return dict(self.repo(repo_id, repo_type).head(rev).files)

    def create_repo(self, repo_id: str, *, private: bool = False, repo_type: str = "model", owner: str | None = None):
        """Create a repo directly in the store (with the Hub's initial `.gitattributes` commit)."""
        with self.lock:
            key = _URL_PREFIX[repo_type] + repo_id
            if key in self.repos:
                raise ValueError(f"{key} exists")
            repo = Repo(repo_id, repo_type, private, owner or repo_id.split("/")[0], datetime.now(timezone.utc))
            self.repos[key] = repo
            self._new_commit(repo, None, {".gitattributes": GITATTRIBUTES}, {}, "initial commit", "", repo.owner)
            repo.branches["main"] = next(iter(repo.commits))
            return repo

    def commit(
        self,
        repo_id: str,
        files: dict[str, bytes | str],
        *,
        branch: str = "main",
        message: str = "seed",
        delete: tuple[str, ...] = (),
        repo_type: str = "model",
    ) -> Commit:
        """Commit `files` directly in the store (LFS mode chosen as `preupload` would)."""
        with self.lock:
            repo = self.repo(repo_id, repo_type)
            parent = repo.head(branch)
            new_files, new_lfs = dict(parent.files), dict(parent.lfs)
            for path in delete:
                new_files.pop(path, None)
                new_lfs.pop(path, None)
            for path, data in files.items():
                data = data.encode() if isinstance(data, str) else data
                new_files[path] = data
                new_lfs.pop(path, None)
                if self._is_lfs(path, len(data)):
                    sha = hashlib.sha256(data).hexdigest()
                    self.lfs_objects[sha] = data
                    new_lfs[path] = sha
            c = self._new_commit(repo, parent.oid, new_files, new_lfs, message, "", repo.owner)
            repo.branches[branch] = c.oid
            return c

    def requests_to(self, route_fragment: str) -> list[tuple[str, str, int]]:
        return [r for r in self.requests if route_fragment in r[1]]

    # -- internals -------------------------------------------------------------------------------------------------

    def _is_lfs(self, path: str, size: int) -> bool:
        name = path.rsplit("/", 1)[-1]
        return size >= self.lfs_threshold or any(fnmatch.fnmatch(name, p) for p in self.lfs_patterns)

    def _new_commit(self, repo, parent, files, lfs, title, message, author) -> Commit:
        self._counter += 1
        seed = f"{repo.key}\0{parent}\0{self._counter}\0{time.time_ns()}\0{title}".encode()
        oid = hashlib.sha1(seed).hexdigest()
        c = Commit(oid, parent, title, message, author, datetime.now(timezone.utc), files, lfs)
        repo.commits[oid] = c
        return c


# ----------------------------------------------------------------------------------------------------------------------
# Request handler
# ----------------------------------------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer  # set by HubServer.start
    protocol_version = "HTTP/1.1"  # keep-alive, as the client expects; every answer carries Content-Length
    timeout = 30  # idle keep-alive connections end after this

    def log_message(self, format, *args):  # silence stderr
        pass

    # -- plumbing --------------------------------------------------------------------------------------------------

    def do_GET(self):
        self._dispatch("GET")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        split = urlsplit(self.path)
        self.query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        self.segs = [unquote(s) for s in split.path.split("/")[1:]]
        self.raw_segs = split.path.split("/")[1:]
        self._status = 0
        try:
            self.body = self._read_body()
            self._route(method)
        except HTTPError as e:
            self._send_error(e)
        except Exception as e:  # a bug in the fake: make it visible to the client
            import traceback

            traceback.print_exc()
            # 599, not 500: the client retries 5xx it knows (500, 502-504) with a long backoff
            self._send_error(HTTPError(599, f"fake hub internal error: {e!r}"))
        finally:
            with self.hub.lock:
                self.hub.requests.append((method, split.path, self._status))

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, content_type: str | None = None):
        self._status = status
        self.send_response(status)
        headers = dict(headers or {})
        if content_type:
            headers.setdefault("Content-Type", content_type)
        headers.setdefault("Content-Length", str(len(body)))
        for k, v in headers.items():  # header values: one line, latin-1
            v = " ".join(str(v).split()) if k.lower().startswith("x-error") else str(v)
            self.send_header(k, v.encode("latin-1", "replace").decode("latin-1"))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _json(self, obj: Any, status: int = 200, headers: dict | None = None):
        self._send(status, json.dumps(obj).encode(), headers, "application/json; charset=utf-8")

    def _send_error(self, e: HTTPError):
        headers = dict(e.headers)
        if e.code:
            headers["X-Error-Code"] = e.code
        headers["X-Error-Message"] = e.message
        self._json({"error": e.message}, e.status, headers)

    def _body_json(self) -> Any:
        try:
            return json.loads(self.body or b"{}")
        except ValueError:
            raise HTTPError(400, "Body is not valid JSON")

    # -- auth ------------------------------------------------------------------------------------------------------

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization")
        if not auth:
            return None
        scheme, _, token = auth.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or token not in self.hub.tokens:
            raise HTTPError(401, _INVALID_CREDENTIALS)
        return token

    def _user(self) -> str | None:
        token = self._token()
        return self.hub.tokens[token] if token else None

    def _require_write(self, namespace: str | None = None) -> str:
        token = self._token()
        if token is None:
            raise HTTPError(401, "You must be authenticated to do this (no token)")
        if token in self.hub.read_only_tokens:
            raise HTTPError(403, "This token has read access only")
        user = self.hub.tokens[token]
        if self.hub.enforce_namespace and namespace and namespace not in (user, *self.hub.orgs):
            raise HTTPError(403, f"You don't have the rights to write to {namespace}")
        return user

    def _get_repo(self, repo_type: str, repo_id: str, write: bool = False) -> Repo:
        user = self._require_write(repo_id.split("/")[0]) if write else self._user()
        repo = self.hub.repos.get(_URL_PREFIX[repo_type] + repo_id)
        if repo is None or (repo.private and user is None):
            raise HTTPError(404, "Repository not found", "RepoNotFound")
        return repo

    def _resolve(self, repo: Repo, rev: str) -> Commit:
        oid = repo.resolve(rev)
        if oid is None:
            raise HTTPError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return repo.commits[oid]

    # -- routing ---------------------------------------------------------------------------------------------------

    def _route(self, method: str) -> None:
        s = self.segs
        hub = self.hub
        with hub.lock:
            if s[:1] == ["api"]:
                return self._route_api(method, s[1:])
            if s[:1] == ["_lfs"] and len(s) == 3 and s[1] == "upload" and method == "PUT":
                return self._lfs_put(s[2])
            if s[:1] == ["_cdn"] and len(s) == 2 and method in ("GET", "HEAD"):
                return self._cdn(s[1])
            # /{prefix}{ns}/{name}/resolve/{rev}/{path...}  and  /{prefix}{ns}/{name}.git/info/lfs/objects/...
            repo_type, rest = "model", s
            if len(rest) >= 5 and rest[1].endswith(".git") and rest[2:5] == ["info", "lfs", "objects"]:
                repo_id = f"{rest[0]}/{rest[1][:-4]}"
                if rest[5:] == ["batch"] and method == "POST":
                    return self._lfs_batch(repo_type, repo_id)
                if rest[5:] == ["verify"] and method == "POST":
                    return self._lfs_verify(repo_type, repo_id)
            if len(rest) >= 5 and rest[2] == "resolve" and method in ("GET", "HEAD"):
                repo_id = f"{rest[0]}/{rest[1]}"
                rev = rest[3]
                path = unquote("/".join(self.raw_segs[len(self.raw_segs) - len(rest) + 4 :]))
                return self._serve_file(repo_type, repo_id, rev, path)
            return self._unhandled(method)

    def _unhandled(self, method: str):
        self.hub.unhandled.append((method, self.path))
        raise HTTPError(404, f"fake hub: route not implemented: {method} {self.path}")

    def _route_api(self, method: str, s: list[str]) -> None:
        if s == ["whoami-v2"] and method == "GET":
            return self._whoami()
        if s == ["repos", "create"] and method == "POST":
            return self._create_repo()
        if s == ["validate-yaml"] and method == "POST":
            return self._validate_yaml()
        if s == ["agent-harnesses"]:
            return self._json({"standardEnvVars": [], "harnesses": {}})
        if s[:1] == ["telemetry"]:
            return self._json({})
        if len(s) >= 3 and s[0] in _TYPE_FROM_PLURAL:
            repo_type, repo_id, rest = _TYPE_FROM_PLURAL[s[0]], f"{s[1]}/{s[2]}", s[3:]
            raw_rest = self.raw_segs[1 + 3 :]
            op = rest[0] if rest else None
            if op is None and method == "GET":
                return self._info(repo_type, repo_id, "main")
            if op == "revision" and method == "GET" and len(rest) >= 2:
                return self._info(repo_type, repo_id, "/".join(rest[1:]))
            if op == "tree" and method == "GET" and len(rest) >= 2:
                return self._tree(repo_type, repo_id, rest[1], unquote("/".join(raw_rest[2:])))
            if op == "preupload" and method == "POST" and len(rest) >= 2:
                return self._preupload(repo_type, repo_id, "/".join(rest[1:]))
            if op == "commit" and method == "POST" and len(rest) >= 2:
                return self._commit(repo_type, repo_id, "/".join(rest[1:]))
            if op == "branch" and len(rest) >= 2 and method in ("POST", "DELETE"):
                return self._branch(method, repo_type, repo_id, "/".join(rest[1:]))
            if op and op.startswith("xet-"):
                raise HTTPError(501, "fake hub has no Xet storage: set HF_HUB_DISABLE_XET=1 (patch constants too)")
        return self._unhandled(method)

    # -- account / repos -------------------------------------------------------------------------------------------

    def _whoami(self):
        token = self._token()
        if token is None:
            raise HTTPError(401, _INVALID_CREDENTIALS)
        user = self.hub.tokens[token]
        role = "read" if token in self.hub.read_only_tokens else "write"
        self._json(
            {
                "type": "user",
                "id": hashlib.md5(user.encode()).hexdigest()[:24],
                "name": user,
                "fullname": user.replace("-", " ").title(),
                "email": f"{user}@example.invalid",
                "emailVerified": True,
                "canPay": False,
                "isPro": False,
                "avatarUrl": "",
                "periodEnd": None,
                "orgs": [{"type": "org", "name": o, "fullname": o, "roleInOrg": "write"} for o in self.hub.orgs],
                "auth": {"type": "access_token", "accessToken": {"displayName": "fake", "role": role}},
            }
        )

    def _create_repo(self):
        payload = self._body_json()
        name = payload.get("name")
        if not name or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise HTTPError(400, f"Invalid repo name: {name!r}")
        user = self._require_write(payload.get("organization"))
        ns = payload.get("organization") or user
        repo_type = payload.get("type") or "model"
        if repo_type not in _URL_PREFIX:
            raise HTTPError(400, f"Invalid repo type {repo_type!r}")
        repo_id = f"{ns}/{name}"
        key = _URL_PREFIX[repo_type] + repo_id
        url = f"{self.hub.endpoint}/{key}"
        if key in self.hub.repos:
            raise_body = {"error": f"You already created this {repo_type} repo", "url": url}
            self._status = 409
            return self._json(raise_body, 409, {"X-Error-Message": raise_body["error"]})
        private = payload.get("visibility") == "private" or bool(payload.get("private"))
        self.hub.create_repo(repo_id, private=private, repo_type=repo_type, owner=user)
        self._json({"url": url, "name": repo_id, "id": hashlib.md5(key.encode()).hexdigest()[:24]})

    def _validate_yaml(self):
        content = self._body_json().get("content", "")
        m = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", content, re.S)
        if m:
            try:
                import yaml

                meta = yaml.safe_load(m[1])
                if meta is not None and not isinstance(meta, dict):
                    raise ValueError("metadata must be a mapping")
            except Exception as e:  # yaml.YAMLError or ValueError
                msg = f"Invalid YAML metadata: {e}"
                return self._json({"errors": [{"message": msg}], "warnings": []}, 400, {"X-Error-Message": msg})
        warnings = [] if m else [{"message": "Empty or missing yaml metadata in repo card"}]
        self._json({"errors": [], "warnings": warnings})

    # -- read API --------------------------------------------------------------------------------------------------

    def _info(self, repo_type, repo_id, rev):
        repo = self._get_repo(repo_type, repo_id)
        commit = self._resolve(repo, rev)
        blobs = self.query.get("blobs") in ("1", "true", "True")
        siblings = []
        for path in sorted(commit.files):
            sib: dict[str, Any] = {"rfilename": path}
            if blobs:
                sib.update(size=len(commit.files[path]), blobId=commit.blob_oid(path))
                if commit.is_lfs(path):
                    size = len(commit.files[path])
                    ptr = lfs_pointer(commit.lfs[path], size)
                    sib["lfs"] = {"size": size, "sha256": commit.lfs[path], "pointerSize": len(ptr)}
            siblings.append(sib)
        info: dict[str, Any] = {
            "_id": hashlib.md5(repo.key.encode()).hexdigest()[:24],
            "id": repo_id,
            "author": repo_id.split("/")[0],
            "sha": commit.oid,
            "lastModified": _iso(commit.date),
            "createdAt": _iso(repo.created_at),
            "private": repo.private,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "usedStorage": sum(len(v) for v in commit.files.values()),
        }
        if repo_type == "model":
            info["modelId"] = repo_id
            cfg = commit.files.get("config.json")
            if cfg is not None:
                with contextlib.suppress(Exception):
                    info["config"] = {
                        k: v for k, v in json.loads(cfg).items() if k in ("architectures", "model_type", "auto_map")
                    }
        if repo_type == "space":
            info["sdk"] = "static"
        self._json(info)

    def _entry(self, commit: Commit, path: str) -> dict:
        if path in commit.files:
            data = commit.files[path]
            e: dict[str, Any] = {"type": "file", "oid": commit.blob_oid(path), "size": len(data), "path": path}
            if commit.is_lfs(path):
                ptr = lfs_pointer(commit.lfs[path], len(data))
                e["lfs"] = {"oid": commit.lfs[path], "size": len(data), "pointerSize": len(ptr)}
        else:
            pre = path + "/"
            children = sorted(p for p in commit.files if p.startswith(pre))
            oid = hashlib.sha1("\0".join(f"{p}:{commit.blob_oid(p)}" for p in children).encode()).hexdigest()
            e = {"type": "directory", "oid": oid, "size": 0, "path": path}
        return e

    @staticmethod
    def _dirs(commit: Commit) -> set[str]:
        out = set()
        for p in commit.files:
            parts = p.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                out.add("/".join(parts[:i]))
        return out

    def _tree(self, repo_type, repo_id, rev, path):
        repo = self._get_repo(repo_type, repo_id)
        commit = self._resolve(repo, rev)
        path = path.strip("/")
        recursive = self.query.get("recursive", "").lower() in ("1", "true")
        dirs = self._dirs(commit)
        if path and path not in dirs:
            headers = {"X-Repo-Commit": commit.oid}
            raise HTTPError(404, f"Entry not found: {path}", "EntryNotFound", headers)
        pre = path + "/" if path else ""
        names = [p for p in list(commit.files) + sorted(dirs) if p.startswith(pre) and p != path]
        if not recursive:
            names = [p for p in names if "/" not in p[len(pre) :]]
        names = sorted(set(names), key=lambda p: (p not in dirs, p))  # folders first, like the Hub
        self._json([self._entry(commit, p) for p in names])

    def _serve_file(self, repo_type, repo_id, rev, path):
        repo = self._get_repo(repo_type, repo_id)
        commit = self._resolve(repo, rev)
        if path not in commit.files:
            raise HTTPError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": commit.oid})
        data = commit.files[path]
        headers = {"X-Repo-Commit": commit.oid, "Accept-Ranges": "bytes"}
        if commit.is_lfs(path):
            sha = commit.lfs[path]
            headers.update({"X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)), "ETag": f'"{sha}"'})
            if self.hub.lfs_redirect:
                headers["Location"] = f"{self.hub.cdn_endpoint}/_cdn/{sha}?sig={secrets.token_hex(8)}"
                return self._send(302, b"", headers)
        else:
            headers["ETag"] = f'"{commit.blob_oid(path)}"'
        headers["Content-Disposition"] = f"inline; filename*=UTF-8''{quote(path.rsplit('/', 1)[-1])}"
        self._send_bytes(data, headers)

    def _send_bytes(self, data: bytes, headers: dict):
        rng = self.headers.get("Range")
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip()) if rng else None
        if m and (m[1] or m[2]):
            total = len(data)
            if m[1]:
                start, end = int(m[1]), int(m[2]) if m[2] else total - 1
            else:  # suffix range
                start, end = max(total - int(m[2]), 0), total - 1
            end = min(end, total - 1)
            if start >= total or start > end:
                return self._send(416, b"", {**headers, "Content-Range": f"bytes */{total}"})
            headers = {**headers, "Content-Range": f"bytes {start}-{end}/{total}"}
            return self._send(206, data[start : end + 1], headers, "application/octet-stream")
        self._send(200, data, headers, "application/octet-stream")

    def _cdn(self, sha):
        data = self.hub.lfs_objects.get(sha)
        if data is None:
            raise HTTPError(404, "NoSuchKey")
        self._send_bytes(data, {"ETag": f'"{sha}"', "Accept-Ranges": "bytes"})

    # -- write API -------------------------------------------------------------------------------------------------

    def _preupload(self, repo_type, repo_id, rev):
        repo = self._get_repo(repo_type, repo_id, write=True)
        commit = self._resolve(repo, rev)
        out = []
        for f in self._body_json().get("files", []):
            path, size = f["path"], int(f["size"])
            mode = "lfs" if self.hub._is_lfs(path, size) else "regular"
            entry = {"path": path, "uploadMode": mode, "shouldIgnore": False}
            if path in commit.files:  # lets the client skip unchanged files
                entry["oid"] = commit.lfs[path] if commit.is_lfs(path) else git_blob_oid(commit.files[path])
            out.append(entry)
        self._json({"files": out, "commitOid": commit.oid})

    def _lfs_batch(self, repo_type, repo_id):
        self._get_repo(repo_type, repo_id, write=True)
        payload = self._body_json()
        if payload.get("operation") != "upload":
            raise HTTPError(400, "fake hub: only the upload operation is implemented")
        key = _URL_PREFIX[repo_type] + repo_id
        objects = []
        for obj in payload.get("objects", []):
            oid, size = obj["oid"], int(obj["size"])
            item: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
            if oid not in self.hub.lfs_objects:  # no "actions" => the client skips the upload
                sig = secrets.token_hex(16)
                self.hub._upload_sigs[oid] = sig
                item["actions"] = {
                    "upload": {"href": f"{self.hub.endpoint}/_lfs/upload/{oid}?sig={sig}&size={size}", "header": {}},
                    "verify": {"href": f"{self.hub.endpoint}/{key}.git/info/lfs/objects/verify", "header": {}},
                }
            objects.append(item)
        body = json.dumps({"transfer": "basic", "objects": objects, "hash_algo": "sha256"}).encode()
        self._send(200, body, None, "application/vnd.git-lfs+json")

    def _lfs_put(self, oid):
        if self.query.get("sig") != self.hub._upload_sigs.get(oid):
            raise HTTPError(403, "Invalid upload signature")
        data = self.body
        if hashlib.sha256(data).hexdigest() != oid:
            raise HTTPError(400, "sha256 of the uploaded content does not match the oid")
        if "size" in self.query and int(self.query["size"]) != len(data):
            raise HTTPError(400, "size of the uploaded content does not match")
        self.hub.lfs_objects[oid] = data
        self.hub.lfs_uploads += 1
        self._send(200, b"", {"ETag": f'"{oid}"'})

    def _lfs_verify(self, repo_type, repo_id):
        self._get_repo(repo_type, repo_id, write=True)
        payload = self._body_json()
        self.hub.lfs_verifies += 1
        data = self.hub.lfs_objects.get(payload.get("oid"))
        if data is None or len(data) != int(payload.get("size", -1)):
            raise HTTPError(404, "LFS object not found")
        self._json({"message": "ok"})

    def _commit(self, repo_type, repo_id, rev):
        user = self._require_write(repo_id.split("/")[0])
        repo = self._get_repo(repo_type, repo_id)
        create_pr = self.query.get("create_pr") in ("1", "true", "True")
        m = re.fullmatch(r"refs/pr/(\d+)", rev)
        branch = rev[len("refs/heads/") :] if rev.startswith("refs/heads/") else rev
        if m and int(m[1]) in repo.pulls and not create_pr:
            parent_oid = repo.pulls[int(m[1])]
        elif branch in repo.branches:
            parent_oid = repo.branches[branch]
        else:
            raise HTTPError(404, f"Invalid rev id: {rev} (not a branch)", "RevisionNotFound")

        header: dict = {}
        ops: list[tuple[str, dict]] = []
        for line in self.body.splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            if item.get("key") == "header":
                header = item.get("value", {})
            else:
                ops.append((item.get("key"), item.get("value", {})))
        if not header.get("summary"):
            raise HTTPError(400, "Commit summary (header) is required")
        parent_commit = header.get("parentCommit")
        if parent_commit:
            resolved = repo.resolve(parent_commit)
            if resolved is None:
                raise HTTPError(404, f"Invalid parent commit {parent_commit}", "RevisionNotFound")
            if create_pr:
                parent_oid = resolved
            elif resolved != parent_oid:
                raise HTTPError(412, "A commit has happened since. Please refresh and try again.")

        parent = repo.commits[parent_oid]
        files, lfs = dict(parent.files), dict(parent.lfs)
        for key, value in ops:
            path = value.get("path", "")
            if key == "file":
                if value.get("encoding", "base64") != "base64":
                    raise HTTPError(400, "fake hub: only base64 file content is implemented")
                files[path] = base64.b64decode(value["content"])
                lfs.pop(path, None)
            elif key == "lfsFile":
                oid = value["oid"]
                data = self.hub.lfs_objects.get(oid)
                if data is None:
                    raise HTTPError(422, f"LFS object {oid} ({path}) was not uploaded")
                if "size" in value and int(value["size"]) != len(data):
                    raise HTTPError(422, f"LFS object {oid}: size mismatch")
                files[path], lfs[path] = data, oid
            elif key == "deletedFile":
                if path not in files:
                    raise HTTPError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                del files[path]
                lfs.pop(path, None)
            elif key == "deletedFolder":
                pre = path.rstrip("/") + "/"
                gone = [p for p in files if p.startswith(pre)]
                if not gone:
                    raise HTTPError(404, f"A folder with this name doesn't exist: {path}", "EntryNotFound")
                for p in gone:
                    del files[p]
                    lfs.pop(p, None)
            else:
                raise HTTPError(400, f"fake hub: unknown commit operation {key!r}")

        commit = self.hub._new_commit(
            repo, parent_oid, files, lfs, header["summary"], header.get("description", ""), user
        )
        base = f"{self.hub.endpoint}/{repo.key}"
        pr_url = None
        if create_pr:
            num = max([*repo.pulls, 0]) + 1
            repo.pulls[num] = commit.oid
            repo.pull_targets[num] = branch
            pr_url = f"{base}/discussions/{num}"
        elif m and int(m[1]) in repo.pulls:
            repo.pulls[int(m[1])] = commit.oid
        else:
            repo.branches[branch] = commit.oid
        self._json(
            {
                "success": True,
                "commitOid": commit.oid,
                "commitUrl": f"{base}/commit/{commit.oid}",
                "pullRequestUrl": pr_url,
            }
        )

    def _branch(self, method, repo_type, repo_id, branch):
        repo = self._get_repo(repo_type, repo_id, write=True)
        if method == "DELETE":
            if branch == "main":
                raise HTTPError(403, "Cannot delete the default branch")
            if branch not in repo.branches:
                raise HTTPError(404, f"Branch {branch} not found", "RevisionNotFound")
            del repo.branches[branch]
            return self._json({})
        if branch in repo.branches:
            raise HTTPError(409, f"Reference already exists: refs/heads/{branch}")
        start = self._body_json().get("startingPoint")
        oid = self._resolve(repo, start).oid if start else repo.branches["main"]
        repo.branches[branch] = oid
        self._json({})


# ----------------------------------------------------------------------------------------------------------------------
# Client configuration + pytest fixture
# ----------------------------------------------------------------------------------------------------------------------


def configure_hf_client(monkeypatch, endpoint: str, token: str | None, home: str | os.PathLike) -> None:
    """Point huggingface_hub (and transformers, if installed) of THIS process at `endpoint`, with `token`,
    caches under `home`, Xet off, offline mode off. Everything goes through `monkeypatch`, so it is undone at
    teardown. See the module docstring for why environment variables alone are not enough."""
    home = Path(home)
    hub_cache = home / "hub"
    modules = home / "modules"
    for d in (hub_cache, modules):
        d.mkdir(parents=True, exist_ok=True)

    env = {
        "HF_ENDPOINT": endpoint,
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_OFFLINE": "0",
        "TRANSFORMERS_OFFLINE": "0",
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(hub_cache),
        "HF_ASSETS_CACHE": str(home / "assets"),
        "HF_XET_CACHE": str(home / "xet"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_MODULES_CACHE": str(modules),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for k in ("HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_CACHE", "HF_HUB_ENABLE_HF_TRANSFER"):
        monkeypatch.delenv(k, raising=False)
    if token:
        monkeypatch.setenv("HF_TOKEN", token)
    else:
        monkeypatch.delenv("HF_TOKEN", raising=False)

    import huggingface_hub.hf_api as hf_api_mod
    from huggingface_hub import constants
    from huggingface_hub.utils import close_session

    patches = {
        "ENDPOINT": endpoint,
        "HUGGINGFACE_CO_URL_TEMPLATE": endpoint + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_XET": True,
        "HF_HUB_DISABLE_TELEMETRY": True,
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(hub_cache),
        "HUGGINGFACE_HUB_CACHE": str(hub_cache),
        "HF_ASSETS_CACHE": str(home / "assets"),
        "HF_XET_CACHE": str(home / "xet"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "AGENT_HARNESSES_PATH": str(home / ".agent_harnesses.json"),
    }
    for name, value in patches.items():
        monkeypatch.setattr(constants, name, value, raising=False)
    # module-level `api = HfApi()` (behind huggingface_hub.create_repo, upload_folder, whoami, ...)
    monkeypatch.setattr(hf_api_mod.api, "endpoint", endpoint)
    close_session()  # fresh httpx client (no pooled connection from a previous server)

    # transformers: only if already imported (importing it costs seconds). If it gets imported later in the
    # test, it reads HF_MODULES_CACHE from the env set above and creates its cached HfApi lazily from the patched
    # constants; the fixture resets that cached HfApi at teardown.
    th = sys.modules.get("transformers.utils.hub")
    tdm = sys.modules.get("transformers.dynamic_module_utils")
    tu = sys.modules.get("transformers.utils")
    if th is None:
        return
    monkeypatch.setattr(th, "_hf_api", None)  # cached HfApi used by push_to_hub / resolve_revision
    for mod in (th, tu, tdm):
        if mod is not None:
            monkeypatch.setattr(mod, "HF_MODULES_CACHE", str(modules), raising=False)
    (modules / "__init__.py").touch()
    monkeypatch.syspath_prepend(str(modules))  # restored (with whatever transformers appends) at teardown


def block_non_loopback(monkeypatch, blocked: list | None = None) -> list:
    """Refuse (ConnectionRefusedError) every Python-level socket connection that is not to a loopback address,
    and record it in `blocked` (returned). The client treats a refused connection as "offline" and may fall back
    silently, hence the record: the fixture fails the test at teardown if anything was blocked."""
    import ipaddress
    import socket

    blocked = [] if blocked is None else blocked
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def _check(address):
        if isinstance(address, tuple) and address:
            host = str(address[0]).split("%")[0]
            try:
                ok = ipaddress.ip_address(host).is_loopback
            except ValueError:
                ok = host == "localhost"
            if not ok:
                blocked.append(address)
                raise ConnectionRefusedError(f"hub_server: blocked a connection to {address} (tests are offline)")

    def connect(self, address):
        _check(address)
        return real_connect(self, address)

    def connect_ex(self, address):
        _check(address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    return blocked


if pytest is not None:

    @pytest.fixture
    def hub_server(monkeypatch, tmp_path) -> Iterator[HubServer]:
        """A running `HubServer`; huggingface_hub/transformers of this process (and subprocesses, via env vars)
        point at it with `server.token` (a valid write token of `server.user`) and caches under tmp_path/hf_home.
        Connections to non-loopback addresses are refused and make the test fail at teardown."""
        with HubServer() as server:
            configure_hf_client(monkeypatch, server.endpoint, server.token, tmp_path / "hf_home")
            server.blocked_connections = block_non_loopback(monkeypatch)
            try:
                yield server
            finally:
                from huggingface_hub.utils import close_session

                close_session()  # closes keep-alive connections so handler threads end
                th = sys.modules.get("transformers.utils.hub")
                if th is not None:
                    th._hf_api = None
            assert not server.blocked_connections, (
                f"hub_server: the test tried to reach the network: {server.blocked_connections}"
            )
