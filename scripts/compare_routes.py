"""llama-server's native routes, answered by specrun and by llama-server itself (a check, not CI).

Starts llama-server (built from the llama.cpp that llama-cpp-python vendors,
`compare_llama_cpp.build_tools`) and `specrun serve` on the same generated model with
fill-in-the-middle tokens (tests/tinymodels.py, `fim=True`), sends both the same /infill and
/completion requests (text and token ids, greedy, cache off; llama-server with specrun's batch of
512 rows, which sets how much of a long file an infill prompt keeps), and prints, per request, whether
the prompt's token count (`tokens_evaluated`), the reply's text and its stop type are the same;
then, for a streamed /completion with `return_progress` sent twice, whether the
`prompt_progress` chunks (total, cache, processed) are.

    python scripts/compare_routes.py [--llama-bin DIR] [--tokens 24]
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import argparse
import json
import sys
import tempfile
import urllib.request
from pathlib import Path

from compare_llama_cpp import build_tools
from compare_llama_server import llama_server, post

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from serve_helpers import RunningServer  # noqa: E402
from tinymodels import write_tiny_llama  # noqa: E402

from specrun.config import SessionConfig  # noqa: E402
from specrun.serve.server import ServeOptions  # noqa: E402

CODE = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n"
REQUESTS = [
    ("/infill", {"input_prefix": CODE, "input_suffix": "\n\nprint(mul(2, 3))\n"}),
    (
        "/infill",
        {
            "input_prefix": CODE,
            "input_suffix": "\n",
            "prompt": "    return",
            "input_extra": [{"filename": "util.py", "text": CODE}],
        },
    ),
    ("/infill", {"input_prefix": "the cat sat on the", "input_suffix": "and the dog", "input_extra": [{"text": "the mat"}]}),
    ("/completion", {"prompt": CODE}),
    ("/completion", {"prompt": [1, 400, 401, 402, 403]}),
    # llama.vscode's preparation: its extra files with n_predict 0, processed and cached only
    ("/infill", {"input_prefix": "", "input_suffix": "", "input_extra": [{"text": CODE, "filename": "util.py"}], "n_predict": 0}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-bin", type=Path, help="folder with llama-server (built when left out)")
    parser.add_argument("--tokens", type=int, default=24)
    args = parser.parse_args()
    bin_dir = args.llama_bin or build_tools()
    folder = Path(tempfile.mkdtemp(prefix="specrun-routes-"))
    model = write_tiny_llama(folder / "fim.gguf", seed=0, fim=True, endless=True, n_ctx_train=4096)
    ours = RunningServer(SessionConfig(target=model, n_ctx=2048, threads=2), ServeOptions(port=0))
    same = 0
    try:
        # specrun decodes batches of 512 rows, which sets how much of a long file an infill prompt keeps;
        # one slot each, and no store of earlier prompts' states in memory (llama-server's --cache-ram),
        # so that both hold the last request's tokens
        with llama_server(
            bin_dir, model, "none", 2, folder / "llama-server.log", ("-b", "512", "-np", "1", "--cache-ram", "0")
        ) as theirs:
            print("| route | prompt tokens (specrun / llama-server) | same text | stop type (specrun / llama-server) |")
            print("|---|---|---|---|")
            for path, body in REQUESTS:
                body = {"n_predict": args.tokens, "temperature": 0, "cache_prompt": False} | body
                a, b = post(f"{ours.url}{path}", body), post(f"{theirs}{path}", body)
                agree = a["tokens_evaluated"] == b["tokens_evaluated"] and a["content"] == b["content"]
                same += agree and a["stop_type"] == b["stop_type"]
                print(
                    f"| {path} | {a['tokens_evaluated']} / {b['tokens_evaluated']} | {a['content'] == b['content']} "
                    f"| {a['stop_type']} / {b['stop_type']} |"
                )
            # Twice, the prompt cached: the second time each slot holds it but for the token decoded again.
            body = {"prompt": CODE + "    return", "n_predict": 4, "stream": True, "return_progress": True}
            for _ in range(2):
                a, b = progress(f"{ours.url}/completion", body), progress(f"{theirs}/completion", body)
                same += a == b
                print(f"| /completion, streamed, return_progress: (total, cache, processed) | {a} / {b} | {a == b} | |")
    finally:
        ours.stop()
    print(f"{same} of {len(REQUESTS) + 2} requests answered alike")


def progress(url: str, body: dict) -> list[tuple[int, int, int]]:
    """(total, cache, processed) of each `prompt_progress` chunk of a streamed request."""
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        lines = response.read().decode().splitlines()
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    return [(p["total"], p["cache"], p["processed"]) for chunk in chunks if (p := chunk.get("prompt_progress"))]


if __name__ == "__main__":
    main()
