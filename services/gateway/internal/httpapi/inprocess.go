package httpapi

import (
	"context"

	"google.golang.org/grpc"

	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
)

// InProcess is the gateway service as the REST face calls it: in the same process, each method
// through chain (the gRPC server's interceptors, grpcx.Server.Unary) with the method's full name,
// exactly as a call arriving over gRPC passes them. It replaced a loopback gRPC connection from
// grpc-gateway to the gateway's own port, whose encoding, TLS and HTTP/2 framing cost a REST
// accept a third more CPU than a gRPC one (docs/capacity.md).
func InProcess(impl gatewayv1.GatewayServiceServer, chain grpc.UnaryServerInterceptor) gatewayv1.GatewayServiceServer {
	return inProcess{impl: impl, chain: chain}
}

type inProcess struct {
	gatewayv1.UnimplementedGatewayServiceServer // never reached: every method is below
	impl                                        gatewayv1.GatewayServiceServer
	chain                                       grpc.UnaryServerInterceptor
}

// unary calls h through the chain as the gRPC server would call method.
func unary[Req, Resp any](ctx context.Context, s inProcess, method string, req Req, h func(context.Context, Req) (Resp, error)) (Resp, error) {
	out, err := s.chain(ctx, req, &grpc.UnaryServerInfo{Server: s.impl, FullMethod: method},
		func(ctx context.Context, req any) (any, error) { return h(ctx, req.(Req)) })
	resp, _ := out.(Resp)
	return resp, err
}

func (s inProcess) InvokeCapability(ctx context.Context, r *gatewayv1.InvokeCapabilityRequest) (*gatewayv1.InvokeCapabilityResponse, error) {
	return unary(ctx, s, gatewayv1.GatewayService_InvokeCapability_FullMethodName, r, s.impl.InvokeCapability)
}

func (s inProcess) GetExecution(ctx context.Context, r *gatewayv1.GetExecutionRequest) (*gatewayv1.GetExecutionResponse, error) {
	return unary(ctx, s, gatewayv1.GatewayService_GetExecution_FullMethodName, r, s.impl.GetExecution)
}

func (s inProcess) ListExecutions(ctx context.Context, r *gatewayv1.ListExecutionsRequest) (*gatewayv1.ListExecutionsResponse, error) {
	return unary(ctx, s, gatewayv1.GatewayService_ListExecutions_FullMethodName, r, s.impl.ListExecutions)
}

func (s inProcess) CancelExecution(ctx context.Context, r *gatewayv1.CancelExecutionRequest) (*gatewayv1.CancelExecutionResponse, error) {
	return unary(ctx, s, gatewayv1.GatewayService_CancelExecution_FullMethodName, r, s.impl.CancelExecution)
}

func (s inProcess) SetConsumer(ctx context.Context, r *gatewayv1.SetConsumerRequest) (*gatewayv1.SetConsumerResponse, error) {
	return unary(ctx, s, gatewayv1.GatewayService_SetConsumer_FullMethodName, r, s.impl.SetConsumer)
}

func (s inProcess) RotateSigningSecret(ctx context.Context, r *gatewayv1.RotateSigningSecretRequest) (*gatewayv1.RotateSigningSecretResponse, error) {
	return unary(ctx, s, gatewayv1.GatewayService_RotateSigningSecret_FullMethodName, r, s.impl.RotateSigningSecret)
}

func (s inProcess) ListEvents(ctx context.Context, r *gatewayv1.ListEventsRequest) (*gatewayv1.ListEventsResponse, error) {
	return unary(ctx, s, gatewayv1.GatewayService_ListEvents_FullMethodName, r, s.impl.ListEvents)
}

func (s inProcess) GetEvent(ctx context.Context, r *gatewayv1.GetEventRequest) (*gatewayv1.GetEventResponse, error) {
	return unary(ctx, s, gatewayv1.GatewayService_GetEvent_FullMethodName, r, s.impl.GetEvent)
}

func (s inProcess) RedeliverEvent(ctx context.Context, r *gatewayv1.RedeliverEventRequest) (*gatewayv1.RedeliverEventResponse, error) {
	return unary(ctx, s, gatewayv1.GatewayService_RedeliverEvent_FullMethodName, r, s.impl.RedeliverEvent)
}

func (s inProcess) RedriveEvents(ctx context.Context, r *gatewayv1.RedriveEventsRequest) (*gatewayv1.RedriveEventsResponse, error) {
	return unary(ctx, s, gatewayv1.GatewayService_RedriveEvents_FullMethodName, r, s.impl.RedriveEvents)
}

func (s inProcess) GetExecutionTimeline(ctx context.Context, r *gatewayv1.GetExecutionTimelineRequest) (*gatewayv1.GetExecutionTimelineResponse, error) {
	return unary(ctx, s, gatewayv1.GatewayService_GetExecutionTimeline_FullMethodName, r, s.impl.GetExecutionTimeline)
}
