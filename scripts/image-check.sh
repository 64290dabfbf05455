#!/usr/bin/env bash
# scripts/image-check.sh — build the platform's image (make images) and check what is inside it.
#
# `podman run` is refused on the machines this runs on (crun cannot set rlimits in the sandbox),
# so the image is checked from its exported filesystem instead:
#   1. make images; podman create + podman export of the image into a temp dir;
#   2. every program in /usr/local/bin is a static ELF executable, the CA bundle, passwd and group
#      are there, and the image's user is 65532:65532 (podman image inspect);
#   3. the exported settlement (the service with the fewest dependencies: Postgres only) runs
#      against the local Postgres — a scratch database migrated by the exported `integrationsctl
#      migrate up` — with internal mTLS from certificates of the exported `integrationsctl
#      dev-certs`, until the exported `integrationsctl health --tls --identity ...` answers
#      SERVING; then SIGTERM: health goes NOT_SERVING during the drain window and the process
#      exits 0.
# Without podman it says so and exits 0 (CI installs podman, so the check always runs there).
# Postgres/RabbitMQ come from scripts/deps.sh (its .run/deps.env), never from hard-coded ports.
# Cleans up the temp dir, the container, the scratch database and the process on every exit.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'image check: %s\n' "$*" >&2; }

if ! command -v podman >/dev/null 2>&1; then
  echo "image check: SKIPPED (podman not installed)"
  exit 0
fi
started=$SECONDS

checkout=$(printf '%s' "$PWD" | sha1sum | cut -c1-8)
db="image_check_${checkout}_$$"
tmp= cid= pid=
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  [[ -n $cid ]] && timeout 60 podman rm --force "$cid" </dev/null >/dev/null 2>&1 || true
  if [[ -n ${INTEGRATIONS_PG_URL:-} ]] && command -v psql >/dev/null 2>&1; then
    psql -q -X "$INTEGRATIONS_PG_URL/postgres" -c "DROP DATABASE IF EXISTS \"$db\"" </dev/null >/dev/null 2>&1 || true
  fi
  [[ -n $tmp ]] && rm -rf "$tmp"
  if ((rc != 0)); then say "FAILED"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() { say "$*"; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/image-check.XXXXXX")
scripts/deps.sh up "$db" >/dev/null 2>"$tmp/deps.log" || { cat "$tmp/deps.log" >&2; fail "scripts/deps.sh up failed"; }
set -a; . .run/deps.env; set +a

tag=$(make --no-print-directory -s images | tail -1)
[[ $tag == localhost/integrations:* ]] || fail "make images printed no tag (got: $tag)"
say "built $tag"

rootfs=$tmp/rootfs
mkdir -p "$rootfs"
# A scratch image has no default command, and podman create wants one; it is never started.
cid=$(timeout 60 podman create "$tag" /usr/local/bin/integrationsctl </dev/null)
timeout 120 podman export "$cid" </dev/null | tar -x -C "$rootfs"

# --- contents -------------------------------------------------------------------------------
user=$(timeout 60 podman image inspect --format '{{.Config.User}}' "$tag" </dev/null)
[[ $user == 65532:65532 ]] || fail "the image's user is \"$user\", not 65532:65532"
size=$(timeout 60 podman image inspect --format '{{.Size}}' "$tag" </dev/null)
for f in etc/ssl/certs/ca-certificates.crt etc/passwd etc/group; do
  [[ -s $rootfs/$f ]] || fail "/$f is missing from the image"
done
grep -qx 'integrations:x:65532:65532:.*' "$rootfs/etc/passwd" || fail "/etc/passwd has no user integrations = 65532"
grep -qx 'integrations:x:65532:' "$rootfs/etc/group" || fail "/etc/group has no group integrations = 65532"
programs=(gateway dispatcher execution-consumer adapter-callback settlement event-router integrationsctl dummy-adapter demo-consumer)
for p in "${programs[@]}"; do
  bin=$rootfs/usr/local/bin/$p
  [[ -x $bin ]] || fail "/usr/local/bin/$p is missing or not executable"
  [[ $(head -c 4 "$bin" | od -An -c | tr -d ' ') == '177ELF' ]] || fail "/usr/local/bin/$p is not an ELF file"
  # A dynamically linked executable names its loader in a PT_INTERP program header.
  if LC_ALL=C readelf -lW "$bin" 2>/dev/null | grep -q 'INTERP'; then
    fail "/usr/local/bin/$p is dynamically linked"
  fi
  LC_ALL=C readelf -hW "$bin" | grep -q 'Type: *EXEC' || fail "/usr/local/bin/$p is not a (static) ELF executable"
done
extra=$(cd "$rootfs" && find . -mindepth 1 \( -type f -o -type l \) | sort | grep -vxF -e ./etc/ssl/certs/ca-certificates.crt -e ./etc/passwd -e ./etc/group \
  $(printf -- '-e ./usr/local/bin/%s ' "${programs[@]}") || true)
[[ -z $extra ]] || fail "unexpected files in the image: $(echo $extra)"
say "contents: ${#programs[@]} static executables, CA bundle, passwd/group, user $user, $((size / 1000000)) MB"

# --- run settlement from the exported filesystem ---------------------------------------------
ctl=$rootfs/usr/local/bin/integrationsctl
export INTEGRATIONS_DATABASE_URL="$INTEGRATIONS_PG_URL/$db?sslmode=disable"
"$ctl" migrate up >/dev/null || fail "integrationsctl migrate up failed"
"$ctl" dev-certs --dir "$tmp/tls" 2>/dev/null || fail "integrationsctl dev-certs failed"
log=$tmp/settlement.log
# Port 0: the kernel picks a free port, read back from the log's "grpc server listening" line.
# The dispatcher address is a closed port: nothing is settled, so it is never nudged.
env INTEGRATIONS_GRPC_ADDR=127.0.0.1:0 INTEGRATIONS_DISPATCHER_ADDR=127.0.0.1:1 \
  INTEGRATIONS_TLS_CERT_FILE="$tmp/tls/settlement.pem" INTEGRATIONS_TLS_KEY_FILE="$tmp/tls/settlement-key.pem" \
  INTEGRATIONS_TLS_CA_FILE="$tmp/tls/ca.pem" \
  INTEGRATIONS_SHUTDOWN_TIMEOUT=6s INTEGRATIONS_DRAIN_WINDOW=1s \
  "$rootfs/usr/local/bin/settlement" </dev/null >"$log" 2>&1 &
pid=$!

addr=
for _ in $(seq 1 100); do
  addr=$(sed -n 's/.*"msg":"grpc server listening".*"addr":"\([0-9.]*:[0-9]*\)".*/\1/p' "$log" | head -1)
  [[ -n $addr ]] && break
  kill -0 "$pid" 2>/dev/null || { tail -20 "$log" >&2; fail "settlement exited before listening (its log above)"; }
  sleep 0.1
done
[[ -n $addr ]] || { tail -20 "$log" >&2; fail "settlement did not log its gRPC address within 10 s"; }

probe=("$ctl" health --addr "$addr" --tls --ca-file "$tmp/tls/ca.pem" --identity spiffe://integrations/settlement --timeout 2s)
serving=
for _ in $(seq 1 50); do
  if "${probe[@]}" 2>"$tmp/probe.err"; then serving=1; break; fi
  kill -0 "$pid" 2>/dev/null || { tail -20 "$log" >&2; fail "settlement exited (its log above)"; }
  sleep 0.2
done
[[ -n $serving ]] || fail "settlement on $addr never answered SERVING: $(cat "$tmp/probe.err")"
say "settlement from the image answers SERVING on $addr (integrationsctl health --tls --identity spiffe://integrations/settlement)"
# The probe verifies the identity: the same server as another service's is refused.
if "$ctl" health --addr "$addr" --tls --ca-file "$tmp/tls/ca.pem" --identity spiffe://integrations/dispatcher 2>/dev/null; then
  fail "integrationsctl health accepted settlement's certificate as spiffe://integrations/dispatcher"
fi

kill -TERM "$pid"
drained=
for _ in $(seq 1 50); do
  if ! "${probe[@]}" 2>/dev/null; then drained=1; break; fi
  sleep 0.02
done
[[ -n $drained ]] || fail "settlement still answered SERVING after SIGTERM"
# The service bounds its own shutdown (INTEGRATIONS_SHUTDOWN_TIMEOUT=6s); 15 s is its limit here.
for _ in $(seq 1 150); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$pid" 2>/dev/null && fail "settlement still running 15 s after SIGTERM"
rc=0
wait "$pid" || rc=$?
pid=
((rc == 0)) || { tail -20 "$log" >&2; fail "settlement exited $rc after SIGTERM, not 0 (its log above)"; }
say "settlement reported NOT_SERVING at SIGTERM and exited 0"
echo "image check: OK ($tag, $((size / 1000000)) MB, $((SECONDS - started)) s)"
