#!/usr/bin/env bash
# scripts/test-timing.sh — run the timing-sensitive tests (scripts/timing-tests.txt) COUNT times in
# a row (-count, -failfast, -race as make test) while two other `go test` runs load the machine.
# A test that passes here does not depend on a narrow window: it waits for events, bounded by
# generous deadlines.
#
# Usage: scripts/test-timing.sh [-run REGEX]      (make test-timing COUNT=20)
#   COUNT    runs in a row (default 20)
#   LOADERS  the two loaders' package patterns, space-separated (default: the gateway's and
#            pkg/mq's suites; each runs `go test -race -count=1` in a loop until the end)
#   FAILFAST set empty (FAILFAST=) to see every failure, not only each package's first
#   -run     only the listed tests matching REGEX (e.g. to rerun one after a fix)
#
# Expects the environment make test sets (INTEGRATIONS_TEST_DATABASE_URL, .run/deps.env with a
# STOMP broker): the Makefile target sets it. Prints the command, its wall time, the load
# averages seen every 15 s during the run, go test's result and the loaders' own failures; exits
# with go test's status.
set -euo pipefail
cd "$(dirname "$0")/.."
MODULE=github.com/integrations-platform/integrations
COUNT=${COUNT:-20}
LOADERS=${LOADERS:-"$MODULE/services/gateway/... $MODULE/pkg/mq/..."}
only=
if [[ ${1:-} == -run ]]; then only=$2; fi

# The list: package directory, test name, then what it depends on (ignored here).
mapfile -t rows < <(grep -E '^[a-z]' scripts/timing-tests.txt | awk '{print $1, $2}')
declare -A pkgs=()
names=()
for r in "${rows[@]}"; do
  read -r dir name <<<"$r"
  if [[ -n $only && ! $name =~ $only ]]; then continue; fi
  pkgs[$MODULE/$dir]=1
  names+=("$name")
done
((${#names[@]})) || { echo "test-timing: no listed test matches" >&2; exit 2; }
regex="^($(printf '%s\n' "${names[@]}" | sort -u | paste -sd'|'))\$"

log=$(mktemp -d)
loaders=()
stop() {
  for pid in "${loaders[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
  [[ -n ${sampler:-} ]] && kill "$sampler" 2>/dev/null || true
}
trap 'stop; rm -rf "$log"' EXIT
# Each loader in a process group of its own (setsid), so that stop ends it and its test binaries.
i=0
for p in $LOADERS; do
  setsid bash -c "while :; do go test -race -count=1 $p >>'$log/loader$i.out' 2>&1; done" &
  loaders+=($!)
  i=$((i + 1))
done
( while :; do cut -d' ' -f1-3 /proc/loadavg >>"$log/load"; sleep 15; done ) &
sampler=$!

cmd=(go test -race -count="$COUNT" ${FAILFAST--failfast} -timeout 60m -run "$regex" "${!pkgs[@]}")
echo "test-timing: ${#names[@]} tests in ${#pkgs[@]} packages, -count=$COUNT, loaders: $LOADERS"
printf '%q ' "${cmd[@]}"; echo
start=$(date +%s)
rc=0
"${cmd[@]}" || rc=$?
took=$(($(date +%s) - start))
stop
echo "test-timing: wall time ${took}s"
awk '{if (n == 0 || $1 < lo) lo = $1; if ($1 > hi) hi = $1; sum += $1; n++; all = all " " $1}
  END {if (n) printf "test-timing: 1-min load average every 15 s:%s\ntest-timing: load average mean %.1f, min %.1f, max %.1f (%d samples)\n", all, sum / n, lo, hi, n}' "$log/load"
# The loaders' own failures are not the proof's, but a test that fails there under the same load
# is timing-sensitive too: worth a look.
if grep -qh -- '^--- FAIL' "$log"/loader*.out 2>/dev/null; then
  echo "test-timing: the loaders' own failures (runs of their suites: $(cat "$log"/loader*.out | grep -cE '^(ok|FAIL)\s') package runs):"
  grep -h -- '^--- FAIL' "$log"/loader*.out | sed 's/ (.*//' | sort | uniq -c
fi
if ((rc == 0)); then echo "test-timing: PASS, $COUNT runs of each"; else echo "test-timing: FAIL (exit $rc)"; fi
exit $rc
