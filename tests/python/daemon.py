"""Starts a ddprun-rendezvous daemon on 127.0.0.1 with a kernel-picked port, for interop tests.

Its output goes to a file, not a pipe: a daemon that logs a lot must never block on a pipe the test
is not reading.
"""
import os
import signal
import subprocess
import tempfile
import time


class Daemon:
    def __init__(self, binary, extra_args=(), host="127.0.0.1", prefix=()):
        """`prefix`: a command the daemon runs under (`ip netns exec NS`), `host` its address."""
        self._dir = tempfile.TemporaryDirectory()
        port_file = os.path.join(self._dir.name, "port")
        self.log_path = os.path.join(self._dir.name, "daemon.log")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [*prefix, binary, "--host", host, "--port", "0", "--port-file", port_file, *extra_args],
            stdout=subprocess.DEVNULL, stderr=self._log)
        deadline = time.monotonic() + 10
        while not os.path.exists(port_file):
            if self.proc.poll() is not None:
                raise RuntimeError("ddprun-rendezvous exited early: " + self.log())
            if time.monotonic() > deadline:
                raise RuntimeError("ddprun-rendezvous did not write its port file within 10s")
            time.sleep(0.01)  # sleep override: waiting for another process's file
        with open(port_file) as f:
            self.port = int(f.read())

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        """SIGTERM; returns (exit code, its log)."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=10)
        self._log.close()
        text = self.log()
        self._dir.cleanup()
        return self.proc.returncode, text

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.stop()
