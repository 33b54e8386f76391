"""--rpc without real servers: endpoint parsing, the pre-flight check against a fake
rpc-server, the memory it adds, doctor and pair check, and the one-line errors."""

import json
import signal
import socket
import subprocess
import sys

import pytest
from rpc_fake_server import FakeRpcServer

from specrun.backend import rpc
from specrun.errors import SpecrunError


def specrun(*args):
    return subprocess.run([sys.executable, "-m", "specrun", *map(str, args)], capture_output=True, text=True, timeout=120)


def assert_one_line_error(result, code, *fragments):
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def refused_endpoint() -> str:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


# --- parsing ------------------------------------------------------------------------------
def test_endpoints_as_llama_cpp_takes_them():
    assert rpc.parse_endpoints(None) == ()
    assert rpc.parse_endpoints("10.0.0.2:50052, gpu-box:7000") == ("10.0.0.2:50052", "gpu-box:7000")
    assert rpc.parse_endpoints("h:050052") == ("h:50052",)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("10.0.0.2", "is not HOST:PORT"),
        (":50052", "is not HOST:PORT"),
        ("a:1,,b:2", "'' is not HOST:PORT"),
        ("[::1]:50052", "not IPv6"),
        ("h:0", "from 1 to 65535"),
        ("h:65536", "from 1 to 65535"),
        ("h:port", "from 1 to 65535"),
        ("h:\u00b2", "from 1 to 65535"),
        ("h:1,h:1", "lists h:1 twice"),
    ],
)
def test_bad_endpoints_are_one_line_naming_the_option(text, fragment):
    with pytest.raises(SpecrunError, match="--draft-rpc") as caught:
        rpc.parse_endpoints(text, "--draft-rpc")
    assert fragment in str(caught.value)


def test_tensor_split():
    assert rpc.parse_tensor_split(None) == ()
    assert rpc.parse_tensor_split("3,1") == (3.0, 1.0)
    assert rpc.parse_tensor_split("0.5/0.5") == (0.5, 0.5)
    for bad in ("3,x", "-1,2", "0,0", "nan,1", "inf"):
        with pytest.raises(SpecrunError, match="--tensor-split"):
            rpc.parse_tensor_split(bad)


# --- the pre-flight check ---------------------------------------------------------------
def test_check_reads_version_and_every_device():
    devices = ((3 * 2**30, 4 * 2**30), (5 * 2**30, 8 * 2**30))
    with FakeRpcServer(devices=devices) as server:
        found = rpc.check_server(server.endpoint)
    assert found.version == (7, 0, 0)
    assert found.devices == tuple(rpc.DeviceMemory(*d) for d in devices)
    assert found.free_bytes == 8 * 2**30


def test_the_pinned_protocol_is_the_installed_release():
    """An upgrade of llama-cpp-python without its RPC protocol in the table fails here."""
    assert rpc.client_protocol() is not None, "add the installed llama-cpp-python to rpc.PROTOCOL_BY_RELEASE"


def test_another_major_version_is_refused_naming_both():
    with FakeRpcServer(version=(6, 1, 0)) as server, pytest.raises(SpecrunError) as caught:
        rpc.check_server(server.endpoint)
    message = str(caught.value)
    assert server.endpoint in message and "6.1.0" in message and rpc.version_text(rpc.client_protocol()) in message


def test_a_newer_minor_version_is_refused_an_older_one_taken():
    major, minor, _ = rpc.client_protocol()
    with FakeRpcServer(version=(major, minor + 1, 0)) as server, pytest.raises(SpecrunError, match="speaks RPC protocol"):
        rpc.check_server(server.endpoint)
    if minor:
        with FakeRpcServer(version=(major, minor - 1, 0)) as server:
            assert rpc.check_server(server.endpoint).version == (major, minor - 1, 0)


@pytest.mark.parametrize("behaviour", ["close", "short"])
def test_an_old_protocol_server_is_named(behaviour):
    with FakeRpcServer(behaviour=behaviour) as server, pytest.raises(SpecrunError) as caught:
        rpc.check_server(server.endpoint)
    assert server.endpoint in str(caught.value) and "did not answer the RPC hello" in str(caught.value)


def test_a_server_that_does_not_answer_times_out():
    with FakeRpcServer(behaviour="silent") as server, pytest.raises(SpecrunError) as caught:
        rpc.check_server(server.endpoint, answer_timeout=0.5)
    assert "did not answer within 0.5 s" in str(caught.value) and "one client at a time" in str(caught.value)


def test_refused_and_unresolvable():
    endpoint = refused_endpoint()
    with pytest.raises(SpecrunError, match=f"{endpoint} refused the connection"):
        rpc.check_server(endpoint)
    with pytest.raises(SpecrunError, match="does not resolve"):
        rpc.check_server("no-such-host.invalid:50052")


def test_one_server_under_two_names_is_refused():
    with FakeRpcServer() as server:
        port = server.endpoint.split(":")[1]
        with pytest.raises(SpecrunError, match="are one rpc-server"):
            rpc.check_servers((server.endpoint, f"localhost:{port}"))
        with pytest.raises(SpecrunError, match="are one rpc-server"):
            rpc.check_servers((f"localhost:{port}",), held=(server.endpoint,))


def test_lost_servers_are_those_that_refuse():
    gone = refused_endpoint()
    with FakeRpcServer() as server:
        assert rpc.lost_servers((server.endpoint, gone)) == [gone]


def test_abort_lines_name_the_server():
    from specrun.backend import rpc_link

    gone = refused_endpoint()
    assert gone in rpc_link.abort_line(f"ggml-rpc.cpp:551: Failed to connect to {gone}\n")
    assert "another RPC protocol" in rpc_link.abort_line(f"ggml-rpc.cpp:554: RPC handshake failed for {gone}\n")
    assert rpc_link.abort_line("ggml.c:1: GGML_ASSERT(x) failed") is None
    assert gone in rpc_link.lost_line((gone,), "unused")
    with FakeRpcServer() as server:
        assert rpc_link.lost_line((server.endpoint,), "all answer") == "all answer"


# --- what the servers' memory counts for ------------------------------------------------
def test_memory_budget_adds_the_servers_free_memory(monkeypatch):
    from specrun.hub import memory

    assert memory.local_budget().bytes > 0  # RAM here: no local GPU
    monkeypatch.setattr(memory, "local_budget", lambda: memory.MemoryBudget(5 * 2**30, "RAM"))
    with FakeRpcServer(devices=((2 * 2**30, 4 * 2**30), (1 * 2**30, 4 * 2**30))) as a, FakeRpcServer() as b:
        budget = memory.memory_budget(rpc=(a.endpoint, b.endpoint))
    assert budget.bytes == 11 * 2**30
    assert budget.where == "RAM (5.4 GB) and 2 RPC servers (6.4 GB)"


def test_pair_check_fits_only_with_the_servers(tiny, monkeypatch):
    from specrun.headers.read import read_local
    from specrun.hub import memory
    from specrun.pair.check import check_pair
    from specrun.pair.report import check_lines

    target, draft = read_local(tiny["target"]), read_local(tiny["draft"])
    needed = check_pair(target, draft).memory_bytes
    monkeypatch.setattr(memory, "local_budget", lambda: memory.MemoryBudget(needed // 2, "RAM"))
    alone = check_pair(target, draft, budget=memory.memory_budget())
    assert alone.fits is False and any(line.startswith("fits       no") for line in check_lines(alone))
    with FakeRpcServer(devices=((needed, needed),)) as server:
        spread = check_pair(target, draft, budget=memory.memory_budget(rpc=(server.endpoint,)))
    assert spread.fits is True and spread.as_json()["memory_available"] == needed // 2 + needed
    assert "1 RPC server" in next(line for line in check_lines(spread) if line.startswith("fits       yes"))


def test_pair_check_cli_counts_rpc_memory(tiny):
    with FakeRpcServer() as server:
        result = specrun("pair", "check", tiny["target"], tiny["draft"], "--rpc", server.endpoint, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["fits"] is True and "1 RPC server" in report["memory_available_in"]


# --- doctor -----------------------------------------------------------------------------
def test_doctor_reaches_each_server():
    gone = refused_endpoint()
    with FakeRpcServer(devices=((2 * 2**30, 4 * 2**30),)) as server:
        result = specrun("doctor", "--json", "--rpc", f"{server.endpoint},{gone}")
        text = specrun("doctor", "--rpc", server.endpoint)
    assert result.returncode == 1  # one server is down
    report = json.loads(result.stdout)
    ok, down = report["rpc_servers"]
    assert ok == {
        "endpoint": server.endpoint,
        "protocol": "7.0.0",
        "devices": [{"memory_free": 2 * 2**30, "memory_total": 4 * 2**30}],
    }
    assert down["endpoint"] == gone and "refused the connection" in down["error"]
    assert report["rpc_protocol"] == rpc.version_text(rpc.client_protocol())
    assert "GGML_RPC=ON" in report["rpc_server_build"] and report["llama_cpp_python"] in report["rpc_server_build"]
    assert text.returncode == 0, text.stderr
    assert f"rpc server {server.endpoint}: protocol 7.0.0, device 0: 2.0 GiB free of 4.0 GiB" in text.stdout


def test_doctor_gives_the_rpc_install_command_when_the_build_lacks_it(monkeypatch):
    import llama_cpp

    from specrun import backend
    from specrun.cli.doctor import diagnose

    monkeypatch.setattr(llama_cpp, "llama_supports_rpc", lambda: False)  # a build without -DGGML_RPC=on
    report = diagnose()
    assert report["rpc"] is False and 'CMAKE_ARGS="-DGGML_RPC=on" pip install' in report["rpc_build_hint"]
    with pytest.raises(SpecrunError, match="without llama.cpp's RPC backend.*-DGGML_RPC=on"):
        backend.check_rpc(("127.0.0.1:1",))


# --- commands ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--rpc", "REFUSED"], ["REFUSED refused the connection"]),
        (["--rpc", "127.0.0.1"], ["--rpc", "is not HOST:PORT"]),
        (["--draft-rpc", "127.0.0.1:1"], ["--draft-rpc", "give --draft too"]),
        (["--tensor-split", "1,x"], ["--tensor-split"]),
        (["--rpc-timeout", "-1"], ["--rpc-timeout", ">= 0"]),
    ],
)
def test_generate_rpc_errors_are_one_line(tiny, args, fragments):
    endpoint = refused_endpoint()
    args = [a.replace("REFUSED", endpoint) for a in args]
    result = specrun("generate", "hello", "--target", tiny["target"], "--lookup", "-n", 4, *args)
    assert_one_line_error(result, 2, *[f.replace("REFUSED", endpoint) for f in fragments])


def test_tensor_split_needs_devices(tiny):
    result = specrun("generate", "hello", "--target", tiny["target"], "--lookup", "-n", 4, "--tensor-split", "1,1")
    assert_one_line_error(result, 2, "--tensor-split needs devices")


def test_bench_and_chat_take_rpc(tiny):
    endpoint = refused_endpoint()
    bench = specrun("bench", "--target", tiny["target"], "--methods", "plain,lookup", "--rpc", endpoint)
    assert_one_line_error(bench, 2, f"{endpoint} refused")
    chat = subprocess.run(
        [sys.executable, "-m", "specrun", "chat", "--target", str(tiny["target"]), "--rpc", endpoint],
        input="",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert chat.returncode == 2 and f"{endpoint} refused" in chat.stderr


# --- when llama.cpp's own client fails (in a subprocess: it leaves RPC unusable there) ----
LOAD_ON_SERVER = """
import sys
from specrun.backend import rpc
{setup}
from specrun.backend import Model, ModelOptions
from specrun.errors import RpcLost

for attempt in range(2):  # the second finds llama.cpp's RPC client stuck, and says so at once
    try:
        Model(sys.argv[1], ModelOptions(rpc_servers=(sys.argv[2],)))
        print("loaded")
    except RpcLost as exc:
        print(f"{{type(exc).__name__}}: {{exc}}")
print(f"a local model loads: {{Model(sys.argv[1]).n_vocab > 0}}")
{after}
"""
STUCK = (
    "RpcLost: llama.cpp's RPC client in this process is stuck since an RPC server was lost or stopped answering: "
    "start a new process to use RPC servers"
)


def load_on(server, tiny, setup: str = "", after: str = "") -> subprocess.CompletedProcess:
    from specrun import backend

    if not backend.rpc_supported():
        pytest.skip('llama-cpp-python was built without the RPC backend (CMAKE_ARGS="-DGGML_RPC=on"; .ci/run builds it)')
    script = LOAD_ON_SERVER.format(setup=setup, after=after)
    return subprocess.run(
        [sys.executable, "-c", script, str(tiny["target"]), server.endpoint], capture_output=True, text=True, timeout=60
    )


def assert_lost_then_stuck(result, line: str):
    """The load raised `line`, the next RPC load was refused at once, and the process went on."""
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.splitlines() == [line, STUCK, "a local model loads: True"]


def test_llama_cpp_refusing_the_version_raises_rpc_lost(tiny):
    """A release missing from the pinned table is checked by llama.cpp itself; its abort becomes RpcLost."""
    with FakeRpcServer(version=(99, 0, 0)) as server:
        result = load_on(server, tiny, "rpc.PROTOCOL_BY_RELEASE.clear()")
    assert_lost_then_stuck(
        result,
        f"RpcLost: RPC server {server.endpoint} speaks another RPC protocol version than this "
        "llama-cpp-python (RPC server version mismatch: 99.0.0): build rpc-server from the "
        "llama.cpp that llama-cpp-python bundles",
    )


def test_a_server_gone_after_the_check_raises_rpc_lost(tiny):
    with FakeRpcServer(behaviour="gone_after_check") as server:
        result = load_on(server, tiny)
    assert_lost_then_stuck(
        result,
        f"RpcLost: RPC server {server.endpoint} cannot be reached any more (llama.cpp could "
        "not connect): is rpc-server still running there?",
    )


def test_a_server_failing_during_the_load_raises_rpc_lost(tiny):
    """The fake answers only specrun's check, so llama.cpp's load fails in ggml-rpc's own
    dispatcher thread, which aborts there: that thread is parked, the caller gets RpcLost."""
    with FakeRpcServer() as server:
        result = load_on(server, tiny)
    assert_lost_then_stuck(
        result,
        f"RpcLost: an RPC server ({server.endpoint}) closed the connection or sent a "
        "malformed reply: restart rpc-server and run again",
    )


def test_a_server_that_stops_answering_after_the_check_is_not_waited_for(tiny):
    with FakeRpcServer(behaviour="answer_once") as server:
        result = load_on(server, tiny, "rpc.ANSWER_TIMEOUT_S = 1")
    assert_lost_then_stuck(
        result,
        f"RpcTimeout: no answer from the RPC servers ({server.endpoint}) for 1 s at the RPC "
        "hello: one is stuck or the network is down",
    )


def test_an_abort_that_is_not_rpcs_still_aborts(tiny):
    """With specrun's abort callback in place, any other GGML_ABORT prints ggml's message and ends the process."""
    abort = "from specrun.backend import library; library.ggml().ggml_abort(b'ggml.c', 1, b'GGML_ASSERT(x) failed')"
    with FakeRpcServer() as server:
        result = load_on(server, tiny, after=abort)
    assert result.returncode == -signal.SIGABRT and "a local model loads: True" in result.stdout
    assert result.stderr.strip().splitlines()[-1] == "ggml.c:1: GGML_ASSERT(x) failed", result.stderr


def test_device_props_layout_matches_ggml():
    """local_gpu_devices reads struct ggml_backend_dev_props: its fields must agree with ggml's getters."""
    from specrun.backend import devices, library

    _, listed = devices.compiled_devices()  # read through the getters
    for i, found in enumerate(listed):
        props = devices.device_props(library.ggml().ggml_backend_dev_get(i))
        assert props.name.decode() == found["name"] and props.description.decode() == found["description"]
        assert devices.DEVICE_TYPES[props.type] == found["type"] and props.memory_total == found["memory_total"]
