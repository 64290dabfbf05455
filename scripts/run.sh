#!/usr/bin/env bash
# scripts/run.sh — `make run`: the whole platform on this machine.
#
# Makes Postgres and the broker reachable (scripts/deps.sh: RabbitMQ, or with
# INTEGRATIONS_BROKER=stomp an ActiveMQ spoken to over STOMP), applies migrations and the dev
# catalog, writes a throwaway CA and the services' certificates into .run/tls if missing
# (integrationsctl dev-certs: every internal hop runs mTLS, as in production; the client-facing
# ports stay plain on loopback), builds and starts the six services, the dummy adapter and the demo consumer, sends one
# sample async call and shows it complete (or says what went wrong with it), then serves until
# Ctrl-C, which stops everything.
#
# Settings (environment): INTEGRATIONS_BROKER (rabbitmq, the default, or stomp),
# INTEGRATIONS_DEV_API_KEY (default below), INTEGRATIONS_TIME_SCALE, INTEGRATIONS_LOG_LEVEL.
# Logs: .run/logs/<program>.log
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
say() { printf 'run: %s\n' "$*" >&2; }

# A database and a queue scope of this checkout's own: the signing secrets in the database are
# sealed with this checkout's .run/secret.key, and two checkouts must not share queues.
checkout=$(printf '%s' "$root" | sha1sum | cut -c1-8)
dev_db="integrations_dev_$checkout"
# The broker the services use; deps.sh makes a STOMP one reachable only when asked (`up stomp`).
export INTEGRATIONS_BROKER="${INTEGRATIONS_BROKER:-rabbitmq}"
case $INTEGRATIONS_BROKER in
  rabbitmq) scripts/deps.sh up "$dev_db" ;;
  stomp) scripts/deps.sh up stomp "$dev_db" ;;
  *) say "INTEGRATIONS_BROKER: \"$INTEGRATIONS_BROKER\" is not one of rabbitmq, stomp"; exit 2 ;;
esac
set -a; . .run/deps.env; set +a
if [[ $INTEGRATIONS_BROKER == stomp ]]; then
  say "broker: STOMP (INTEGRATIONS_STOMP_URL from .run/deps.env); the services do not use RabbitMQ"
fi

mkdir -p .run/logs bin
# Generated once per checkout and kept in .run/ (git-ignored).
[ -s .run/secret.key ] || head -c 32 /dev/urandom | base64 > .run/secret.key
[ -s .run/adapter.credential ] || printf 'adc_%s' "$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')" > .run/adapter.credential
chmod 600 .run/secret.key .run/adapter.credential

export INTEGRATIONS_DATABASE_URL="${INTEGRATIONS_PG_URL}/${dev_db}?sslmode=disable"
export INTEGRATIONS_DEV_API_KEY="${INTEGRATIONS_DEV_API_KEY:-dev-api-key-change-me}"
export INTEGRATIONS_SECRET_KEY; INTEGRATIONS_SECRET_KEY=$(cat .run/secret.key)
export INTEGRATIONS_DUMMY_ADAPTER_CREDENTIAL; INTEGRATIONS_DUMMY_ADAPTER_CREDENTIAL=$(cat .run/adapter.credential)
export INTEGRATIONS_DUMMY_ADAPTER_ADDR=127.0.0.1:9096
export INTEGRATIONS_CALLBACK_ADDR=127.0.0.1:9093
export INTEGRATIONS_WEBHOOK_ALLOW_HTTP=true INTEGRATIONS_WEBHOOK_ALLOW_PRIVATE=true
export INTEGRATIONS_QUEUE_SCOPE="${INTEGRATIONS_QUEUE_SCOPE:-dev.$checkout}"
export INTEGRATIONS_LOG_LEVEL="${INTEGRATIONS_LOG_LEVEL:-info}"
export INTEGRATIONS_DEMO_CONSUMER_ADDR=127.0.0.1:8081
export INTEGRATIONS_DEMO_CONSUMER_SECRET_FILE="$root/.run/consumer.secret"
export INTEGRATIONS_API_KEY="$INTEGRATIONS_DEV_API_KEY" INTEGRATIONS_GATEWAY_ADDR=127.0.0.1:9090
export INTEGRATIONS_ADMIN_TOKEN="${INTEGRATIONS_ADMIN_TOKEN:-dev-admin-token}"

say "building"
make --no-print-directory build >/dev/null

# The key that signs the platform's calls to adapters and its public half: made once per checkout.
scripts/platform-keys.sh bin/integrationsctl .run
export INTEGRATIONS_PLATFORM_SIGNING_KEY_FILE="$root/.run/platform-signing.key"
export INTEGRATIONS_PLATFORM_PUBLIC_KEYS_FILE="$root/.run/platform-public.key"
# This checkout's throwaway CA and one certificate per service (kept; renewed when near expiry).
bin/integrationsctl dev-certs --dir .run/tls
export INTEGRATIONS_TLS_CA_FILE="$root/.run/tls/ca.pem"

say "migrating $INTEGRATIONS_DATABASE_URL"
bin/integrationsctl migrate up >&2
# The services listen on loopback only: the default dev key (dev-api-key-change-me) is taken with
# a warning, and the gateway warns again at start.
bin/integrationsctl catalog apply --allow-weak-keys deploy/catalog/dev.yaml >&2

pids=()
stopping=
stop_all() {
  trap - INT TERM EXIT
  stopping=1
  say "stopping"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  scripts/deps.sh down
  say "stopped"
}
trap stop_all INT TERM EXIT

# start NAME GRPC_ADDR [VAR=VALUE...]: start a program with its own address settings, and a
# service of the platform with its internal identity (.run/tls/NAME.pem).
start() {
  local name=$1 addr=$2 identity=(); shift 2
  if [ -s ".run/tls/$name.pem" ]; then
    identity=(INTEGRATIONS_TLS_CERT_FILE="$root/.run/tls/$name.pem" INTEGRATIONS_TLS_KEY_FILE="$root/.run/tls/$name-key.pem")
  fi
  env "${identity[@]}" "$@" INTEGRATIONS_GRPC_ADDR="$addr" "bin/$name" >".run/logs/$name.log" 2>&1 &
  pids+=("$!")
}

# await NAME HOST:PORT: wait until the port accepts connections, or fail if the program died.
await() {
  local name=$1 host=${2%:*} port=${2##*:} pid=${pids[-1]} i
  for i in $(seq 1 200); do
    if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      say "$name exited; its log (.run/logs/$name.log) ends with:"; tail -20 ".run/logs/$name.log" >&2; return 1
    fi
    sleep 0.05
  done
  say "$name did not open $2"; return 1
}

start settlement         127.0.0.1:9094 INTEGRATIONS_METRICS_ADDR=127.0.0.1:9194; await settlement 127.0.0.1:9094
start adapter-callback   127.0.0.1:9093 INTEGRATIONS_METRICS_ADDR=127.0.0.1:9193; await adapter-callback 127.0.0.1:9093
start dispatcher         127.0.0.1:9091 INTEGRATIONS_METRICS_ADDR=127.0.0.1:9191; await dispatcher 127.0.0.1:9091
start execution-consumer 127.0.0.1:9092 INTEGRATIONS_METRICS_ADDR=127.0.0.1:9192; await execution-consumer 127.0.0.1:9092
start event-router       127.0.0.1:9095 INTEGRATIONS_METRICS_ADDR=127.0.0.1:9195; await event-router 127.0.0.1:9095
start gateway            127.0.0.1:9090 INTEGRATIONS_METRICS_ADDR=127.0.0.1:9190 INTEGRATIONS_HTTP_ADDR=127.0.0.1:8080
await gateway 127.0.0.1:8080
start dummy-adapter      127.0.0.1:9097; await dummy-adapter "$INTEGRATIONS_DUMMY_ADAPTER_ADDR"
start demo-consumer      127.0.0.1:9098; await demo-consumer "$INTEGRATIONS_DEMO_CONSUMER_ADDR"
say "all services up (logs in .run/logs/)"

# sample_call: one async call through the whole platform, shown end to end. Its failure is
# reported, not fatal: the platform keeps serving, since what failed may be the demo's own
# plumbing (another webhook registered meanwhile, a slow first start) and the logs, the CLI
# and the API are what one needs to find out.
sample_call() {
  local out code body id i
  if ! bin/integrationsctl consumer set-webhook "http://$INTEGRATIONS_DEMO_CONSUMER_ADDR/events" --secret-file .run/consumer.secret >&2; then
    say "could not register the demo consumer as the dev application's webhook (see above)"
    return 1
  fi
  say "sample call: POST http://127.0.0.1:8080/v1/capabilities/dummy.echo:invoke"
  if ! out=$(curl -sS -X POST http://127.0.0.1:8080/v1/capabilities/dummy.echo:invoke \
    -H "Authorization: Bearer $INTEGRATIONS_DEV_API_KEY" -H 'Content-Type: application/json' \
    -d '{"mode": "MODE_ASYNC", "payload": {"message": "hello from make run"}}' -w '\n%{http_code}'); then
    say "the sample call did not reach the gateway on 127.0.0.1:8080 (see .run/logs/gateway.log)"
    return 1
  fi
  code=${out##*$'\n'} body=${out%$'\n'*}
  printf '%s\n' "$body" >.run/sample.json
  printf '%s\n  -> HTTP %s\n' "$body" "$code"
  if [[ $code != 2* ]]; then
    say "the sample call was answered HTTP $code (body above; see .run/logs/gateway.log)"
    return 1
  fi
  id=$(sed -n 's/.*"id":"\([0-9a-f-]*\)".*/\1/p' .run/sample.json | head -1)
  if [[ -z $id ]]; then
    say "the sample call's answer names no execution (body above)"
    return 1
  fi
  for i in $(seq 1 100); do
    if grep -q "execution=$id" .run/logs/demo-consumer.log; then break; fi
    sleep 0.1
  done
  if ! grep -q "execution=$id" .run/logs/demo-consumer.log; then
    say "no event for execution $id reached the demo consumer within 10 s; the execution now:"
    bin/integrationsctl get "$id" || true
    say "its event goes to the dev application's webhook: if another one was registered meanwhile, it went there (bin/integrationsctl events list; .run/logs/event-router.log, .run/logs/demo-consumer.log)"
    return 1
  fi
  say "the demo consumer received:"
  grep "execution=$id" .run/logs/demo-consumer.log >&2
  bin/integrationsctl get "$id" || true
}

if ! sample_call; then
  say "the sample call did not complete (above); the platform keeps serving"
fi
say "broker diagnostic (POST /api/v1/system/mq-diagnostic):"
curl -sS -X POST -H "Authorization: Bearer $INTEGRATIONS_ADMIN_TOKEN" http://127.0.0.1:8080/api/v1/system/mq-diagnostic >&2 || true
if [[ $INTEGRATIONS_DEV_API_KEY == dev-api-key-change-me ]]; then
  key="dev-api-key-change-me (the development default)"
else
  key="the value of INTEGRATIONS_DEV_API_KEY"
fi
say "the platform is running: REST http://127.0.0.1:8080, gRPC 127.0.0.1:9090, API key $key"
say "try: bin/integrationsctl invoke dummy.echo --payload '{\"dummy\": {\"fail_transient\": 2}}' --wait   (with INTEGRATIONS_API_KEY set)"
say "Ctrl-C stops everything"
wait -n "${pids[@]}" || true
if [ -z "$stopping" ]; then
  say "a program exited; see .run/logs/"
  exit 1
fi
