#!/usr/bin/env bash
# Container smoke test: builds docker/Dockerfile with podman, starts the image, and from outside
# the container checks Health (and the image's HEALTHCHECK), Generate on the embedded default
# model and on a model mounted under /models, a chat completion over the OpenAI HTTP API, a 20 s
# kiln-loadgen run without errors, the metrics endpoint, and a clean exit on SIGTERM. Needs root or sudo (apt-get, rootful podman) and
# Debian's package mirror; no image registry (the base image is made with debootstrap).
# Takes minutes: most of it is the image build (the first one compiles everything).
#
# Environment: KILN_IMAGE (tag to build, default localhost/kiln:smoke),
# KILN_SMOKE_DIR (logs and scratch files, default build/container-smoke), KILN_SMOKE_PRESET (the
# CMake preset whose kiln and kiln-loadgen drive the container from the host, default release).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
start=$SECONDS

image=${KILN_IMAGE:-localhost/kiln:smoke}
base_image=docker.io/library/debian:bookworm-slim
work=${KILN_SMOKE_DIR:-$repo/build/container-smoke}
preset=${KILN_SMOKE_PRESET:-release}
name=kiln-smoke-$$
mkdir -p "$work"

step_number=0
step_start=$SECONDS
step() {
  if ((step_number > 0)); then echo "    ($((SECONDS - step_start)) s)"; fi
  step_number=$((step_number + 1))
  step_start=$SECONDS
  echo
  echo "==> [$step_number] $*"
}
fail() {
  echo "container_smoke: FAILED: $*" >&2
  exit 1
}

sudo=()
if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi

# docs/containers.md: this sandbox refuses default ulimits and systemd cgroups; runc, not crun.
export CONTAINERS_CONF=$work/containers.conf
cat >"$CONTAINERS_CONF" <<'EOF'
[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
EOF
podman() { "${sudo[@]}" env CONTAINERS_CONF="$CONTAINERS_CONF" podman --runtime runc "$@"; }

cleanup() {
  local status=$?
  if podman container exists "$name" 2>/dev/null; then
    if ((status != 0)); then
      echo "--- container log (last 40 lines) ---" >&2
      podman logs --tail 40 "$name" >&2 || true
    fi
    podman rm -f --time 5 "$name" >/dev/null 2>>"$work/podman.err" || true
  fi
  if ((status == 0)); then
    echo
    echo "container_smoke: PASSED in $((SECONDS - start)) s"
  else
    echo "container_smoke: FAILED after $((SECONDS - start)) s (logs in $work)" >&2
  fi
}
trap cleanup EXIT

step "podman and tools (apt-get, only what is missing)"
packages=(podman buildah runc crun fuse-overlayfs slirp4netns uidmap debootstrap curl)
missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [[ $status == "install ok installed" ]] || missing+=("$package")
done
if ((${#missing[@]} > 0)); then
  echo "installing ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"
fi
podman --version

step "base image $base_image"
if podman image exists "$base_image"; then
  echo "present"
else
  # No registry here: debootstrap makes the same Debian bookworm (minbase), about a minute.
  if ! podman image exists localhost/debian:bookworm; then
    rootfs=$(mktemp -d)
    chmod 755 "$rootfs"   # becomes the image's /, which uid 10001 must traverse
    "${sudo[@]}" debootstrap --variant=minbase bookworm "$rootfs" >"$work/debootstrap.log" 2>&1 ||
      { tail -n 20 "$work/debootstrap.log" >&2; fail "debootstrap"; }
    # As in debian:bookworm-slim: no downloaded packages or package lists (80 MB).
    "${sudo[@]}" sh -c "rm -rf '$rootfs'/var/cache/apt/archives/*.deb '$rootfs'/var/cache/apt/*.bin \
      '$rootfs'/var/lib/apt/lists/*"
    "${sudo[@]}" tar -C "$rootfs" -c . | podman import --quiet - localhost/debian:bookworm >/dev/null
    "${sudo[@]}" rm -rf "$rootfs"
  fi
  podman tag localhost/debian:bookworm "$base_image"
  echo "made with debootstrap and tagged"
fi

step "host kiln CLI and kiln-loadgen ($preset preset)"
scripts/setup.sh
export CCACHE_DIR=${CCACHE_DIR:-$repo/build/ccache}
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" --target kiln kiln-loadgen
kiln=$repo/build/$preset/clients/kiln
loadgen=$(find "$repo/build/$preset/clients" -name kiln-loadgen -type f -perm -u+x -print -quit)
[[ -x $kiln && -n $loadgen ]] || fail "kiln or kiln-loadgen was not built"

step "podman build $image (log: $work/build.log)"
build_start=$SECONDS
# --format docker keeps HEALTHCHECK (the OCI image format has no such field).
if ! podman build --network=host --format docker -t "$image" -f docker/Dockerfile . \
  >"$work/build.log" 2>&1; then
  tail -n 60 "$work/build.log" >&2
  fail "image build"
fi
awk '/^(\[[0-9]+\/[0-9]+\] )?STEP/ { print substr($0, 1, 150) } /^(build-deps|runtime packages):/' \
  "$work/build.log"
build_seconds=$((SECONDS - build_start))
size=$(podman image inspect --format '{{.Size}}' "$image")
echo "image built in ${build_seconds} s; size $((size / 1000000)) MB"

step "image contents: user, binaries, shared libraries"
user=$(podman image inspect --format '{{.Config.User}}' "$image")
[[ $user == 10001:10001 ]] || fail "image user is '$user', not 10001:10001"
healthcheck=$(podman image inspect --format '{{.Config.Healthcheck}}' "$image")
[[ $healthcheck == *"kiln health"* ]] || fail "image has no HEALTHCHECK ($healthcheck)"
ldd_out=$(podman run --rm --network=host --no-healthcheck --entrypoint ldd "$image" \
  /usr/local/bin/kiln-server /usr/local/bin/kiln /usr/local/bin/kiln-loadgen 2>&1) ||
  fail "ldd in the image: $ldd_out"
if grep -q 'not found' <<<"$ldd_out"; then
  grep 'not found' <<<"$ldd_out" >&2
  fail "a shared library is missing from the runtime image"
fi
echo "user $user; kiln-server, kiln, kiln-loadgen present with all their libraries"

step "a model to mount under /models"
mounted=$work/models/mounted
if [[ ! -f $mounted/tokenizer.json ]]; then
  "$kiln" synth --preset kiln-tiny --dtype bf16 --seed 7 --out "$mounted" >/dev/null
fi
chmod -R a+rX "$work/models"   # the container runs as uid 10001
echo "$mounted"

step "start the container"
read -r port metrics_port http_port < <(/usr/bin/python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
server_help=$(podman run --rm --network=host --no-healthcheck "$image" kiln-server --helpfull \
  2>&1 || true)
# Host networking: every port is a free one (the image's config would take 8000 for HTTP).
args=(--listen "0.0.0.0:$port" --http-listen "0.0.0.0:$http_port" --model "mounted=/models/mounted")
have_metrics=0
if grep -q 'metrics_listen' <<<"$server_help"; then
  have_metrics=1
  args+=(--metrics-listen "0.0.0.0:$metrics_port")
fi
# --read-only as with the Kubernetes manifests' readOnlyRootFilesystem. No systemd here to run
# the HEALTHCHECK on a timer (podman logs errors saying so, to podman.err); it is run by hand.
podman run -d --name "$name" --network=host --read-only --health-interval=disable \
  -e KILN_HEALTH_SERVER="127.0.0.1:$port" -v "$mounted:/models/mounted:ro" \
  "$image" "${args[@]}" >/dev/null 2>>"$work/podman.err" ||
  { cat "$work/podman.err" >&2; fail "podman run"; }
echo "container $name: gRPC 0.0.0.0:$port, HTTP 0.0.0.0:$http_port$( ((have_metrics)) && echo ", metrics 0.0.0.0:$metrics_port")"

step "wait for Health SERVING (kiln health from the host)"
deadline=$((SECONDS + 180))
until health=$("$kiln" health --server "127.0.0.1:$port" --timeout 2 2>&1); do
  [[ $(podman inspect --format '{{.State.Running}}' "$name") == true ]] ||
    fail "the container exited before serving"
  ((SECONDS < deadline)) || fail "not SERVING after 180 s: $health"
  sleep 1
done
echo "$health after $((SECONDS - step_start)) s"
podman healthcheck run "$name" >/dev/null 2>>"$work/podman.err" ||
  fail "the image's HEALTHCHECK reports unhealthy"
echo "HEALTHCHECK (kiln health inside the container): healthy"

step "Generate from outside (kiln generate)"
for model in default mounted; do
  text=$("$kiln" generate --server "127.0.0.1:$port" --timeout 60 --model "$model" \
    --prompt 'The kiln is' --max_tokens 16 --ignore_eos 2>"$work/generate-$model.err") ||
    { cat "$work/generate-$model.err" >&2; fail "generate on $model"; }
  # default is the trained model built into the image, mounted has random weights: the text is
  # not checked, but all 16 tokens must come back.
  grep -q 'completion_tokens=16 ' "$work/generate-$model.err" ||
    { cat "$work/generate-$model.err" >&2; fail "generate on $model: not 16 tokens"; }
  echo "$model: $(printf '%q' "$text")"
  sed 's/^/    /' "$work/generate-$model.err"
done

step "the OpenAI HTTP API from outside (curl)"
reply=$(curl -fsS --max-time 60 "http://127.0.0.1:$http_port/v1/chat/completions" \
  -H 'Content-Type: application/json' \
  -d '{"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
       "ignore_eos": true}') || fail "POST /v1/chat/completions"
grep -q '"completion_tokens":8' <<<"$reply" || fail "chat completion: not 8 tokens: $reply"
echo "$reply"

step "kiln-loadgen: concurrency 4 for 20 s"
if ! "$loadgen" --target "127.0.0.1:$port" --model default --concurrency 4 --duration 20s \
  --json "$work/loadgen.json" >"$work/loadgen.out" 2>&1; then
  cat "$work/loadgen.out" >&2
  fail "kiln-loadgen exited with an error"
fi
tail -n 20 "$work/loadgen.out"

step "metrics endpoint"
if ((have_metrics)); then
  metrics=$(curl -fsS --max-time 10 "http://127.0.0.1:$metrics_port/metrics") ||
    fail "GET /metrics on port $metrics_port"
  grep -q '^kiln_' <<<"$metrics" || fail "/metrics has no kiln_ series"
  echo "$(grep -c '^kiln_' <<<"$metrics") kiln_ samples, e.g.:"
  # awk reads all its input: head would close the pipe early, and under pipefail the
  # writer's SIGPIPE (exit 141) would fail the script.
  awk '/^kiln_/ && shown++ < 5 { print "    " $0 }' <<<"$metrics"
else
  echo "SKIPPED: this kiln-server has no --metrics-listen flag"
fi

step "stop (SIGTERM) and check the exit status"
podman stop --time 30 "$name" >/dev/null 2>>"$work/podman.err"
exit_code=$(podman inspect --format '{{.State.ExitCode}}' "$name")
podman logs --tail 3 "$name" 2>&1 | sed 's/^/    /'
((exit_code == 0)) || fail "kiln-server exited with status $exit_code after SIGTERM"
echo "exited with status 0"
podman rm "$name" >/dev/null 2>>"$work/podman.err"
echo "    ($((SECONDS - step_start)) s)"
echo
echo "image build ${build_seconds} s, image size $((size / 1000000)) MB"
