"""Read a hub GGUF's header with HTTP range requests, never its weights.

The header (metadata, token list, tensor table) sits at the start of the file. We fetch a
growing prefix into a sparse file as large as the remote one, so GGUFReader can parse it
unchanged; the tensor bytes it maps are holes that are never read. A parse counts only if
GGUFReader's data offset (the end of the header) lies inside the bytes fetched: every
byte it read is then real, not a hole.
"""

from __future__ import annotations

import re
import struct
import tempfile
from pathlib import Path
from urllib.parse import quote

from gguf import GGUFReader
from huggingface_hub import get_session
from huggingface_hub.utils import build_hf_headers

from specrun.errors import SpecrunError
from specrun.headers.read import ModelFacts, PlainArrayReader, facts_from_reader
from specrun.hub.containment import check_name
from specrun.hub.download import hub_endpoint

FIRST_FETCH = 4 << 20  # most headers fit (Gemma 3: 6.2 MiB with its 262k-token vocabulary)
MAX_HEADER = 256 << 20  # a header larger than this is not a header we can use
CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")


def read_remote(repo_id: str, filename: str, revision: str | None = None, endpoint: str | None = None) -> ModelFacts:
    check_name(filename, f"{repo_id}: file name")
    # The hub's resolve URL, built like hf_hub_url but with the endpoint the hub
    # package uses (HF_ENDPOINT read now, not at import time).
    base = (endpoint or hub_endpoint()).rstrip("/")
    url = f"{base}/{repo_id}/resolve/{quote(revision or 'main', safe='')}/{quote(filename)}"
    source = f"{repo_id}/{filename}"
    with tempfile.TemporaryDirectory(prefix="specrun-header-") as tmp:
        return _read_prefix_until_parsed(url, source, Path(tmp) / "header.gguf")


def _read_prefix_until_parsed(url: str, source: str, sparse: Path) -> ModelFacts:
    fetched, want = 0, FIRST_FETCH
    chunk, total = fetch_range(url, source, 0, want)
    sparse.write_bytes(chunk)
    fetched = len(chunk)
    while True:
        reader = _parse_prefix(sparse, fetched, total)
        if reader is not None:
            return facts_from_reader(reader, source=source, file_size=total)
        if fetched >= min(total, MAX_HEADER):
            raise SpecrunError(f"{source}: no complete GGUF header in the first {fetched >> 20} MiB; is it a GGUF file?")
        want = min(fetched * 2, MAX_HEADER, total)  # doubling: at most 2x the header fetched
        chunk, _ = fetch_range(url, source, fetched, want)
        with sparse.open("r+b") as out:
            out.seek(fetched)
            out.write(chunk)
        fetched += len(chunk)


def _parse_prefix(sparse: Path, fetched: int, total: int) -> GGUFReader | None:
    """GGUFReader over the prefix, or None when the header runs past what we have."""
    with sparse.open("r+b") as out:
        out.truncate(total)  # holes, not bytes on disk
    try:
        reader = PlainArrayReader(sparse)
    except (ValueError, KeyError, IndexError, OverflowError, struct.error):
        return None  # ran into the zero-filled holes; fetch more
    # data_offset is the header's end rounded up to the alignment; a file without
    # tensors may end before that rounding.
    return reader if min(reader.data_offset, total) <= fetched else None


def fetch_range(url: str, source: str, start: int, end: int) -> tuple[bytes, int]:
    """Bytes [start, end) of url and the file's total size, via one Range request."""
    headers = {**build_hf_headers(), "Range": f"bytes={start}-{end - 1}"}
    try:
        with get_session().stream("GET", url, headers=headers) as response:
            _raise_for_status(response.status_code, source)
            total = _total_size(response.headers.get("content-range", ""), source)
            body = b"".join(response.iter_bytes())
    except Exception as exc:
        if not _is_transport_error(exc):
            raise
        raise SpecrunError(
            f"{source}: cannot read the header from the hub ({exc}); check the connection or pass a local path"
        ) from None
    return body[: end - start], total


def _is_transport_error(exc: Exception) -> bool:
    """Connection/timeout errors of whichever HTTP client huggingface_hub uses."""
    client_modules = {"httpx", "httpx2", "requests", "urllib3", "h11", "httpcore"}
    return isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in client_modules


def _raise_for_status(status: int, source: str) -> None:
    if status == 206:
        return
    if status in (401, 403):
        raise SpecrunError(
            f"{source}: the repository is gated or private; accept its terms on the hub and log in (`hf auth login` or HF_TOKEN)"
        )
    if status == 404:
        raise SpecrunError(f"{source}: not found on the hub; check owner/repo/file.gguf")
    if status == 200:
        raise SpecrunError(f"{source}: the server ignored the Range request; reading the header would download the whole file")
    raise SpecrunError(f"{source}: the hub answered HTTP {status}")


def _total_size(content_range: str, source: str) -> int:
    match = CONTENT_RANGE.fullmatch(content_range.strip())
    if not match:
        raise SpecrunError(f"{source}: the hub's answer has no usable Content-Range")
    return int(match.group(3))
