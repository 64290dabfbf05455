#!/usr/bin/env bash
# scripts/offline.sh — run a command as on a fresh machine: in a loopback-only network namespace
# where no Postgres, RabbitMQ or ActiveMQ of the machine answers and nothing outside is reachable,
# in a bare environment, with Go modules from the cache only (GOPROXY=off).
#
# Usage: scripts/offline.sh [--fetch] COMMAND...      e.g.  scripts/offline.sh --fetch make test
#
#   --fetch  First, while the network is there: download every module the workspace's packages
#            and tests need, build the pinned protobuf tools and golangci-lint (make tools), and run npm ci in
#            every npm package with a package-lock.json (sdk/typescript/*, examples/*), so that
#            the command needs nothing from the network.
#
# Inside, scripts/deps.sh starts the project-local servers (the machine's own are on the other
# side of the namespace); at the end, whatever it started is stopped by pid (`deps.sh down`): a
# daemon started in a namespace would otherwise outlive it. Needs root (or CAP_SYS_ADMIN) for
# unshare; .ci/run runs the README's `make test` this way. The environment kept: PATH, HOME, LANG
# and the variables named in OFFLINE_KEEP (space-separated), e.g.
# OFFLINE_KEEP=INTEGRATIONS_E2E_REQUIRE_BROWSER.
set -euo pipefail
cd "$(dirname "$0")/.."
self=$PWD/scripts/offline.sh # $0 may be relative to where it was called from, which the cd left

if [[ ${1:-} == --in-namespace ]]; then
  shift
  ip link set lo up
  # Whatever deps.sh started in here is stopped on the way out, also after a failure.
  trap 'scripts/deps.sh down 2>&1 | sed "s/^/offline: /" >&2 || true' EXIT
  "$@"
  exit
fi

say() { printf 'offline: %s\n' "$*" >&2; }
export PATH="/usr/local/go/bin:$HOME/go/bin:$PATH:/usr/sbin:/sbin"

if [[ ${1:-} == --fetch ]]; then
  shift
  module=github.com/integrations-platform/integrations
  t0=$SECONDS
  # The module graphs of every module of the workspace, and every package the tests build.
  go mod download
  go list -deps -test "$module/pkg/..." "$module/sdk/..." "$module/examples/..." "$module/migrations/..." "$module/services/..." "$module/cmd/..." \
    "$module/e2e/..." "$module/bench/..." "$module/deploy/k8s/check/..." >/dev/null
  # The modules published on their own, as a module outside the workspace resolves them (their
  # own go.mod files, not the workspace's versions): e2e's TestGoSDKOutsideTheWorkspace builds so.
  for m in pkg/gen sdk/go; do
    (cd "$m" && GOWORK=off go mod download)
  done
  make -s tools
  # The npm packages' dependencies (sdk/typescript/*, then examples/*, which link the SDK), from
  # their lockfiles: make test runs their tests, and the e2e suite the TypeScript adapter example.
  for lock in sdk/typescript/*/package-lock.json examples/*/package-lock.json; do
    [[ -f $lock ]] || continue
    (cd "$(dirname "$lock")" && npm ci --no-audit --no-fund --loglevel=error)
  done
  say "modules and tools fetched in $((SECONDS - t0)) s"
fi
(($#)) || { sed -n '2,/^set -e/{/^set -e/d;s/^# \{0,1\}//;p}' "$self" >&2; exit 2; }

command -v unshare >/dev/null || { say "unshare (util-linux) is not installed"; exit 1; }
unshare -n true 2>/dev/null || { say "unshare -n is refused: run as root (or with CAP_SYS_ADMIN)"; exit 1; }

keep=(PATH="$PATH" HOME="$HOME" LANG="${LANG:-C.UTF-8}" GOPROXY=off)
[[ -n ${GOFLAGS:-} ]] && keep+=(GOFLAGS="$GOFLAGS")
for v in ${OFFLINE_KEEP:-}; do
  [[ -n ${!v+x} ]] && keep+=("$v=${!v}")
done
exec unshare -n env -i "${keep[@]}" "$BASH" "$self" --in-namespace "$@"
