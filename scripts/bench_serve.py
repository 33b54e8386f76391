"""specrun serve against llama-server on the same GGUF and threads, through the OpenAI API (benchmark, not CI).

Builds llama-server from the llama.cpp that the installed llama-cpp-python vendors (as
compare_llama_cpp.py builds llama-lookup), starts every server set-up, and replays the
workloads one request at a time (streamed, greedy, timed from the client):

  - agent: the same JSON fields extracted from N short documents (structured output that
    repeats across requests: where drafts learned across requests should pay);
  - copy: the copy-heavy prompts of compare_llama_cpp.py.

Every set-up runs at once and each request goes to each of them in turn (interleaved).
Set-ups: llama-server with no speculation, --spec-type ngram-simple, ngram-mod (its
defaults) and ngram-mod with n-max 64 (dropped when that is already its default);
specrun serve with drafts learned across requests (the default) and with per-request
lookup only (--store-tokens 0); with --baseline DIR, both again as another checkout has
them (to measure a change, before and after, in one interleaved run). Reported: tokens/s per workload and the ratios the issue
asks for, the server's overhead per request (client wall time minus the server's own
prompt_ms + predicted_ms), and the first streamed chunk's latency after prefill (time to
the first text chunk minus prompt_ms; it includes the first step's decode).

    python scripts/bench_serve.py [--target GGUF] [--threads 2] [--agent-requests 20] [--max-tokens 128] [--rounds 1]
    python scripts/bench_serve.py --baseline /tmp/before   # after git worktree add /tmp/before REV
    python scripts/bench_serve.py --memory [--requests 1000]   # resident memory after 100 and after N requests
    python scripts/bench_serve.py --conversation [--turns 10]  # first chunk of each chat turn (the prompt cache)
    python scripts/bench_serve.py --clients 1,4,8 --baseline /tmp/before   # concurrent clients: aggregate tok/s, first-token p95
    python scripts/bench_serve.py --clients 4 --compare /tmp/head   # and specrun --parallel 4 as another checkout has it
    python scripts/bench_serve.py --target tiny.gguf --agent-requests 3 --copy-prompts 1 --max-tokens 16   # a quick run
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import argparse
import json
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from chat_ttft import MESSAGES
from compare_llama_cpp import build_tools, read_prompts

from specrun.hub.embedded import embedded_model_path

HERE = Path(__file__).parent

# --- workloads ------------------------------------------------------------------------------
PEOPLE = [
    ("Maria Lopez", 34, "architect", "Madrid", "Estudio Norte", 2015),
    ("James Carter", 52, "pilot", "Denver", "Summit Air", 1998),
    ("Aiko Tanaka", 29, "data analyst", "Osaka", "Kansai Retail", 2019),
    ("Olu Adeyemi", 41, "civil engineer", "Lagos", "Delta Works", 2007),
    ("Sofia Rossi", 37, "pharmacist", "Turin", "Farmacia Centrale", 2012),
    ("Liam Murphy", 45, "carpenter", "Cork", "Murphy and Sons", 2001),
    ("Chen Wei", 31, "software developer", "Shenzhen", "Bright Path", 2017),
    ("Fatima Zahra", 26, "nurse", "Rabat", "Avicenne Clinic", 2021),
    ("Erik Lindqvist", 58, "ship captain", "Gothenburg", "Nordic Lines", 1990),
    ("Priya Nair", 33, "teacher", "Kochi", "Green Valley School", 2014),
    ("Lucas Martin", 48, "chef", "Lyon", "Le Bouchon", 2003),
    ("Anna Kowalska", 39, "accountant", "Krakow", "Vistula Finance", 2010),
    ("Diego Silva", 27, "electrician", "Porto", "Luz Servicos", 2020),
    ("Hannah Becker", 44, "veterinarian", "Hamburg", "Elbe Animal Care", 2005),
    ("Kwame Mensah", 36, "journalist", "Accra", "Daily Coast", 2013),
    ("Elena Petrova", 50, "translator", "Sofia", "Balkan Words", 1999),
    ("Tom Nguyen", 30, "mechanic", "Hanoi", "Red River Motors", 2018),
    ("Grace Kim", 42, "dentist", "Busan", "Harbor Dental", 2006),
    ("Mateo Garcia", 35, "photographer", "Bogota", "Andes Studio", 2011),
    ("Nora Haddad", 28, "biologist", "Beirut", "Cedar Labs", 2022),
]
EXAMPLE = ("Peter Novak", 40, "baker", "Brno", "Golden Crust", 2008)
FIELDS = ("name", "age", "occupation", "city", "employer", "start_year")


def document(person: tuple) -> str:
    name, age, job, city, employer, year = person
    return (
        f"{name} is a {age}-year-old {job} who lives in {city}. After years of training, "
        f"{name.split()[0]} joined {employer} in {year} and still works there today."
    )


def record(person: tuple) -> str:
    return json.dumps(dict(zip(FIELDS, person)))


def agent_prompts(count: int) -> list[str]:
    head = (
        f"Extract the person's details from each document as one line of JSON with the fields "
        f"{', '.join(FIELDS)}.\n\nDocument: {document(EXAMPLE)}\nJSON: {record(EXAMPLE)}\n\n"
    )
    return [f"{head}Document: {document(PEOPLE[i % len(PEOPLE)])}\nJSON:" for i in range(count)]


# --- servers --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setup:
    name: str
    kind: str  # "llama-server" or "specrun"
    args: tuple[str, ...] = ()
    checkout: Path | None = None  # where `python -m specrun` runs, so it imports that checkout's code
    parallel: int = 1  # requests it runs at once (llama-server -np, specrun --parallel), each with the context size


def llama_server_setups(bin_dir: Path) -> list[Setup]:
    """llama-server without speculation and with each n-gram type it has."""
    llama = [
        Setup("llama-server none", "llama-server"),
        Setup("llama-server ngram-simple", "llama-server", ("--spec-type", "ngram-simple")),
        Setup("llama-server ngram-mod", "llama-server", ("--spec-type", "ngram-mod")),
    ]
    if ngram_mod_default_n_max(bin_dir) != 64:
        llama.append(
            Setup("llama-server ngram-mod n-max 64", "llama-server", ("--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "64"))
        )
    else:
        print("note: ngram-mod's default n-max is already 64 in this build; its 'n-max 64' set-up is the default one")
    return llama


def setups(bin_dir: Path, baseline: Path | None) -> list[Setup]:
    specrun = [
        Setup("specrun cross-request", "specrun"),
        Setup("specrun per-request lookup", "specrun", ("--store-tokens", "0")),
    ]
    if baseline:
        specrun += [Setup(f"{s.name} @ baseline", s.kind, s.args, baseline.resolve()) for s in specrun]
    return llama_server_setups(bin_dir) + specrun


def ngram_mod_default_n_max(bin_dir: Path) -> int | None:
    help_text = subprocess.run([bin_dir / "llama-server", "--help"], capture_output=True, text=True).stdout
    found = re.search(r"--spec-ngram-mod-n-max N\s.*?\(default: (\d+)\)", help_text, re.S)
    return int(found[1]) if found else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Running:
    """A server process on a free loopback port, stopped by its process id."""

    def __init__(self, setup: Setup, bin_dir: Path, model: Path, threads: int, ctx: int, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if setup.kind == "llama-server":  # its -c is shared by its slots
            cmd = [
                bin_dir / "llama-server",
                "-m",
                model,
                "-t",
                threads,
                "-c",
                ctx * setup.parallel,
                "-np",
                setup.parallel,
                "--host",
                "127.0.0.1",
                "--port",
                self.port,
                "--no-webui",
                "--no-repack",
                *setup.args,
            ]  # repacking off, as specrun runs
        else:
            cmd = [
                sys.executable,
                "-m",
                "specrun",
                "serve",
                "--target",
                model,
                "--threads",
                threads,
                "--ctx-size",
                ctx,
                "--port",
                self.port,
                *setup.args,
            ]
        self._log = log.open("w")
        self.process = subprocess.Popen([str(c) for c in cmd], stdout=self._log, stderr=subprocess.STDOUT, cwd=setup.checkout)
        deadline = time.monotonic() + 300
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                sys.exit(f"{setup.name} did not start: see {log}")
            time.sleep(0.2)

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


# --- requests -------------------------------------------------------------------------------
@dataclass
class Timed:
    text: str
    tokens: int
    wall_s: float
    first_chunk_s: float | None
    timings: dict = field(default_factory=dict)

    @property
    def overhead_ms(self) -> float:
        return 1000 * self.wall_s - self.timings.get("prompt_ms", 0.0) - self.timings.get("predicted_ms", 0.0)

    @property
    def first_chunk_after_prefill_ms(self) -> float | None:
        if self.first_chunk_s is None:
            return None
        return 1000 * self.first_chunk_s - self.timings.get("prompt_ms", 0.0)


def complete(http: httpx.Client, url: str, prompt: str, max_tokens: int, stop: list[str]) -> Timed:
    return timed_stream(http, f"{url}/v1/completions", {"prompt": prompt}, max_tokens, stop)


def timed_stream(http: httpx.Client, endpoint: str, body: dict, max_tokens: int, stop: list[str]) -> Timed:
    """One greedy streamed request (completion or chat), timed from before sending to the last byte."""
    body = {
        **body,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "stop": stop or None,
    }
    pieces, tokens, timings, first = [], 0, {}, None
    started = time.perf_counter()
    with http.stream("POST", endpoint, json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                text = choice.get("text") or (choice.get("delta") or {}).get("content")
                if text:
                    first = first if first is not None else time.perf_counter() - started
                    pieces.append(text)
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            timings = chunk.get("timings") or timings
    wall = time.perf_counter() - started
    return Timed("".join(pieces), tokens or timings.get("predicted_n", 0), wall, first, timings)


def client() -> httpx.Client:
    """A new loopback connection per request, for both servers: this llama-server build sometimes
    shuts down when a streamed request follows another on a kept-alive connection."""
    return httpx.Client(timeout=600, limits=httpx.Limits(max_keepalive_connections=0))


def interleaved_replay(
    servers: dict[str, "Running"], workload: tuple[list[str], list[str]], max_tokens: int, rounds: int
) -> dict[str, list[Timed]]:
    """Each prompt sent to every server in turn, after one untimed warm-up request each.

    Each round after the first begins every prompt with its number, so no server answers a
    prompt it has seen whole from a prompt cache (llama-server keeps earlier prompts' caches).
    """
    prompts, stop = workload
    runs: dict[str, list[Timed]] = {name: [] for name in servers}
    with client() as http:
        for server in servers.values():
            complete(http, server.url, "Warm-up: the quick brown fox", 8, [])  # first decodes allocate
        for round_ in range(rounds):
            for prompt in prompts:
                prompt = f"Round {round_ + 1}.\n{prompt}" if round_ else prompt
                for name, server in servers.items():
                    runs[name].append(complete(http, server.url, prompt, max_tokens, stop))
    return runs


# --- reports --------------------------------------------------------------------------------
def rate(runs: list[Timed]) -> float:
    return sum(r.tokens for r in runs) / sum(r.wall_s for r in runs)


def median(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def report(results: dict[str, dict[str, list[Timed]]], workloads: list[str], rounds: int) -> None:
    print(f"\n{'set-up':34} " + " ".join(f"{w + ' tok/s':>14}" for w in workloads) + f" {'overhead ms':>12} {'1st chunk ms':>13}")
    for name, by_workload in results.items():
        runs = [r for w in workloads for r in by_workload[w]]
        print(
            f"{name:34} "
            + " ".join(f"{rate(by_workload[w]):14.1f}" for w in workloads)
            + f" {median(r.overhead_ms for r in runs):12.1f} {median(r.first_chunk_after_prefill_ms for r in runs):13.1f}"
        )
    for workload in workloads:
        ngram = {n: rate(r[workload]) for n, r in results.items() if "ngram" in n}
        best = max(ngram, key=ngram.get) if ngram else None
        cross, per = results["specrun cross-request"][workload], results["specrun per-request lookup"][workload]
        plain = results["llama-server none"][workload]
        ours = rate(cross)
        line = f"{workload}: specrun cross-request / llama-server none {ours / rate(plain):.2f}"
        if best:
            line += f"; / best n-gram ({best}) {ours / ngram[best]:.2f}"
        line += f"; cross-request / per-request lookup {ours / rate(per):.2f}"
        print(line)
        if rounds > 1:  # later rounds resend round 1's documents: the store has seen their answers
            first = len(cross) // rounds
            print(
                f"  cross-request / per-request lookup: round 1 {rate(cross[:first]) / rate(per[:first]):.2f}, "
                f"later rounds {rate(cross[first:]) / rate(per[first:]):.2f}"
            )
        if best:  # greedy paths can part after a near-tie: compare speeds where both wrote the same text
            pairs = [(a, b) for a, b in zip(cross, results[best][workload]) if a.text == b.text]
            if pairs:
                print(
                    f"  on the {len(pairs)}/{len(results[best][workload])} requests with the same text as {best}: "
                    f"{rate([a for a, _ in pairs]) / rate([b for _, b in pairs]):.2f}"
                )
        same = sum(a.text == b.text for a, b in zip(cross, plain))
        print(f"  outputs identical to llama-server none: {same}/{len(plain)}")


def memory(args, bin_dir: Path, model: Path, log_dir: Path) -> None:
    """Resident memory of each server after 100 requests and after --requests, on varied agent prompts."""
    prompts = agent_prompts(len(PEOPLE))
    for setup in (
        Setup("specrun cross-request", "specrun"),
        Setup("llama-server ngram-mod", "llama-server", ("--spec-type", "ngram-mod")),
    ):
        server = Running(setup, bin_dir, model, args.threads, args.ctx_size, log_dir / f"{setup.kind}-memory.log")
        try:
            with client() as http:
                marks = {}
                for i in range(1, args.requests + 1):
                    # A counter keeps every prompt new, so caches and stores keep growing if they are unbounded.
                    complete(http, server.url, f"Request {i}.\n{prompts[i % len(prompts)]}", args.memory_tokens, ["\n"])
                    if i in (100, args.requests):
                        marks[i] = server.rss_mb()
        finally:
            server.stop()
        after_100 = marks.get(100, float("nan"))
        print(
            f"{setup.name}: RSS after 100 requests {after_100:.1f} MB, after {args.requests} "
            f"{marks[args.requests]:.1f} MB ({100 * (marks[args.requests] / after_100 - 1):+.1f}%)"
        )


def conversation(args, bin_dir: Path, model: Path, log_dir: Path) -> None:
    """Time to the first chunk of each turn of one chat: with the prompt cache, turn 10 should cost what turn 2 does."""
    for setup in (Setup("specrun cross-request", "specrun"), Setup("llama-server none", "llama-server")):
        server = Running(setup, bin_dir, model, args.threads, args.ctx_size, log_dir / f"{setup.kind}-conversation.log")
        messages, turns = [], []
        try:
            with client() as http:
                timed_stream(http, f"{server.url}/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}, 4, [])
                for turn in range(args.turns):
                    messages.append({"role": "user", "content": MESSAGES[turn % len(MESSAGES)]})
                    timed = timed_stream(http, f"{server.url}/v1/chat/completions", {"messages": messages}, args.turn_tokens, [])
                    messages.append({"role": "assistant", "content": timed.text})
                    turns.append(timed)
        finally:
            server.stop()
        print(f"{setup.name}: turn, prompt tokens, processed (not cached), first chunk ms")
        for i, t in enumerate(turns, start=1):
            print(
                f"  {i:4} {t.timings.get('prompt_n', 0) + t.timings.get('cache_n', 0):6} {t.timings.get('prompt_n', 0):6} "
                f"{1000 * (t.first_chunk_s or float('nan')):8.1f}"
            )
        if len(turns) >= 10 and turns[1].first_chunk_s and turns[9].first_chunk_s:
            print(f"  first chunk of turn 10 / of turn 2: {turns[9].first_chunk_s / turns[1].first_chunk_s:.2f}")


def burst(server: "Running", prompts: list[str], clients: int, max_tokens: int) -> tuple[float, list[Timed]]:
    """`clients` clients at once, each sending its share of the prompts one after another: the
    burst's wall seconds, and each request timed from its own send (queueing included)."""
    shares = [prompts[i::clients] for i in range(clients)]
    timed: list[Timed] = []

    def client_loop(share: list[str]) -> None:
        with client() as http:
            for prompt in share:
                timed.append(complete(http, server.url, prompt, max_tokens, ["\n"]))

    threads = [threading.Thread(target=client_loop, args=(share,)) for share in shares]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started, timed


def concurrent_setups(bin_dir: Path, clients: int, baseline: Path | None, compare: Path | None) -> list[Setup]:
    """llama-server with `clients` slots, without speculation and with its n-gram types; specrun with
    as many slots; the baseline checkout's specrun serve as it is (one request at a time there);
    the compare checkout's specrun with as many slots."""
    llama = [
        Setup(f"llama-server -np {clients} {s.name.removeprefix('llama-server ')}", s.kind, s.args, parallel=clients)
        for s in llama_server_setups(bin_dir)
    ]
    ours = [Setup(f"specrun --parallel {clients}", "specrun", ("--parallel", str(clients)))]
    if baseline:
        ours.append(Setup("specrun @ baseline", "specrun", (), baseline.resolve()))
    if compare:
        ours.append(Setup(f"specrun --parallel {clients} @ compare", "specrun", ours[0].args, compare.resolve()))
    return llama + ours


def concurrent(args, bin_dir: Path, model: Path, log_dir: Path) -> None:
    """--clients: the agent workload from N clients at once, every set-up in turn, --rounds times."""
    prompts = agent_prompts(args.agent_requests)
    for clients in (int(n) for n in args.clients.split(",")):
        setups_now = concurrent_setups(bin_dir, clients, args.baseline, args.compare)
        totals: dict[str, list[tuple[float, list[Timed]]]] = {s.name: [] for s in setups_now}
        servers: dict[str, Running] = {}
        try:
            for setup in setups_now:
                servers[setup.name] = Running(
                    setup, bin_dir, model, args.threads, args.ctx_size, log_dir / f"{setup.name.replace(' ', '-')}-{clients}.log"
                )
                with client() as http:
                    complete(http, servers[setup.name].url, "Warm-up: the quick brown fox", 8, [])
            for round_ in range(args.rounds):  # every set-up in turn, each round: drift falls on all alike
                for name, server in servers.items():
                    numbered = [f"Round {round_ + 1}.\n{p}" for p in prompts]  # no prompt cache answers a whole prompt
                    totals[name].append(burst(server, numbered, clients, args.max_tokens))
        finally:
            for server in servers.values():
                server.stop()
        print(f"\n{clients} client(s), {len(prompts)} agent requests each round, {args.rounds} round(s):")
        print(f"{'set-up':40} {'tok/s':>8} {'1st chunk p50 s':>16} {'p95 s':>7}")
        rates = {}
        for name, bursts in totals.items():
            timed = [t for _, ts in bursts for t in ts]
            rates[name] = sum(t.tokens for t in timed) / sum(seconds for seconds, _ in bursts)
            firsts = sorted(t.first_chunk_s for t in timed if t.first_chunk_s is not None)
            p95 = statistics.quantiles(firsts, n=20, method="inclusive")[18] if len(firsts) > 1 else firsts[0]
            print(f"{name:40} {rates[name]:8.1f} {statistics.median(firsts):16.3f} {p95:7.3f}")
        ours = rates[f"specrun --parallel {clients}"]
        best = max((n for n in rates if "ngram" in n), key=rates.get)
        line = f"specrun --parallel {clients} / {best} (the best llama-server): {ours / rates[best]:.2f}"
        if args.baseline:
            line += f"; / specrun @ baseline: {ours / rates['specrun @ baseline']:.2f}"
        if args.compare:
            line += f"; / specrun --parallel {clients} @ compare: {ours / rates[f'specrun --parallel {clients} @ compare']:.2f}"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, help="GGUF both servers load (default: the embedded Gemma 3 270M)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctx-size", type=int, default=4096)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--agent-requests", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1, help="times each workload is replayed")
    parser.add_argument("--prompts", type=Path, default=HERE / "prompts" / "copy_heavy.txt")
    parser.add_argument("--copy-prompts", type=int, help="use only the first N copy-heavy prompts")
    parser.add_argument("--build", type=Path, default=Path(tempfile.gettempdir()) / "llama-tools")
    parser.add_argument("--memory", action="store_true", help="measure resident memory instead of speed")
    parser.add_argument("--requests", type=int, default=1000, help="requests in the --memory run")
    parser.add_argument("--memory-tokens", type=int, default=32, help="max tokens per --memory request")
    parser.add_argument("--conversation", action="store_true", help="time the first chunk of each turn of one chat instead")
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--turn-tokens", type=int, default=48, help="max tokens per --conversation reply")
    parser.add_argument("--clients", help="comma list of concurrent client counts: the agent workload from that many at once")
    parser.add_argument(
        "--baseline", type=Path, help="another checkout (git worktree add DIR REV) whose specrun serve runs beside this one's"
    )
    parser.add_argument(
        "--compare",
        type=Path,
        help="with --clients: another checkout whose specrun serve runs with as "
        "many slots as this one's (to measure a change to batching)",
    )
    args = parser.parse_args()
    if min(args.agent_requests, args.max_tokens, args.rounds) < 1 or args.requests < 100:
        sys.exit("bench_serve.py: --agent-requests, --max-tokens and --rounds have to be >= 1, --requests >= 100")
    copy = read_prompts(args.prompts)[: args.copy_prompts]
    bin_dir, model = build_tools(args.build, ["llama-server"]), args.target or embedded_model_path()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    print(f"model {model}, {args.threads} threads, context {args.ctx_size}; server logs in {log_dir}")
    if args.memory:
        return memory(args, bin_dir, model, log_dir)
    if args.conversation:
        return conversation(args, bin_dir, model, log_dir)
    if args.clients:
        return concurrent(args, bin_dir, model, log_dir)
    workloads = {"agent": (agent_prompts(args.agent_requests), ["\n"]), "copy": (copy, [])}
    # Every set-up runs at once and each request goes to all of them in turn, so the machine's
    # drift falls on every set-up alike (an idle server waits without spinning).
    servers: dict[str, Running] = {}
    try:
        for setup in setups(bin_dir, args.baseline):
            servers[setup.name] = Running(
                setup, bin_dir, model, args.threads, args.ctx_size, log_dir / f"{setup.name.replace(' ', '-')}.log"
            )
        results = {
            name: interleaved_replay(servers, workload, args.max_tokens, args.rounds) for name, workload in workloads.items()
        }
    finally:
        for server in servers.values():
            server.stop()
    results = {name: {w: results[w][name] for w in workloads} for name in servers}
    report(results, list(workloads), args.rounds)


if __name__ == "__main__":
    main()
