"""Screenshot of `specrun serve`'s chat page after real replies (docs/chat-page.png).

Drives Debian's Chromium headless through Playwright against a server already running, sends
each prompt (the last one with "Reply as JSON" and a schema, so grammar-forced tokens show), waits for
every reply, and saves the whole page:

    specrun serve --target ~/.cache/specrun-ci/SmolLM2-135M-Instruct.Q4_1.gguf --k 4 --port 8080 &
    python scripts/page_screenshot.py --url http://127.0.0.1:8080 --out docs/chat-page.png
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import argparse
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from serve_helpers import CHROMIUM_ARGS  # noqa: E402

SCHEMA = '{"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]}'
PROMPTS = [
    "Fix the typo and repeat the sentence: The quick brown fox jumpd over the lazy dog by the old red barn.",
    "Describe a cat named Ada, who is 3 years old, as JSON.",
]
WAIT_MS = 120_000


def reply(page: Page, prompt: str, as_json: bool) -> None:
    page.set_checked("#json", as_json)
    page.fill("#prompt", prompt)
    page.press("#prompt", "Enter")
    page.wait_for_function("() => document.getElementById('send').textContent === 'Stop'", timeout=WAIT_MS)
    page.wait_for_function("() => document.getElementById('send').textContent === 'Send'", timeout=WAIT_MS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the running server, e.g. http://127.0.0.1:8080")
    parser.add_argument("--out", default="docs/chat-page.png")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--max-tokens", type=int, default=80)
    args = parser.parse_args()
    with sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
        browser = playwright.chromium.launch_persistent_context(
            profile, executable_path=args.chromium, args=CHROMIUM_ARGS, viewport={"width": 1100, "height": 700}
        )
        page = browser.new_page()
        page.goto(args.url)
        page.wait_for_function("() => document.getElementById('model').textContent !== '…'", timeout=WAIT_MS)
        page.fill("#system", "You are a helpful assistant.")
        page.fill("#temperature", "0")
        page.fill("#max-tokens", str(args.max_tokens))
        page.fill("#schema", SCHEMA)
        for i, prompt in enumerate(PROMPTS):
            reply(page, prompt, as_json=i == len(PROMPTS) - 1)
        page.evaluate("() => document.activeElement.blur()")  # no focus ring in the picture
        page.wait_for_function("() => document.getElementById('slots').textContent.startsWith('0 of')", timeout=WAIT_MS)
        page.screenshot(path=args.out, full_page=True)
        browser.close()
    print(args.out)


if __name__ == "__main__":
    main()
