#!/usr/bin/env bash
# platform-keys.sh INTEGRATIONSCTL DIR: makes the key that signs the platform's calls to adapters
# (DIR/platform-signing.key, for the gateway and the execution-consumer) and its public half
# (DIR/platform-public.key, which the dummy adapter checks them with), once per checkout; later
# runs keep them. scripts/run.sh runs it.
set -euo pipefail
ctl=$1 dir=$2
signing=$dir/platform-signing.key public=$dir/platform-public.key

# An empty key file is what an interrupted run leaves (generate creates the file, then is stopped
# before writing it): removed, or generate, which never overwrites a key, would refuse on every
# run after. Its public half, written by the same command, goes with it.
if [ -e "$signing" ] && [ ! -s "$signing" ]; then
  rm -f "$signing" "$public"
fi
[ -s "$signing" ] ||
  "$ctl" platform-key generate --private-key "$signing" >"$public"
[ -s "$public" ] ||
  "$ctl" platform-key public --private-key "$signing" >"$public"
