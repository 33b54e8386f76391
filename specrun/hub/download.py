"""Hugging Face hub access through huggingface_hub and its cache (no private cache).

HF_HOME / HF_HUB_CACHE, HF_TOKEN and HF_HUB_OFFLINE are honoured by huggingface_hub
itself; HF_ENDPOINT is re-read here at call time so a mirror set after import works.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx2
from huggingface_hub import HfApi, constants, hf_hub_download, scan_cache_dir, try_to_load_from_cache
from huggingface_hub.errors import (
    CacheNotFound,
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import get_token
from rich.progress import Progress

from specrun.errors import SpecrunError
from specrun.hub.containment import check_name, inside
from specrun.hub.memory import format_bytes
from specrun.hub.progress import download_progress
from specrun.hub.quants import RepoFile

NETWORK_ERRORS = (httpx2.ConnectError, httpx2.TimeoutException, OfflineModeIsEnabled)
HASH_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class RepoListing:
    repo: str
    commit: str
    files: list[RepoFile]
    gated: bool
    cached: bool  # True when read from the local cache instead of the hub


class NetworkUnavailable(Exception):
    """The hub could not be reached; the caller may fall back to the cache."""


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")


def hub_cache_dir() -> Path:
    return Path(constants.HF_HUB_CACHE)


def offline_mode() -> bool:
    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


def repo_url(repo: str) -> str:
    return f"{hub_endpoint()}/{repo}"


def fetch_listing(repo: str) -> RepoListing:
    """Files with sizes and LFS sha256 at the repository's current commit."""
    with hub_errors(repo):
        info = HfApi(endpoint=hub_endpoint()).model_info(repo, files_metadata=True)
    files = [
        RepoFile(s.rfilename, s.lfs.size if s.lfs else (s.size or 0), s.lfs.sha256 if s.lfs else None)
        for s in info.siblings or []
    ]
    return RepoListing(repo, info.sha or "", files, gated=bool(info.gated), cached=False)


def cached_listing(repo: str) -> RepoListing | None:
    """What the local cache holds for a repository: its newest cached revision."""
    try:
        cache = scan_cache_dir(hub_cache_dir())
    except CacheNotFound:
        return None
    for cached_repo in cache.repos:
        if cached_repo.repo_id.lower() == repo.lower() and cached_repo.repo_type == "model":
            revision = max(cached_repo.revisions, key=lambda r: ("main" in r.refs, r.last_modified))
            files = [RepoFile(f.file_path.relative_to(revision.snapshot_path).as_posix(), f.size_on_disk) for f in revision.files]
            return RepoListing(cached_repo.repo_id, revision.commit_hash, files, gated=False, cached=True)
    return None


def cached_path(repo: str, commit: str, filename: str) -> Path | None:
    """The cached copy of a listed file; a name that would leave the cache is refused."""
    what = f"{repo}: file name from the hub"
    check_name(filename, what)
    root = hub_cache_dir()
    found = try_to_load_from_cache(repo, filename, cache_dir=root, revision=commit)
    if not isinstance(found, str):
        return None
    return inside(root, os.path.relpath(found, root).replace(os.sep, "/"), what)


def download(listing: RepoListing, parts: tuple[RepoFile, ...], show_progress: bool = True) -> list[Path]:
    """Fetch every part into the hub cache (resuming dropped transfers), sha256-checked."""
    missing = [p for p in parts if cached_path(listing.repo, listing.commit, p.path) is None]
    if missing:
        check_can_download(listing, missing)
    with download_progress(enabled=show_progress) as progress:
        for part in missing:
            local = fetch_file(listing, part, progress.tqdm_class(part.path.rsplit("/", 1)[-1]))
            verify_sha256(Path(local), part, listing.repo, progress.progress)
    paths = [cached_path(listing.repo, listing.commit, p.path) for p in parts]
    return [p for p in paths if p is not None]


def fetch_file(listing: RepoListing, part: RepoFile, tqdm_class: type | None) -> str:
    """One file through hf_hub_download, which resumes a dropped transfer with a Range request."""
    try:
        with hub_errors(listing.repo):
            return hf_hub_download(
                listing.repo,
                part.path,
                revision=listing.commit,
                cache_dir=hub_cache_dir(),
                endpoint=hub_endpoint(),
                tqdm_class=tqdm_class,
            )
    except NetworkUnavailable as exc:
        raise SpecrunError(
            f"download of {listing.repo}/{part.path} failed, the hub is unreachable ({exc.__cause__}): "
            f"check the connection and run again; no partial file was kept"
        ) from None
    except OSError as exc:  # huggingface_hub's size check, or a full or unwritable disk
        raise SpecrunError(f"download of {listing.repo}/{part.path} failed: {exc}") from None


def check_can_download(listing: RepoListing, missing: list[RepoFile]) -> None:
    """Refuse before the first byte: gated without a token, or too little disk."""
    if listing.gated and get_token() is None:
        raise SpecrunError(gated_message(listing.repo, have_token=False))
    need = sum(p.size for p in missing)
    folder = hub_cache_dir()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if need > free:
        raise SpecrunError(
            f"not enough disk space for {listing.repo}: need {format_bytes(need)}, "
            f"{format_bytes(free)} free in {folder}; free space or set HF_HOME to a larger disk"
        )


def verify_sha256(local: Path, part: RepoFile, repo: str, progress: Progress | None = None) -> None:
    """A downloaded blob must hash to the sha256 the hub lists, else it leaves the cache."""
    if part.sha256 is None:  # small non-LFS files carry only a git hash
        return
    task = progress.add_task(f"sha256 {local.name}", total=part.size) if progress else None
    digest = hashlib.sha256()
    with open(local, "rb") as blob:
        while chunk := blob.read(HASH_CHUNK):
            digest.update(chunk)
            if progress is not None and task is not None:
                progress.advance(task, len(chunk))
    if digest.hexdigest() != part.sha256.lower():
        blob_path = local.resolve()
        local.unlink(missing_ok=True)
        blob_path.unlink(missing_ok=True)
        raise SpecrunError(
            f"download of {repo}/{part.path} is corrupt (sha256 {digest.hexdigest()[:12]}..., "
            f"expected {part.sha256[:12]}...) and was removed from the cache: run the command again"
        )


def gated_message(repo: str, have_token: bool) -> str:
    url = repo_url(repo)
    if have_token:
        return (
            f"{repo} is gated and your Hugging Face token has no access yet: accept the license at "
            f"{url} with the account that owns the token, then retry"
        )
    return (
        f"{repo} is gated: accept the license at {url}, then give a token with "
        f"`hf auth login` or the HF_TOKEN environment variable"
    )


@contextmanager
def hub_errors(repo: str) -> Iterator[None]:
    """Translate huggingface_hub's errors into one line the user can act on."""
    try:
        yield
    except GatedRepoError:
        raise SpecrunError(gated_message(repo, have_token=get_token() is not None)) from None
    except RepositoryNotFoundError:
        raise SpecrunError(
            f"no repository {repo} on {hub_endpoint()} (or it is private): check the name, "
            f"or log in with `hf auth login` if it is yours"
        ) from None
    except (RevisionNotFoundError, EntryNotFoundError) as exc:
        raise SpecrunError(f"{repo} changed while downloading ({type(exc).__name__}): run the command again") from None
    except (LocalEntryNotFoundError, *NETWORK_ERRORS) as exc:
        raise NetworkUnavailable(str(exc)) from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else 0
        if status >= 500:  # the hub is down: as good as offline, the cache may do
            raise NetworkUnavailable(f"HTTP {status}") from exc
        raise SpecrunError(f"the hub answered HTTP {status} for {repo}: try again later") from None
    except httpx2.HTTPError as exc:
        raise SpecrunError(f"download from {hub_endpoint()} failed for {repo}: {exc}") from None
