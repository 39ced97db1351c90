#!/usr/bin/env python3
"""Checks that the code keeps its folders' promises (docs/design.md, Layout).

Includes, in every folder of the repository:
- common/, rendezvous/ and launcher/ are layers: a file includes headers of its own folder and of
  lower layers only; siblings of one layer (the store and etcd backends; the store's server and
  client) never include each other; nothing includes the daemon; nothing there includes the SDK,
  the tests, the benchmarks or the examples (the exceptions: the watchdog reads the progress page's
  layout, and the workers' and the agent's code the worker environment's names, from the SDK's
  Torch-free headers);
- worker_sdk/include/ (the installed headers) includes only itself; worker_sdk/src/ the SDK and
  common/;
- examples/ include only the SDK's public headers and each other, as a user's program would;
- tests/ and benchmarks/ include anything but another folder's test files; no file includes a
  .cpp (a shared suite is a header and one instantiation per binary);
- a quoted include names a file that exists (else it is a typo or a file since moved).
Namespaces: nothing in the SDK or the examples is declared in LibTorch's (torch, c10, at); in
rendezvous/ and launcher/: the code of rendezvous/X/ is in ddprun::rdzv::X (the
folder's short name: ddprun::launcher::rendezvous is the launcher's), of launcher/X[/Y]/ in
ddprun::launcher::X[::Y], or in namespaces nested in it; a block of another namespace may only
declare classes ahead (class X;).
Link edges, from the CMakeLists of common/, rendezvous/ and launcher/: a library links only
libraries of lower layers (or of its own folder), never the daemon's, and only libraries whose
headers its own files include.
Exit 0 when all holds; otherwise prints every breach and exits 1.
  scripts/check_layers.py [ROOT]"""
import pathlib
import re
import sys

# folder -> layer (higher may include lower; equal only within the same folder)
LAYERS = {
    "common": 0,
    "rendezvous/core": 1,
    "rendezvous/jobs": 2,
    "rendezvous/server": 3,
    "rendezvous/client": 3,
    "rendezvous/daemon": 4,
    "launcher/workers": 5,
    "launcher/rendezvous": 6,
    "launcher/rendezvous/store": 7,
    "launcher/rendezvous/etcd": 7,
    "launcher/ft": 8,
    "launcher/watchdog": 8,
    "launcher/view": 9,
    "launcher/top": 9,
    "launcher/cli": 9,
    "launcher/agent": 10,
    "launcher": 11,
}
PRIVATE = {"rendezvous/daemon"}  # the top of its own stack: no other folder includes or links it
# Includes across areas that are the design, not a breach: (including folder, included file).
EXCEPTIONS = {("launcher/watchdog", "worker_sdk/include/ddprun/worker/progress_page.hpp"),
              ("launcher/workers", "worker_sdk/include/ddprun/worker/env_contract.hpp"),
              ("launcher/agent", "worker_sdk/include/ddprun/worker/env_contract.hpp")}
SCANNED = ("common", "rendezvous", "launcher", "worker_sdk", "examples", "benchmarks", "tests")
# Where a quoted include is looked for, after the including file's own folder (the build's
# include directories: the root, the SDK's public and private headers, the examples' folder).
SEARCH = ("", "worker_sdk/include", "examples", "worker_sdk/src", "worker_sdk/compat")
SOURCES = (".hpp", ".cpp", ".h", ".in")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(path: str):
    """The layer folder holding `path` (a path relative to the root), or None."""
    parts = path.split("/")[:-1]
    while parts:
        f = "/".join(parts)
        if f in LAYERS:
            return f
        parts.pop()
    return None


def area_of(path: str):
    """What part of the repository `path` is in: a layer folder, or sdk, sdk-src, examples, ..."""
    layer = folder_of(path)
    if layer:
        return layer
    for prefix, area in (("worker_sdk/include/", "sdk"), ("worker_sdk/", "sdk-src"), ("examples/", "examples"),
                         ("benchmarks/", "benchmarks"), ("tests/support/", "test-support"), ("tests/", "tests")):
        if path.startswith(prefix):
            return area
    return None


def resolve(root: pathlib.Path, including: str, inc: str):
    """The repository path a quoted include names, None for a system header, "" for a missing file."""
    here = pathlib.PurePosixPath(including).parent
    for base in [str(here)] + list(SEARCH):
        candidate = (root / base / inc).resolve()
        if candidate.is_file():
            try:
                return candidate.relative_to(root.resolve()).as_posix()
            except ValueError:
                return None
    first = inc.split("/")[0]
    return "" if first in SCANNED or first == "ddprun" else None


def include_breach(mine: str, rel: str, theirs_path: str):
    """Why `rel` (in area `mine`) may not include `theirs_path`, or None."""
    theirs = area_of(theirs_path)
    if theirs_path.endswith((".cpp", ".cc")):
        return f"{rel} includes {theirs_path}: a source file (share a header, compile the .cpp once)"
    if theirs is None or theirs == mine:
        return None
    if (mine, theirs_path) in EXCEPTIONS:
        return None
    if mine in LAYERS:
        if theirs not in LAYERS:
            return f"{rel} ({mine}) includes {theirs_path}: {theirs} code, outside the layers"
        if theirs in PRIVATE:
            return f"{rel}: includes {theirs_path} ({theirs} is the daemon's alone)"
        if LAYERS[theirs] >= LAYERS[mine]:
            what = "a sibling" if LAYERS[theirs] == LAYERS[mine] else "an upper layer"
            return f"{rel} ({mine}) includes {theirs_path}: {what} ({theirs})"
        return None
    allowed = {
        "sdk": set(),  # installed alone: self-contained
        "sdk-src": {"sdk", "common"},
        "examples": {"sdk"},
        "test-support": set(LAYERS) | {"sdk"},
        "benchmarks": set(LAYERS) | {"sdk", "sdk-src", "examples", "test-support"},
        "tests": set(LAYERS) | {"sdk", "sdk-src", "examples", "test-support"},
    }[mine]
    if theirs in allowed:
        return None
    return f"{rel} ({mine}) includes {theirs_path} ({theirs})"


def check_includes(root: pathlib.Path, bad: list):
    """Every include of every scanned file; returns (includes checked, {file: [included paths]})."""
    checked = 0
    graph = {}
    for top in SCANNED:
        for f in sorted((root / top).rglob("*")):
            if f.suffix not in SOURCES or not f.is_file():
                continue
            rel = f.relative_to(root).as_posix()
            mine = area_of(rel)
            if top in ("common", "rendezvous", "launcher") and folder_of(rel) != "/".join(rel.split("/")[:-1]):
                bad.append(f"{rel}: not in a layer folder (docs/design.md, Layout)")
                continue
            graph[rel] = []
            for inc in INCLUDE.findall(f.read_text(errors="replace")):
                path = resolve(root, rel, inc)
                if path is None:
                    continue  # a system or third-party header
                checked += 1
                if path == "":
                    bad.append(f"{rel} includes \"{inc}\", which is not in the repository")
                    continue
                graph[rel].append(path)
                why = include_breach(mine, rel, path)
                if why:
                    bad.append(why)
    return checked, graph


CALL = re.compile(r"\b(add_library|target_link_libraries)\s*\(([^)]*)\)", re.S)


def libraries(root: pathlib.Path):
    """{name: (folder, [sources], [project libraries linked])} of the layers' CMakeLists."""
    libs, aliases, links = {}, {}, {}
    for top in ("common", "rendezvous", "launcher"):
        for cm in sorted((root / top).rglob("CMakeLists.txt")):
            base = cm.parent.relative_to(root).as_posix()
            text = re.sub(r"#[^\n]*", "", cm.read_text())
            for call, args in CALL.findall(text):
                words = args.split()
                if call == "add_library":
                    if len(words) == 3 and words[1] == "ALIAS":
                        aliases[words[0]] = words[2]
                        continue
                    srcs = [w for w in words[1:] if w not in ("STATIC", "SHARED", "OBJECT", "INTERFACE")]
                    libs[words[0]] = (base, [f"{base}/{s}" for s in srcs if not s.startswith("$")])
                else:
                    links.setdefault(words[0], []).extend(
                        w for w in words[1:] if w not in ("PUBLIC", "PRIVATE", "INTERFACE"))
    out = {}
    for name, (base, srcs) in libs.items():
        deps = [aliases.get(d, d) for d in links.get(name, [])]
        out[name] = (srcs, [d for d in deps if d in libs])
    return out


def check_links(root: pathlib.Path, graph: dict, bad: list):
    libs = libraries(root)

    def members(name, seen=()):  # an INTERFACE library stands for what it links
        srcs, deps = libs[name]
        if srcs:
            return [name]
        return [m for d in deps if d not in seen for m in members(d, seen + (name,))]

    def folders(name):
        return {folder_of(s) for s in libs[name][0]}

    checked = 0
    for name, (srcs, deps) in sorted(libs.items()):
        if not srcs:
            continue
        mine = folders(name)
        if len(mine) != 1 or None in mine:
            bad.append(f"{name}: its sources are not in one layer folder ({sorted(map(str, mine))})")
            continue
        mine = mine.pop()
        # The folders this library's files reach: its sources and the headers of its own folder
        # they include, followed within the folder.
        todo, seen, used = list(srcs), set(), set()
        while todo:
            f = todo.pop()
            if f in seen:
                continue
            seen.add(f)
            for inc in graph.get(f, []):
                if folder_of(inc) == mine:
                    todo.append(inc)
                else:
                    used.add(folder_of(inc))
        for dep in deps:
            for m in members(dep):
                checked += 1
                theirs = folders(m).pop()
                if theirs in PRIVATE:
                    bad.append(f"{name} ({mine}) links {m}: the daemon's alone")
                elif theirs != mine and LAYERS[theirs] >= LAYERS[mine]:
                    bad.append(f"{name} ({mine}) links {m} ({theirs}): not a lower layer")
            if not any(folders(m).pop() in used | {mine} for m in members(dep)):
                bad.append(f"{name} ({mine}) links {dep}, whose headers none of its files include")
    return checked


NAMESPACE_OPEN = re.compile(r"^namespace (ddprun[\w:]*) \{", re.M)
TORCH_NAMESPACE = re.compile(r"^namespace ((?:torch|c10|at|caffe2)(?:::\w+)*) \{", re.M)
FORWARD_ONLY = re.compile(r"^(\s*(class|struct) \w+;\s*)+$")


def namespace_of(folder: str):
    """The namespace a layer folder's code is in, or None (common/ and the launcher's main)."""
    parts = folder.split("/")
    if parts[0] == "rendezvous" and len(parts) == 2:
        return "ddprun::rdzv::" + parts[1]
    if parts[0] == "launcher" and len(parts) >= 2:
        return "ddprun::" + "::".join(parts)
    return None


def namespace_blocks(text: str):
    """(name, body) of each top-level `namespace ddprun... {` block, its end found by counting braces."""
    for m in NAMESPACE_OPEN.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        yield m.group(1), text[m.end():i - 1]


def check_namespaces(root: pathlib.Path, bad: list):
    checked = 0
    for top in ("rendezvous", "launcher"):
        for f in sorted((root / top).rglob("*")):
            if f.suffix not in (".hpp", ".cpp"):
                continue
            rel = f.relative_to(root).as_posix()
            want = namespace_of(folder_of(rel) or "")
            if want is None:
                continue
            text = f.read_text()
            for name, body in namespace_blocks(text):
                checked += 1
                if name == want or name.startswith(want + "::"):
                    continue
                if FORWARD_ONLY.match(body):
                    continue
                bad.append(f"{rel}: its code is in namespace {name}, not {want} (its folder's)")
    # The SDK and the examples declare nothing in LibTorch's namespaces (worker_sdk/compat/ stands
    # in for headers a LibTorch build lacks, so it is theirs to write).
    for top in ("worker_sdk/include", "worker_sdk/src", "examples"):
        for f in sorted((root / top).rglob("*")):
            if f.suffix not in (".hpp", ".cpp", ".h"):
                continue
            for m in TORCH_NAMESPACE.finditer(f.read_text()):
                checked += 1
                bad.append(f"{f.relative_to(root).as_posix()}: declares in LibTorch's namespace {m.group(1)} "
                           "(include LibTorch's header instead)")
    return checked


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    bad = []
    checked, graph = check_includes(root, bad)
    links = check_links(root, graph, bad)
    namespaces = check_namespaces(root, bad)
    for line in bad:
        print(line)
    print(f"check_layers: {checked} includes in {len(graph)} files, {links} link edges and {namespaces} namespace "
          f"blocks checked, {len(bad)} not allowed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
