#!/usr/bin/env bash
# Reliability soak test: kiln-server on loopback with two tiny synthesized models (a and b),
# 256 concurrent streams from kiln-loadgen for a set time (192 over gRPC, 64 over the OpenAI HTTP
# API, half of each on each model; prompt and output lengths uniform), 10 % of the requests
# cancelled and 5 % disconnected by the client mid-stream, model b unloaded and loaded again every
# 30 s under its traffic, the server's RSS and thread count sampled every 10 s. Then a report and
# pass/fail criteria:
#
#   errors        none but those provoked: requests cancelled or disconnected on purpose, and
#                 requests to b that overlap one of its reloads, with one of the codes an unload
#                 gives (gRPC NOT_FOUND or UNAVAILABLE; HTTP 404, 503, or an error event). Every
#                 other request must finish with its max_tokens (finish reason LENGTH: prompts
#                 ignore EOS).
#   reloads       every unload and load succeeds.
#   faults        cancellations and disconnections happened over both protocols.
#   RSS           growth from the end of the warm-up (the first minute; a third of a run shorter
#                 than 3 minutes) to the end of the load, once the clients finished, ≤ 5 %.
#   threads       under load (about one a gRPC stream: the sync server's) the last sample
#                 ≤ the one after the warm-up + 8; once the load drained ≤ the count before it
#                 (after a 2 s burst of requests started the lazy pools) + 8. A thread leaked per
#                 disconnect or per stream grows past either, one per reload in a run of 10.
#   ITL           the p99 inter-token latency of every token the clients received in the last
#                 full window ≤ 2 × that of the first full window after the warm-up (windows of
#                 60 s for runs of 5 minutes or more, else 10 s; a window is full when the load
#                 ran through all of it). Each client's own series (kiln-loadgen's) is shown.
#   drain         once the load ended: no request running or waiting and no KV block held
#                 (/metrics), Health SERVING, a and b READY.
#   shutdown      SIGTERM ends the server with status 0 within 30 s.
#
#   scripts/soak.sh [--minutes N | --seconds N] [--results DIR] [--reload-every SECONDS]
#
# Defaults: 10 minutes, results in build/soak/ (the loadgen JSONs and outputs, samples.csv,
# reloads.log, metrics.txt, server.log, report.txt). Environment: KILN_SOAK_BUILD (the build
# directory whose kiln-server, kiln and kiln-loadgen run, default build/dev), KILN_SOAK_LOADGEN
# (a kiln-loadgen binary to use instead of the build directory's). Exit status: 0 when every
# criterion holds, 1 when one fails (the report says which), 2 for a usage or setup error.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}
# A usage or setup error: exit status 2.
usage_error() {
  echo "soak: $*" >&2
  exit 2
}

seconds=600
results=$repo/build/soak
reload_every=30
while (($# > 0)); do
  case $1 in
  --minutes | --minutes=*)
    value=${1#--minutes=}
    [[ $1 == --minutes ]] && { value=${2:-}; shift; }
    [[ $value =~ ^[0-9]+$ && $value -gt 0 ]] || usage_error "--minutes takes a positive integer"
    seconds=$((value * 60))
    ;;
  --seconds | --seconds=*)
    value=${1#--seconds=}
    [[ $1 == --seconds ]] && { value=${2:-}; shift; }
    [[ $value =~ ^[0-9]+$ && $value -ge 30 ]] || usage_error "--seconds takes an integer ≥ 30"
    seconds=$value
    ;;
  --results | --results=*)
    value=${1#--results=}
    [[ $1 == --results ]] && { value=${2:-}; shift; }
    [[ -n $value ]] || usage_error "--results takes a directory"
    results=$value
    ;;
  --reload-every | --reload-every=*)
    value=${1#--reload-every=}
    [[ $1 == --reload-every ]] && { value=${2:-}; shift; }
    [[ $value =~ ^[0-9]+$ && $value -ge 5 ]] || usage_error "--reload-every takes an integer ≥ 5"
    reload_every=$value
    ;;
  -h | --help)
    usage
    exit 0
    ;;
  *)
    usage_error "unknown argument '$1' (see --help)"
    ;;
  esac
  shift
done

build=${KILN_SOAK_BUILD:-build/dev}
[[ $build == /* ]] || build=$repo/$build
server_bin=$build/server/kiln-server
kiln=$build/clients/kiln
loadgen=${KILN_SOAK_LOADGEN:-$build/clients/loadgen/kiln-loadgen}
python=${PYTHON:-python3}
for binary in "$server_bin" "$kiln" "$loadgen"; do
  [[ -x $binary ]] || usage_error "$binary is missing (build it, or set KILN_SOAK_BUILD)"
done
if ! grep -q -- '--disconnect-fraction' <<<"$("$loadgen" --help)"; then
  usage_error "$loadgen has no --cancel-fraction/--disconnect-fraction: rebuild kiln-loadgen"
fi

# The warm-up (RSS and thread baselines, the ITL baseline window) and the ITL window.
if ((seconds >= 180)); then warmup=60; else warmup=$((seconds / 3)); fi
if ((seconds >= 300)); then window=60; else window=10; fi
sample_every=10
grpc_streams=96 # per model
http_streams=32 # per model
lengths=(--input-tokens-dist uniform:4:96 --output-tokens-dist uniform:8:128)
max_context=256 # above the longest prompt + output

mkdir -p "$results"
results=$(cd "$results" && pwd)
rm -f "$results"/loadgen-*.json "$results"/loadgen-*.out "$results"/samples.csv \
  "$results"/reloads.log "$results"/metrics.txt "$results"/server.log "$results"/report.txt \
  "$results"/settings.txt "$results"/models.txt "$results"/reloads.out
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-soak.XXXXXX")
server_pid=""
background=()

# shellcheck disable=SC2317  # run by the trap
cleanup() {
  local status=$?
  for pid in "${background[@]}"; do kill "$pid" 2>/dev/null || true; done
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
  wait 2>/dev/null || true
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }
# Sleeps until `now_ms` reaches $1.
sleep_until_ms() {
  local left
  while left=$(($1 - $(now_ms))); ((left > 0)); do
    sleep "$((left / 1000)).$(printf '%03d' $((left % 1000)))"
  done
}

echo "==> soak: ${seconds} s of load (warm-up ${warmup} s, ITL windows of ${window} s)," \
  "model b reloaded every ${reload_every} s"
echo "    binaries: $server_bin, $kiln, $loadgen"
echo "    results: $results"

echo "==> two tiny models (kiln synth --preset kiln-tiny)"
mkdir -p "$work/models"
"$kiln" synth --preset kiln-tiny --seed 1 --out "$work/models/a" >/dev/null
"$kiln" synth --preset kiln-tiny --seed 2 --out "$work/models/b" >/dev/null
printf 'soak-admin-%s\n' "$RANDOM$RANDOM" >"$work/admin-token"

read -r port http_port < <("$python" -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
admin=(--server "127.0.0.1:$port" --admin_token_file "$work/admin-token")

echo "==> kiln-server on 127.0.0.1:$port (gRPC) and 127.0.0.1:$http_port (HTTP)"
"$server_bin" --listen "127.0.0.1:$port" --http-listen "127.0.0.1:$http_port" \
  --model-root "$work/models" --model "a=$work/models/a" --model "b=$work/models/b" \
  --admin-token-file "$work/admin-token" --max-context "$max_context" \
  >"$results/server.log" 2>&1 &
server_pid=$!
deadline=$((SECONDS + 60))
until "$kiln" health --server "127.0.0.1:$port" --timeout 2 >/dev/null 2>&1; do
  if ! kill -0 "$server_pid" 2>/dev/null; then
    tail -n 20 "$results/server.log" >&2
    usage_error "kiln-server exited at start"
  fi
  ((SECONDS < deadline)) || usage_error "kiln-server not SERVING after 60 s"
  sleep 0.5
done
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$server_pid/status" 2>/dev/null || echo -1; }
threads() { awk '/^Threads:/ { print $2 }' "/proc/$server_pid/status" 2>/dev/null || echo -1; }
# A short burst of the same load first (2 s, a tenth of the streams, no faults): thread pools
# that start or grow with the first requests (each engine's OpenMP team, gRPC's executors) belong
# in the baseline.
burst=()
for model in a b; do
  "$loadgen" --target "127.0.0.1:$port" --model "$model" --concurrency $((grpc_streams / 10)) \
    --duration 2s "${lengths[@]}" >"$work/burst-grpc-$model.out" 2>&1 &
  burst+=("$!")
  "$loadgen" --protocol openai --target "http://127.0.0.1:$http_port" --model "$model" \
    --concurrency $((http_streams / 10)) --duration 2s "${lengths[@]}" \
    >"$work/burst-http-$model.out" 2>&1 &
  burst+=("$!")
done
for pid in "${burst[@]}"; do
  wait "$pid" || { cat "$work"/burst-*.out >&2; usage_error "the first burst of requests failed"; }
done
sleep 2
# Threads by name (their comm, e.g. kiln-engine, grpcpp_sync_ser), counted: "N name; ...".
thread_names() {
  cat "/proc/$server_pid"/task/*/comm 2>/dev/null | sort | uniq -c |
    awk '{ printf "%s%d %s", (NR > 1 ? "; " : ""), $1, $2 } END { print "" }'
}
idle_rss=$(rss_kb)
idle_threads=$(threads)
idle_names=$(thread_names)
echo "    serving (after a 2 s burst of requests): RSS $((idle_rss / 1024)) MiB," \
  "$idle_threads threads"

cat >"$results/settings.txt" <<EOF
seconds=$seconds
warmup=$warmup
window=$window
reload_every=$reload_every
sample_every=$sample_every
grpc_streams_per_model=$grpc_streams
http_streams_per_model=$http_streams
lengths=${lengths[*]}
max_context=$max_context
idle_rss_kb=$idle_rss
idle_threads=$idle_threads
idle_thread_names=$idle_names
EOF

echo "==> load: $((2 * grpc_streams)) gRPC + $((2 * http_streams)) HTTP streams for ${seconds} s"
t0=$(now_ms)
echo "t0_ms=$t0" >>"$results/settings.txt"
common=(--duration "${seconds}s" --cancel-fraction 0.1 --disconnect-fraction 0.05
  --window "${window}s" --request-timeout 60s "${lengths[@]}")
loadgen_pids=()
for model in a b; do
  seed=$([[ $model == a ]] && echo 11 || echo 12)
  "$loadgen" --target "127.0.0.1:$port" --model "$model" --concurrency "$grpc_streams" \
    --connections 4 --seed "$seed" "${common[@]}" --json "$results/loadgen-grpc-$model.json" \
    >"$results/loadgen-grpc-$model.out" 2>&1 &
  loadgen_pids+=("$!")
  "$loadgen" --protocol openai --target "http://127.0.0.1:$http_port" --model "$model" \
    --concurrency "$http_streams" --seed "$((seed + 10))" "${common[@]}" \
    --json "$results/loadgen-http-$model.json" >"$results/loadgen-http-$model.out" 2>&1 &
  loadgen_pids+=("$!")
done

# RSS and threads every sample_every seconds: t_s,rss_kb,threads.
(
  echo "t_s,rss_kb,threads"
  k=0
  while kill -0 "$server_pid" 2>/dev/null; do
    sleep_until_ms $((t0 + k * sample_every * 1000))
    echo "$((k * sample_every)),$(rss_kb),$(threads)"
    k=$((k + 1))
  done
) >"$results/samples.csv" &
background+=("$!")

# Model b unloaded and loaded again every reload_every seconds while the load runs:
# unload_start_ms unload_end_ms unload_rc load_end_ms load_rc.
(
  k=1
  while ((k * reload_every < seconds)); do
    sleep_until_ms $((t0 + k * reload_every * 1000))
    u0=$(now_ms)
    urc=0
    "$kiln" models unload b "${admin[@]}" --timeout 60 >>"$work/reload.out" 2>&1 || urc=$?
    u1=$(now_ms)
    lrc=0
    "$kiln" models load b "$work/models/b" "${admin[@]}" --timeout 60 >>"$work/reload.out" 2>&1 ||
      lrc=$?
    echo "$u0 $u1 $urc $(now_ms) $lrc"
    k=$((k + 1))
  done
) >"$results/reloads.log" &
reload_pid=$!
background+=("$reload_pid")

loadgen_status=()
for pid in "${loadgen_pids[@]}"; do
  rc=0
  wait "$pid" || rc=$?
  loadgen_status+=("$rc")
done
load_end=$(now_ms)
wait "$reload_pid" || true
cp "$work/reload.out" "$results/reloads.out" 2>/dev/null || true
end_rss=$(rss_kb)
end_threads=$(threads)
echo "==> load ended after $(((load_end - t0) / 1000)) s (loadgen exit status ${loadgen_status[*]})"

loaded_names=$(thread_names)
# Drained: a few seconds for cancelled sequences to leave, and up to 10 s more for idle threads
# to end (gRPC's pools let theirs go after a while).
sleep 3
for _ in $(seq 20); do
  (($(threads) <= idle_threads + 8)) && break
  sleep 0.5
done
drained_rss=$(rss_kb)
drained_threads=$(threads)
drained_names=$(thread_names)
metrics_ok=1
"$python" - "$http_port" >"$results/metrics.txt" 2>&1 <<'EOF' || metrics_ok=0
import sys, urllib.request
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10) as r:
    sys.stdout.write(r.read().decode())
EOF
health=$("$kiln" health --server "127.0.0.1:$port" --timeout 10 2>&1) || true
"$kiln" models list "${admin[@]}" --timeout 10 >"$results/models.txt" 2>&1 || true
server_alive=0
kill -0 "$server_pid" 2>/dev/null && server_alive=1

shutdown_rc=-1
shutdown_s=-1
if ((server_alive)); then
  kill -TERM "$server_pid"
  s0=$SECONDS
  for _ in $(seq 300); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$server_pid" 2>/dev/null; then
    kill -KILL "$server_pid" 2>/dev/null || true
    shutdown_rc=timeout
  fi
  rc=0
  wait "$server_pid" || rc=$?
  [[ $shutdown_rc == timeout ]] || shutdown_rc=$rc
  shutdown_s=$((SECONDS - s0))
else
  rc=0
  wait "$server_pid" || rc=$?
  shutdown_rc="crashed:$rc"
fi
server_pid=""
for pid in "${background[@]}"; do kill "$pid" 2>/dev/null || true; done
background=()

cat >>"$results/settings.txt" <<EOF
load_end_ms=$load_end
loadgen_status=${loadgen_status[*]}
end_rss_kb=$end_rss
end_threads=$end_threads
drained_rss_kb=$drained_rss
drained_threads=$drained_threads
loaded_thread_names=$loaded_names
drained_thread_names=$drained_names
metrics_ok=$metrics_ok
health=$health
server_alive=$server_alive
shutdown_rc=$shutdown_rc
shutdown_s=$shutdown_s
EOF

echo "==> report"
set +e
"$python" - "$results" <<'EOF' | tee "$results/report.txt"
import collections, csv, json, math, os, re, sys

results = sys.argv[1]
settings = {}
for line in open(os.path.join(results, "settings.txt")):
    key, _, value = line.rstrip("\n").partition("=")
    settings[key] = value
num = lambda key: float(settings[key])
seconds, warmup, window = num("seconds"), num("warmup"), num("window")
t0 = num("t0_ms") / 1000
failures = []

def fail(why):
    failures.append(why)

# ---- reloads -----------------------------------------------------------------------------------
reloads = []  # (unload start, unload end, its status, load end, its status), unix seconds
for line in open(os.path.join(results, "reloads.log")):
    parts = line.split()
    if len(parts) != 5:
        continue
    u0, u1, urc, l1, lrc = int(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]), int(parts[4])
    reloads.append((u0 / 1000, u1 / 1000, urc, l1 / 1000, lrc))
expected_reloads = math.ceil(seconds / num("reload_every")) - 1  # at k × reload_every < seconds
print(f"Model b reloads: {len(reloads)} of {expected_reloads}")
for u0, u1, urc, l1, lrc in reloads:
    print(f"  at {u0 - t0:6.1f} s: unload {'ok' if urc == 0 else f'FAILED ({urc})'} in "
          f"{(u1 - u0) * 1e3:.0f} ms, load {'ok' if lrc == 0 else f'FAILED ({lrc})'} in "
          f"{(l1 - u1) * 1e3:.0f} ms")
    if urc != 0 or lrc != 0:
        fail(f"the reload of b at {u0 - t0:.1f} s failed (unload {urc}, load {lrc}; see "
             f"reloads.out)")
if len(reloads) != expected_reloads:
    fail(f"{len(reloads)} reloads of b ran, {expected_reloads} were due")
# A request to b may fail when its life overlaps a reload (0.5 s of slack for clocks).
windows_b = [(u0 - 0.5, l1 + 0.5) for u0, _, _, l1, _ in reloads]

# ---- requests ----------------------------------------------------------------------------------
RELOAD_CODES = {"NOT_FOUND", "UNAVAILABLE", "http_404", "http_503", "stream_error"}
statuses = settings["loadgen_status"].split()
totals = collections.Counter()
failed_codes = collections.Counter()
failed_examples = {}
reload_codes = collections.Counter()
series = {}
faults = collections.Counter()
print()
print(f"{'client':<8} {'requests':>9} {'ok':>8} {'tokens':>9} {'cancel':>7} {'discon':>7} "
      f"{'b reload':>9} {'failed':>7}")
for i, name in enumerate(["grpc-a", "http-a", "grpc-b", "http-b"]):  # the order they started in
    path = os.path.join(results, f"loadgen-{name}.json")
    status = statuses[i] if len(statuses) == 4 else "?"
    if status not in ("0", "1") or not os.path.exists(path):
        fail(f"kiln-loadgen {name} exited with status {status} (see loadgen-{name}.out)")
        continue
    report = json.load(open(path))
    phase = report["phases"][0]
    start = phase["start_unix_s"]
    model = name[-1]
    c = collections.Counter()
    for r in report["requests"]:
        c["requests"] += 1
        code, finish = r["code"], r["finish_reason"]
        begin, end = start + r["start_s"], start + r["start_s"] + r["e2e_s"]
        if r.get("client_fault"):
            c[r["client_fault"]] += 1
            faults[(name[:4], r["client_fault"])] += 1
            c["tokens"] += r["output_tokens"]
            continue
        if code == "OK" and finish.upper() == "LENGTH":
            c["ok"] += 1
            c["tokens"] += r["output_tokens"]
            continue
        label = code if code != "OK" else f"OK/{finish or 'no finish'}"
        overlaps = any(begin <= w1 and end >= w0 for w0, w1 in windows_b)
        if model == "b" and overlaps and code in RELOAD_CODES:
            c["reload"] += 1
            c["tokens"] += r["output_tokens"]
            reload_codes[f"{name[:4]} {label}"] += 1
            continue
        c["failed"] += 1
        key = f"{name} {label}"
        failed_codes[key] += 1
        failed_examples.setdefault(key, f"{r['error'][:120]} (start {begin - t0:.1f} s, "
                                        f"{r['e2e_s']:.2f} s, {r['output_tokens']} tokens)")
    totals.update(c)
    series[name] = phase["itl_series"]
    print(f"{name:<8} {c['requests']:>9} {c['ok']:>8} {c['tokens']:>9} {c['cancelled']:>7} "
          f"{c['disconnected']:>7} {c['reload']:>9} {c['failed']:>7}")
print(f"{'all':<8} {totals['requests']:>9} {totals['ok']:>8} {totals['tokens']:>9} "
      f"{totals['cancelled']:>7} {totals['disconnected']:>7} {totals['reload']:>9} "
      f"{totals['failed']:>7}")
print("(ok: finished with max_tokens; tokens: received, by every request; cancel/discon: ended by"
      " the client on purpose; b reload: requests to b that met an unload, allowed)")
if reload_codes:
    print("Requests to b that met a reload, by code: " +
          ", ".join(f"{k} {v}" for k, v in sorted(reload_codes.items())))
if failed_codes:
    print("FAILED requests, by code:")
    for key, count in sorted(failed_codes.items()):
        print(f"  {key}: {count}, e.g. {failed_examples[key]}")
    fail(f"{sum(failed_codes.values())} requests failed: " +
         ", ".join(f"{k} {v}" for k, v in sorted(failed_codes.items())))
for protocol in ("grpc", "http"):
    for fault in ("cancelled", "disconnected"):
        if faults[(protocol, fault)] == 0:
            fail(f"no {protocol} request was {fault} by the client: the faults were not exercised")

# ---- RSS and threads ---------------------------------------------------------------------------
samples = [(float(r["t_s"]), int(r["rss_kb"]), int(r["threads"]))
           for r in csv.DictReader(open(os.path.join(results, "samples.csv")))
           if int(r["rss_kb"]) > 0]
print()
print("Server samples (t s: RSS MiB, threads): " +
      "; ".join(f"{t:.0f}: {rss / 1024:.1f}, {th}" for t, rss, th in samples))
idle_rss, idle_threads = int(settings["idle_rss_kb"]), int(settings["idle_threads"])
end_rss, end_threads = int(settings["end_rss_kb"]), int(settings["end_threads"])
drained_rss, drained_threads = int(settings["drained_rss_kb"]), int(settings["drained_threads"])
load_seconds = (num("load_end_ms") / 1000) - t0
warm = next(((t, rss, th) for t, rss, th in samples if t >= warmup), None)
loaded = [(t, rss, th) for t, rss, th in samples if t <= seconds]  # while clients issued requests
if warm is None or not loaded or end_rss <= 0:
    fail("no RSS sample after the warm-up or at the end (did the server die?)")
else:
    last = loaded[-1]
    # At the end: once the clients finished, when what requests held is freed and what stays is
    # what the run left behind (under load the RSS of this machine still creeps for a minute or
    # two as the allocator's arenas settle, past a short run's warm-up).
    growth = (end_rss - warm[1]) / warm[1] * 100
    print(f"RSS: {idle_rss / 1024:.1f} MiB at the start, {warm[1] / 1024:.1f} MiB after the "
          f"warm-up ({warm[0]:.0f} s), {last[1] / 1024:.1f} MiB at {last[0]:.0f} s, "
          f"{end_rss / 1024:.1f} MiB at the end, once the clients finished ({load_seconds:.0f} s; "
          f"{growth:+.1f} % since the warm-up, limit +5 %), {drained_rss / 1024:.1f} MiB drained")
    if growth > 5:
        fail(f"RSS grew {growth:.1f} % after the warm-up ({warm[1]} kB at {warm[0]:.0f} s → "
             f"{end_rss} kB at the end; limit 5 %)")
    print(f"Threads: {idle_threads} at the start, {warm[2]} after the warm-up, {last[2]} at "
          f"{last[0]:.0f} s (limit {warm[2] + 8}), {drained_threads} once the load drained (limit "
          f"{idle_threads + 8})")
    if last[2] > warm[2] + 8:
        fail(f"threads under load grew from {warm[2]} after the warm-up to {last[2]} at "
             f"{last[0]:.0f} s (limit +8)")
    print(f"  by name at the start: {settings['idle_thread_names']}")
    print(f"  by name when the load ended: {settings['loaded_thread_names']}")
    print(f"  by name once drained: {settings['drained_thread_names']}")
    if drained_threads > idle_threads + 8:
        fail(f"{drained_threads} threads once the load drained, {idle_threads} before it (limit "
             f"+8)")

# ---- inter-token latency -----------------------------------------------------------------------
print()
print(f"p99 inter-token latency (ms) by {window:.0f} s window since the start (* = not full):")
names = [n for n in ["grpc-a", "grpc-b", "http-a", "http-b"] if n in series]
print(f"{'from (s)':>8} " + " ".join(f"{n:>8}" for n in names))
starts = sorted({w["start_s"] for n in names for w in series[n]})
for s in starts:
    cells = []
    for n in names:
        w = next((w for w in series[n] if w["start_s"] == s), None)
        cells.append("-" if w is None or w["p99_s"] is None else
                     f"{w['p99_s'] * 1e3:.1f}{'' if w['full'] else '*'}")
    print(f"{s:>8.0f} " + " ".join(f"{c:>8}" for c in cells))

# Every token the clients received, by window since the load started: p99 of its latency.
def percentile(sorted_values, p):  # numpy's default interpolation, as kiln-loadgen's
    rank = p / 100 * (len(sorted_values) - 1)
    below = math.floor(rank)
    above = min(below + 1, len(sorted_values) - 1)
    return sorted_values[below] + (sorted_values[above] - sorted_values[below]) * (rank - below)

by_window = collections.defaultdict(list)
for name in names:
    report = json.load(open(os.path.join(results, f"loadgen-{name}.json")))
    start = report["phases"][0]["start_unix_s"]
    for r in report["requests"]:
        if r["code"] != "OK" or r.get("client_fault") or r["ttft_s"] is None:
            continue
        arrival = start + r["start_s"] + r["ttft_s"] - t0
        for gap in r["itl_s"]:
            arrival += gap
            by_window[int(arrival // window)].append(gap)
merged = []
for k in sorted(by_window):
    gaps = sorted(by_window[k])
    merged.append({"start_s": k * window, "full": (k + 1) * window <= seconds + 1e-6,
                   "tokens": len(gaps), "p99_s": percentile(gaps, 99)})
print("All clients together: " + "; ".join(
    f"{w['start_s']:.0f} s: {w['p99_s'] * 1e3:.1f}{'' if w['full'] else '*'} ms "
    f"({w['tokens']} tokens)" for w in merged))
full = [w for w in merged if w["full"]]
base = next((w for w in full if w["start_s"] >= warmup - 1e-6), None)
last = full[-1] if full else None
if base is None or last is None or last["start_s"] <= base["start_s"]:
    fail("no full ITL window after the warm-up to compare with the last")
else:
    ratio = last["p99_s"] / base["p99_s"]
    print(f"p99 ITL of the last full window ({last['start_s']:.0f} s): {last['p99_s'] * 1e3:.1f} ms"
          f" = {ratio:.2f} × the first after the warm-up ({base['start_s']:.0f} s: "
          f"{base['p99_s'] * 1e3:.1f} ms; limit 2×)")
    if ratio > 2:
        fail(f"p99 ITL of the last window is {ratio:.2f} × the first after the warm-up "
             f"(limit 2×)")

# ---- after the load ----------------------------------------------------------------------------
print()
if settings["metrics_ok"] != "1":
    fail("GET /metrics failed after the load")
else:
    held = []
    for line in open(os.path.join(results, "metrics.txt")):
        m = re.match(r'(kiln_requests_running|kiln_requests_waiting|kiln_kv_cache_usage_ratio)'
                     r'\{([^}]*)\}\s+(\S+)', line)
        if m and float(m.group(3)) != 0:
            held.append(f"{m.group(1)}{{{m.group(2)}}} = {m.group(3)}")
    print("After the load: " + ("nothing running, waiting or holding KV blocks" if not held else
                                "; ".join(held)))
    if held:
        fail("after the load drained the server still holds requests or KV blocks: " +
             "; ".join(held))
print(f"Health: {settings['health']}")
if settings["health"].strip() != "SERVING":
    fail(f"Health after the load: {settings['health']!r}")
models = open(os.path.join(results, "models.txt")).read()
for model in ("a", "b"):
    if not re.search(rf"^{model}\s+READY\b", models, re.M):
        fail(f"model {model} is not READY after the load (models.txt)")
shutdown = settings["shutdown_rc"]
print(f"Shutdown (SIGTERM): status {shutdown} after {settings['shutdown_s']} s")
if shutdown.startswith("crashed"):
    fail(f"kiln-server died during the run (wait status {shutdown.split(':')[1]}; the end of "
         f"server.log follows)")
    print("".join(open(os.path.join(results, "server.log"), errors="replace").readlines()[-20:]))
elif shutdown != "0":
    fail(f"kiln-server did not exit cleanly on SIGTERM: status {shutdown}")

print()
if failures:
    print(f"soak: FAILED ({len(failures)}):")
    for why in failures:
        print(f"  - {why}")
    sys.exit(1)
print("soak: PASSED")
EOF
status=${PIPESTATUS[0]}
exit "$status"
