"""Starts a ddprun-rendezvous daemon on 127.0.0.1 with a kernel-picked port, for interop tests."""
import os
import signal
import subprocess
import tempfile
import time


class Daemon:
    def __init__(self, binary, extra_args=()):
        self._dir = tempfile.TemporaryDirectory()
        port_file = os.path.join(self._dir.name, "port")
        self.proc = subprocess.Popen(
            [binary, "--host", "127.0.0.1", "--port", "0", "--port-file", port_file, *extra_args],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        while not os.path.exists(port_file):
            if self.proc.poll() is not None:
                raise RuntimeError("ddprun-rendezvous exited early: " + self.proc.stderr.read())
            if time.monotonic() > deadline:
                raise RuntimeError("ddprun-rendezvous did not write its port file within 10s")
            time.sleep(0.01)  # sleep override: waiting for another process's file
        with open(port_file) as f:
            self.port = int(f.read())

    def stop(self):
        """SIGTERM; returns (exit code, stderr)."""
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=10)
        self._dir.cleanup()
        return self.proc.returncode, err

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.stop()
