#!/usr/bin/env bash
# Runs every fuzz target of the workspace for FUZZTIME each (default 60s), one at a time, and
# prints a table of targets, executions and new corpus entries. A crasher fails the run and is
# left under the package's testdata/fuzz/<Target>/ for `go test -run <Target>/<file>` to replay.
# FUZZ_TARGETS=<regexp> runs only the targets it matches. The seed corpora also run as ordinary tests in `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime="${FUZZTIME:-60s}"
only="${FUZZ_TARGETS:-.}" # a regular expression: run only the targets it matches
module=github.com/integrations-platform/integrations
say() { printf 'fuzz: %s\n' "$*" >&2; }

# Every package of the workspace with a Fuzz function, and its targets.
mapfile -t pkgs < <(grep -rl --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]*\(' pkg services cmd e2e bench migrations 2>/dev/null \
  | xargs -r -n1 dirname | sort -u)
[ "${#pkgs[@]}" -gt 0 ] || { say "no fuzz targets found"; exit 1; }

results=()
failed=0
for dir in "${pkgs[@]}"; do
  mapfile -t targets < <(grep -h -E -o '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go \
    | sed 's/^func //' | sort -u)
  for t in "${targets[@]}"; do
    [[ "$t" =~ $only ]] || continue
    say "$dir $t for $fuzztime"
    log=$(mktemp)
    if (cd "$dir" && go test -run '^$' -fuzz "^${t}\$" -fuzztime "$fuzztime" .) >"$log" 2>&1; then
      verdict=ok
    else
      verdict=FAILED; failed=1
      cat "$log" >&2
    fi
    execs=$(grep -o 'execs: [0-9]*' "$log" | tail -1 | awk '{print $2}')
    newc=$(grep -o 'new interesting: [0-9]*' "$log" | tail -1 | awk '{print $3}')
    results+=("$(printf '| %s | %s | %s | %s | %s |' "${dir}" "$t" "${execs:-?}" "${newc:-?}" "$verdict")")
    rm -f "$log"
  done
done
printf '\n| package | target | executions | new corpus entries | result |\n|---|---|---|---|---|\n'
printf '%s\n' "${results[@]}"
exit "$failed"
