"""The table of bad inputs and what each prints, from the tests that check them.

Runs tests/test_cli_errors.py (every row there is a command line that must end in one
`error:` line, exit 2 and nothing written) and prints a Markdown table of each command
line and the line it printed, as recorded by the tests.

    python scripts/error_table.py > table.md
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED_TEST = "test_shared_options_refuse_bad_values["  # checked on generate, chat, bench and serve alike


def tidy(line: str) -> str:
    """The tests' scratch folders as the names a reader would use."""
    line = re.sub(r"\S*/tiny\d*/target\.gguf", "tiny.gguf", line)
    line = re.sub(r"\S*/recurrent\d*/", "", line)  # the tiny recurrent targets, by file name
    line = re.sub(r"/\S*/config/", "$XDG_CONFIG_HOME/", line)
    return re.sub(r"/\S*/work/", "./", line)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "errors.xml"
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                str(ROOT / "tests" / "test_cli_errors.py"),
                f"--junitxml={report}",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        print(run.stdout.strip().splitlines()[-1], file=sys.stderr)
        cases = ElementTree.parse(report).getroot().iter("testcase")
        rows = []
        for case in cases:
            recorded = {prop.get("name"): prop.get("value") for prop in case.iter("property")}
            shared_elsewhere = case.get("name", "").startswith(SHARED_TEST) and not recorded.get("input", "").startswith(
                "generate "
            )
            if "refusal" in recorded and not shared_elsewhere:  # shared options: shown once, on generate
                rows.append((recorded["input"], tidy(recorded["refusal"])))
    print("| input | what specrun prints (exit 2) |")
    print("|---|---|")
    for command, line in rows:
        cell = line.replace("|", "\\|")
        print(f"| `{command}` | {cell} |")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
