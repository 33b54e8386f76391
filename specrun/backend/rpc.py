"""llama.cpp RPC servers: the endpoints of --rpc, and a check of each before llama.cpp sees it.

llama.cpp's RPC client aborts when it cannot connect (specrun.backend turns that into RpcLost,
after which RPC is unusable in the process) and waits forever for a server that accepts the
connection but does not answer (an `rpc-server` serves one client at a time). So before an
endpoint is handed to llama.cpp, specrun connects itself, with timeouts, and asks what
llama.cpp asks first: the protocol version (HELLO), the number of devices and each
device's memory. The wire format is ggml-rpc.cpp's: a command byte, a little-endian u64
payload size and the payload; a reply is a u64 size and the payload. Nothing else goes over
this connection: the model's traffic is llama.cpp's own.
"""

from __future__ import annotations

import socket
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata

from specrun.errors import SpecrunError

# ggml-rpc.cpp's command numbers (HELLO is fixed at 14 across protocol versions).
CMD_GET_DEVICE_MEMORY = 11
CMD_HELLO = 14
CMD_DEVICE_COUNT = 15
CONN_CAPS_SIZE = 24  # transport capabilities sent with HELLO; all zero means plain TCP
HELLO_REPLY_SIZE = 4 + CONN_CAPS_SIZE  # major, minor, patch, padding, capabilities

# RPC_PROTO_*_VERSION of ggml-rpc.h in the llama.cpp that each tested llama-cpp-python
# release bundles (tests/test_rpc.py checks it against an rpc-server built from that source).
PROTOCOL_BY_RELEASE = {"0.3.36": (7, 0, 0)}

CONNECT_TIMEOUT_S = 5.0
ANSWER_TIMEOUT_S = 10.0
LOST_CHECK_TIMEOUT_S = 2.0

Version = tuple[int, int, int]


@dataclass(frozen=True)
class DeviceMemory:
    free: int
    total: int


@dataclass(frozen=True)
class RpcServer:
    endpoint: str
    version: Version | None  # None when not asked (llama.cpp already holds the connection)
    devices: tuple[DeviceMemory, ...]

    @property
    def free_bytes(self) -> int:
        return sum(d.free for d in self.devices)


def parse_endpoints(text: str | None, option: str = "--rpc") -> tuple[str, ...]:
    """HOST:PORT[,HOST:PORT...] as llama.cpp's RPC client takes them (IPv4 or a host name)."""
    if text is None:
        return ()
    endpoints = []
    for item in (part.strip() for part in text.split(",")):
        host, sep, port = item.partition(":")
        if not item or not sep or not host or ":" in port:
            ipv6 = " (llama.cpp's RPC client takes IPv4 addresses and host names, not IPv6)" if item.count(":") > 1 else ""
            raise SpecrunError(
                f"{option} {text!r}: {item!r} is not HOST:PORT{ipv6}; e.g. {option} 192.168.1.20:50052,192.168.1.21:50052"
            )
        if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
            raise SpecrunError(f"{option} {text!r}: the port of {item!r} has to be a number from 1 to 65535")
        endpoint = f"{host}:{int(port)}"
        if endpoint in endpoints:
            raise SpecrunError(f"{option} lists {endpoint} twice: give each rpc-server once")
        endpoints.append(endpoint)
    return tuple(endpoints)


def parse_tensor_split(text: str | None) -> tuple[float, ...]:
    """--tensor-split 3,1 (or 3/1, as llama.cpp takes it): each device's share of the layers."""
    if text is None:
        return ()
    parts = [p.strip() for p in text.replace("/", ",").split(",")]
    try:
        weights = tuple(float(p) for p in parts)
    except ValueError:
        raise SpecrunError(f"--tensor-split {text!r}: give one number per device, e.g. --tensor-split 3,1") from None
    if any(not w >= 0 or w == float("inf") for w in weights) or not any(weights):
        raise SpecrunError(f"--tensor-split {text!r}: the weights have to be finite, >= 0, and not all 0")
    return weights


def client_protocol() -> Version | None:
    """The RPC protocol the installed llama-cpp-python speaks; None for an untested release."""
    try:
        return PROTOCOL_BY_RELEASE.get(metadata.version("llama-cpp-python"))
    except metadata.PackageNotFoundError:
        return None


def version_text(version: Version | None) -> str:
    return ".".join(map(str, version)) if version else "unknown"


def check_server(
    endpoint: str, connect_timeout: float = CONNECT_TIMEOUT_S, answer_timeout: float = ANSWER_TIMEOUT_S
) -> RpcServer:
    """Connect to one rpc-server and read its version and devices, or fail with one line."""
    with _connect(endpoint, connect_timeout) as sock:
        sock.settimeout(answer_timeout)
        try:
            version = _hello(sock)
            (count,) = struct.unpack("<I", _call(sock, CMD_DEVICE_COUNT, b"", 4))
            devices = tuple(
                DeviceMemory(*struct.unpack("<QQ", _call(sock, CMD_GET_DEVICE_MEMORY, struct.pack("<I", i), 16)))
                for i in range(count)
            )
        except socket.timeout:
            raise SpecrunError(
                f"RPC server {endpoint} accepted the connection but did not answer within {answer_timeout:g} s: "
                "an rpc-server serves one client at a time; is another program (another specrun?) using it?"
            ) from None
        except _BadReply as exc:
            raise SpecrunError(f"RPC server {endpoint} {exc}") from None
        except OSError as exc:
            raise SpecrunError(
                f"RPC server {endpoint} dropped the connection ({exc.strerror or exc}): is it an rpc-server?"
            ) from None
    if not devices:
        raise SpecrunError(f"RPC server {endpoint} has no devices to hold layers: start rpc-server with a device")
    return RpcServer(endpoint, version, devices)


def check_servers(endpoints: tuple[str, ...], held: tuple[str, ...] = ()) -> list[RpcServer]:
    """check_server for each, in parallel. Two names for one server are refused, also against
    the `held` endpoints this process is connected to: llama.cpp would open a second connection,
    which a busy rpc-server never answers."""
    addresses: dict[tuple[str, int], str] = {}
    for endpoint in (*held, *endpoints):
        address = _address(endpoint)
        other = addresses.setdefault(address, endpoint)
        if other != endpoint:
            raise SpecrunError(f"{other} and {endpoint} are one rpc-server ({address[0]}:{address[1]}): name it one way only")
    with ThreadPoolExecutor(max_workers=max(1, len(endpoints))) as pool:
        return list(pool.map(check_server, endpoints))


def lost_servers(endpoints: tuple[str, ...], timeout: float = LOST_CHECK_TIMEOUT_S) -> list[str]:
    """The endpoints that no longer accept a TCP connection (refused, unreachable, silent)."""

    def lost(endpoint: str) -> bool:
        try:
            with _connect(endpoint, timeout):
                return False
        except SpecrunError:
            return True

    with ThreadPoolExecutor(max_workers=max(1, len(endpoints))) as pool:
        return [e for e, gone in zip(endpoints, pool.map(lost, endpoints)) if gone]


class _BadReply(Exception):
    """A reply that is not what the protocol says; the message completes 'RPC server X ...'."""


def _address(endpoint: str) -> tuple[str, int]:
    """The IPv4 address llama.cpp will connect to (it resolves with gethostbyname)."""
    host, _, port = endpoint.rpartition(":")
    try:
        infos = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror:
        raise SpecrunError(f"RPC server {endpoint}: the host name {host!r} does not resolve to an IPv4 address") from None
    return str(infos[0][4][0]), int(port)


def _connect(endpoint: str, timeout: float) -> socket.socket:
    address = _address(endpoint)
    try:
        return socket.create_connection(address, timeout=timeout)
    except ConnectionRefusedError:
        raise SpecrunError(
            f"RPC server {endpoint} refused the connection: is rpc-server running there "
            f"(`rpc-server -H <its address> -p {address[1]}`)?"
        ) from None
    except socket.timeout:
        raise SpecrunError(
            f"RPC server {endpoint} did not accept a connection within {timeout:g} s: "
            f"check the address, that the machine is up and that port {address[1]} is open"
        ) from None
    except OSError as exc:
        raise SpecrunError(f"RPC server {endpoint} cannot be reached: {exc.strerror or exc}") from None


def _hello(sock: socket.socket) -> Version:
    ours = client_protocol()
    try:
        reply = _call(sock, CMD_HELLO, bytes(CONN_CAPS_SIZE), HELLO_REPLY_SIZE)
    except (_BadReply, ConnectionError):
        raise _BadReply(
            f"did not answer the RPC hello of protocol {version_text(ours)}: it runs another llama.cpp "
            "version (older or newer RPC protocol), or it is not an rpc-server; build rpc-server from the "
            "llama.cpp that llama-cpp-python bundles (`specrun doctor` shows how)"
        ) from None
    theirs = (reply[0], reply[1], reply[2])
    # negotiate_hello's rule: the same major version, and no newer minor than the client's.
    if ours is not None and (theirs[0] != ours[0] or theirs[1] > ours[1]):
        raise _BadReply(
            f"speaks RPC protocol {version_text(theirs)}, but this llama-cpp-python speaks {version_text(ours)}: "
            "build rpc-server from the llama.cpp that llama-cpp-python bundles (`specrun doctor` shows how)"
        )
    return theirs


def _call(sock: socket.socket, command: int, payload: bytes, reply_size: int) -> bytes:
    sock.sendall(bytes([command]) + struct.pack("<Q", len(payload)) + payload)
    (size,) = struct.unpack("<Q", _read(sock, 8))
    if size != reply_size:
        raise _BadReply(f"sent a {size}-byte reply where the RPC protocol has {reply_size} bytes: is it an rpc-server?")
    return _read(sock, size)


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data
