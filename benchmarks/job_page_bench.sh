#!/usr/bin/env bash
# What the job page costs, and how big a job it draws quickly.
#   1. A training job watched against one not watched: the C++ SDK's DDP benchmark (ddp_bench)
#      under ddprun, 2 processes, in alternating runs (drift falls on both sides alike):
#        off: no --http_port;
#        on:  --http_port, and /api/job fetched every 1.5 s for the whole run, as an open page
#             does (the browser itself runs elsewhere: its own CPU is not the agent's cost).
#      Prints each run's steps/s and the median on/off ratio (1.00 = no cost).
#   2. The page of 1024 and 16384 synthetic ranks (job_page_synthetic) in headless chromium: the
#      page's own time to draw the job (data-render-ms, measured by the page), the whole load
#      (browser start included) and the size and time of one /api/job.
#   3. Supervision under a flood of page requests: a worker of a 2-worker job SIGKILLed, and the
#      time until ddprun has stopped the other (from its report file: the two workers' ends; ddprun
#      holds a SIGKILLed worker's failure 1 s, to tell it from a job-wide kill), with 16 clients
#      fetching /api/job and /ui as fast as they can, against none.
#   4. A page left open for HOURS (24: a day) on a running job, in headless chromium's virtual time
#      (its timers run as fast as the page's requests are answered: a day's 57,600 refreshes take
#      minutes): the refreshes made, the page's JS heap at the end (Chromium's
#      performance.memory, on <body>) against after one hour, and the agent's RSS before and after.
#   benchmarks/job_page_bench.sh BUILD_DIR [STEPS] [BATCH_PER_RANK] [PAIRS] [HOURS]
#   PARTS="2 4" benchmarks/job_page_bench.sh ...   runs only those parts (default: all four)
set -euo pipefail
build=${1:?usage: job_page_bench.sh BUILD_DIR [STEPS] [BATCH] [PAIRS] [HOURS]}
steps=${2:-600}
batch=${3:-64}
pairs=${4:-5}
hours=${5:-24}
export OMP_NUM_THREADS=1
ddprun="$build/launcher/ddprun"
bench="$build/benchmarks/ddp_bench"
synthetic="$build/benchmarks/job_page_synthetic"
worker="$build/tests/test_worker"
command -v chromium >/dev/null || { echo "job_page_bench: chromium is missing (scripts/install_deps.sh)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

parts=" ${PARTS:-1 2 3 4} "
part() { [[ $parts == *" $1 "* ]]; }
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" | tail -1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# One GET over bash's /dev/tcp (no curl needed): the body's size in bytes.
get() {
  local port=$1 path=$2
  exec 3<>"/dev/tcp/127.0.0.1/$port" || return 1
  printf 'GET %s HTTP/1.1\r\nHost: localhost\r\n\r\n' "$path" >&3
  local n
  n=$(cat <&3 | wc -c)
  exec 3<&-
  echo "$n"
}
poll() { while :; do get "$1" /api/job >/dev/null 2>&1 || true; sleep 1.5; done; }

run_off() { "$ddprun" --nproc_per_node 2 "$bench" "$steps" "$batch" 2>/dev/null | field steps_per_s; }
run_on() {
  local port
  port=$(free_port)
  poll "$port" &
  local poller=$!
  "$ddprun" --nproc_per_node 2 --http_port "$port" "$bench" "$steps" "$batch" 2>/dev/null | field steps_per_s
  kill "$poller" 2>/dev/null || true
  wait "$poller" 2>/dev/null || true
}
if part 1; then
off=() on=() ratios=()
for ((i = 0; i < pairs; i++)); do
  if ((i % 2 == 0)); then a=$(run_off); b=$(run_on); else b=$(run_on); a=$(run_off); fi
  off+=("$a") on+=("$b") ratios+=("$(echo "$b / $a" | bc -l)")
  printf 'pair %d: off %.1f steps/s, on %.1f steps/s, on/off %.3f\n' "$((i + 1))" "$a" "$b" "${ratios[-1]}"
done
printf 'LeNet-5, batch %s per rank, %s steps, 2 processes, %s pairs\n' "$batch" "$steps" "$pairs"
printf 'median steps/s: no page %.1f, page open %.1f; median on/off ratio %.3f (min %.3f, max %.3f)\n' \
  "$(median "${off[@]}")" "$(median "${on[@]}")" "$(median "${ratios[@]}")" \
  "$(printf '%s\n' "${ratios[@]}" | sort -g | head -1)" "$(printf '%s\n' "${ratios[@]}" | sort -g | tail -1)"
fi

if part 2; then
for ranks in 1024 16384; do
  mkfifo "$work/in"
  "$synthetic" "$ranks" <"$work/in" >"$work/out" &
  server=$!
  exec 4>"$work/in"
  for _ in $(seq 100); do grep -q port= "$work/out" 2>/dev/null && break; sleep 0.1; done
  port=$(field port <"$work/out")
  t0=$(date +%s%N)
  bytes=$(get "$port" /api/job)
  t1=$(date +%s%N)
  renders=()
  loads=()
  for _ in 1 2 3; do
    s=$(date +%s%N)
    dom=$(chromium --headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking \
      --disable-component-update --disable-sync --user-data-dir="$work/profile" --window-size=1200,900 \
      --dump-dom "http://127.0.0.1:$port/ui" 2>/dev/null)
    e=$(date +%s%N)
    renders+=("$(printf '%s' "$dom" | sed -n 's/.*data-render-ms="\([0-9.]*\)".*/\1/p' | head -1)")
    loads+=("$(echo "($e - $s) / 1000000" | bc)")
    grep -q 'data-rank="' <<<"$dom" || echo "job_page_bench: the page of $ranks ranks shows no rank" >&2
  done
  printf '%5d ranks: /api/job %d bytes in %d ms; the page draws the job in %s ms (median of 3; %s), browser start to DOM %s ms\n' \
    "$ranks" "$bytes" "$(((t1 - t0) / 1000000))" "$(median "${renders[@]}")" "${renders[*]}" "$(median "${loads[@]}")"
  exec 4>&-
  wait "$server" 2>/dev/null || true
  rm -f "$work/in" "$work/out"
done
fi

# 3. A worker killed while 16 clients flood a page: from its death to the other worker's stop. The flood itself takes
#    CPU from everyone on this machine, so it runs twice: against the job's own ddprun, and against
#    another ddprun's page (the same load on the machine, none on the job's ddprun); the difference
#    is what serving the flood costs the supervision.
if part 3; then
flood() { while :; do get "$1" /api/job >/dev/null 2>&1 || true; get "$1" /ui >/dev/null 2>&1 || true; done; }
other_port=$(free_port)
"$ddprun" --nproc_per_node 1 --http_port "$other_port" "$worker" sleep 100000 >/dev/null 2>&1 &
other=$!
trap 'kill $other 2>/dev/null || true; rm -rf "$work"' EXIT
kill_to_exit() {
  local target=$1 port pids=() ddp victim s e
  port=$(free_port)
  "$ddprun" --nproc_per_node 2 --max_restarts 0 --http_port "$port" --report_file "$work/report.json" \
    "$worker" sleep 120 >/dev/null 2>&1 &
  ddp=$!
  for _ in $(seq 100); do get "$port" /api/job 2>/dev/null | grep -q . && break; sleep 0.1; done
  if [[ $target == own ]]; then target=$port; elif [[ $target == other ]]; then target=$other_port; else target=""; fi
  if [[ -n $target ]]; then
    for ((k = 0; k < 16; k++)); do flood "$target" & pids+=($!); done
  fi
  sleep 2
  victim=""
  for _ in $(seq 300); do
    victim=$(pgrep -P "$ddp" -x "$(basename "$worker")" | head -1 || true)  # a worker, exec'd
    [[ -n $victim ]] && break
    sleep 0.1
  done
  kill -9 "$victim"
  wait "$ddp" 2>/dev/null || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  # The report's two workers: the killed one's end and the other's (stopped by ddprun), in ms.
  python3 - "$work/report.json" <<'PY'
import datetime, json, sys
workers = json.load(open(sys.argv[1]))["attempts"][-1]["workers"]
ends = sorted(datetime.datetime.fromisoformat(w["ended_at"].replace("Z", "+00:00")) for w in workers)
print(round((ends[-1] - ends[0]).total_seconds() * 1000))
PY
}
quiet=() own=() others=()
for ((i = 0; i < pairs; i++)); do
  a=$(kill_to_exit none)
  if ((i % 2 == 0)); then b=$(kill_to_exit own); c=$(kill_to_exit other); else c=$(kill_to_exit other); b=$(kill_to_exit own); fi
  quiet+=("$a") own+=("$b") others+=("$c")
  printf 'round %d: a worker killed to the other stopped: %d ms, nobody asking; %d ms, 16 clients flooding its page; %d ms, 16 flooding another ddprun'"'"'s\n' \
    "$((i + 1))" "$a" "$b" "$c"
done
printf 'a worker killed to the other stopped, median: %s ms quiet, %s ms with its own page flooded, %s ms with another page flooded\n' \
  "$(median "${quiet[@]}")" "$(median "${own[@]}")" "$(median "${others[@]}")"
fi

# 4. A page open for HOURS on a running job: bounded on both sides.
if part 4; then
port=$(free_port)
"$ddprun" --nproc_per_node 2 --http_port "$port" "$bench" 1000000000 "$batch" >/dev/null 2>&1 &
ddp=$!
trap 'kill ${other:-} $ddp 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 100); do get "$port" /api/job 2>/dev/null | grep -q . && break; sleep 0.1; done
sleep 5
agent_rss() { ps -o rss= -p "$ddp" | tr -d ' '; }
open_for() {
  chromium --headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$work/profile-day" --enable-precise-memory-info \
    --virtual-time-budget="$(($1 * 3600 * 1000))" --dump-dom "http://127.0.0.1:$port/ui" 2>/dev/null |
    sed -n 's/.*data-refreshes="\([0-9]*\)".*data-heap-bytes="\([0-9]*\)".*/\1 \2/p; s/.*data-heap-bytes="\([0-9]*\)".*data-refreshes="\([0-9]*\)".*/\2 \1/p' | head -1
}
before=$(agent_rss)
read -r r1 h1 <<<"$(open_for 1)"
s=$(date +%s)
read -r rn hn <<<"$(open_for "$hours")"
e=$(date +%s)
after=$(agent_rss)
printf 'a page open %s h (virtual time, %d s here): %s refreshes, its JS heap %.1f MiB (after 1 h: %s refreshes, %.1f MiB); the agent %.1f MiB before, %.1f MiB after\n' \
  "$hours" "$((e - s))" "${rn:-?}" "$(echo "${hn:-0} / 1048576" | bc -l)" "${r1:-?}" "$(echo "${h1:-0} / 1048576" | bc -l)" \
  "$(echo "$before / 1024" | bc -l)" "$(echo "$after / 1024" | bc -l)"
kill "$ddp" 2>/dev/null || true
wait "$ddp" 2>/dev/null || true
fi
