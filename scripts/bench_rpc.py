"""Speculation with the target on llama.cpp rpc-servers behind a network delay (benchmark, not CI).

Starts two rpc-servers on loopback ports and splits the target over them (`--rpc`), each
behind a proxy that holds every chunk of bytes for D ms in each direction, to stand for a
local network (the kernel here has no netem). At each delay, and without RPC, it runs
`specrun bench` with plain decoding, prompt lookup and a draft model (a derived draft,
`specrun pair derive`, unless --draft is given), which stays on this machine, and prints
tokens/s and speed-up over plain at that delay. A delay of 0 runs without a proxy.

    python scripts/bench_rpc.py [--target T.gguf] [--draft D.gguf | --layers 0-5,12-17|auto]
        [--delays 0,0.5,2] [--prompts scripts/prompts/copy_heavy.txt] [--max-tokens 128]
        [--k auto] [--repeat 1] [--rpc-server PATH] [--json OUT]

The rpc-server comes from --rpc-server, $SPECRUN_RPC_SERVER or PATH (`specrun doctor` prints
how to build one from the installed llama-cpp-python's source). Each bench runs with its own
empty verify-cost cache: the costs of a decode change with the delay.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from specrun.backend import rpc
from specrun.errors import SpecrunError
from specrun.hub.embedded import embedded_model_path

HERE = Path(__file__).parent
CHUNK = 1 << 16


class DelayProxy:
    """Forwards 127.0.0.1:<port> to `upstream`, each chunk held `delay_ms` in each direction.

    Threads, not asyncio: asyncio's timers round up to whole milliseconds, too coarse for 0.5 ms.
    Chunks keep their order and are delayed independently, as on a wire (latency, not bandwidth).
    """

    def __init__(self, upstream: str, delay_ms: float):
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.delay = delay_ms / 1000
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self.upstream)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # Nagle would add its own delay
            self._pipe(client, server)
            self._pipe(server, client)

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        held: queue.Queue = queue.Queue()

        def read() -> None:
            while True:
                try:
                    data = source.recv(CHUNK)
                except OSError:
                    data = b""
                held.put((time.perf_counter() + self.delay, data))
                if not data:
                    return

        def write() -> None:
            while True:
                due, data = held.get()
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                try:
                    if not data:
                        sink.shutdown(socket.SHUT_WR)
                        return
                    sink.sendall(data)
                except OSError:
                    return

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=write, daemon=True).start()


class RpcServer:
    def __init__(self, binary: str, threads: int):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.endpoint = f"127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [binary, "-H", "127.0.0.1", "-p", str(port), "-t", str(threads)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                rpc.check_server(self.endpoint, connect_timeout=1, answer_timeout=5)
                return
            except SpecrunError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"bench_rpc.py: {binary} did not start on {self.endpoint}")
                time.sleep(0.1)

    def stop(self) -> None:
        self.proc.kill()  # by the PID started here
        self.proc.wait(timeout=10)


def find_rpc_server(given: str | None) -> str:
    binary = given or os.environ.get("SPECRUN_RPC_SERVER") or shutil.which("ggml-rpc-server") or shutil.which("rpc-server")
    if not binary or not Path(binary).is_file():
        sys.exit(
            "bench_rpc.py: no rpc-server: give --rpc-server PATH or set SPECRUN_RPC_SERVER "
            "(`specrun doctor` prints how to build one from the installed llama-cpp-python)"
        )
    return binary


def specrun(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "specrun", *args], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"bench_rpc.py: specrun {' '.join(args[:2])} failed:\n{result.stderr.strip()}")
    return result


def derive_draft(target: Path, layers: str, folder: Path) -> Path:
    """`specrun pair derive` with these layers, or with --auto (measured choice) for "auto"."""
    out = folder / "derived-draft.gguf"
    choice = ["--auto"] if layers == "auto" else ["--layers", layers]
    specrun("pair", "derive", "--target", str(target), *choice, "-o", str(out))
    return out


def run_bench(args, target: Path, draft: Path, rpc_flag: str | None, folder: Path) -> dict:
    out = folder / "bench.json"
    command = [
        "bench",
        str(args.prompts),
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--methods",
        "plain,lookup,draft",
        "--k",
        args.k,
        "--max-tokens",
        str(args.max_tokens),
        "--repeat",
        str(args.repeat),
        "--threads",
        str(args.threads),
        "--json",
        str(out),
    ]
    if rpc_flag:
        command += ["--rpc", rpc_flag]
    with tempfile.TemporaryDirectory() as cache:  # verify costs measured afresh for each set-up
        specrun(*command, env={**os.environ, "XDG_CACHE_HOME": cache})
    return json.loads(out.read_text())


def rows(label: str, document: dict) -> list[dict]:
    found = [{"setting": label, "method": "plain", "k": "", **document["plain"]}]
    found += [{"setting": label, **row} for row in document["summary"].values()]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, help="Target GGUF (default: the embedded Gemma 3 270M).")
    parser.add_argument("--draft", type=Path, help="Draft GGUF (default: derived from the target with --layers).")
    parser.add_argument("--layers", default="0-5,12-17", help="Layers of the derived draft, or 'auto' (default 0-5,12-17).")
    parser.add_argument("--delays", default="0,0.5,2", help="Added one-way delays in ms (0: RPC without a proxy).")
    parser.add_argument("--prompts", type=Path, default=HERE / "prompts" / "copy_heavy.txt")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", default="auto", help="specrun bench --k (comma list).")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="Local threads (the draft, and the target without RPC).")
    parser.add_argument("--server-threads", type=int, default=1, help="Threads of each rpc-server.")
    parser.add_argument("--rpc-server", help="Path to llama.cpp's ggml-rpc-server.")
    parser.add_argument("--json", type=Path, help="Write every row as JSON here.")
    args = parser.parse_args()
    if not args.prompts.is_file():
        sys.exit(f"bench_rpc.py: prompts file not found: {args.prompts} (give --prompts FILE)")
    delays = [float(d) for d in args.delays.split(",")]
    binary = find_rpc_server(args.rpc_server)
    target = args.target or embedded_model_path()

    table: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        draft = args.draft or derive_draft(target, args.layers, folder)
        print(f"target {target}, draft {draft}; {args.prompts.name}, {args.max_tokens} tokens, k {args.k}", file=sys.stderr)
        table += rows("no RPC", run_bench(args, target, draft, None, folder))
        servers = [RpcServer(binary, args.server_threads) for _ in range(2)]
        try:
            for delay in delays:
                proxies = [DelayProxy(s.endpoint, delay) for s in servers] if delay else []
                endpoints = [p.endpoint for p in proxies] or [s.endpoint for s in servers]
                label = f"RPC x2, +{delay:g} ms each way" if delay else "RPC x2, no added delay"
                print(f"{label} ...", file=sys.stderr)
                table += rows(label, run_bench(args, target, draft, ",".join(endpoints), folder))
                for proxy in proxies:
                    proxy.close()
        finally:
            for server in servers:
                server.stop()

    print(f"{'setting':<28} {'method':<7} {'k':>5} {'tok/s':>8} {'speed-up':>9} {'accepted':>9}")
    for row in table:
        accepted = f"{row['acceptance_rate']:.0%}" if row["method"] != "plain" else ""
        print(
            f"{row['setting']:<28} {row['method']:<7} {row['k']!s:>5} {row['tokens_per_s']:>8.1f} "
            f"{row['speedup']:>8.2f}x {accepted:>9}"
        )
    if args.json:
        args.json.write_text(json.dumps(table, indent=2) + "\n")


if __name__ == "__main__":
    main()
