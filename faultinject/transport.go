package faultinject

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
)

// Transport wraps the object store's HTTP transport so that s3/request
// fires on every request: error fails it before it is sent, status(N)
// answers N with an S3 error document (the request is not sent), reset
// fails it as a reset connection, timeout holds it until its context
// ends, sleep delays it, corrupt flips one byte of the answer's body. A
// nil Injector returns inner itself; a nil inner is
// http.DefaultTransport.
func (in *Injector) Transport(inner http.RoundTripper) http.RoundTripper {
	if inner == nil {
		inner = http.DefaultTransport
	}
	if in == nil {
		return inner
	}
	return &faultyTransport{inner: inner, in: in}
}

type faultyTransport struct {
	inner http.RoundTripper
	in    *Injector
}

func (t *faultyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	f := t.in.Eval(req.Context(), S3Request)
	switch f.Kind {
	case KindError:
		closeBody(req)
		return nil, f.Err()
	case KindReset:
		closeBody(req)
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: &Error{Point: S3Request, Err: syscall.ECONNRESET}}
	case KindTimeout:
		closeBody(req)
		<-req.Context().Done()
		return nil, req.Context().Err()
	case KindStatus:
		closeBody(req)
		return s3ErrorResponse(req, f.Code), nil
	}
	resp, err := t.inner.RoundTrip(req)
	if err != nil || f.Kind != KindCorrupt || resp.Body == nil {
		return resp, err
	}
	resp.Body = &flipBody{ReadCloser: resp.Body, fault: f, at: -1}
	return resp, nil
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// s3ErrorResponse is the answer of a store that failed the request with
// status code.
func s3ErrorResponse(req *http.Request, code int) *http.Response {
	s3code := "InternalError"
	if code == http.StatusServiceUnavailable {
		s3code = "SlowDown"
	}
	body := fmt.Sprintf(`<?xml version="1.0" encoding="UTF-8"?>`+
		`<Error><Code>%s</Code><Message>injected fault at %s</Message><Resource>%s</Resource><RequestId>faultinject</RequestId></Error>`,
		s3code, S3Request, req.URL.Path)
	h := http.Header{}
	h.Set("Content-Type", "application/xml")
	return &http.Response{
		Status: fmt.Sprintf("%d %s", code, http.StatusText(code)), StatusCode: code,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(bytes.NewReader([]byte(body))),
		ContentLength: int64(len(body)), Request: req,
	}
}

// flipBody flips one bit of the first chunk of the body it reads.
type flipBody struct {
	io.ReadCloser
	fault Fault
	at    int
}

func (b *flipBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 && b.at < 0 {
		b.at = Flip(p[:n], b.fault)
	}
	return n, err
}
