"""A launched ddprun as the Python tests watch it: a fact polled until a deadline or the process's
end, and an end awaited with a deadline that kills it and says what it printed."""
import subprocess
import time


class Launched:
    """Base of the tests' handles on a ddprun: subclasses set `proc` and `name` and define output()."""

    proc = None
    name = "ddprun"

    def output(self):
        raise NotImplementedError

    def wait_until(self, fact, timeout=60, poll=0.1):
        """Whether `fact()` holds before `timeout` seconds or the process's end."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if fact():
                return True
            if self.proc.poll() is not None:
                return fact()
            time.sleep(poll)  # sleep override: polling another process's output with a deadline
        return False

    def wait(self, timeout=120):
        """The exit code; past `timeout` the process is killed and the test fails with its output."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"{self.name} did not end within {timeout} s:\n{self.output()[-4000:]}")
