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

import datetime
import hashlib
import hmac
import http.server
import io
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

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


def _split(address):
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class _StateServer:
    """Serves this rank's state of one committed step to healing peers (HTTP GET /state/<step>).

    Every answer carries HMAC-SHA256(key, body) in X-Ddprun-Mac, with a key of this process's that
    travels only inside the quorum (the rendezvous store, then the peers' worker stores): a healing
    peer unpickles nothing that this rank did not send. `address` is "host:port#key-in-hex"."""

    def __init__(self, host):
        self._lock = threading.Lock()
        self._step = None
        self._blob = b""
        self._mac = ""
        self._key = os.urandom(32)
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                with owner._lock:
                    step, blob = owner._step, owner._blob
                if step is None or self.path != "/state/%d" % step:
                    self.send_error(404, "this rank serves step %s" % step)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(blob)))
                self.send_header("X-Ddprun-Mac", owner._mac)
                self.end_headers()
                self.wfile.write(blob)

            def log_message(self, *args):
                pass

        self._server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self.address = "%s:%d#%s" % (host if ":" not in host else "[%s]" % host, self._server.server_address[1],
                                     self._key.hex())
        self._thread = threading.Thread(target=self._server.serve_forever, name="ddprun_ft state", daemon=True)
        self._thread.start()

    def offer(self, step, state):
        buf = io.BytesIO()
        torch.save(state, buf)
        blob = buf.getvalue()
        mac = hmac.new(self._key, blob, hashlib.sha256).hexdigest()
        with self._lock:
            self._step, self._blob, self._mac = step, blob, mac

    def close(self):
        self._server.shutdown()
        self._server.server_close()


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
        self._store = _store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout + quorum_timeout)
        self._server = _StateServer(self._node) if state_dict is not None else None
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
        self._store.set("ddprun_ft/ask/%d/%d" % (self._n, self.rank), json.dumps(ask))
        self._pending = True

    def _resolve(self):
        """Reads the pending quorum's answer (on the training thread or DDP's hook thread); what
        must stop the worker (the job's end, no quorum) is kept for _raise_fatal, on the training
        thread."""
        with self._lock:
            if not self._pending:
                return
            view = json.loads(self._store.get("ddprun_ft/quorum/%d" % self._n))
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
        address, _, key = address.partition("#")
        if not address or not key:
            raise RuntimeError("replica group %d must heal from group %d, whose rank %d serves no state"
                               % (self.group, view["recover_from"], self.rank))
        host, port = _split(address)
        url = "http://%s:%d/state/%d" % (host if ":" not in host else "[%s]" % host, port, view["max_step"])
        started = time.monotonic()
        deadline = started + self._timeout.total_seconds()
        while True:
            # The peer offers its state once it has read the same quorum: until then it answers 404.
            try:
                with urllib.request.urlopen(url, timeout=self._timeout.total_seconds()) as reply:
                    blob, mac = reply.read(), reply.headers.get("X-Ddprun-Mac", "")
                break
            except urllib.error.HTTPError as e:
                if e.code != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(0.01)  # sleep override: the peer has not read the quorum yet
        # A pickle can run code: only bytes the peer rank sent (its key's MAC) are loaded.
        if not hmac.compare_digest(mac, hmac.new(bytes.fromhex(key), blob, hashlib.sha256).hexdigest()):
            raise RuntimeError("the state served at %s:%d for step %d does not carry its peer's MAC: not loaded"
                               % (host, port, view["max_step"]))
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
        self._store.set("ddprun_ft/commit/%d/%d" % (self._n, self.rank), "1" if ok else "0")
        commit = ok
        if self.world_size > 1:  # (a group of one rank has its vote; the agent reads it at the end)
            keys = ["ddprun_ft/commit/%d/%d" % (self._n, r) for r in range(self.world_size)]
            self._store.wait(keys)
            commit = all(self._store.get(k) == b"1" for k in keys)
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
