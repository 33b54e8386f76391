"""The code passes the linter, the formatter's check and the type checker with the project's
settings (pyproject.toml, [tool.ruff] and [tool.mypy])."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_code_is_formatted():
    # ruff's formatter, pinned to one minor release in pyproject.toml: its style changes only between those.
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", str(ROOT)], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stdout + result.stderr + "\nrun `ruff format` in the repository root"


def test_mypy_finds_nothing():
    # From the repository root, so mypy reads [tool.mypy] in pyproject.toml (which names specrun/).
    result = subprocess.run([sys.executable, "-m", "mypy"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
