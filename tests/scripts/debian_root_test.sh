#!/usr/bin/env bash
# scripts/debian_root.sh --fresh over a root that a killed run left with its mounts in place (the
# checkout bound at /ddprun, /dev and /sys bound in): making the root anew must unmount them
# first, never delete through them into the checkout or the host's /dev.
#
#   tests/scripts/debian_root_test.sh REPO
#
# debootstrap is real and pointed at a mirror nothing answers, so it fails at once after the old
# root is cleared; what is checked is what survives. Exit 77 (skipped) without root or mounts.
set -euo pipefail
repo=$(cd "${1:?usage: debian_root_test.sh REPO}" && pwd)

fail() { echo "FAIL: $*" >&2; exit 1; }
if [[ $(id -u) -ne 0 ]]; then echo "skipped: needs root (mounts)"; exit 77; fi

tmp=$(mktemp -d /var/tmp/ddprun-root-test.XXXXXX)
root="$tmp/root"
checkout="$tmp/checkout"
cleanup() {
  umount -R "$root" 2>/dev/null || true
  while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(findmnt -rn -o TARGET | grep -F "$tmp/" | sort -r)
  if ! findmnt -rn -o TARGET | grep -qF "$tmp/"; then rm -rf --one-file-system "$tmp"; fi
}
trap cleanup EXIT

mkdir -p "$root/ddprun" "$root/dev" "$checkout"
echo "work in progress" >"$checkout/train.py"
touch "$root/.ddprun-root-ready"
# What a killed run leaves: the checkout and a device directory bound into the root. (A tmpfs
# stands in for the host's /dev so that a failure of this test deletes nothing of the host.)
devdir="$tmp/dev"
mkdir -p "$devdir"
mount -t tmpfs -o size=1m tmpfs "$devdir" || { echo "skipped: cannot mount here"; exit 77; }
touch "$devdir/null-standin"
mount --bind "$checkout" "$root/ddprun" || { echo "skipped: cannot bind-mount here"; exit 77; }
mount --bind "$devdir" "$root/dev"

set +e
out=$(DDPRUN_DEBIAN_MIRROR=http://127.0.0.1:9/debian bash "$repo/scripts/debian_root.sh" --release bookworm \
        --root "$root" --fresh -- true 2>&1)
rc=$?
set -e
echo "$out"
[[ $rc -ne 0 ]] || fail "debootstrap from a mirror nothing answers succeeded?"
[[ -f "$checkout/train.py" ]] || fail "the checkout bound into the old root was deleted through its mount"
[[ -f "$devdir/null-standin" ]] || fail "the device directory bound into the old root was emptied"
! findmnt -rn -o TARGET | grep -qF "$root/" || fail "mounts left under $root: $(findmnt -rn -o TARGET | grep -F "$root/")"
echo "$out" | grep -q "debootstrap bookworm" || fail "the failure does not say that debootstrap failed"
echo "PASS: the old root's mounts were undone before it was removed; nothing behind them was touched"
