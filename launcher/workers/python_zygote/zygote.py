# ddprun's zygote (see launcher/workers/zygote.hpp): one Python interpreter per node that imports
# the --preload modules once; each worker is then forked from it and runs its program as __main__.
#
# ddprun starts it with DDPRUN_ZYGOTE_SOCKET (a Unix SOCK_SEQPACKET socket ddprun listens on) and
# DDPRUN_ZYGOTE_PRELOAD (comma-separated modules). Messages are one JSON object each:
#   zygote -> ddprun, once: {"ok": true, "seconds": S, "pid": P} or {"ok": false, "error": "..."}
#   ddprun -> zygote, per worker: {"argv", "env", "cwd", "cpus", "numa_node", "parent"} with the
#     worker's stdin, stdout and stderr as SCM_RIGHTS
#   zygote -> ddprun, per worker: {"pid": N} or {"error": "..."}
# A worker is forked twice (zygote -> intermediate -> worker) and the intermediate exits at once,
# so the worker's parent becomes ddprun (a child subreaper), which sees its exit status as for any
# worker. The zygote only imports: it never starts a thread, a process group or CUDA; with more
# than one thread after the imports it refuses to serve (forking could deadlock a worker).
import os
import socket
import sys


def _send(sock, obj):
    import json
    sock.send(json.dumps(obj).encode())


def _threads():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading
        return threading.active_count()


def _preload(sock, modules):
    import importlib
    import time
    began = time.monotonic()
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as e:  # SystemExit and KeyboardInterrupt from a module's import too
            import traceback
            what = "".join(traceback.format_exception_only(type(e), e)).strip()
            _send(sock, {"ok": False, "error": "importing %s failed: %s" % (name, what)})
            return False
    threads = _threads()
    if threads > 1:
        _send(sock, {"ok": False, "error": "the interpreter holds %d threads after importing %s, and a fork keeps "
                     "only one (a lock another thread held would never be released)" % (threads, ",".join(modules))})
        return False
    _send(sock, {"ok": True, "seconds": time.monotonic() - began, "pid": os.getpid()})
    return True


def _receive(sock):
    import array
    import json
    fds = array.array("i")
    msg, ancillary, _, _ = sock.recvmsg(1 << 22, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    if not msg:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(msg), list(fds)


def _serve(sock):
    """Forks workers until ddprun closes the socket. Returns (request, fds) in a forked worker, None
    in the zygote when the job is over."""
    while True:
        try:
            request, fds = _receive(sock)
        except (OSError, ValueError):
            return None
        if request is None:
            return None
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            _send(sock, {"error": "expected 3 descriptors (stdin, stdout, stderr), got %d" % len(fds)})
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        r, w = os.pipe()
        try:
            middle = os.fork()
        except OSError as e:
            for fd in fds + [r, w]:
                os.close(fd)
            _send(sock, {"error": "fork failed: %s" % e})
            continue
        if middle == 0:
            os.close(r)
            try:
                pid = os.fork()
            except OSError as e:
                os.write(w, ("E%s" % e).encode())
                os._exit(1)
            if pid == 0:
                os.close(w)
                sock.close()
                return request, fds
            try:
                os.setpgid(pid, pid)  # also done by the worker: the group exists before anyone signals it
            except OSError:
                pass
            os.write(w, b"P%d" % pid)
            os._exit(0)
        os.close(w)
        reply = b""
        while True:
            chunk = os.read(r, 256)
            if not chunk:
                break
            reply += chunk
        os.close(r)
        os.waitpid(middle, 0)  # gone: the worker's parent is ddprun now
        for fd in fds:
            os.close(fd)
        if reply.startswith(b"P"):
            _send(sock, {"pid": int(reply[1:])})
        else:
            _send(sock, {"error": "fork failed: %s" % (reply[1:].decode(errors="replace") or "the forking process died")})


def _prctl(option, arg):
    import ctypes
    return ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)


def _set_memory_policy(node):
    # MPOL_PREFERRED on one NUMA node, best effort (as ddprun does for exec'd workers).
    import ctypes
    import platform
    number = {"x86_64": 238, "aarch64": 237, "ppc64le": 261}.get(platform.machine())
    if number is None or node < 0:
        return
    bits = 8 * ctypes.sizeof(ctypes.c_ulong)
    mask = (ctypes.c_ulong * (node // bits + 1))()
    mask[node // bits] = 1 << (node % bits)
    ctypes.CDLL(None, use_errno=True).syscall(number, 1, mask, len(mask) * bits + 1)


def _become_worker(request, fds):
    import signal
    import time
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    parent = request["parent"]
    # The intermediate process exits at once; then ddprun is the parent, and its death kills us.
    deadline = time.monotonic() + 10
    while os.getppid() != parent:
        if time.monotonic() > deadline:
            os._exit(127)
        time.sleep(0.0005)
    _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(127)  # ddprun died before the death signal was armed
    _prctl(0x59616D61, parent)  # PR_SET_PTRACER: ddprun may read our stacks (Yama)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    if request.get("cpus"):
        os.sched_setaffinity(0, request["cpus"])
    _set_memory_policy(request.get("numa_node", -1))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(kv.split("=", 1) for kv in request["env"] if "=" in kv)
    # The signal dispositions of a fresh interpreter (the zygote changes none; this is for certain).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # Each worker's random state is its own, unless its program seeds it.
    import random
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()
    if os.environ.get("PYTHONFAULTHANDLER"):
        import faulthandler
        faulthandler.enable()
    hook = sys.modules.get("sitecustomize")
    if hook is not None and hasattr(hook, "_ddprun_worker_start"):
        hook._ddprun_worker_start()
    return _program(request["argv"])


def _program(argv):
    """The program of `python -u [-m] PROGRAM ARGS...` (argv as ddprun would exec it)."""
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-m":
        i += 1  # interpreter options (-u: the zygote runs unbuffered too)
    if i < len(argv) and argv[i] == "-m":
        sys.argv = ["-m"] + argv[i + 2:]
        sys.path[0] = os.getcwd()
        return ("module", argv[i + 1])
    script = argv[i]
    if not os.path.exists(script):
        sys.stderr.write("%s: can't open file %r: [Errno 2] No such file or directory\n" % (argv[0], script))
        sys.stderr.flush()
        os._exit(2)
    sys.argv = argv[i:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    return ("script", script)


def _main():
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(os.environ.pop("DDPRUN_ZYGOTE_SOCKET"))
    modules = [m for m in os.environ.pop("DDPRUN_ZYGOTE_PRELOAD", "").split(",") if m]
    if not _preload(sock, modules):
        return None
    # From here on the zygote prints nothing: its workers get their own stdio.
    sys.stdout.flush()
    sys.stderr.flush()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    worker = _serve(sock)
    if worker is None:
        return None
    return _become_worker(*worker)


_ddprun_run = _main()
if _ddprun_run is None:
    os._exit(0)  # the zygote: no atexit handlers of the preloaded modules, nothing to flush
import runpy  # noqa: E402

if _ddprun_run[0] == "module":
    runpy.run_module(_ddprun_run[1], run_name="__main__", alter_sys=True)
else:
    runpy.run_path(_ddprun_run[1], run_name="__main__")
