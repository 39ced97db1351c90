"""A loopback port reserved for this test process (the Python side of tests/support/free_port.hpp).

Probing a port with bind(0) and binding it later races with every connect() on the machine. A
reserved port lies below the kernel's ephemeral range (so the kernel never hands it out), is held by
an exclusive lock on /tmp/ddprun-test-ports/PORT for the life of this process (so no other test
process, C++ or Python, reserves it), and is skipped if something already listens on it.
"""
import fcntl
import os
import socket

_held = []  # lock files kept open (and locked) until the process exits
_next = None


def _ephemeral_start():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
            return lo if lo > 1024 else 32768
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def free_port():
    global _next
    low, high = 10000, _ephemeral_start()
    span = high - low
    if _next is None:
        _next = low + (os.getpid() * 7919) % span
    os.makedirs("/tmp/ddprun-test-ports", mode=0o1777, exist_ok=True)
    for _ in range(span):
        port = _next
        _next = low if _next + 1 >= high else _next + 1
        f = open(f"/tmp/ddprun-test-ports/{port}", "a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            continue
        if not _bindable(port):
            f.close()
            continue
        _held.append(f)
        return port
    raise RuntimeError("free_port: no port below the ephemeral range could be reserved")


def port_taken(port):
    """Whether a process has bound `port` (a ddprun now hosting its store there): a probe by bind,
    which that process does not see (a connection would reach its store)."""
    return not _bindable(port)
