package httpapi

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
)

// inProcess is GatewayService as the REST handlers call it in process: each method runs the gRPC
// server's unary interceptor chain (grpcx.Server.Unary: recovery, logging, decode, error mapping,
// then auth and the rate gate) around the service's own method, with the FullMethod a gRPC call
// of it carries. grpc-gateway's in-process handlers (RegisterGatewayServiceHandlerServer) call
// the service directly and bypass the interceptors; without this a REST call would skip
// authentication. The service has no streaming methods.
type inProcess struct {
	gatewayv1.UnimplementedGatewayServiceServer
	impl  gatewayv1.GatewayServiceServer
	unary grpc.UnaryServerInterceptor
}

// unaryCall runs s.unary around method for req.
func unaryCall[Req, Resp any](ctx context.Context, s *inProcess, fullMethod string, req *Req, method func(context.Context, *Req) (*Resp, error)) (*Resp, error) {
	info := &grpc.UnaryServerInfo{Server: s.impl, FullMethod: fullMethod}
	out, err := s.unary(ctx, req, info, func(ctx context.Context, r any) (any, error) {
		return method(ctx, r.(*Req))
	})
	if err != nil {
		return nil, err
	}
	resp, ok := out.(*Resp)
	if !ok {
		return nil, fmt.Errorf("%s: unexpected response %T", fullMethod, out)
	}
	return resp, nil
}

func (s *inProcess) InvokeCapability(ctx context.Context, req *gatewayv1.InvokeCapabilityRequest) (*gatewayv1.InvokeCapabilityResponse, error) {
	return unaryCall(ctx, s, gatewayv1.GatewayService_InvokeCapability_FullMethodName, req, s.impl.InvokeCapability)
}

func (s *inProcess) GetExecution(ctx context.Context, req *gatewayv1.GetExecutionRequest) (*gatewayv1.GetExecutionResponse, error) {
	return unaryCall(ctx, s, gatewayv1.GatewayService_GetExecution_FullMethodName, req, s.impl.GetExecution)
}

func (s *inProcess) ListExecutions(ctx context.Context, req *gatewayv1.ListExecutionsRequest) (*gatewayv1.ListExecutionsResponse, error) {
	return unaryCall(ctx, s, gatewayv1.GatewayService_ListExecutions_FullMethodName, req, s.impl.ListExecutions)
}

func (s *inProcess) CancelExecution(ctx context.Context, req *gatewayv1.CancelExecutionRequest) (*gatewayv1.CancelExecutionResponse, error) {
	return unaryCall(ctx, s, gatewayv1.GatewayService_CancelExecution_FullMethodName, req, s.impl.CancelExecution)
}

func (s *inProcess) SetConsumer(ctx context.Context, req *gatewayv1.SetConsumerRequest) (*gatewayv1.SetConsumerResponse, error) {
	return unaryCall(ctx, s, gatewayv1.GatewayService_SetConsumer_FullMethodName, req, s.impl.SetConsumer)
}

func (s *inProcess) RotateSigningSecret(ctx context.Context, req *gatewayv1.RotateSigningSecretRequest) (*gatewayv1.RotateSigningSecretResponse, error) {
	return unaryCall(ctx, s, gatewayv1.GatewayService_RotateSigningSecret_FullMethodName, req, s.impl.RotateSigningSecret)
}

func (s *inProcess) ListEvents(ctx context.Context, req *gatewayv1.ListEventsRequest) (*gatewayv1.ListEventsResponse, error) {
	return unaryCall(ctx, s, gatewayv1.GatewayService_ListEvents_FullMethodName, req, s.impl.ListEvents)
}

func (s *inProcess) GetEvent(ctx context.Context, req *gatewayv1.GetEventRequest) (*gatewayv1.GetEventResponse, error) {
	return unaryCall(ctx, s, gatewayv1.GatewayService_GetEvent_FullMethodName, req, s.impl.GetEvent)
}

func (s *inProcess) RedeliverEvent(ctx context.Context, req *gatewayv1.RedeliverEventRequest) (*gatewayv1.RedeliverEventResponse, error) {
	return unaryCall(ctx, s, gatewayv1.GatewayService_RedeliverEvent_FullMethodName, req, s.impl.RedeliverEvent)
}

func (s *inProcess) RedriveEvents(ctx context.Context, req *gatewayv1.RedriveEventsRequest) (*gatewayv1.RedriveEventsResponse, error) {
	return unaryCall(ctx, s, gatewayv1.GatewayService_RedriveEvents_FullMethodName, req, s.impl.RedriveEvents)
}
