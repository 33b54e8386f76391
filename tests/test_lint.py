"""The code passes the linter and the type checker with the project's settings (pyproject.toml,
[tool.ruff] and [tool.mypy])."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], capture_output=True, text=True,
                            cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_nothing():
    # From the repository root, so mypy reads [tool.mypy] in pyproject.toml (which names specrun/).
    result = subprocess.run([sys.executable, "-m", "mypy"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
