"""A stand-in for llama.cpp's rpc-server that answers only the commands specrun's check sends
(HELLO, DEVICE_COUNT, GET_DEVICE_MEMORY), or misbehaves on purpose (not a test module itself).

It listens on 127.0.0.1 on a free port, serves one connection at a time like rpc-server,
answers at most `max_connections` connections, and stops when closed.
"""

from __future__ import annotations

import socket
import struct
import threading
from typing import Literal

# answer: as rpc-server; silent: never answers HELLO; close: hangs up at HELLO; short: protocol 2's
# 3-byte HELLO reply; answer_once: answers the first client only (as if it stopped right after);
# gone_after_check: answers the first client, then stops listening (later connections are refused)
Behaviour = Literal["answer", "silent", "close", "short", "answer_once", "gone_after_check"]


class FakeRpcServer:
    def __init__(
        self, version=(7, 0, 0), devices=((3 * 2**30, 4 * 2**30),), behaviour: Behaviour = "answer", max_connections: int = 20
    ):
        self.version, self.devices, self.behaviour = version, devices, behaviour
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.endpoint = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._stop = threading.Event()
        self._max = max_connections
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()

    def __enter__(self) -> "FakeRpcServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _serve(self) -> None:
        for served in range(self._max):
            conn = self._accept()
            if conn is None:
                return
            if served == 1 and self.behaviour == "answer_once":
                self.behaviour = "silent"
            with conn:
                conn.settimeout(5)
                try:
                    self._session(conn)
                except OSError:
                    pass
            if self.behaviour == "gone_after_check":
                self._listener.close()
                return

    def _accept(self) -> socket.socket | None:
        while not self._stop.is_set():
            try:
                return self._listener.accept()[0]
            except socket.timeout:
                continue
        return None

    def _session(self, conn: socket.socket) -> None:
        while not self._stop.is_set():
            header = _read(conn, 9)
            if header is None:
                return
            command, size = header[0], struct.unpack("<Q", header[1:])[0]
            payload = _read(conn, size) if size else b""
            if command == 14:  # HELLO
                if self.behaviour == "silent":
                    self._stop.wait(10)
                    return
                if self.behaviour == "close":
                    return
                reply = bytes([*self.version, 0]) + bytes(24)
                if self.behaviour == "short":
                    reply = reply[:3]  # protocol 2's reply: three bytes, no capabilities
            elif command == 15:  # DEVICE_COUNT
                reply = struct.pack("<I", len(self.devices))
            elif command == 11:  # GET_DEVICE_MEMORY
                (device,) = struct.unpack("<I", payload)
                reply = struct.pack("<QQ", *self.devices[device])
            else:
                return
            conn.sendall(struct.pack("<Q", len(reply)) + reply)


def _read(conn: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data
