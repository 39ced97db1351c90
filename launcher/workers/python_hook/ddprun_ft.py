"""ddprun's fault-tolerant replica groups, for PyTorch workers (1.13 and 2.x).

ddprun writes this module beside its Python hook and puts it on the workers' PYTHONPATH: a worker
of a job started with --replica_group imports it as `ddprun_ft`. docs/fault-tolerance.md has the
design and the guarantees. In a training loop:

    manager = ddprun_ft.Manager(state_dict=lambda: {"model": model.state_dict(), "optimizer": opt.state_dict()},
                                load_state_dict=load)
    ddp = ddprun_ft.DistributedDataParallel(model, manager)  # inside the group: Python DDP as always
    while manager.step < steps:
        manager.start_quorum()                           # heals this group first if it is behind
        loss = ddp(x).sum(); loss.backward()             # gradients averaged over the group, then the groups
        if manager.should_commit(): opt.step()           # every rank of every taking part group agrees
        opt.zero_grad()

Sampler draws each step's batch from where the committed steps left off (see its doc).

The quorum itself is the agent's (ddprun relays the group's requests to the job's quorum); the
worker speaks to its own group's worker store only, through PyTorch's TCPStore. The process group
across the groups is a fresh Gloo group whenever the quorum's membership changes or a member's
last collective failed, so no hung or broken collective has to be aborted.
"""

import asyncio
import datetime
import hashlib
import hmac
import io
import json
import os
import socket
import struct
import sys
import threading
import time

import torch
import torch.distributed as dist

__all__ = ["Manager", "DistributedDataParallel", "Sampler", "JobFinished", "allreduce_hook"]


class JobFinished(SystemExit):
    """start_quorum() found the job over: another replica group finished its training while this
    one was away (killed, frozen, started late), and no group is left to train with. Its state is
    behind and there is nobody to heal from: the worker has nothing left to do. A SystemExit with
    status 0, so that a worker that does not catch it ends cleanly (Python prints nothing for it);
    catch it to do something else first. `finished` is {"step", "group", "at"}."""

    def __init__(self, group, finished):
        super().__init__(0)
        self.finished = finished
        self.group = group
        self.message = ("the job finished at step %d (replica group %d, %s) and no other group is left: nothing "
                        "to train" % (finished["step"], finished["group"], finished.get("at", "")))

    def __str__(self):
        return "replica group %d: %s" % (self.group, self.message)


def _store(host, port, timeout):
    # PyTorch >= 2.4 defaults to the libuv client, which a PyTorch built without libuv refuses.
    try:
        return dist.TCPStore(host, port, is_master=False, timeout=timeout, use_libuv=False)
    except TypeError:
        return dist.TCPStore(host, port, is_master=False, timeout=timeout)


class _AgentWatch:
    """Asks this rank's ddprun (the worker store it hosts) for a sign of life once a second, on a
    connection of its own: PyTorch's store client waits for an answer without a bound, and a rank
    whose ddprun is stopped (SIGSTOP, a frozen host) or gone would wait for its quorum for good
    while the other groups wait for it in a collective. When the store gives no answer for
    `patience` seconds (the quorum's heartbeat timeout, after which the others go on without this
    group), the rank leaves: exit status 1, so that the collective it was due in fails at once for
    them; its ddprun, back, restarts it and it heals. The store's PING: VALIDATE's magic, then
    PING (13) with a nonce, answered by its echo (TCPSTORE_PROTOCOL: 2.x numbering)."""

    def __init__(self, host, port, patience):
        self._host, self._port, self._patience = host, port, patience
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ddprun_ft-agent-watch", daemon=True)
        self._thread.start()

    def close(self):
        self._stop.set()

    def _ping(self, sock, nonce):
        sock.sendall(b"\x0d" + struct.pack("<I", nonce))
        echo = b""
        while len(echo) < 4:
            chunk = sock.recv(4 - len(echo))
            if not chunk:
                raise ConnectionError("the worker store closed the connection")
            echo += chunk
        if struct.unpack("<I", echo)[0] != nonce:
            raise ConnectionError("the worker store answered a ping with something else")

    def _run(self):
        interval = min(1.0, self._patience / 4)
        sock, nonce, since = None, 0, time.monotonic()
        while not self._stop.wait(interval):
            try:
                if sock is None:
                    sock = socket.create_connection((self._host, self._port), timeout=self._patience)
                    sock.sendall(b"\x00" + struct.pack("<I", 0x3C85F7CE))
                sock.settimeout(max(0.1, self._patience - (time.monotonic() - since)))
                nonce = (nonce + 1) & 0xFFFFFFFF
                self._ping(sock, nonce)
                since = time.monotonic()
            except OSError:
                if sock is not None:
                    sock.close()
                sock = None
                if time.monotonic() - since >= self._patience and not self._stop.is_set():
                    sys.stderr.write("ddprun_ft: rank %s: this rank's ddprun has not answered for %.0f s (stopped, "
                                     "frozen or gone): the rank leaves, so that no other replica group waits for it "
                                     "in a collective; its ddprun restarts it once it is back\n"
                                     % (os.environ.get("RANK", "?"), time.monotonic() - since))
                    sys.stderr.flush()
                    os._exit(1)


def _split(address):
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


# -- the round's key (common/ft_wire.hpp draws the wire; byte for byte the C++ SDK's) ---------------
# Any local process may read and write the worker store (PyTorch's clients cannot authenticate), so
# every value of the contract is sealed with the round's key, which the worker finds in its
# environment only, and a peer's state key reaches a healing rank masked with it.

def _hmac(key, data):
    return hmac.new(key, data, hashlib.sha256).digest()


def _seal(key, name, body):
    mac = _hmac(key, b"ddprun-ft-v1 " + name.encode() + b"\n" + body.encode("utf-8")).hex()
    return json.dumps({"body": body, "mac": mac})


def _unseal(key, name, value):
    """The body of a value sealed under `name` with `key`, or None for anything else."""
    try:
        record = json.loads(value)
        body, mac = record["body"], record["mac"]
        if not isinstance(body, str) or not isinstance(mac, str):
            return None
        expected = _hmac(key, b"ddprun-ft-v1 " + name.encode() + b"\n" + body.encode("utf-8")).hex()
        return body if hmac.compare_digest(mac.encode("utf-8", "replace"), expected.encode()) else None
    except (ValueError, TypeError, KeyError):
        return None


def _state_key(key, rank):
    return _hmac(key, b"ddprun-ft-v1 state %d" % rank)


def _mask(key, name, index, secret):
    pad = _hmac(key, b"ddprun-ft-v1 mask %s %d" % (name.encode(), index))
    return bytes(a ^ b for a, b in zip(secret, pad))


def _request_proof(state_key, target):
    return _hmac(state_key, b"ddprun-ft-v1 GET " + target).hex()


def _answer_mac(state_key, step, length, digest):
    return _hmac(state_key, b"ddprun-ft-v1 state %d %d %s" % (step, length, digest.encode())).hex()


class _StateServer:
    """Serves this rank's state of one committed step to healing peers: HTTP GET /state/<step>.

    A request must prove this rank's state key (derived from the round's key; the quorum carries it
    to the healing peers only): X-Ddprun-Auth, HMAC-SHA256(key, "ddprun-ft-v1 GET <target>"). Without
    it the answer is a 403 that names no step. The answer's header vouches for the body (its
    SHA-256 and length, MAC'd), so a peer reads no more than that and unpickles nothing this rank did
    not send. One thread (asyncio), every connection at once, at most MAX_CONNECTIONS (a new one
    closes the oldest still sending its request), each with REQUEST_TIME to send its request and
    WRITE_TIME for each part of the answer it takes in. `address` is "host:port"."""

    MAX_CONNECTIONS = 32
    REQUEST_TIME = 10.0
    WRITE_TIME = 30.0
    CHUNK = 1 << 20

    def __init__(self, host, key):
        self._key = key
        self._offer = None  # (step, blob, digest, mac): replaced whole, read by the server's thread
        self._connections = {}  # writer -> answering (the server's thread; in order of arrival)
        self._sock = self._listen(host)
        port = self._sock.getsockname()[1]
        self.address = "%s:%d" % (host if ":" not in host else "[%s]" % host.strip("[]"), port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="ddprun_ft state", daemon=True)
        self._thread.start()

    @staticmethod
    def _listen(host):
        # A host name is bound at the first of its addresses this host can bind, and advertised
        # as the name: a healing peer resolves it on its own host.
        why = "it has no address"
        for family, kind, proto, _, where in socket.getaddrinfo(host.strip("[]"), 0, type=socket.SOCK_STREAM,
                                                                 flags=socket.AI_PASSIVE):
            sock = socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(where)
                sock.listen(64)
                return sock
            except OSError as e:
                sock.close()
                why = "%s: %s" % (where[0], e)
        raise RuntimeError("cannot serve state on %s: %s" % (host, why))

    def _run(self):
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, sock=self._sock, limit=8192))
        try:
            self._loop.run_forever()
        finally:
            server.close()
            for writer in list(self._connections):
                writer.close()
            tasks = asyncio.all_tasks(self._loop)
            for t in tasks:
                t.cancel()
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self._loop.close()

    def _make_room(self):
        if len(self._connections) < self.MAX_CONNECTIONS:
            return True
        for writer, answering in self._connections.items():
            if not answering:
                del self._connections[writer]
                writer.close()
                return True
        return False

    def _answer(self, head):
        """(status line, extra headers, body) for a request's head."""
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        fields = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if colon:
                fields[name.strip().lower()] = value.strip()
        target = parts[1] if len(parts) == 3 else ""
        proof = fields.get("x-ddprun-auth", "").encode("latin-1")
        if parts[0] != "GET" or not hmac.compare_digest(proof, _request_proof(self._key, target.encode("latin-1"))
                                                        .encode()):
            return ("403 Forbidden", [("Content-Type", "text/plain")],
                    b"this rank's state is for the peers its quorum sends: the request does not prove their key "
                    b"(X-Ddprun-Auth)")
        offer = self._offer
        if offer is None or target != "/state/%d" % offer[0]:
            return ("404 Not Found", [("Content-Type", "text/plain")],
                    ("this rank serves step %d" % offer[0] if offer else "this rank serves no step yet").encode())
        return "200 OK", [("X-Ddprun-Digest", offer[2]), ("X-Ddprun-Mac", offer[3])], offer[1]

    async def _serve(self, reader, writer):
        if not self._make_room():
            writer.close()
            return
        self._connections[writer] = False
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.REQUEST_TIME)
            self._connections[writer] = True
            status, fields, body = self._answer(head)
            writer.write(("HTTP/1.1 %s\r\nContent-Length: %d\r\n%sConnection: close\r\n\r\n"
                          % (status, len(body), "".join("%s: %s\r\n" % f for f in fields))).encode())
            view = memoryview(body)
            for at in range(0, len(body), self.CHUNK):
                writer.write(view[at:at + self.CHUNK])
                await asyncio.wait_for(writer.drain(), self.WRITE_TIME)
            await asyncio.wait_for(writer.drain(), self.WRITE_TIME)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError,
                OSError):
            pass  # out of time, cut off, or a request too long: this connection alone ends
        finally:
            self._connections.pop(writer, None)
            writer.close()

    def offer(self, step, state):
        buf = io.BytesIO()
        torch.save(state, buf)
        blob = buf.getvalue()
        digest = hashlib.sha256(blob).hexdigest()
        self._offer = (step, blob, digest, _answer_mac(self._key, step, len(blob), digest))

    def close(self):
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._sock.close()


def _fetch(address, key, step, timeout):
    """The bytes of step `step` from the peer rank at `address` ("host:port") with its state `key`,
    retried while the peer has not offered it yet (404: it has not read the same quorum) or cannot be
    reached, all within `timeout` seconds. Raises RuntimeError on a refusal, a timeout, or an answer
    the key does not vouch for."""
    host, port = _split(address)
    target = "/state/%d" % step
    request = ("GET %s HTTP/1.1\r\nHost: %s\r\nX-Ddprun-Auth: %s\r\n\r\n"
               % (target, address, _request_proof(key, target.encode()))).encode()
    what = "fetching step %d's state from %s" % (step, address)
    deadline = time.monotonic() + timeout
    last = "no answer"

    def left():
        return deadline - time.monotonic()

    while True:
        if left() <= 0:
            raise RuntimeError("%s: nothing within %.0f s (last: %s)" % (what, timeout, last))
        try:
            with socket.create_connection((host, port), timeout=max(left(), 0.01)) as sock:
                sock.sendall(request)
                head = b""
                while b"\r\n\r\n" not in head:
                    if len(head) > 8192 or left() <= 0:
                        raise OSError("no whole header in time")
                    sock.settimeout(max(left(), 0.01))
                    chunk = sock.recv(8192)
                    if not chunk:
                        raise OSError("the peer closed the connection")
                    head += chunk
                head, _, rest = head.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                status = lines[0].split(" ")[1] if len(lines[0].split(" ")) > 1 else ""
                fields = {}
                for line in lines[1:]:
                    name, colon, value = line.partition(":")
                    if colon:
                        fields[name.strip().lower()] = value.strip()
                if status == "404":
                    last = "it serves another step: it has not read the same quorum yet"
                    time.sleep(0.01)  # sleep override: the peer has not read the quorum yet
                    continue
                if status != "200":
                    raise RuntimeError("%s: refused (HTTP %s%s)" % (what, status, ": it does not take the key the "
                                                                    "quorum gave for it" if status == "403" else ""))
                length, digest = fields.get("content-length", ""), fields.get("x-ddprun-digest", "")
                if not length.isdigit() or not hmac.compare_digest(
                        fields.get("x-ddprun-mac", "").encode("latin-1"),
                        _answer_mac(key, step, int(length), digest).encode()):
                    raise RuntimeError("%s: its answer does not carry the MAC of the key the quorum gave for it: "
                                       "not loaded" % what)
                # The key vouches for the length: no more is read, nor held.
                blob = bytearray(int(length))
                got = min(len(rest), len(blob))
                blob[:got] = rest[:got]
                view = memoryview(blob)
                while got < len(blob):
                    if left() <= 0:
                        raise OSError("the state did not arrive in time")
                    sock.settimeout(max(left(), 0.01))
                    n = sock.recv_into(view[got:])
                    if n == 0:
                        raise OSError("the peer closed the connection")
                    got += n
                if not hmac.compare_digest(hashlib.sha256(blob).hexdigest().encode(), digest.encode("latin-1")):
                    raise RuntimeError("%s: its bytes are not the ones its header vouches for: not loaded" % what)
                return bytes(blob)
        except OSError as e:
            last = str(e) or type(e).__name__
        time.sleep(0.01)  # sleep override: polling a peer with a deadline


class Manager:
    """One rank's side of its replica group's quorum.

    state_dict(): what a healing peer needs (model and optimizer state); load_state_dict(d) puts it
    back. step: the steps this group has committed. Thread-safety: the training thread only.
    """

    def __init__(self, state_dict=None, load_state_dict=None, timeout=datetime.timedelta(seconds=60),
                 shrink_only=False):
        if "DDPRUN_REPLICA_GROUP" not in os.environ:
            raise RuntimeError("ddprun_ft.Manager needs a worker of a replica group: start it with "
                               "ddprun --replica_group ID --rdzv_backend c10d --rdzv_endpoint HOST:PORT ...")
        self.group = int(os.environ["DDPRUN_REPLICA_GROUP"])
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.step = 0
        self.healed = 0  # times this rank fetched its state from a peer
        self.last_heal = None  # the latest healing: {"step", "seconds", "bytes"}
        self._state_dict = state_dict
        self._load_state_dict = load_state_dict
        self._timeout = timeout
        self._shrink_only = shrink_only
        self._node = os.environ.get("DDPRUN_NODE_ADDR", os.environ["MASTER_ADDR"])
        # The agent answers every ask within its quorum timeout (join_timeout; an error when it
        # had none): a quorum may take that long (a partition, groups still starting), and no
        # reply after it and this rank's own timeout means the agent is gone.
        quorum_timeout = datetime.timedelta(seconds=float(os.environ.get("DDPRUN_FT_QUORUM_TIMEOUT", "600")))
        try:
            self._key = bytes.fromhex(os.environ["DDPRUN_FT_KEY"])
            if len(self._key) != 32:
                raise ValueError
        except (KeyError, ValueError):
            raise RuntimeError("ddprun_ft.Manager needs the round's key in DDPRUN_FT_KEY (64 hex digits), which ddprun "
                               "--replica_group gives its workers: run the worker under the ddprun that ships this "
                               "ddprun_ft") from None
        self._store_timeout = timeout + quorum_timeout
        self._store = _store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), self._store_timeout)
        self._server = _StateServer(self._node, _state_key(self._key, self.rank)) if state_dict is not None else None
        patience = float(os.environ.get("DDPRUN_FT_AGENT_TIMEOUT", "0"))
        self._watch = _AgentWatch(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                  patience) if patience > 0 else None
        self._n = 0
        self._pg = None
        self._pg_quorum_id = None
        self._error = None
        self._last_ok = True
        self._lock = threading.Lock()
        self._pending = False  # asked, the answer not read yet
        self._view = None  # the latest quorum as this group sees it
        self._heal_due = False
        self._fatal = None

    # -- the quorum -----------------------------------------------------------------------------
    @property
    def quorum(self):
        """The quorum of the step begun by the latest start_quorum*() (a dict; None before the
        first). After start_quorum_async() it waits for the answer."""
        self._resolve()
        self._raise_fatal()
        return self._view

    def start_quorum(self):
        """Asks for the next quorum (every rank of the group calls it before its step) and waits
        for it; heals this rank first when the group is behind the quorum's highest committed step.
        Raises JobFinished (a SystemExit of status 0) when the job is over without this group."""
        self.start_quorum_async()
        self._resolve()
        self._heal_if_due()
        return self.quorum

    def start_quorum_async(self):
        """Asks for the next quorum and returns at once, so that the forward runs while the
        groups agree: the answer is waited for by the first collective across the groups (DDP's
        hook, in the backward), by `quorum`, or by should_commit(). A group behind the quorum's
        highest step trains that step with zero gradients either way; it loads its peer's state in
        should_commit(), before the vote (never while the backward runs). For a loop whose batch
        does not depend on the quorum (Sampler's does: it reads `quorum`, so it waits there)."""
        if self._pending:
            self._resolve()  # the answers come in order: the previous one is read first
        self._raise_fatal()
        self._error = None
        self._n += 1
        ask = {"step": self.step, "recovery": self._server.address if self._server else "",
               "shrink_only": self._shrink_only, "pg_ok": self._last_ok}
        self._write_sealed("ddprun_ft/ask/%d/%d" % (self._n, self.rank), json.dumps(ask))
        self._pending = True

    def _write_sealed(self, name, body):
        self._store.set(name, _seal(self._key, name, body))

    def _read_sealed(self, name):
        """The body of `name` as its writer (the agent, or a rank of the group) sealed it. Any local
        process may write the worker store: a value it wrote there is waited past until the real one
        replaces it, or until the store's timeout."""
        deadline = time.monotonic() + self._store_timeout.total_seconds()
        while True:
            body = _unseal(self._key, name, self._store.get(name))
            if body is not None:
                return body
            self._say("the worker store holds a value for %s/... that its agent or its group did not seal (another "
                      "process writes into the worker store): ignored, waiting for theirs" % name.rpartition("/")[0])
            if time.monotonic() >= deadline:
                raise RuntimeError("replica group %d: the worker store held only values for %s that nobody of the "
                                   "group sealed, until the store's timeout" % (self.group, name))
            time.sleep(0.05)  # sleep override: the store cannot wait for a key to change

    def _resolve(self):
        """Reads the pending quorum's answer (on the training thread or DDP's hook thread); what
        must stop the worker (the job's end, no quorum) is kept for _raise_fatal, on the training
        thread."""
        with self._lock:
            if not self._pending:
                return
            view = json.loads(self._read_sealed("ddprun_ft/quorum/%d" % self._n))
            self._pending = False
            if "finished" in view:
                self._fatal = JobFinished(self.group, view["finished"])
                self._say(self._fatal.message)
                return
            if "error" in view:
                self._fatal = RuntimeError("replica group %d got no quorum: %s" % (self.group, view["error"]))
                return
            self._view = view
            self._heal_due = bool(view["heal"])
            if view["serves"] and self._server:
                self._server.offer(self.step, self._state_dict())
            # What depends on the peers (healing, the process group across the groups) never raises
            # here: a failure means this step is not committed, and the next quorum tries again (a
            # rank that raised would end its group, and the peers waiting on it in a collective).
            if self._pg is None or view["quorum_id"] != self._pg_quorum_id or view.get("reconfigure", False):
                try:
                    self._configure(view)
                except Exception as e:
                    self._pg, self._pg_quorum_id = None, None
                    self._error = self._error or e

    def _raise_fatal(self):
        if self._fatal is not None:
            if isinstance(self._fatal, JobFinished):
                self.close()
            raise self._fatal

    def _heal_if_due(self):
        if not self._heal_due:
            return
        self._heal_due = False
        try:
            self._heal(self._view)
        except Exception as e:
            self._error = self._error or e

    def _heal(self, view):
        if self._load_state_dict is None:
            raise RuntimeError("replica group %d is behind (step %d of %d) and its Manager has no "
                               "load_state_dict to heal with" % (self.group, self.step, view["max_step"]))
        address = view["recover_addresses"][self.rank] if self.rank < len(view["recover_addresses"]) else ""
        # "host:port#<the peer rank's state key, masked for this group>"
        address, _, masked = address.partition("#")
        try:
            peer_key = _mask(self._key, "ddprun_ft/quorum/%d" % self._n, self.rank, bytes.fromhex(masked))
        except ValueError:
            peer_key = b""
        if not address or len(peer_key) != 32:
            raise RuntimeError("replica group %d must heal from group %d, whose rank %d serves no state"
                               % (self.group, view["recover_from"], self.rank))
        started = time.monotonic()
        # A pickle can run code: only bytes the peer rank sent (its key's MAC) are loaded.
        blob = _fetch(address, peer_key, view["max_step"], self._timeout.total_seconds())
        self._load_state_dict(torch.load(io.BytesIO(blob), map_location="cpu", weights_only=False))
        self.step = view["max_step"]
        self.healed += 1
        self.last_heal = {"step": self.step, "seconds": time.monotonic() - started, "bytes": len(blob)}

    def _configure(self, view):
        self._pg = None
        if view["replica_world_size"] > 1:
            host, port = _split(view["store"])
            prefix = "ddprun_ft/pg/%d/%d/%d" % (view["quorum_id"], view["seq"], self.rank)
            store = dist.PrefixStore(prefix, _store(host, port, self._timeout))
            try:
                opts = dist.ProcessGroupGloo._Options()
                opts._devices = [dist.ProcessGroupGloo.create_device(hostname=self._node)]
                opts._timeout = self._timeout
                self._pg = dist.ProcessGroupGloo(store, view["replica_rank"], view["replica_world_size"], opts)
            except AttributeError:
                self._pg = dist.ProcessGroupGloo(store, view["replica_rank"], view["replica_world_size"],
                                                 self._timeout)
        self._pg_quorum_id = view["quorum_id"]

    # -- collectives across the groups -----------------------------------------------------------
    def allreduce_async(self, tensor):
        """Starts averaging `tensor` in place over the groups of the quorum that are at its highest
        step; a torch Future of it. The future never fails: a failure is remembered (this step will
        not be committed). Call it in the same order on every group (DDP's hooks run in bucket
        order): the collectives across the groups match by their order."""
        self._resolve()
        view = self._view if self._fatal is None else None
        done = torch.futures.Future()
        if view is None or view["replica_world_size"] <= 1:
            done.set_result(tensor)
            return done
        try:
            if self._pg is None:
                raise RuntimeError("no process group across the replica groups (see the previous error)")
            # A group that heals this step (or failed to) adds nothing: its gradients come from
            # another state than its peers'. It applies the average of those at max_step.
            if view["heal"] or self._error is not None:
                tensor.zero_()
            work = self._pg.allreduce([tensor])
        except Exception as e:
            self._error = self._error or e
            done.set_result(tensor)
            return done
        participants = max(view.get("participants", view["replica_world_size"]), 1)

        def finish(f):
            try:
                f.value()  # raises what the collective met (a peer group died in the middle of it)
                tensor.div_(participants)
            except Exception as e:
                self._error = self._error or e
            return tensor

        return work.get_future().then(finish)

    def allreduce_(self, tensor):
        """allreduce_async, waited for."""
        return self.allreduce_async(tensor).wait()

    def report_error(self, error):
        """Something of this step failed: it will not be committed."""
        self._error = error

    # -- the commit vote -------------------------------------------------------------------------
    def should_commit(self):
        """True when every rank of the group finished the step's collectives: then the caller
        steps its optimizer and the group's step counts. Every rank must call it."""
        self._resolve()
        self._raise_fatal()
        self._heal_if_due()
        ok = self._error is None
        self._write_sealed("ddprun_ft/commit/%d/%d" % (self._n, self.rank), "1" if ok else "0")
        commit = ok
        if self.world_size > 1:  # (a group of one rank has its vote; the agent reads it at the end)
            keys = ["ddprun_ft/commit/%d/%d" % (self._n, r) for r in range(self.world_size)]
            self._store.wait(keys)
            commit = all([self._read_sealed(k) == "1" for k in keys]) and commit
        self._last_ok = commit
        if not ok:
            self._say("step %d not committed: %s" % (self.step + 1, self._error))
        elif not commit:
            self._say("step %d not committed: another rank of the group failed its step" % (self.step + 1))
        if commit:
            self.step += 1
        return commit

    def _say(self, text):
        # One line per event on stderr (ddprun prefixes it with the rank); the same words twice in a
        # row are said once.
        if text != getattr(self, "_said", None):
            print("ddprun_ft: replica group %d: %s" % (self.group, text), file=sys.stderr, flush=True)
        self._said = text

    def close(self):
        if self._watch:
            self._watch.close()
        if self._server:
            self._server.close()
        self._pg = None


def allreduce_hook(manager, bucket):
    """A DDP communication hook: the gradients averaged over the group (as Python DDP does), then
    over the replica groups of the quorum.

    The collective across the groups is started here, on the thread that runs DDP's hooks in bucket
    order, so that every group starts its buckets' in the same order (they match by order); the
    group's own sum is therefore waited for first (it does not overlap the rest of the backward)."""
    buffer = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
    group_size = dist.get_world_size()
    if group_size > 1:
        dist.all_reduce(buffer)
        buffer.div_(group_size)
    return manager.allreduce_async(buffer)


def DistributedDataParallel(module, manager, **kwargs):
    """torch's DistributedDataParallel inside the group, with allreduce_hook across the groups.

    Its gradient buckets keep the layout they are built with (find_unused_parameters=True: DDP
    rebuilds them after the first step otherwise, in the order gradients became ready): a group
    back from a restart has fresh buckets, and the groups' buckets must hold the same parameters
    in the same order for one all-reduce across them to add up what belongs together.
    """
    if kwargs.get("find_unused_parameters") is False:
        raise ValueError("ddprun_ft.DistributedDataParallel keeps its buckets' first layout, which "
                         "takes find_unused_parameters=True")
    kwargs["find_unused_parameters"] = True
    ddp = torch.nn.parallel.DistributedDataParallel(module, **kwargs)
    ddp.register_comm_hook(manager, allreduce_hook)
    return ddp


class Sampler:
    """Which samples each rank trains on, following the committed steps.

    A cursor over a seeded permutation of the dataset (one per epoch) that only a committed step
    moves: each step the participants (the groups at the quorum's highest step) take consecutive
    slices of batch_size samples, group by group (participant_rank), rank by rank within a group; a
    healing group takes none (its gradients are zero that step). Its state (epoch, cursor) goes in
    the state a healing peer fetches, so after any failure no sample of a committed step is trained
    twice and none is skipped; a step that is not committed is drawn again by the next. An epoch
    ends when the next step's samples would run past its end (its tail is left, as drop_last).
    Every rank of every group must use the same length, batch_size and seed, and groups of the same
    size.

        sampler = ddprun_ft.Sampler(len(dataset), batch_size)
        ... state_dict: {..., "sampler": sampler.state_dict()}, load: sampler.load_state_dict(...)
        manager.start_quorum(); x, y = collate(dataset[i] for i in sampler.indices(manager))
        if manager.should_commit(): opt.step(); sampler.commit(manager)
    """

    def __init__(self, length, batch_size, seed=0):
        if length <= 0 or batch_size <= 0:
            raise ValueError("ddprun_ft.Sampler needs a dataset and a batch size above 0 (got %d and %d)"
                             % (length, batch_size))
        self.length, self.batch_size, self.seed = length, batch_size, seed
        self.epoch, self.cursor = 0, 0
        self._order = None  # (epoch, the permutation)

    def step_samples(self, manager):
        """How many samples the step manager.start_quorum() just began trains on, over the groups."""
        return max(manager.quorum.get("participants", 1), 1) * manager.world_size * self.batch_size

    def position(self, manager):
        """(epoch, cursor) of this step's first sample: the next epoch's start when this step
        would run past the end of the current one."""
        total = self.step_samples(manager)
        if total > self.length:
            raise ValueError("ddprun_ft.Sampler: a step takes %d samples (%d groups x %d ranks x %d), more than "
                             "the dataset's %d" % (total, manager.quorum.get("participants", 1), manager.world_size,
                                                   self.batch_size, self.length))
        if self.cursor + total > self.length:
            return self.epoch + 1, 0
        return self.epoch, self.cursor

    def _permutation(self, epoch):
        if self._order is None or self._order[0] != epoch:
            gen = torch.Generator().manual_seed(self.seed + epoch)
            self._order = (epoch, torch.randperm(self.length, generator=gen))
        return self._order[1]

    def indices(self, manager):
        """This rank's samples for the step manager.start_quorum() just began: a list of indices,
        empty for a group that heals this step."""
        view = manager.quorum
        if view is None:
            raise RuntimeError("ddprun_ft.Sampler.indices: call manager.start_quorum() first")
        place = view.get("participant_rank", view["replica_rank"])
        if place < 0:
            return []
        epoch, cursor = self.position(manager)
        first = cursor + (place * manager.world_size + manager.rank) * self.batch_size
        return self._permutation(epoch)[first:first + self.batch_size].tolist()

    def commit(self, manager):
        """The step is committed (manager.should_commit() was True): the cursor moves past it."""
        epoch, cursor = self.position(manager)
        self.epoch, self.cursor = epoch, cursor + self.step_samples(manager)

    def state_dict(self):
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state):
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
