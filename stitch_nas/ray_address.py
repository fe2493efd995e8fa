"""Whether Ray answers at a cluster address, asked before anything is started or written.

``ray.init`` retries an address nothing answers at for minutes, silently, and one where another
service listens (a database's port) as long, so the address must answer as Ray does (a gRPC
server's HTTP/2 handshake) within ``search.ray_connect_timeout_s`` first. Torch- and Ray-free:
the CLI asks it with the other checks, in a second rather than after the imports.
"""

from __future__ import annotations

import os
import socket
import time

from stitch_nas.errors import ConfigError

__all__ = ["CONNECT_TIMEOUT_S", "check_ray_address"]

#: seconds a Ray cluster's address has to answer as Ray (search.ray_connect_timeout_s' default)
CONNECT_TIMEOUT_S = 10.0
# where a running local Ray records its address (what address="auto" joins without RAY_ADDRESS)
_CURRENT_CLUSTER = "/tmp/ray/ray_current_cluster"


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a cluster address (``host:port``, ``ray://host:port``, ``auto``: the
    one Ray would join); None when there is none to check (Ray then fails at once itself)."""
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS", "")
        if not address and os.path.isfile(_CURRENT_CLUSTER):
            with open(_CURRENT_CLUSTER) as stream:
                address = stream.read().strip()
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


#: what an HTTP/2 client sends first (RFC 9113, 3.4): the preface, then an empty SETTINGS frame
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS = 4  # the frame type a server's own preface starts with


def _answers_as_grpc(sock: socket.socket, deadline: float) -> bool:
    """Whether the server on ``sock`` answers an HTTP/2 preface with a SETTINGS frame, as a
    gRPC server (Ray's GCS, the Ray Client server) does; False if it says anything else or
    closes. Raises TimeoutError when it says nothing before ``deadline`` (monotonic)."""
    sock.settimeout(max(0.001, deadline - time.monotonic()))
    sock.sendall(_HTTP2_PREFACE)
    head = b""
    while len(head) < 9:  # a frame header: length (3), type, flags, stream id (4)
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        chunk = sock.recv(9 - len(head))
        if not chunk:
            return False
        head += chunk
    return head[3] == _SETTINGS and head[5:9] == bytes(4)


def check_ray_address(address: str | None, timeout_s: float | None = None) -> None:
    """Refuse a Ray cluster address that does not answer as Ray within ``timeout_s`` (default
    :data:`CONNECT_TIMEOUT_S`), before anything is started or written: nothing listens there,
    nothing answers, or another service does (``ray.init`` would retry either for minutes).

    Raises:
        ConfigError: no Ray answers there.
    """
    target = _host_port(address) if address else None
    if target is None:
        return
    timeout_s = CONNECT_TIMEOUT_S if timeout_s is None else timeout_s
    fix = "start it (ray start --head) or fix --ray-address"
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection(target, timeout=timeout_s) as sock:
            try:
                ray = _answers_as_grpc(sock, deadline)
            except TimeoutError:
                raise ConfigError(
                    f"the Ray cluster at {address!r} accepts a connection but does not answer as "
                    f"Ray within {timeout_s:g} s (another service listens there?); {fix} (ray "
                    "start prints the address; search.ray_connect_timeout_s: how long to wait)"
                ) from None
    except OSError as exc:
        timed_out = isinstance(exc, TimeoutError)
        why = f"no answer within {timeout_s:g} s" if timed_out else exc.strerror or str(exc)
        raise ConfigError(f"cannot reach the Ray cluster at {address!r} ({why}); {fix}") from None
    if not ray:
        raise ConfigError(
            f"what answers at {address!r} is not Ray (no gRPC handshake: another service "
            f"listens there); {fix} (ray start prints the address, port 6379 by default)"
        )
