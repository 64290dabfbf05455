# integrations — the entry point for building, running and testing. `make help` lists targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

MODULE   := github.com/integrations-platform/integrations
# Every Go module of the workspace, for go vet / go test.
PKGS     := $(MODULE)/pkg/... $(MODULE)/migrations/... $(MODULE)/services/... $(MODULE)/cmd/... $(MODULE)/e2e/... $(MODULE)/bench/... $(MODULE)/deploy/k8s/check/...
BINARIES := gateway dispatcher execution-consumer adapter-callback settlement event-router
# The release every binary prints (`integrationsctl version`, `-version`) and logs at start:
# `git describe` (v0.1.0, v0.1.0-3-g3f2a9c1, -dirty with changes), pkg/version's fallback
# without git. `make build VERSION=...` overrides it.
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo 0.1.0-dev)
LDFLAGS  := -X $(MODULE)/pkg/version.release=$(VERSION)
TOOLS    := bin/buf bin/protoc-gen-go bin/protoc-gen-go-grpc bin/protoc-gen-grpc-gateway bin/protoc-gen-openapiv2 bin/openapi3gen

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-18s %s\n", $$1, $$2}'

.PHONY: run
run: ## Run the whole platform locally (deps, migrations, six services, dummy adapter, demo consumer) and a sample call
	@scripts/run.sh

.PHONY: test
# deps.sh starts an ActiveMQ for pkg/stomp's tests when none answers; the trap stops the one this
# run started (a CI clone must leave no java running), never one that was there before.
test: ## Unit, integration and end-to-end tests against real Postgres, RabbitMQ and ActiveMQ (STOMP) (mTLS inside; e2e twice: plain and TLS client-facing listeners; then the image check, skipped without podman; then make test-ts)
	@started=$$(mktemp); \
	trap 'if grep -qx stomp "$$started"; then scripts/deps.sh down stomp; fi; rm -f "$$started"' EXIT; \
	DEPS_STARTED_FILE=$$started scripts/deps.sh up stomp && \
	set -a && . .run/deps.env && set +a && \
	export INTEGRATIONS_TEST_DATABASE_URL="$${INTEGRATIONS_TEST_DATABASE_URL:-$$INTEGRATIONS_PG_URL/test?sslmode=disable}" && \
	go vet $(PKGS) && \
	go test -race -count=1 -timeout 15m $(MODULE)/pkg/... $(MODULE)/services/... $(MODULE)/cmd/... $(MODULE)/deploy/k8s/check/... && \
	go test -count=1 -timeout 15m $(MODULE)/e2e/... $(MODULE)/bench/internal/chaos/... $(MODULE)/bench/internal/mqbench/... && \
	echo "e2e again, with TLS on the client-facing listeners (INTEGRATIONS_E2E_PUBLIC_TLS=true)" && \
	INTEGRATIONS_E2E_PUBLIC_TLS=true go test -count=1 -timeout 15m $(MODULE)/e2e/... && \
	scripts/image-check.sh && \
	$(MAKE) -s test-ts

.PHONY: test-ts
test-ts: ## The TypeScript adapter SDK's tests with Node's own runner: all 61 protocol vectors, renewal and retry rules (needs npm ci in sdk/typescript/adapter)
	cd sdk/typescript/adapter && node --test test/

.PHONY: build
build: ## Build every binary into bin/, each saying its release (VERSION, from git describe)
	go build -ldflags "$(LDFLAGS)" -o bin/ $(addprefix $(MODULE)/services/,$(BINARIES)) $(MODULE)/cmd/...

# The platform's one image (deploy/image/Containerfile): every program of PROGRAMS in
# /usr/local/bin, static. Its build context is IMAGE_STAGE, filled here: no Go base image can be
# pulled for a multi-stage build.
IMAGE       := localhost/integrations
IMAGE_STAGE := bin/image
PROGRAMS    := $(BINARIES) integrationsctl dummy-adapter demo-consumer
# The nodes' architecture (default: this machine's) and the build machine's CA bundle (Debian and
# Ubuntu's path; Fedora's is /etc/pki/tls/certs/ca-bundle.crt). The binaries are always Linux's.
IMAGE_ARCH  ?= $(shell go env GOARCH)
CA_BUNDLE   ?= /etc/ssl/certs/ca-certificates.crt

.PHONY: images
images: ## Build the one OCI image with podman, tagged localhost/integrations:<12-digit git revision> and :dev; prints the tag
	@set -euo pipefail; \
	rev=$$(git rev-parse HEAD); tag=$(IMAGE):$$(git rev-parse --short=12 HEAD); \
	rm -rf $(IMAGE_STAGE); mkdir -p $(IMAGE_STAGE)/usr/local/bin $(IMAGE_STAGE)/etc/ssl/certs; \
	CGO_ENABLED=0 GOOS=linux GOARCH=$(IMAGE_ARCH) go build -trimpath -ldflags "-s -w $(LDFLAGS)" -o $(IMAGE_STAGE)/usr/local/bin/ \
		$(addprefix $(MODULE)/services/,$(BINARIES)) $(addprefix $(MODULE)/cmd/,integrationsctl dummy-adapter demo-consumer); \
	for p in $(PROGRAMS); do test -x $(IMAGE_STAGE)/usr/local/bin/$$p || { echo "images: $$p was not built" >&2; exit 1; }; done; \
	cp $(CA_BUNDLE) $(IMAGE_STAGE)/etc/ssl/certs/ca-certificates.crt; \
	cp deploy/image/passwd deploy/image/group $(IMAGE_STAGE)/etc/; \
	timeout 600 podman build --layers=false --arch $(IMAGE_ARCH) --file deploy/image/Containerfile --build-arg REVISION=$$rev --build-arg VERSION=$(VERSION) \
		--tag $$tag --tag $(IMAGE):dev $(IMAGE_STAGE) </dev/null >&2; \
	timeout 120 podman image prune --force --filter label=org.opencontainers.image.title=integrations </dev/null >/dev/null; \
	echo $$tag

.PHONY: lint
lint: tools ## buf lint, gofmt and go vet
	bin/buf lint
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '^pkg/gen/'))" || { gofmt -l $$(git ls-files '*.go' | grep -v '^pkg/gen/'); echo "gofmt: files above need formatting"; exit 1; }
	go vet $(PKGS)

.PHONY: tools
tools: $(TOOLS) ## Build the pinned protobuf tools (tools/go.mod, tools/buf/go.mod) into bin/

bin/buf: tools/buf/go.mod tools/buf/go.sum
	GOWORK=off go -C tools/buf build -o ../../bin/ github.com/bufbuild/buf/cmd/buf

bin/openapi3gen: tools/go.mod tools/go.sum $(wildcard tools/openapi3gen/*.go)
	GOWORK=off go -C tools build -o ../bin/ ./openapi3gen

bin/protoc-gen-%: tools/go.mod tools/go.sum
	GOWORK=off go -C tools build -o ../bin/ \
		google.golang.org/protobuf/cmd/protoc-gen-go \
		google.golang.org/grpc/cmd/protoc-gen-go-grpc \
		github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-grpc-gateway \
		github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-openapiv2

# The OpenAPI document: protoc-gen-openapiv2's Swagger 2.0 (bin/openapiv2, an intermediate), the
# protos' descriptors and the overlay beside gateway.proto, made one OpenAPI 3.1 document.
OPENAPI_OVERLAY := proto/integrations/gateway/v1/openapi.yaml
OPENAPI_DOC     := pkg/gen/openapi/integrations.openapi.yaml

.PHONY: generate
generate: tools ## Regenerate pkg/gen from proto/ (buf lint first), the OpenAPI 3.1 document included
	bin/buf lint
	bin/buf generate
	bin/buf build --exclude-source-info -o bin/openapiv2/image.binpb
	@mkdir -p $(dir $(OPENAPI_DOC))
	bin/openapi3gen -swagger bin/openapiv2/integrations.swagger.json -descriptors bin/openapiv2/image.binpb \
		-overlay $(OPENAPI_OVERLAY) -out $(OPENAPI_DOC)

.PHONY: check-generated
check-generated: generate ## Fail if the committed generated code differs from what make generate produces
	@git diff --exit-code -- pkg/gen && test -z "$$(git status --porcelain -- pkg/gen)" || { echo "pkg/gen is stale: run make generate and commit"; exit 1; }

.PHONY: deps-down
deps-down: ## Stop the Postgres/RabbitMQ that scripts/deps.sh started (if any)
	@scripts/deps.sh down

.PHONY: clean
clean: ## Remove build output and local run state
	rm -rf bin .run

.PHONY: fuzz
fuzz: ## Every go test -fuzz target for FUZZTIME each (default 60s), with a table of executions per target
	@scripts/deps.sh up
	@set -a; . .run/deps.env; set +a; \
	export INTEGRATIONS_TEST_DATABASE_URL="$${INTEGRATIONS_TEST_DATABASE_URL:-$$INTEGRATIONS_PG_URL/test?sslmode=disable}"; \
	FUZZTIME=$(or $(FUZZTIME),60s) FUZZ_TARGETS="$(FUZZ_TARGETS)" scripts/fuzz.sh

.PHONY: chaos
chaos: ## The fault suite: 2 replicas of every service, kill -9s, broker and Postgres connections cut, a failing receiver; then the invariants (CHAOS_FLAGS=... passes flags, e.g. -executions 10000 -strict, -mode adapter, -mode rolling -callers 64)
	@scripts/deps.sh up
	@set -a; . .run/deps.env; set +a; \
	export INTEGRATIONS_TEST_DATABASE_URL="$${INTEGRATIONS_TEST_DATABASE_URL:-$$INTEGRATIONS_PG_URL/test?sslmode=disable}"; \
	go run $(MODULE)/bench/cmd/chaos $(CHAOS_FLAGS)

.PHONY: bench-mq
# Both providers in one run, each beside its raw baseline on its own broker; the ActiveMQ this run
# started is stopped at its end, as make test does.
bench-mq: ## Message-port throughput beside each provider's raw baseline on the same broker: RabbitMQ (amqp091-go) and STOMP (raw frames; ActiveMQ from deps.sh) (BENCH_MQ_FLAGS=... passes flags)
	@started=$$(mktemp); \
	trap 'if grep -qx stomp "$$started"; then scripts/deps.sh down stomp; fi; rm -f "$$started"' EXIT; \
	DEPS_STARTED_FILE=$$started scripts/deps.sh up stomp && \
	set -a && . .run/deps.env && set +a && \
	go run $(MODULE)/bench/cmd/bench-mq -provider rabbitmq,stomp $(BENCH_MQ_FLAGS)

.PHONY: bench-accept
bench-accept: ## Accept throughput (gRPC, REST) on the real stack beside the raw Postgres ceiling and River's insert
	@scripts/deps.sh up bench
	@set -a; . .run/deps.env; set +a; \
	export INTEGRATIONS_BENCH_DATABASE_URL="$${INTEGRATIONS_BENCH_DATABASE_URL:-$$INTEGRATIONS_PG_URL/bench?sslmode=disable}"; \
	go run $(MODULE)/bench/cmd/bench -scenarios accept $(BENCH_FLAGS)

.PHONY: bench
bench: ## All benchmarks in one report: message port, accept, serial, end to end beside River (doing the same work, and bare) and Temporal, open-loop latency, cost, broker messages per retry, issue 13's PASS/FAIL table, rate limits under a flood (BENCH_FLAGS=... passes flags to bench/cmd/bench)
	@scripts/deps.sh up bench
	@mkdir -p bench/results
	@set -a; . .run/deps.env; set +a; \
	export INTEGRATIONS_BENCH_DATABASE_URL="$${INTEGRATIONS_BENCH_DATABASE_URL:-$$INTEGRATIONS_PG_URL/bench?sslmode=disable}"; \
	mq=$$(mktemp) && go run $(MODULE)/bench/cmd/bench-mq -json $$mq && \
	go run $(MODULE)/bench/cmd/bench -scenarios accept,serial,e2e,latency,retry,ratelimit -mq-json $$mq $(BENCH_FLAGS); \
	rc=$$?; rm -f $$mq; exit $$rc

.PHONY: bench-issue13
bench-issue13: ## Issue 13's must-show table only: serial, e2e, 200/s open loop and the retry scenario, beside River doing the same work and River's bare insert → complete (BENCH_FLAGS=... passes flags)
	@scripts/deps.sh up bench
	@mkdir -p bench/results
	@set -a; . .run/deps.env; set +a; \
	export INTEGRATIONS_BENCH_DATABASE_URL="$${INTEGRATIONS_BENCH_DATABASE_URL:-$$INTEGRATIONS_PG_URL/bench?sslmode=disable}"; \
	go run $(MODULE)/bench/cmd/bench -scenarios serial,e2e,latency,retry -peers riversw,river -rates 200 $(BENCH_FLAGS)
