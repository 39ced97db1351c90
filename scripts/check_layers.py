#!/usr/bin/env python3
"""Checks that includes point down the layers (README, Layout): a file may include headers of its
own folder and of lower layers only; siblings of one layer (the store and etcd backends; the
store's server and client) never include each other, and nothing includes the daemon.
Exit 0 when every include is allowed; otherwise prints each one that is not, and exits 1.
  scripts/check_layers.py [ROOT]"""
import pathlib
import re
import sys

# folder -> layer (higher may include lower; equal only within the same folder)
LAYERS = {
    "common": 0,
    "rendezvous/core": 1,
    "rendezvous/server": 2,
    "rendezvous/client": 2,
    "rendezvous/daemon": 3,
    "launcher/workers": 4,
    "launcher/rendezvous": 5,
    "launcher/rendezvous/store": 6,
    "launcher/rendezvous/etcd": 6,
    "launcher/watchdog": 7,
    "launcher/cli": 8,
    "launcher/agent": 9,
    "launcher": 10,
}
PRIVATE = {"rendezvous/daemon"}  # the top of its own stack: no other folder includes it
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(path: str):
    parts = path.split("/")[:-1]
    while parts:
        f = "/".join(parts)
        if f in LAYERS:
            return f
        parts.pop()
    return None


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    bad = []
    checked = 0
    for top in ("common", "rendezvous", "launcher"):
        for f in sorted((root / top).rglob("*")):
            if f.suffix not in (".hpp", ".cpp", ".in"):
                continue
            rel = f.relative_to(root).as_posix()
            mine = folder_of(rel)
            if mine is None or folder_of(rel) != "/".join(rel.split("/")[:-1]):
                bad.append(f"{rel}: not in a layer folder (README, Layout)")
                continue
            for inc in INCLUDE.findall(f.read_text()):
                theirs = folder_of(inc)
                if theirs is None or theirs == mine:
                    continue  # a system or SDK header, or the file's own folder
                checked += 1
                if theirs in PRIVATE:
                    bad.append(f"{rel}: includes {inc} ({theirs} is the daemon's alone)")
                elif LAYERS[theirs] >= LAYERS[mine]:
                    what = "a sibling" if LAYERS[theirs] == LAYERS[mine] else "an upper layer"
                    bad.append(f"{rel} ({mine}) includes {inc}: {what} ({theirs})")
    for line in bad:
        print(line)
    print(f"check_layers: {checked} includes across folders checked, {len(bad)} not allowed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
