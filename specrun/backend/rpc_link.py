"""The RPC servers this process holds, and the one thread that talks to them through llama.cpp.

llama.cpp's RPC client cannot carry on without a server: the layers it held are gone, and the
client calls GGML_ABORT when a connection fails, after which ggml calls abort() as soon as the
abort callback returns. It also waits forever for a server that accepts but never answers.
So every llama.cpp call that can wait on an RPC server runs on one thread, the link, while its
caller waits with a timeout (and can be interrupted). On an RPC abort, in the link's thread or
in one of ggml-rpc's dispatcher threads that it waits on, the callback hands the caller one
line and parks its own thread for good instead of returning; the caller raises RpcLost. A call
past its timeout raises RpcTimeout. Either way the link is lost: its thread, or one it waits
on, never comes back, and llama.cpp's RPC client may be left holding its locks, so every later
RPC call in this process raises at once. Local models never touch the link.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections import Counter
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from functools import cache
from typing import Any, Callable

from specrun.backend import rpc
from specrun.backend.devices import device_memory, local_gpu_devices
from specrun.backend.library import ABORT_CALLBACK, ADD_SERVER, ggml, llama, recent_log
from specrun.errors import RpcLost, RpcTimeout, SpecrunError

RPC_BUILD = 'CMAKE_ARGS="-DGGML_RPC=on" pip install --force-reinstall --no-cache-dir "llama-cpp-python>=0.3.36,<0.4"'
DURING_DECODE = "during a decode"

_held: Counter[str] = Counter()  # endpoints that live models of this process hold a connection to


@dataclass(frozen=True)
class Waiting:
    """What a call through the link waits on, and for how long."""

    servers: tuple[str, ...]
    timeout: float  # seconds; 0 waits forever
    doing: str = DURING_DECODE  # completes "no answer ... for N s {doing}"

    def timed_out_line(self) -> str:
        hint = " (raise --rpc-timeout if decodes are this slow)" if self.doing == DURING_DECODE else ""
        return lost_line(
            self.servers,
            f"no answer from the RPC servers ({', '.join(self.servers)}) for {self.timeout:g} s "
            f"{self.doing}: one is stuck or the network is down{hint}",
        )


class RpcLink:
    """The one thread that makes this process's llama.cpp calls that can wait on RPC servers."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Future, Callable[..., Any], tuple]] = queue.SimpleQueue()
        self._lock = threading.Lock()  # orders submitting, running and failing calls
        self._thread: threading.Thread | None = None
        self._running: Future | None = None
        self._failure: RpcLost | None = None

    @property
    def lost(self) -> bool:
        return self._failure is not None

    def ensure_usable(self) -> None:
        """Refuse new work on RPC servers once the link is lost."""
        if self._failure is not None:
            raise RpcLost(
                "llama.cpp's RPC client in this process is stuck since an RPC server was lost or stopped "
                "answering: start a new process to use RPC servers"
            )

    def call(self, waiting: Waiting, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the link's thread. Raises RpcLost when a server goes away meanwhile,
        RpcTimeout past waiting.timeout, and either at once when the link was lost before."""
        job: Future = Future()
        self._submit(job, fn, args)
        deadline = time.monotonic() + waiting.timeout if waiting.timeout > 0 else None
        try:
            return self._wait(job, waiting, deadline)
        except KeyboardInterrupt:
            self._settle_interrupted(job, waiting, deadline)
            raise

    def fail(self, error: RpcLost) -> None:
        """Give the link up: the calls waiting on it and every later one raise `error` (the first kept)."""
        with self._lock:
            self._failure = self._failure or error
            waiting = [self._running] if self._running else []
            while not self._calls.empty():
                waiting.append(self._calls.get_nowait()[0])
            for job in waiting:
                if not job.done():
                    job.set_exception(self._error())

    def _error(self) -> RpcLost:
        assert self._failure is not None
        return type(self._failure)(str(self._failure))  # a fresh one per raise, for a clean traceback

    def _submit(self, job: Future, fn: Callable[..., Any], args: tuple) -> None:
        with self._lock:
            if self._failure is not None:
                raise self._error()
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="specrun-rpc-link", daemon=True)
                self._thread.start()
            self._calls.put((job, fn, args))

    def _serve(self) -> None:
        while True:
            job, fn, args = self._calls.get()
            with self._lock:
                self._running = job
            try:
                result, error = fn(*args), None
            except BaseException as exc:  # handed to the caller, whatever it is
                result, error = None, exc
            with self._lock:
                self._running = None
                if job.done():  # a failure got there first
                    continue
                if error is None:
                    job.set_result(result)
                else:
                    job.set_exception(error)

    def _wait(self, job: Future, waiting: Waiting, deadline: float | None) -> Any:
        try:
            return job.result(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            self.fail(RpcTimeout(waiting.timed_out_line()))
            raise self._error() from None

    def _settle_interrupted(self, job: Future, waiting: Waiting, deadline: float | None) -> None:
        """After Ctrl-C the call goes on in the link's thread: let it end (a decode takes moments),
        so the caller's clean-up finds llama.cpp idle. A second Ctrl-C gives the servers up."""
        try:
            self._wait(job, waiting, deadline)
        except KeyboardInterrupt:
            self.fail(
                RpcLost(
                    f"interrupted {waiting.doing}, with the RPC servers ({', '.join(waiting.servers)}) still at "
                    "work: llama.cpp's RPC client cannot carry on in this process; start a new one"
                )
            )
        except Exception:
            pass  # the call's own error: the caller hears of the interrupt


LINK = RpcLink()


# --- the servers -------------------------------------------------------------------------
def rpc_supported() -> bool:
    """Whether this llama-cpp-python was built with llama.cpp's RPC backend."""
    L = llama()
    return bool(L.llama_supports_rpc())


def check_rpc(endpoints: tuple[str, ...]) -> list[rpc.RpcServer]:
    """That this build can use RPC servers and each of them answers, or one line saying why not."""
    if not rpc_supported():
        raise SpecrunError(f"this llama-cpp-python was built without llama.cpp's RPC backend, needed by --rpc: {RPC_BUILD}")
    LINK.ensure_usable()
    return rpc_servers(endpoints)


def rpc_servers(endpoints: tuple[str, ...]) -> list[rpc.RpcServer]:
    """Version and device memory of each server. A server this process already holds is asked
    through llama.cpp's own connection: an rpc-server would not answer a second one."""
    held = set(endpoints) & set(held_endpoints())
    checked = iter(rpc.check_servers(tuple(e for e in endpoints if e not in held), held=held_endpoints()))
    servers = []
    for endpoint in endpoints:
        if endpoint in held:
            waiting = Waiting((endpoint,), rpc.ANSWER_TIMEOUT_S, "when asked for its memory")
            servers.append(rpc.RpcServer(endpoint, None, LINK.call(waiting, _server_memory, endpoint)))
        else:
            servers.append(next(checked))
    return servers


def offload_devices(endpoints: tuple[str, ...]) -> list[int]:
    """The devices a model with layers on `endpoints` offloads to: the RPC servers' devices in
    the order given (llama.cpp puts RPC first to keep transfers down), then the local GPUs."""
    check_rpc(endpoints)  # a server that is down, busy or of another version: one clear line, no abort
    _watch_aborts()
    devices = []
    for endpoint in endpoints:
        # The server answered specrun's check a moment ago, but llama.cpp would wait forever if it stops now.
        devices += LINK.call(Waiting((endpoint,), rpc.ANSWER_TIMEOUT_S, "at the RPC hello"), _server_devices, endpoint)
    return devices + local_gpu_devices()


def hold(endpoints: tuple[str, ...]) -> None:
    _held.update(endpoints)


def release(endpoints: tuple[str, ...]) -> None:
    _held.subtract(endpoints)


def held_endpoints() -> tuple[str, ...]:
    return tuple(e for e, n in _held.items() if n > 0)


def _server_devices(endpoint: str) -> list[int]:
    """llama.cpp's devices for one server (ggml_backend_rpc_add_server, as llama.cpp's --rpc does;
    it keeps one registry per endpoint, so asking again is free). On the link's thread."""
    lib = ggml()
    rpc_reg = lib.ggml_backend_reg_by_name(b"RPC")
    add_server = ADD_SERVER(lib.ggml_backend_reg_get_proc_address(rpc_reg, b"ggml_backend_rpc_add_server"))
    server_reg = add_server(endpoint.encode())
    if not server_reg:
        raise SpecrunError(f"RPC server {endpoint} has no devices to hold layers: start rpc-server with a device")
    return [lib.ggml_backend_reg_dev_get(server_reg, i) for i in range(lib.ggml_backend_reg_dev_count(server_reg))]


def _server_memory(endpoint: str) -> tuple[rpc.DeviceMemory, ...]:
    return tuple(rpc.DeviceMemory(*device_memory(dev)) for dev in _server_devices(endpoint))


# --- when an RPC server goes away ----------------------------------------------------------
def abort_line(text: str) -> str | None:
    """One line for an abort of ggml-rpc.cpp's client; None for any other abort."""
    if "Failed to connect to " in text:
        endpoint = text.split("Failed to connect to ", 1)[1].strip()
        return (
            f"RPC server {endpoint} cannot be reached any more (llama.cpp could not connect): is rpc-server still running there?"
        )
    if "RPC handshake failed for " in text:
        endpoint = text.split("RPC handshake failed for ", 1)[1].strip()
        said = next((line.strip() for line in reversed(recent_log()) if "version mismatch" in line), "")
        return (
            f"RPC server {endpoint} speaks another RPC protocol version than this llama-cpp-python"
            f"{f' ({said})' if said else ''}: build rpc-server from the llama.cpp that llama-cpp-python bundles"
        )
    if "Remote RPC server crashed" in text:
        held = held_endpoints()
        return lost_line(
            held,
            f"an RPC server ({', '.join(held)}) closed the connection or sent a malformed reply: "
            "restart rpc-server and run again",
        )
    return None


def lost_line(endpoints: tuple[str, ...], otherwise: str) -> str:
    """Names the servers that no longer take connections; `otherwise` when all still do."""
    lost = rpc.lost_servers(endpoints)
    if not lost:
        return otherwise
    return (
        f"lost RPC server {', '.join(lost)}: it no longer accepts connections (stopped, or its machine or "
        "network went down); the layers it held are gone: restart rpc-server and run again"
    )


@cache
def _watch_aborts() -> None:
    ggml().ggml_set_abort_callback(_on_ggml_abort)


@ABORT_CALLBACK
def _on_ggml_abort(message: bytes) -> None:
    text = message.decode("utf-8", "replace")
    line = abort_line(text)
    if line is None or os.environ.get("SPECRUN_DEBUG"):
        print(text, file=sys.stderr)  # what ggml prints without a callback
    if line is None:
        return  # not RPC's: ggml's abort() follows, as without a callback
    LINK.fail(RpcLost(line))
    threading.Event().wait()  # never return, or ggml aborts the process; the wait releases the GIL
