package kubetest

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// Backend is one replica behind a Service: its address and its readiness
// URL (the pod's readinessProbe).
type Backend struct {
	Addr, Ready string
}

// Service stands in for a ClusterIP Service and kube-proxy: it listens on
// a loopback address and sends each new connection to the first backend
// whose readiness URL answers 200 (only Ready endpoints get traffic). A
// connection stays with its backend until either end closes it.
type Service struct {
	Addr string

	l        net.Listener
	backends []Backend
	mu       sync.Mutex
	conns    map[net.Conn]bool
}

// NewService starts a Service; the test's cleanup stops it.
func NewService(t testing.TB, backends ...Backend) *Service {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Service{Addr: l.Addr().String(), l: l, backends: backends, conns: map[net.Conn]bool{}}
	go s.serve()
	t.Cleanup(s.close)
	return s
}

func (s *Service) serve() {
	for {
		c, err := s.l.Accept()
		if err != nil {
			return
		}
		go s.forward(c)
	}
}

func (s *Service) forward(c net.Conn) {
	b := s.ready()
	if b == "" {
		c.Close() // no ready endpoint: the connection is refused
		return
	}
	up, err := net.DialTimeout("tcp", b, 2*time.Second)
	if err != nil {
		c.Close()
		return
	}
	if !s.track(c, up) {
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	c.Close()
	up.Close()
	<-done
	s.mu.Lock()
	delete(s.conns, c)
	delete(s.conns, up)
	s.mu.Unlock()
}

func (s *Service) track(cs ...net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conns == nil {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		s.conns[c] = true
	}
	return true
}

// ready returns the address of the first ready backend, or "".
func (s *Service) ready() string {
	// A kubelet's HTTPS probe: no client certificate, the server's not
	// checked.
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true}}
	for _, b := range s.backends {
		resp, err := hc.Get(b.Ready)
		if err != nil {
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return b.Addr
		}
	}
	return ""
}

func (s *Service) close() {
	s.l.Close()
	s.mu.Lock()
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()
	for c := range conns {
		c.Close()
	}
}
