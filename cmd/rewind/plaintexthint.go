package main

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/transport"
)

// plaintextHint makes the calls of an operator command without TLS name
// the likely cause when the server closes the plaintext connection, as a
// coordinator with --tls-dir does: gRPC alone says only "error reading
// server preface: EOF". With TLS it adds nothing.
func plaintextHint(sec *transport.Security, addr string) []grpc.DialOption {
	if sec.TLS() {
		return nil
	}
	hint := func(err error) error {
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "server preface") {
			return err
		}
		return fmt.Errorf("%s closed a plaintext connection, as a coordinator with TLS does: give this command an operator's or reader's certificate directory, --tls-dir or $%s (%w)",
			addr, EnvTLSDir, err)
	}
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return hint(invoker(ctx, method, req, reply, cc, opts...))
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			s, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				return nil, hint(err)
			}
			return hintedStream{s, hint}, nil
		}),
	}
}

// hintedStream passes a stream's receive errors through hint.
type hintedStream struct {
	grpc.ClientStream
	hint func(error) error
}

func (s hintedStream) RecvMsg(m any) error { return s.hint(s.ClientStream.RecvMsg(m)) }
