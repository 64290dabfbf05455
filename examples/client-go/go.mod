module github.com/integrations-platform/integrations/examples/client-go

go 1.26.0

require (
	github.com/integrations-platform/integrations/sdk/go v0.1.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/integrations-platform/integrations/pkg/gen v0.2.0 // indirect
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.44.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20261110000943-09e21b237f2c // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261110000943-09e21b237f2c // indirect
	google.golang.org/grpc v1.85.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

// In this repository the example builds on the SDK as it is; outside it, drop these lines and
// require the releases.
replace (
	github.com/integrations-platform/integrations/pkg/gen => ../../pkg/gen
	github.com/integrations-platform/integrations/sdk/go => ../../sdk/go
)
