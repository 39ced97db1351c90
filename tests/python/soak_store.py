"""Soak: ddprun-rendezvous under hostile clients while a real PyTorch job runs through it.

For a bounded time, attacker threads cycle through everything a hostile or buggy client can send
(garbage, unknown commands, wrong handshakes, oversized headers, replies too large to build,
pipelined requests never read, a watcher that never reads, requests over the store's limits, slow
and half-sent requests, connection floods), while two PyTorch gloo workers (Debian's torch 1.13)
rendezvous through the same daemon and all-reduce in a loop, checking every result. At the end the
workers must have succeeded, the daemon must still serve, and its memory must have stayed bounded.

usage: /usr/bin/python3 soak_store.py PATH/TO/ddprun-rendezvous [SECONDS]
"""
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time

from daemon import Daemon

MAGIC = struct.pack("<I", 0x3C85F7CE)
HELLO = b"\x00" + MAGIC


def s_(b):
    return struct.pack("<Q", len(b)) + b


def v2_set(k, v):
    return b"\x01" + s_(k) + s_(v)


def v2_keys(op, keys):
    return bytes([op]) + struct.pack("<Q", len(keys)) + b"".join(s_(k) for k in keys)


def connect(port, timeout=5.0):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def drain_until_closed(s, limit=1 << 20):
    got = 0
    try:
        while got < limit:
            b = s.recv(65536)
            if not b:
                return True
            got += len(b)
    except (socket.timeout, ConnectionError):
        return False
    return False


# Each attack connects, misbehaves, and leaves; exceptions from the daemon closing on it are the point.
def garbage(port, rnd):
    with connect(port) as s:
        s.sendall(bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 300))))
        drain_until_closed(s)


def unknown_command(port, rnd):
    with connect(port) as s:
        s.sendall(HELLO + b"\x7f")
        drain_until_closed(s)


def wrong_magic(port, rnd):
    with connect(port) as s:
        s.sendall(HELLO + b"\x00" + struct.pack("<I", 0xDEADBEEF))
        drain_until_closed(s)


def oversized_header(port, rnd):
    with connect(port) as s:
        s.sendall(HELLO + b"\x03" + struct.pack("<Q", 1 << 40))
        drain_until_closed(s)


def huge_reply(port, rnd):
    with connect(port) as s:
        s.sendall(HELLO + v2_set(b"soak/big", b"x" * (8 << 20)))
        s.sendall(v2_keys(10, [b"soak/big"] * 2000))  # MULTI_GET: a 16 GiB reply
        drain_until_closed(s)


def pipelined_unread(port, rnd):
    with connect(port) as s:
        s.sendall(HELLO + b"".join(b"\x03" + s_(b"soak/big") for _ in range(500)))
        time.sleep(0.2)  # sleep override: leave the replies unread for a while


def watcher_not_reading(port, rnd):
    with connect(port) as w, connect(port) as setter:
        w.sendall(b"\x07" + s_(b"/soak/w"))  # 1.13 WATCH_KEY
        w.recv(1)
        for i in range(12):
            setter.sendall(b"\x00" + s_(b"/soak/w") + s_(bytes([65 + i]) * (4 << 20)))  # 1.13 SET
        setter.sendall(b"\x06")  # GETNUMKEYS: every SET applied
        setter.recv(8)


def over_store_limit(port, rnd):
    with connect(port) as s:
        entries = [(b"soak/m%d" % i, b"y" * (6 << 20)) for i in range(12)]  # 72 MiB > --max-store-bytes
        s.sendall(HELLO + b"\x0b" + struct.pack("<q", len(entries)) + b"".join(s_(k) + s_(v) for k, v in entries))
        drain_until_closed(s)


def slow_request(port, rnd):
    with connect(port) as s:
        req = HELLO + v2_keys(6, [b"soak/slow%d" % i for i in range(300)])  # WAIT on keys never set
        for off in range(0, len(req), 7):
            s.sendall(req[off:off + 7])
        s.sendall(b"\x0c")  # CANCEL_WAIT
        s.recv(1)


def half_sent(port, rnd):
    with connect(port) as s:
        s.sendall(HELLO + v2_set(b"soak/half", b"z" * 1000)[:rnd.randint(1, 500)])
        time.sleep(0.05)  # sleep override: a client that stops mid-request, then vanishes


def connection_flood(port, rnd):
    socks = []
    try:
        for _ in range(300):
            socks.append(connect(port))
    finally:
        for s in socks:
            s.close()


ATTACKS = [garbage, unknown_command, wrong_magic, oversized_header, huge_reply, pipelined_unread,
           watcher_not_reading, over_store_limit, slow_request, half_sent, connection_flood]

WORKER = r"""
import datetime, os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=120))
rank, world = dist.get_rank(), dist.get_world_size()
store = dist.distributed_c10d._get_default_store()
deadline = time.time() + float(sys.argv[1])
steps = 0
while True:
    # Stop together: every rank must run the same collectives.
    go = torch.tensor([1.0 if time.time() < deadline else 0.0])
    dist.all_reduce(go, op=dist.ReduceOp.MIN)
    if go.item() == 0:
        break
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.all(t == world * (world + 1) / 2), t[:4]
    store.set(f"soak/r{rank}/{steps % 8}", str(steps))
    assert store.get(f"soak/r{rank}/{steps % 8}") == str(steps).encode()
    assert store.add(f"soak/count/{rank}", 1) == steps + 1
    steps += 1
dist.barrier()
print(f"rank {rank}: {steps} steps", flush=True)
"""


def main():
    binary = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
    daemon = Daemon(binary, ["--max-store-bytes", str(64 << 20), "--metrics-port", "0"])
    workers = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(daemon.port), RANK=str(rank),
                   WORLD_SIZE="2", LOCAL_RANK=str(rank), TORCHELASTIC_USE_AGENT_STORE="True",
                   TORCHELASTIC_RESTART_COUNT="0", OMP_NUM_THREADS="1",
                   # ddprun's Python hook, as under ddprun (PyTorch >= 2.4 without libuv needs it)
                   PYTHONPATH=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "launcher",
                                           "workers", "python_hook"))
        workers.append(subprocess.Popen([sys.executable, "-c", WORKER, str(seconds)], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    stop = time.monotonic() + seconds
    counts = {a.__name__: 0 for a in ATTACKS}
    peak_rss = [0]

    def attacker(seed):
        rnd = random.Random(seed)
        while time.monotonic() < stop:
            attack = ATTACKS[rnd.randrange(len(ATTACKS))]
            try:
                attack(daemon.port, rnd)
            except OSError:
                pass  # the daemon closed on us: that is what it should do
            counts[attack.__name__] += 1
            peak_rss[0] = max(peak_rss[0], daemon.rss_kib())

    threads = [threading.Thread(target=attacker, args=(seed,)) for seed in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failures = []
    for rank, w in enumerate(workers):
        out, _ = w.communicate(timeout=180)
        if w.returncode != 0:
            failures.append(f"worker {rank} exited {w.returncode}:\n{out}")
        else:
            print(out.strip())
    alive = daemon.proc.poll() is None
    if alive:
        with connect(daemon.port) as s:  # still serving
            s.sendall(HELLO + b"\x0d" + struct.pack("<I", 42))
            if s.recv(4) != struct.pack("<I", 42):
                failures.append("the daemon stopped answering")
    else:
        failures.append(f"the daemon exited with {daemon.proc.returncode}:\n{daemon.log()[-3000:]}")
    print(f"attacks run: {counts}")
    print(f"daemon peak RSS while under attack: {peak_rss[0] // 1024} MiB")
    if peak_rss[0] > 512 * 1024:
        failures.append(f"daemon RSS reached {peak_rss[0] // 1024} MiB")
    if min(counts.values()) == 0:
        failures.append("not every attack ran; lengthen the soak")
    code, log = daemon.stop()
    closed = sum(1 for line in log.splitlines() if "closing the connection" in line)
    print(f"connections the daemon closed for bad input or limits: {closed}")
    if failures:
        print("FAIL:\n" + "\n".join(failures), file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
