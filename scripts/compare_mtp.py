"""specrun's MTP drafts against llama.cpp's own draft-mtp, draft by draft (a cross-check, not CI).

Writes a tiny random qwen35 GGUF with one MTP (NextN) block (tests/tinyhybrid.py), builds
llama-server from the llama.cpp that the installed llama-cpp-python vendors, and runs both
greedily on the same prompt: llama-server with `--spec-type draft-mtp` on a free loopback port
(stopped by its process id), at log verbosity 5, where llama.cpp's speculative.cpp logs each
draft call's candidates; and specrun with `--draft mtp` at the same fixed k, recording each
draft. Prints, per k, how many draft calls each made, how many drafts were identical token for
token, and whether the generated tokens were.

    python scripts/compare_mtp.py [--k 1,2,3,4] [--tokens 64] [--build DIR]
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import argparse
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from compare_llama_cpp import build_tools
from compare_llama_server import free_port, post

from specrun.config import SessionConfig
from specrun.drafts.mtp import MtpDraft
from specrun.session import Session

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "tests"))
from tinyhybrid import write_tiny_qwen35  # noqa: E402

PROMPT = "Hello world, the cat and the dog were there. What time is it now"
CANDIDATE = re.compile(rb"draft candidate\s+0, pos\s+(\d+):\s+(-?\d+) ")


def llama_drafts(
    bin_dir: Path, spec: list, k: int, tokens: int, log: Path, impl: str = "draft-mtp"
) -> tuple[list[list[int]], list[int]]:
    """llama-server's draft calls with `spec` (the model and drafter arguments; its speculative
    implementation `impl`): each call's drafted tokens, in order, and its generated tokens."""
    port = free_port()
    cmd = [
        bin_dir / "llama-server",
        *spec,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-t",
        "1",
        "-c",
        "1024",
        "-np",
        "1",
        "--no-webui",
        "--no-repack",
        "--spec-type",
        impl,
        "--spec-draft-n-max",
        str(k),
        "-lv",
        "5",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            if process.poll() is not None:
                sys.exit(f"compare_mtp: llama-server exited; see {log}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        start = log.stat().st_size
        reply = post(
            f"{url}/completion",
            {"prompt": PROMPT, "n_predict": tokens, "temperature": 0, "top_k": 1, "cache_prompt": False, "return_tokens": True},
        )
        time.sleep(1)  # its log is written asynchronously
    finally:
        process.terminate()
        process.wait(timeout=30)
    drafts: list[list[int]] = []
    current: dict[int, int] = {}
    for line in log.read_bytes()[start:].split(b"\n"):
        if match := CANDIDATE.search(line):
            current[int(match[1])] = int(match[2])
        elif f"called impl {impl}".encode() in line:
            drafts.append([current[i] for i in sorted(current)])  # DSpark without its anchor logs from 1
            current = {}
    return drafts, reply["tokens"]


def specrun_drafts(config: SessionConfig, source: type, tokens: int) -> tuple[list[list[int]], list[int]]:
    """The draft calls of specrun's `source` (its class) and the generated tokens, greedy at the config's k."""
    drafts: list[list[int]] = []
    propose = source.propose

    def recording(self, history, request):
        draft = yield from propose(self, history, request)
        drafts.append(list(draft.tokens))
        return draft

    source.propose = recording
    try:
        with Session(config) as session:
            generated = session.generate(PROMPT, max_tokens=tokens).tokens
    finally:
        source.propose = propose
    return drafts, generated


def compare(theirs: tuple[list[list[int]], list[int]], ours: tuple[list[list[int]], list[int]], k: int) -> None:
    """One line: the draft calls each made, how many were identical, and whether the text was."""
    (their_drafts, their_tokens), (our_drafts, our_tokens) = theirs, ours
    # Near the end both cut a draft to what can still be emitted; llama.cpp logs it whole.
    same = sum(mine == full[: len(mine)] for mine, full in zip(our_drafts, their_drafts))
    print(
        f"k {k}: draft calls specrun {len(our_drafts)}, llama.cpp {len(their_drafts)}; identical {same} of "
        f"{min(len(our_drafts), len(their_drafts))}; generated tokens identical: "
        f"{our_tokens == their_tokens[: len(our_tokens)]} ({len(our_tokens)} tokens)"
    )


def arguments(description: str) -> argparse.ArgumentParser:
    """The options every comparison takes: the ks, the tokens generated, where llama.cpp is built."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--k", default="1,2,3,4")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--build", type=Path, default=Path(tempfile.gettempdir()) / "llama-tools")
    return parser


def main() -> None:
    args = arguments(__doc__.splitlines()[0]).parse_args()
    bin_dir = build_tools(args.build, ["llama-server"])
    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_qwen35(Path(tmp) / "qwen35-mtp.gguf", nextn=True, trunk_scale=0.5, mtp_agree=1.0, mtp_scale=0.3)
        for k in (int(value) for value in args.k.split(",")):
            spec = ["-m", model, "--spec-draft-p-min", "0", "--spec-draft-n-min", "0"]  # k tokens a draft, as a fixed k
            theirs = llama_drafts(bin_dir, spec, k, args.tokens, Path(tmp) / f"server-{k}.log")
            config = SessionConfig(target=model, sources=("mtp",), k=k, n_ctx=1024, threads=1)
            compare(theirs, specrun_drafts(config, MtpDraft, args.tokens), k)


if __name__ == "__main__":
    main()
