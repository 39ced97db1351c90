#!/usr/bin/env bash
# Runs clang-tidy with the checked-in .clang-tidy over the translation units of common/, rendezvous/
# and launcher/ in BUILD_DIR's compile_commands.json (the SDK's, LibTorch's, are left to the
# compiler's warnings: a LibTorch translation unit takes clang-tidy minutes). Pinned to clang-tidy
# 14 (Debian 12's): another version has other checks, so there it skips (exit 77).
#
# The units of one library or program are checked together, as one unit that includes them all
# (BUILD_DIR/tidy/<target>.cpp, with that target's flags): clang-tidy 14 walks the whole syntax tree,
# Boost's and the standard library's headers included, for every unit, and that walk is most of its
# time, so one walk per target instead of one per file takes the check from about 23 CPU-minutes to
# about 3 here. A target whose combined unit does not compile (two files defining one name in their
# anonymous namespaces) is checked file by file instead, and says so. What combining can miss: a
# using-declaration in one file that only a later file of the same target uses
# (misc-unused-using-decls); the compiler's own warnings cover the rest of what crosses files.
#   tidy.sh [--per-file] [BUILD_DIR]    (default build/); exit 1 with the findings when there are any
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
per_file=0
if [[ ${1:-} == --per-file ]]; then per_file=1; shift; fi
build=${1:-$root/build}
tool=$(command -v clang-tidy-14 || command -v clang-tidy || true)
[[ -n $tool ]] || { echo "tidy: clang-tidy is not installed (scripts/install_deps.sh installs it)" >&2; exit 2; }
version=$("$tool" --version | sed -n 's/.*LLVM version \([0-9][0-9]*\)\..*/\1/p')
if [[ $version != 14 ]]; then
  echo "tidy: skipped: the checks are pinned to clang-tidy 14 (Debian 12's), this is $version"
  exit 77
fi
[[ -f $build/compile_commands.json ]] || { echo "tidy: no $build/compile_commands.json: configure first" >&2; exit 2; }
exec python3 - "$tool" "$build" "$root" "$per_file" "$(nproc)" <<'PY'
import collections, concurrent.futures, json, os, re, shlex, subprocess, sys

tool, build, root, per_file, jobs = sys.argv[1], os.path.realpath(sys.argv[2]), os.path.realpath(sys.argv[3]), \
    sys.argv[4] == "1", int(sys.argv[5])
config = os.path.join(root, ".clang-tidy")
finding = re.compile(r"^(/[^:]+):\d+:\d+: (warning|error): ")

# The units to check, grouped by the target whose flags they are compiled with.
groups = collections.OrderedDict()
for entry in json.load(open(os.path.join(build, "compile_commands.json"))):
    path = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
    if os.path.relpath(path, root).split("/")[0] not in ("common", "rendezvous", "launcher") or \
            not path.endswith(".cpp"):
        continue
    args = entry.get("arguments") or shlex.split(entry["command"])
    target = re.search(r"CMakeFiles/([^/]+)\.dir/", " ".join(args))
    key = target.group(1) if target else path
    files, _ = groups.setdefault(key, ([], entry))
    if path not in files:
        files.append(path)
units = sorted({f for files, _ in groups.values() for f in files})


def run(argv):
    done = subprocess.run(argv, cwd=build, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return done.stdout.splitlines()


def per_file_check(files):
    return [line for f in files for line in run([tool, "-p", build, "--quiet", f])]


def flags_of(entry):
    """The compiler's arguments of one unit, less the compiler, its output and its input."""
    args = entry.get("arguments") or shlex.split(entry["command"])
    kept, skip = [], False
    for a in args[1:]:
        if skip:
            skip = False
        elif a in ("-o", "-c"):
            skip = True
        elif a != entry["file"]:
            kept.append(a)
    return kept


def check_group(name, files, entry):
    if per_file or len(files) == 1:
        return per_file_check(files), None
    unity = os.path.join(build, "tidy", name + ".cpp")
    os.makedirs(os.path.dirname(unity), exist_ok=True)
    with open(unity, "w") as f:
        f.write("".join(f'#include "{p}"\n' for p in files))
    out = run([tool, "--quiet", "--config-file=" + config, unity, "--", *flags_of(entry)])
    if any(": error: " in line for line in out):
        first = next(line for line in out if ": error: " in line)
        return per_file_check(files), f"{name}: its {len(files)} files do not compile as one ({first.strip()}); checked one by one"
    # The combined unit's own lines (its #include "x.cpp") are not the project's.
    return [line for line in out if not line.startswith(unity + ":")], None


lines, notes = [], []
with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
    # The biggest groups first, so that the last to finish is a small one.
    ordered = sorted(groups.items(), key=lambda kv: -len(kv[1][0]))
    for out, note in pool.map(lambda kv: check_group(kv[0], *kv[1]), ordered):
        lines += out
        if note:
            notes.append(note)
for note in notes:
    print("tidy: " + note)
findings = sorted({line for line in lines if finding.match(line)})
how = "file by file" if per_file else f"in {len(groups)} groups"
if findings:
    print("\n".join(findings))
    print(f"tidy: {len(findings)} finding(s) in {len(units)} translation units, {how} "
          f"(clang-tidy 14, .clang-tidy)")
    sys.exit(1)
print(f"tidy: {len(units)} translation units clean, {how} (clang-tidy 14, .clang-tidy)")
PY
