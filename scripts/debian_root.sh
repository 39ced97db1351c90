#!/usr/bin/env bash
# Runs a command on this checkout inside a Debian root made with debootstrap, as a new user of that
# release would: the checkout is bound at /ddprun, /proc, /sys and /dev are bound in, and the
# build goes to /ddprun/build-<release> so it never mixes with the host's build/.
#
#   scripts/debian_root.sh [--release trixie|bookworm] [--root DIR] [--fresh] [COMMAND...]
#
# COMMAND runs in /ddprun with bash (default: bash scripts/test.sh, the README's test command).
# --release  the Debian suite (default trixie, Debian 13)
# --root     where the root lives (default /var/cache/ddprun/<release>-root: made once, reused)
# --fresh    make the root anew first (a new user's machine: nothing installed yet)
# Needs root (chroot, mounts). If the root cannot be made, says why and exits non-zero.
set -euo pipefail

release=trixie
root_dir=""
fresh=0
while (($#)); do
  case "$1" in
    --release) release="$2"; shift 2 ;;
    --release=*) release="${1#*=}"; shift ;;
    --root) root_dir="$2"; shift 2 ;;
    --root=*) root_dir="${1#*=}"; shift ;;
    --fresh) fresh=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) break ;;
  esac
done
case "$release" in
  trixie|bookworm) ;;
  *) echo "debian_root: unsupported release '$release': use trixie (Debian 13) or bookworm (Debian 12)" >&2; exit 2 ;;
esac
command_line=("$@")
if ((${#command_line[@]} == 0)); then command_line=(bash scripts/test.sh); fi

if [[ $(id -u) -ne 0 ]]; then
  echo "debian_root: needs root (debootstrap, chroot and bind mounts): run it with sudo" >&2
  exit 2
fi

repo=$(cd "$(dirname "$0")/.." && pwd)
root_dir="${root_dir:-/var/cache/ddprun/${release}-root}"
mirror="${DDPRUN_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
ready="$root_dir/.ddprun-root-ready"

fail() { echo "debian_root: $*" >&2; exit 1; }

# The mounts at or under the root, deepest first.
mounts_under_root() {
  findmnt -rn -o TARGET | awk -v r="$root_dir" '$0 == r || index($0, r "/") == 1' | sort -r
}

# A run that was killed (SIGKILL, the end of a session) leaves its mounts in place: the checkout
# at /ddprun, the host's /dev and /sys. Under the lock no other run uses the root, so whatever is
# mounted there is such a leftover: undone before this run mounts its own.
unmount_leftovers() {
  local m
  while read -r m; do
    [[ -n "$m" ]] || continue
    umount -R "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done < <(mounts_under_root)
}

# Removes an old root (after unmount_leftovers). rm -rf would go through a mount and delete the
# checkout or the host's device nodes, so nothing is removed while one is left.
clear_root() {
  if [[ -n "$(mounts_under_root)" ]]; then
    fail "cannot unmount what is mounted in the old root ($(mounts_under_root | tr '\n' ' ')); unmount it, then try again"
  fi
  rm -rf --one-file-system "$root_dir"
}

make_root() {
  if ! command -v debootstrap >/dev/null 2>&1; then
    echo "debian_root: installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq || fail "apt-get update failed: cannot install debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap debian-archive-keyring \
      || fail "cannot install debootstrap (Debian's package); the $release root cannot be made"
  fi
  clear_root
  mkdir -p "$(dirname "$root_dir")"
  local log="$root_dir.debootstrap.log"
  echo "debian_root: making a Debian $release root in $root_dir (debootstrap, a few minutes; log: $log)"
  if ! debootstrap --variant=minbase "$release" "$root_dir" "$mirror" >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    fail "debootstrap $release $root_dir $mirror failed (above: the end of $log); the $release root cannot be made"
  fi
  touch "$ready"
}

lock="$root_dir.lock"
mkdir -p "$(dirname "$root_dir")"
exec 9>"$lock"
flock 9
unmount_leftovers
if ((fresh)) || [[ ! -f "$ready" ]]; then make_root; fi

mounts=()
cleanup() {
  local i
  trap '' INT TERM  # a second signal (a stop passed on twice) must not cut the unmounting short
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount -R "${mounts[$i]}" 2>/dev/null || umount -l "${mounts[$i]}" 2>/dev/null || true
  done
}
trap cleanup EXIT
bind() {  # bind SOURCE TARGET [--rbind]
  mkdir -p "$2"
  mount "${3:---bind}" "$1" "$2" || fail "cannot bind $1 at $2"
  mount --make-rslave "$2" 2>/dev/null || true
  mounts+=("$2")
}
# The root is a mount point of its own, as / is on a machine: `ip netns exec` and unshare make
# it a slave mount, which needs one.
mount --bind "$root_dir" "$root_dir" || fail "cannot bind $root_dir onto itself"
mount --make-rprivate "$root_dir" 2>/dev/null || true  # nothing mounted in it reaches the host
mounts+=("$root_dir")
mkdir -p "$root_dir/proc"
mount -t proc proc "$root_dir/proc" || fail "cannot mount /proc in $root_dir"
mounts+=("$root_dir/proc")
bind /sys "$root_dir/sys" --rbind
bind /dev "$root_dir/dev" --rbind
bind "$repo" "$root_dir/ddprun"
# The root shares this host's network and host name: it resolves them as this host does.
for f in resolv.conf hosts; do cp "/etc/$f" "$root_dir/etc/$f" 2>/dev/null || true; done

echo "debian_root: running '${command_line[*]}' in Debian $release ($root_dir)"
set +e
chroot "$root_dir" /usr/bin/env -i \
  HOME=/root TERM="${TERM:-dumb}" LANG=C.UTF-8 CI="${CI:-}" \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  DDPRUN_BUILD_DIR="/ddprun/build-$release" \
  ${DDPRUN_TEST_JOBS:+DDPRUN_TEST_JOBS=$DDPRUN_TEST_JOBS} \
  ${DDPRUN_TEST_BOX_END:+DDPRUN_TEST_BOX_END=$DDPRUN_TEST_BOX_END} \
  ${DDPRUN_BOX_FIRST:+DDPRUN_BOX_FIRST=$DDPRUN_BOX_FIRST} \
  bash -c 'cd /ddprun && exec "$@"' bash "${command_line[@]}"
rc=$?
set -e
echo "debian_root: '${command_line[*]}' in Debian $release exited with $rc"
exit $rc
