"""A hostile local peer of a fault-tolerant job, for test_ft_hostile.py: what any process that reaches a
replica group's worker store (PyTorch's store clients cannot authenticate, so the store cannot tell
them from the group's workers) or a rank's state server may do. It speaks the TCPStore wire itself
(2.x numbering) and reads whatever it finds there, signed values included: signing hides nothing.

  ft_hostile.py serve PORT_FILE LOG_FILE MARK_FILE
      a state server of its own on 127.0.0.1: every request is a line in LOG_FILE; it answers every
      GET with a pickle that writes MARK_FILE when it is loaded, with a MAC under its own key, and
      writes its "host:port#key" to PORT_FILE
  ft_hostile.py quorums STORE_PORT ADDRESS COUNT
      writes COUNT quorum answers, from the third after the latest, into the worker store before
      the group's agent does, each telling the group to heal from ADDRESS
  ft_hostile.py asks STORE_PORT ADDRESS COUNT RANK
      writes rank RANK's next COUNT asks into the worker store before its worker does, each at the
      step the group holds, with ADDRESS as where the rank serves its state
  ft_hostile.py hold STORE_PORT READY_FILE IDLE
      opens IDLE connections that send nothing and one that sends a header line a second to the
      state server of rank 0 (found in the asks), writes READY_FILE, and keeps them until killed
  ft_hostile.py probe STORE_PORT
      asks rank 0's state server for its state without a proof, and with a made-up one (and for
      the step a 404 names, if one does); prints one JSON line per request: path, status, bytes
"""
import hashlib
import hmac
import http.server
import json
import os
import pickle
import re
import socket
import struct
import sys
import time

MAGIC = 0x3C85F7CE
SET, GET, LIST = 1, 3, 17
KEY = bytes.fromhex("11" * 32)


def _field(b):
    return struct.pack("<Q", len(b)) + b


def _recv(c, n):
    out = b""
    while len(out) < n:
        chunk = c.recv(n - len(out))
        if not chunk:
            raise EOFError("the store closed the connection")
        out += chunk
    return out


class Store:
    def __init__(self, port):
        self.c = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.c.sendall(b"\x00" + struct.pack("<I", MAGIC))

    def set(self, key, value):
        self.c.sendall(bytes([SET]) + _field(key.encode()) + _field(value.encode()))

    def get(self, key):
        self.c.sendall(bytes([GET]) + _field(key.encode()))
        return _recv(self.c, struct.unpack("<Q", _recv(self.c, 8))[0]).decode()

    def keys(self):
        self.c.sendall(bytes([LIST]))
        n = struct.unpack("<q", _recv(self.c, 8))[0]
        return [_recv(self.c, struct.unpack("<Q", _recv(self.c, 8))[0]).decode() for _ in range(n)]


def readable(value):
    """A value as a reader sees it: a signed one's body (signing hides nothing), else itself."""
    record = json.loads(value)
    if isinstance(record, dict) and isinstance(record.get("body"), str):
        return json.loads(record["body"])
    return record


def forged(record):
    """`record` as both kinds of reader would take it: its fields, and a body with a made-up MAC."""
    return json.dumps(dict(record, body=json.dumps(record), mac="00" * 32))


def latest(store, kind):
    """The highest n of /ddprun_ft/<kind>/<n>... in the store, and its value (rank 0's for asks)."""
    found = [int(m.group(1)) for m in (re.match(r"/ddprun_ft/%s/(\d+)" % kind, k) for k in store.keys()) if m]
    top = max(found)
    return top, readable(store.get("/ddprun_ft/%s/%d" % (kind, top) + ("/0" if kind == "ask" else "")))


def state_server(store):
    """Rank 0's state server, as its asks name it ("host:port", a "#key" after it left off)."""
    _, ask = latest(store, "ask")
    host, _, port = ask["recovery"].partition("#")[0].rpartition(":")
    return host.strip("[]"), int(port)


def serve(port_file, log_file, mark_file):
    class Payload:
        def __reduce__(self):
            return (os.system, ("echo loaded by pid $PPID > '%s'" % mark_file,))

    blob = pickle.dumps(Payload(), protocol=2)
    mac = hmac.new(KEY, blob, hashlib.sha256).hexdigest()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            with open(log_file, "a") as log:
                log.write("%s %s\n" % (self.command, self.path))
            self.send_response(200)
            self.send_header("Content-Length", str(len(blob)))
            self.send_header("X-Ddprun-Mac", mac)
            self.end_headers()
            self.wfile.write(blob)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(port_file + ".tmp", "w") as f:
        f.write("127.0.0.1:%d#%s" % (server.server_address[1], KEY.hex()))
    os.rename(port_file + ".tmp", port_file)
    server.serve_forever()


# The first quorum written ahead of the latest one: the group's agent may write the next one or two
# between the LIST that finds the latest and the first SET (a step every 0.1 s, and a loaded host),
# and a lie written over a sealed answer is an overwrite, which stops a job (a documented limit of
# an open worker store), not the write-before that the tests try.
AHEAD = 3


def quorums(port, address, count):
    store = Store(port)
    top, view = latest(store, "quorum")
    for k in range(AHEAD, count + AHEAD):
        lie = dict(view, seq=view.get("seq", 0) + k, heal=True, recover_from=view["groups"][0],
                   recover_addresses=[address] * 8, max_step=view["max_step"] + k, serves=[], participant_rank=-1)
        store.set("/ddprun_ft/quorum/%d" % (top + k), forged(lie))
    store.get("/ddprun_ft/quorum/%d" % top)  # a round trip: every SET before it has landed
    print("wrote quorums %d..%d" % (top + AHEAD, top + count + AHEAD - 1), flush=True)


def asks(port, address, count, rank):
    store = Store(port)
    top, view = latest(store, "quorum")
    for k in range(1, count + 1):  # the test holds the group between two quorums: no race here
        lie = {"step": view["max_step"] + k, "recovery": address, "shrink_only": False, "pg_ok": True}
        store.set("/ddprun_ft/ask/%d/%d" % (top + k, rank), forged(lie))
    store.get("/ddprun_ft/quorum/%d" % top)
    print("wrote asks %d..%d of rank %d" % (top + 1, top + count, rank), flush=True)


def hold(port, ready_file, idle):
    where = state_server(Store(port))
    held = [socket.create_connection(where, timeout=10) for _ in range(idle)]
    slow = socket.create_connection(where, timeout=10)
    slow.sendall(b"GET /state/0 HTTP/1.1\r\n")
    with open(ready_file, "w") as f:
        f.write("%s:%d\n" % where)
    line = 0
    while True:
        try:
            slow.sendall(b"X-Slow-%d: y\r\n" % line)
        except OSError:
            pass  # cut off: what the server may do
        line += 1
        time.sleep(1)  # sleep override: a slow peer's pace (the idle ones stay open in `held`)


def request(where, path, headers=()):
    c = socket.create_connection(where, timeout=10)
    c.sendall(("GET %s HTTP/1.1\r\nHost: x\r\n%s\r\n" % (path, "".join("%s: %s\r\n" % h for h in headers))).encode())
    out = b""
    try:
        while True:
            chunk = c.recv(1 << 20)
            if not chunk:
                break
            out += chunk
            head, _, body = out.partition(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length: *(\d+)", head)
            if length and len(body) >= int(length.group(1)):
                break
    except OSError:
        pass
    head, _, body = out.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/") else 0
    return {"path": path, "status": status, "bytes": len(body), "body": body[:200].decode("latin-1")}


def probe(port):
    where = state_server(Store(port))
    answers = [request(where, "/state/0"), request(where, "/state/0", [("X-Ddprun-Auth", "ab" * 32)])]
    named = re.search(r"serves step (\d+)", answers[0]["body"])
    if named:
        answers.append(request(where, "/state/" + named.group(1)))
    for a in answers:
        print(json.dumps(a), flush=True)


if __name__ == "__main__":
    what, args = sys.argv[1], sys.argv[2:]
    if what == "serve":
        serve(*args)
    elif what == "quorums":
        quorums(int(args[0]), args[1], int(args[2]))
    elif what == "asks":
        asks(int(args[0]), args[1], int(args[2]), int(args[3]))
    elif what == "hold":
        hold(int(args[0]), args[1], int(args[2]))
    elif what == "probe":
        probe(int(args[0]))
    else:
        sys.exit(__doc__)
