#!/usr/bin/env bash
# The ddprun package, installed into a clean root (dpkg-deb -x): what it holds, what it depends on,
# and that the installed files work: --version, a two-worker DDP job of the installed examples, the
# daemon started with the packaged config file, man pages and bash completion for every flag.
#   installed_runtime_test.sh PACKAGE_DIR
set -euo pipefail
debs=$(cd "$1" && pwd)
work=$(mktemp -d)
daemon=""
trap '[[ -n $daemon ]] && kill $daemon 2>/dev/null; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

deb=$(ls "$debs"/ddprun_*_*.deb)
[[ $(basename "$deb") =~ ^ddprun_[0-9]+\.[0-9]+\.[0-9]+_[a-z0-9]+\.deb$ ]] || fail "package name $(basename "$deb")"

# Depends from dpkg-shlibdeps: the C library, the C++ runtime, OpenSSL; never LibTorch.
depends=$(dpkg-deb -f "$deb" Depends)
for d in libc6 libstdc++6 libssl3 adduser; do
  [[ $depends == *"$d"* ]] || fail "Depends lacks $d: $depends"
done
[[ $depends != *torch* ]] || fail "the launcher package must not depend on LibTorch: $depends"
dpkg-deb -I "$deb" conffiles | grep -qx /etc/default/ddprun-rendezvous || fail "config file not a conffile"
dpkg-deb -I "$deb" postinst | grep -q "adduser --system" || fail "postinst does not make the daemon's user"

root="$work/root"
mkdir -p "$root"
for d in "$debs"/*.deb; do dpkg-deb -x "$d" "$root"; done
for f in usr/bin/ddprun usr/bin/ddprun-rendezvous usr/bin/ddprun-top usr/share/man/man1/ddprun.1.gz \
         usr/share/man/man1/ddprun-rendezvous.1.gz usr/share/man/man1/ddprun-top.1.gz \
         usr/share/bash-completion/completions/ddprun usr/share/bash-completion/completions/ddprun-rendezvous \
         usr/share/bash-completion/completions/ddprun-top \
         usr/lib/systemd/system/ddprun-rendezvous.service etc/default/ddprun-rendezvous; do
  [[ -e "$root/$f" ]] || fail "the packages lack /$f"
done
bin="$root/usr/bin"
readelf -S "$bin/ddprun" | grep -q '\.symtab' && fail "ddprun is not stripped"

# --version, and a two-worker DDP job of the installed example from the installed launcher.
[[ $("$bin/ddprun" --version) =~ ^ddprun\ [0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "ddprun --version: $("$bin/ddprun" --version)"
[[ $("$bin/ddprun-top" --version) =~ ^ddprun-top\ [0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "ddprun-top --version: $("$bin/ddprun-top" --version)"
job=$("$bin/ddprun" --nproc_per_node 2 "$root/usr/libexec/ddprun/examples/mlp" --epochs 1 --max-steps 5 \
      --train-limit 1280 2>"$work/job.err") || { cat "$work/job.err"; fail "the two-worker job failed"; }
grep -q '"world_size": 2' <<<"$job" || fail "no two-worker result: $job"

# The daemon with the packaged options, the secret and the port swapped for the test's.
head -c 32 /dev/urandom | base64 > "$work/token"
chmod 600 "$work/token"
source "$root/etc/default/ddprun-rendezvous"
opts=${DDPRUN_RENDEZVOUS_OPTS//\/etc\/ddprun\/token/$work/token}
opts=${opts//--port 29400/--port 0}
[[ $opts == *"--state-file /var/lib/ddprun-rendezvous/state"* ]] || fail "the packaged options keep no state across restarts"
grep -qx "StateDirectory=ddprun-rendezvous" "$root/usr/lib/systemd/system/ddprun-rendezvous.service" \
  || fail "the unit has no StateDirectory for --state-file"
opts=${opts//\/var\/lib\/ddprun-rendezvous/$work}
grep -q "^ExecStart=/usr/bin/ddprun-rendezvous \$DDPRUN_RENDEZVOUS_OPTS$" "$root/usr/lib/systemd/system/ddprun-rendezvous.service" \
  || fail "the unit does not run the packaged binary with the config file's options"
# shellcheck disable=SC2086
"$bin/ddprun-rendezvous" $opts --port-file "$work/port" > "$work/daemon.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [[ -s "$work/port" ]] && break; sleep 0.1; done
[[ -s "$work/port" ]] || { cat "$work/daemon.log"; fail "ddprun-rendezvous did not start with the packaged options"; }
"$bin/ddprun-rendezvous" status --endpoint "127.0.0.1:$(cat "$work/port")" --token-file "$work/token" | grep -q '"jobs"' \
  || fail "status against the packaged daemon"
kill "$daemon"; wait "$daemon" || true; daemon=""

# Man pages and completion: every flag of --help, in both.
for tool in ddprun ddprun-rendezvous ddprun-top; do
  man_text=$(zcat "$root/usr/share/man/man1/$tool.1.gz" | sed 's/\\-/-/g')
  grep -q '^\.TH' <<<"$man_text" || fail "$tool.1 is not a man page"
  # An option's line: its names, then (after two spaces) the first line of its help.
  flags=$("$bin/$tool" --help | grep -E '^ {1,10}-' | sed -E 's/^ +//; s/  .*//' | grep -oE -- '--[a-z][a-z0-9_-]*' |
          sort -u)
  [[ -n $flags ]] || fail "no flags in $tool --help"
  # shellcheck disable=SC1090
  source "$root/usr/share/bash-completion/completions/$tool"
  fn="_${tool//-/_}"
  COMP_WORDS=("$tool" "--"); COMP_CWORD=1; COMPREPLY=()
  "$fn" || true
  for f in $flags; do
    grep -qF -- "$f" <<<"$man_text" || fail "$tool.1 lacks $f"
    [[ " ${COMPREPLY[*]} " == *" $f "* ]] || fail "the completion of $tool lacks $f"
  done
done
# After the program, its own arguments: files, not ddprun's flags.
COMP_WORDS=(ddprun --nnodes 1 train.py --); COMP_CWORD=4; COMPREPLY=(); _ddprun || true
[[ " ${COMPREPLY[*]} " != *" --nnodes "* ]] || fail "ddprun's flags completed after the program"
COMP_WORDS=(ddprun --rdzv_backend ""); COMP_CWORD=2; COMPREPLY=(); _ddprun || true
[[ "${COMPREPLY[*]}" == "static c10d etcd" ]] || fail "rdzv_backend values: ${COMPREPLY[*]}"
echo "installed ddprun package: $(basename "$deb"), Depends: $depends; --version, a two-worker job, the daemon with its config, man pages and completion for every flag"
