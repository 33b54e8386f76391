"""The target split over two real llama.cpp rpc-servers on loopback ports.

The rpc-server binary comes from $SPECRUN_RPC_SERVER (.ci/run builds ggml-rpc-server from the
installed llama-cpp-python's own source), else `ggml-rpc-server` or `rpc-server` on PATH; each
test that needs one skips, naming why, when there is none. Generation runs in subprocesses:
a lost server leaves llama.cpp's RPC client stuck in the process that used it.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from serve_helpers import wait_healthy

from specrun.backend import rpc
from specrun.errors import SpecrunError

RPC_SERVER_ENV = "SPECRUN_RPC_SERVER"
PROMPT = "the cat sat on the mat and the cat sat on the"


def find_rpc_server() -> str | None:
    configured = os.environ.get(RPC_SERVER_ENV)
    if configured:
        if not Path(configured).is_file():
            pytest.fail(f"{RPC_SERVER_ENV}={configured} is not a file")
        return configured
    return shutil.which("ggml-rpc-server") or shutil.which("rpc-server")


class RpcServerProcess:
    """One rpc-server on a free loopback port, answering before the constructor returns."""

    def __init__(self, binary: str):
        for _ in range(5):  # another process may take the free port first
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            self.proc = subprocess.Popen(
                [binary, "-H", "127.0.0.1", "-p", str(port), "-t", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            self.endpoint = f"127.0.0.1:{port}"
            if self._answers():
                return
            self.stop()
        pytest.fail(f"{binary} did not start answering on a loopback port")

    def _answers(self) -> bool:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                rpc.check_server(self.endpoint, connect_timeout=1, answer_timeout=5)
                return True
            except SpecrunError:
                time.sleep(0.1)
        return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # by the PID we started; SIGKILL also ends a stopped process
        self.proc.wait(timeout=10)


@pytest.fixture
def servers():
    from specrun import backend

    if not backend.rpc_supported():
        pytest.skip('llama-cpp-python was built without the RPC backend (CMAKE_ARGS="-DGGML_RPC=on"; .ci/run builds it)')
    binary = find_rpc_server()
    if binary is None:
        pytest.skip(f"no rpc-server binary: set {RPC_SERVER_ENV} to llama.cpp's ggml-rpc-server (.ci/run builds one)")
    started: list[RpcServerProcess] = []
    try:
        for _ in range(2):
            started.append(RpcServerProcess(binary))
        yield started
    finally:
        for server in started:
            server.stop()


def generate(*args, debug: bool = False) -> subprocess.CompletedProcess:
    """`specrun generate --json` greedy; debug adds llama.cpp's log (where each buffer went) to stderr."""
    env = {**os.environ, "SPECRUN_DEBUG": "1"} if debug else None
    # One local thread: the two rpc-servers compute too, and spinning OpenMP threads that
    # outnumber the cores slow every decode a hundredfold.
    return subprocess.run(
        [sys.executable, "-m", "specrun", "generate", PROMPT, "--temp", "0", "--json", "-t", "1", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def rpc_flag(servers) -> str:
    return ",".join(s.endpoint for s in servers)


def model_sections(log: str) -> list[str]:
    """llama.cpp's log split per model load: [before, target, draft, ...]."""
    return log.split("llama_model_loader: loaded meta data")


def buffer_lines(section: str) -> list[str]:
    return [line for line in section.splitlines() if "model buffer size" in line]


@pytest.mark.parametrize("drafting", ["draft", "lookup"])
def test_split_target_gives_the_local_output(servers, tiny, drafting):
    source = ["--draft", tiny["draft"]] if drafting == "draft" else ["--lookup"]
    settings = ["--target", tiny["target"], *source, "--k", 4, "-n", 48, "-c", 512]
    local = generate(*settings)
    split = generate(*settings, "--rpc", rpc_flag(servers), debug=True)
    assert local.returncode == 0 and split.returncode == 0, local.stderr + split.stderr[-3000:]
    out = json.loads(split.stdout)
    assert out["tokens"] == json.loads(local.stdout)["tokens"] and out["stats"]["drafted"] > 0
    target = buffer_lines(model_sections(split.stderr)[1])
    for server in servers:  # both servers hold some of the target's weights
        assert any(f"[{server.endpoint}] model buffer size" in line for line in target), target
    if drafting == "draft":  # ... and the draft stays on this machine
        assert not any("RPC" in line for line in buffer_lines(model_sections(split.stderr)[2]))


def test_draft_rpc_and_tensor_split_place_the_layers(servers, tiny):
    a, b = servers
    result = generate(
        "--target",
        tiny["target"],
        "--draft",
        tiny["draft"],
        "-n",
        8,
        "-c",
        256,
        "--rpc",
        rpc_flag(servers),
        "--tensor-split",
        "0,1",
        "--draft-rpc",
        a.endpoint,
        debug=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _, target, draft = model_sections(result.stderr)[:3]
    assert any(f"[{b.endpoint}]" in line for line in buffer_lines(target))
    assert not any(f"[{a.endpoint}]" in line for line in buffer_lines(target))  # weight 0: nothing on a
    assert any(f"[{a.endpoint}]" in line for line in buffer_lines(draft))


@pytest.mark.gemma
def test_gemma_split_gives_the_local_output(servers, gemma):
    settings = ["--target", gemma, "--lookup", "--k", 4, "-n", 24, "-c", 512]
    local, split = generate(*settings), generate(*settings, "--rpc", rpc_flag(servers))
    assert local.returncode == 0 and split.returncode == 0, local.stderr + split.stderr
    assert json.loads(split.stdout)["tokens"] == json.loads(local.stdout)["tokens"]


def start_long_generation(tiny, servers, *extra) -> subprocess.Popen:
    """A generation that runs for seconds (its model never ends one); returns once it has printed its first text."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specrun",
            "generate",
            PROMPT,
            "--target",
            str(tiny["endless"]),
            "--lookup",
            "-n",
            "3000",
            "-c",
            "4096",
            "-t",
            "1",
            "--rpc",
            rpc_flag(servers),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    assert ready and proc.stdout.read1(1), proc.stderr.read().decode() if proc.poll() is not None else "no output"
    return proc


def finish(proc: subprocess.Popen, after: str = "its rpc-server went away") -> tuple[int, str, str]:
    """Exit status, the rest of stdout, and stderr."""
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"specrun was still running 60 s after {after}")
    return proc.returncode, out.decode("utf-8", "replace"), err.decode()  # generated text may be cut mid-character


def test_ctrl_c_ends_a_generation_on_the_servers(servers, tiny):
    proc = start_long_generation(tiny, servers)
    proc.send_signal(signal.SIGINT)
    code, _, err = finish(proc, "Ctrl-C")
    assert code == 130 and err.strip().splitlines()[-1] == "interrupted", err


def test_a_server_killed_mid_generation_is_named(servers, tiny):
    proc = start_long_generation(tiny, servers)
    servers[1].stop()
    code, _, err = finish(proc)
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: lost RPC server {servers[1].endpoint}:"), err


def test_a_stuck_server_ends_the_run_after_the_timeout(servers, tiny):
    proc = start_long_generation(tiny, servers, "--rpc-timeout", "2")
    os.kill(servers[1].proc.pid, signal.SIGSTOP)
    started = time.monotonic()
    code, _, err = finish(proc)
    assert code == 1 and time.monotonic() - started < 30, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "no answer from the RPC servers" in lines[0] and "for 2 s" in lines[0], err


PYTHON_USER = """
import sys
import specrun

target, servers, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
with specrun.load(target, lookup=True, rpc=servers, threads=1, n_ctx=4096, rpc_timeout=timeout) as session:
    try:
        for n, event in enumerate(session.stream(sys.argv[4], 3000)):
            if n == 10:
                print("streaming", flush=True)
    except specrun.SpecrunError as exc:
        print(f"{type(exc).__name__}: {exc}", flush=True)
    try:
        session.generate("the cat", max_tokens=4)
    except specrun.SpecrunError as exc:
        print(f"then {type(exc).__name__}", flush=True)
with specrun.load(target, lookup=True, threads=1, n_ctx=256) as local:
    print(f"a local model generates {len(local.generate('the cat', max_tokens=4).tokens)} tokens")
"""


INTERRUPTED_USER = """
import sys
import specrun

with specrun.load(sys.argv[1], lookup=True, rpc=sys.argv[2], threads=1, n_ctx=4096) as session:
    try:
        while True:
            for n, event in enumerate(session.stream(sys.argv[4], 3000)):
                if n == 10:
                    print("streaming", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    print(f"then {len(session.generate('the cat', max_tokens=4).tokens)} tokens")
"""


def start_python_user(tiny, servers, timeout: float, script: str = PYTHON_USER) -> subprocess.Popen:
    """A Python program generating on the servers; returns once it is streaming."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tiny["target"]), rpc_flag(servers), str(timeout), PROMPT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    assert ready and proc.stdout.readline() == b"streaming\n", (
        proc.stderr.read().decode() if proc.poll() is not None else "no output"
    )
    return proc


def test_a_python_user_gets_rpc_lost_when_a_server_dies_mid_generation(servers, tiny):
    proc = start_python_user(tiny, servers, 300)
    servers[1].stop()
    code, out, err = finish(proc)
    lines = out.splitlines()
    assert code == 0, err
    assert lines[0].startswith(f"RpcLost: lost RPC server {servers[1].endpoint}:"), lines
    assert lines[1:] == ["then RpcLost", "a local model generates 4 tokens"]


def test_a_python_user_gets_rpc_timeout_from_a_stuck_server(servers, tiny):
    proc = start_python_user(tiny, servers, 2)
    os.kill(servers[1].proc.pid, signal.SIGSTOP)
    started = time.monotonic()
    code, out, err = finish(proc)
    lines = out.splitlines()
    assert code == 0 and time.monotonic() - started < 30, err
    assert lines[0] == (
        f"RpcTimeout: no answer from the RPC servers ({', '.join(s.endpoint for s in servers)}) for 2 s during a decode: "
        "one is stuck or the network is down (raise --rpc-timeout if decodes are this slow)"
    ), lines
    assert lines[1:] == ["then RpcTimeout", "a local model generates 4 tokens"]


def test_ctrl_c_on_a_python_user_leaves_the_session_usable(servers, tiny):
    """Ctrl-C lets the decode in flight end, so the caches stay consistent and the servers in use."""
    proc = start_python_user(tiny, servers, 300, INTERRUPTED_USER)
    proc.send_signal(signal.SIGINT)
    code, out, err = finish(proc, "Ctrl-C")
    assert code == 0 and out.splitlines() == ["interrupted", "then 4 tokens"], err


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_server_whose_rpc_server_died_answers_503_and_keeps_serving(servers, tiny):
    """specrun serve on the servers, one of which dies once the model is loaded: the next request
    and every later one get OpenAI's error object with code rpc_lost, /health says so too, and when
    stopped the server exits 1 with the lost server's line, so a supervisor knows to restart it."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specrun",
            "serve",
            "--target",
            str(tiny["target"]),
            "--lookup",
            "-t",
            "1",
            "-c",
            "4096",
            "--port",
            str(port),
            "--rpc",
            rpc_flag(servers),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 120)
        servers[1].stop()
        with httpx.Client(base_url=url, timeout=120) as client:
            responses = [client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8}) for _ in range(2)]
            responses.append(client.get("/health"))
        for response in responses:
            assert response.status_code == 503, response.text
            error = response.json()["error"]
            assert error["code"] == "rpc_lost" and error["message"].startswith(f"lost RPC server {servers[1].endpoint}"), error
    finally:
        proc.send_signal(signal.SIGTERM)  # by the PID we started
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err.decode()
    assert err.decode().strip().splitlines()[-1].startswith(f"error: lost RPC server {servers[1].endpoint}")


def test_a_busy_server_is_reported_not_waited_for(servers):
    busy = servers[0].endpoint
    host, port = busy.split(":")
    with socket.create_connection((host, int(port))) as holder:  # rpc-server now serves this client only
        holder.sendall(bytes([rpc.CMD_HELLO]) + (rpc.CONN_CAPS_SIZE).to_bytes(8, "little") + bytes(rpc.CONN_CAPS_SIZE))
        with pytest.raises(SpecrunError, match="did not answer within 1 s"):
            rpc.check_server(busy, answer_timeout=1)


def test_the_pinned_protocol_matches_a_server_built_from_the_same_source(servers):
    assert rpc.check_server(servers[0].endpoint).version == rpc.client_protocol()


def test_doctor_reports_the_servers_devices(servers):
    result = subprocess.run(
        [sys.executable, "-m", "specrun", "doctor", "--json", "--rpc", rpc_flag(servers)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    for server, found in zip(servers, json.loads(result.stdout)["rpc_servers"]):
        assert found["endpoint"] == server.endpoint and found["protocol"] == rpc.version_text(rpc.client_protocol())
        assert len(found["devices"]) == 1 and 0 < found["devices"][0]["memory_free"] <= found["devices"][0]["memory_total"]


def test_one_process_reuses_its_own_connection(servers, tiny):
    """A long-running process (serve) loads and frees models on the same servers: while a model
    holds a server, specrun asks through llama.cpp's connection (a second one would never be
    answered), and once it is freed the server takes new clients."""
    from specrun import backend
    from specrun.backend import Context, ContextOptions, Model, ModelOptions

    a = servers[0].endpoint
    target = Model(tiny["target"], ModelOptions(rpc_servers=(a,)))
    try:
        held = backend.rpc_servers((a,))[0]
        assert held.version is None and held.free_bytes > 0
        port = a.split(":")[1]
        with pytest.raises(SpecrunError, match="are one rpc-server"):
            backend.rpc_servers((f"localhost:{port}",))
        draft = Model(tiny["draft"], ModelOptions(rpc_servers=(a,)))
        context = Context(draft, ContextOptions(n_ctx=64))
        assert context.eval(draft.tokenize("hello"), 1).shape == (1, draft.n_vocab)
        context.close()
        draft.close()
    finally:
        target.close()
    assert rpc.check_server(a).version == rpc.client_protocol()
