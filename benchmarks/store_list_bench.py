#!/usr/bin/env python3
"""LIST on a store of many keys: how long its answer takes, and how long the store's one thread is
held meanwhile (a PING sent by another client just after the LIST, timed to its reply), for
ddprun-rendezvous and, in the same run, a reference build of it (an older ddprun-rendezvous).

  store_list_bench.py --daemon PATH [--reference PATH] [--keys 800000] [--runs 5]

Each daemon runs in its own process on a port of its own; the keys ("/bench/key-NNNNNNN", one-byte
values) are written by pipelined SETs, then LIST and the PING race RUNS times. Prints the medians
and the reference's over ddprun's."""
import argparse
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

MAGIC = 0x3C85F7CE
SET, PING, LIST = 1, 13, 17


def field(b):
    return struct.pack("<Q", len(b)) + b


def recv_exact(c, n):
    out = bytearray()
    while len(out) < n:
        chunk = c.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise EOFError("the store closed the connection")
        out += chunk
    return bytes(out)


def connect(port):
    c = socket.create_connection(("127.0.0.1", port), timeout=120)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.sendall(b"\x00" + struct.pack("<I", MAGIC))
    return c


def ping(c, nonce=7):
    c.sendall(bytes([PING]) + struct.pack("<I", nonce))
    (got,) = struct.unpack("<I", recv_exact(c, 4))
    assert got == nonce, got


def read_list(c):
    buf = bytearray(recv_exact(c, 8))
    (n,) = struct.unpack_from("<q", buf)
    pos, seen = 8, 0
    while seen < n:  # parse what has come, read more when a key is cut off
        while seen < n and pos + 8 <= len(buf):
            (size,) = struct.unpack_from("<Q", buf, pos)
            if pos + 8 + size > len(buf):
                break
            pos += 8 + size
            seen += 1
        if seen < n:
            del buf[:pos]
            pos = 0
            chunk = c.recv(1 << 22)
            if not chunk:
                raise EOFError("the store closed the connection")
            buf += chunk
    return n


def measure(binary, keys, runs):
    tmp = tempfile.mkdtemp(prefix="store-list-bench-")
    port_file = os.path.join(tmp, "port")
    proc = subprocess.Popen([binary, "--port", "0", "--port-file", port_file, "--max-total-keys", str(keys + 1024)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{binary} did not start")
            time.sleep(0.05)
        port = int(open(port_file).read())
        w = connect(port)
        batch = bytearray()
        for i in range(keys):
            batch += bytes([SET]) + field(b"/bench/key-%07d" % i) + field(b"v")
            if len(batch) > (1 << 20):
                w.sendall(batch)
                batch = bytearray()
        w.sendall(batch)
        ping(w)
        lister, pinger = connect(port), connect(port)
        ping(pinger)
        held, answered = [], []
        for _ in range(runs):
            t0 = time.monotonic()
            lister.sendall(bytes([LIST]))
            time.sleep(0.002)  # the LIST is the store's first
            t1 = time.monotonic()
            ping(pinger)
            held.append(time.monotonic() - t1)
            n = read_list(lister)
            answered.append(time.monotonic() - t0)
            assert n == keys, (n, keys)
        return statistics.median(answered), statistics.median(held)
    finally:
        proc.terminate()
        proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--reference")
    ap.add_argument("--keys", type=int, default=800000)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    rows = [("ddprun-rendezvous", a.daemon)] + ([("reference", a.reference)] if a.reference else [])
    got = {}
    for name, binary in rows:
        got[name] = measure(binary, a.keys, a.runs)
        answer, held = got[name]
        print(f"{name:18} {a.keys} keys: LIST answered in {answer * 1000:.0f} ms, "
              f"a PING behind it waited {held * 1000:.0f} ms (medians of {a.runs})")
    if a.reference:
        (na, nh), (ra, rh) = got["ddprun-rendezvous"], got["reference"]
        print(f"reference / ddprun: LIST {ra / na:.2f}x, store thread held {rh / max(nh, 1e-6):.2f}x")


if __name__ == "__main__":
    sys.exit(main())
