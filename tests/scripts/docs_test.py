#!/usr/bin/env python3
"""Runs every command block of README.md and docs/*.md marked runnable (a fence opened with
"```sh runnable"), each in a fresh directory with bash -euo pipefail and the built ddprun and
ddprun-rendezvous first on PATH; fails on the first block that fails, naming its file and line.
A block's expected output, where it matters, is checked by the block itself.
  docs_test.py ROOT BIN_DIR...   (BIN_DIR: the folders of the built programs)"""
import os
import pathlib
import re
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^```sh runnable\s*$")


def blocks(path):
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines):
        if FENCE.match(lines[i]):
            start = i + 1
            j = start
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            yield start, "\n".join(lines[start:j])
            i = j
        i += 1


def main():
    root = pathlib.Path(sys.argv[1])
    path = os.pathsep.join([os.path.abspath(d) for d in sys.argv[2:]] + [os.environ.get("PATH", "")])
    files = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
    ran = 0
    for f in files:
        for line, code in blocks(f):
            with tempfile.TemporaryDirectory() as d:
                r = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=d, capture_output=True, text=True,
                                   env=dict(os.environ, PATH=path), timeout=300)
            where = f"{f.relative_to(root)}:{line}"
            if r.returncode != 0:
                print(f"FAIL: the block at {where} exited {r.returncode}:\n{code}\n--- stdout\n{r.stdout}"
                      f"--- stderr\n{r.stderr}")
                return 1
            print(f"ok: {where}")
            ran += 1
    if ran == 0:
        print("FAIL: no runnable block found (```sh runnable) in README.md or docs/")
        return 1
    print(f"docs_test: {ran} runnable blocks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
