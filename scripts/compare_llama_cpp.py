"""specrun against llama.cpp's own tools on the same GGUF, prompts and threads (benchmark, not CI).

Builds llama-bench, llama-completion, llama-lookup and llama-speculative-simple from the
llama.cpp that the installed llama-cpp-python vendors (its source distribution), then runs,
interleaved per prompt: llama.cpp's tool, then specrun's equivalent. Greedy, tokens/s over
generated tokens after the prompt.

    python scripts/compare_llama_cpp.py [--prompts scripts/prompts/copy_heavy.txt] [--draft D.gguf]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import llama_cpp

from specrun.hub.embedded import embedded_model_path

HERE = Path(__file__).parent
TOOLS = ["llama-bench", "llama-completion", "llama-lookup", "llama-speculative-simple"]
DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
EVAL = re.compile(r"\beval time =\s+([\d.]+) ms /\s+(\d+) runs")
ACCEPT = re.compile(r"accept\s+=\s+([\d.]+)%")


def build_tools(build: Path, tools: list[str] = TOOLS, version: str | None = None) -> Path:
    """`tools` built from the llama.cpp that llama-cpp-python `version` (default: the installed one)
    vendors; their folder."""
    if all((build / "bin" / tool).exists() for tool in tools):
        return build / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        version = version or llama_cpp.__version__
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"llama-cpp-python=={version}",
                "-d",
                tmp,
            ],
            check=True,
        )
        archive = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        source = next(p for p in Path(tmp).glob("llama_cpp_python-*") if p.is_dir()) / "vendor" / "llama.cpp"
        subprocess.run(
            [
                "cmake",
                "-S",
                source,
                "-B",
                build,
                "-DCMAKE_BUILD_TYPE=Release",
                "-DLLAMA_CURL=OFF",
                "-DLLAMA_BUILD_TESTS=OFF",
                "-DLLAMA_BUILD_SERVER=ON",
                "-DGGML_RPC=ON",
            ],
            check=True,
        )
        subprocess.run(["cmake", "--build", build, "-j", str(os.cpu_count() or 1), "--target", *tools], check=True)
    return build / "bin"


def read_prompts(path: Path) -> list[str]:
    """Prompts separated by lines of `---`; a missing file ends the script with one line."""
    if not path.is_file():
        sys.exit(f"{Path(sys.argv[0]).name}: prompts file not found: {path} (give --prompts FILE)")
    return [p.strip("\n") + "\n" for p in path.read_text().split("\n---\n") if p.strip()]


def tool_speed(cmd: list, prompt_file: Path) -> tuple[float, float | None]:
    out = subprocess.run([*map(str, cmd), "-f", prompt_file], capture_output=True, text=True, check=True)
    log = out.stdout + out.stderr
    if m := DECODED.search(log):
        accept = ACCEPT.search(log)
        return int(m[1]) / float(m[2]), float(accept[1]) / 100 if accept else None
    ms, runs = EVAL.findall(log)[-1]
    return int(runs) / (float(ms) / 1000), None


def specrun_speed(args: list, prompt: str) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, "-m", "specrun", "generate", *map(str, args), "--json"],
        input=prompt,
        capture_output=True,
        text=True,
        check=True,
    )
    stats = json.loads(out.stdout)["stats"]
    return stats["tokens_per_s"], stats["acceptance_rate"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=Path, default=HERE / "prompts" / "copy_heavy.txt")
    parser.add_argument("--draft", type=Path, help="draft GGUF for llama-speculative-simple vs specrun --draft")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--build", type=Path, default=Path(tempfile.gettempdir()) / "llama-tools")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    prompts = read_prompts(args.prompts)
    bin_dir, model = build_tools(args.build), embedded_model_path()
    n, t = str(args.tokens), str(args.threads)
    common = ["-m", model, "-n", n, "-t", t, "-c", "2048", "--temp", "0", "--no-repack"]  # as specrun runs
    ours = ["--target", model, "-n", n, "-t", t, "-c", "2048"]
    pairs = {
        "plain": ([bin_dir / "llama-completion", *common], ours),
        "lookup k8": ([bin_dir / "llama-lookup", *common, "--spec-draft-n-max", "8"], [*ours, "--lookup", "--k", "8"]),
        "lookup k16": ([bin_dir / "llama-lookup", *common, "--spec-draft-n-max", "16"], [*ours, "--lookup", "--k", "16"]),
        "lookup auto": ([bin_dir / "llama-lookup", *common, "--spec-draft-n-max", "16"], [*ours, "--lookup", "--k", "auto"]),
    }
    if args.draft:
        pairs["draft"] = (
            [bin_dir / "llama-speculative-simple", *common, "--spec-type", "draft-simple", "-md", args.draft],
            [*ours, "--draft", args.draft, "--k", "auto"],
        )
    bench = subprocess.run(
        [bin_dir / "llama-bench", "-m", model, "-p", "0", "-n", n, "-t", t, "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    print(f"llama-bench tg{n}: {json.loads(bench.stdout)[0]['avg_ts']:.1f} tok/s")
    results: dict[str, dict[str, list]] = {name: {"llama.cpp": [], "specrun": [], "acc": []} for name in pairs}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for i, prompt in enumerate(prompts):
                prompt_file = Path(tmp) / f"p{i}.txt"
                prompt_file.write_text(prompt)
                for name, (tool, spec) in pairs.items():
                    speed, accept = tool_speed(tool, prompt_file)
                    results[name]["llama.cpp"].append(speed)
                    results[name]["acc"].append(accept)
                    results[name]["specrun"].append(specrun_speed(spec, prompt)[0])
    plain_ours = statistics.median(results["plain"]["specrun"])
    print(f"{'method':12} {'llama.cpp tok/s':>16} {'specrun tok/s':>14} {'ratio':>6} {'vs specrun plain':>17}")
    for name, r in results.items():
        theirs, ours_ = statistics.median(r["llama.cpp"]), statistics.median(r["specrun"])
        print(f"{name:12} {theirs:16.1f} {ours_:14.1f} {ours_ / theirs:6.2f} {ours_ / plain_ours:17.2f}")
    print("per prompt, tok/s (llama.cpp | specrun):")
    for name, r in results.items():
        pairs_text = "  ".join(f"{theirs:.1f}|{ours_:.1f}" for theirs, ours_ in zip(r["llama.cpp"], r["specrun"]))
        print(f"  {name:12} {pairs_text}")
    fastest_lookup = max(statistics.median(results[name]["llama.cpp"]) for name in ("lookup k8", "lookup k16"))
    auto = statistics.median(results["lookup auto"]["specrun"])
    print(f"specrun --lookup --k auto / llama-lookup at its faster of k8 and k16: {auto / fastest_lookup:.2f}")


if __name__ == "__main__":
    main()
