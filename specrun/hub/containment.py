"""Names from outside (hub listings, specs, profiles, other tools' manifests) stay in their cache.

A name joined into a path must be a plain relative path: no `..`, no absolute path or
drive, no backslash; and once joined, following symlinks must still land inside the
folder it belongs to. Anything else is refused with one line, never followed.
"""

from __future__ import annotations

import re
from pathlib import Path

from specrun.errors import SpecrunError

_DRIVE_RE = re.compile(r"^[A-Za-z]:")


def check_name(name: str, what: str) -> str:
    """`name` unchanged when it is a plain relative path; refused otherwise."""
    plain = (
        "\\" not in name
        and "\x00" not in name
        and not _DRIVE_RE.match(name)
        and all(part not in ("", ".", "..") for part in name.split("/"))
    )
    if not plain:
        raise SpecrunError(f"{what}: {name!r} is not a plain relative name (no '..', no absolute path); refused")
    return name


def inside(root: Path, name: str, what: str) -> Path:
    """root/name, refused unless it stays inside root with symlinks followed."""
    check_name(name, what)
    path = root / name
    base = root.resolve()
    if not path.resolve().is_relative_to(base):
        raise SpecrunError(f"{what}: {name!r} leads outside {root} (through a symlink); refused")
    return path
