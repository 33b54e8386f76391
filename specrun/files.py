"""Reading text files with one-line errors, and writing files whole or not at all."""

from __future__ import annotations

import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from specrun.errors import SpecrunError


class WriteError(SpecrunError):
    """A file could not be written; nothing of it was left behind."""


def read_text(path: Path, what: str) -> str:
    """A UTF-8 text file, or one line saying why it cannot be read (`what` names it, e.g. "--prompt-file")."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SpecrunError(f"cannot read {what} {path}: {exc.strerror}") from None
    return decode_utf8(data, f"{what} {path}")


def decode_utf8(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise SpecrunError(f"{where} line {line}: not UTF-8 text (byte 0x{data[exc.start]:02x})") from None


def check_writable(path: Path, what: str) -> None:
    """Fail before minutes of work, not after, when `path` cannot be written.

    `what` names the file for the user, e.g. "--json" or "/save".
    """
    if path.is_dir():
        raise WriteError(f"{what} {path} is a directory: give a file name")
    folder = path.parent
    if not folder.is_dir():
        raise WriteError(f"{what} {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise WriteError(f"{what} {path}: folder {folder} is not writable")


@contextmanager
def atomic_path(path: Path, what: str = "") -> Iterator[Path]:
    """A temporary path beside `path` to write to; renamed onto `path` when the block ends
    normally, removed otherwise. Readers never see half a file and a failure leaves nothing.

    An OSError (full disk, a folder where the file should go) becomes one WriteError line.
    """
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}.partial")
    try:
        yield temp
        os.replace(temp, path)
    except OSError as exc:
        label = f"{what} " if what else ""
        raise WriteError(f"cannot write {label}{path}: {exc.strerror or exc}") from None
    finally:
        temp.unlink(missing_ok=True)


def write_text_atomic(path: Path, text: str, what: str = "") -> None:
    with atomic_path(path, what) as temp:
        temp.write_text(text, encoding="utf-8")
