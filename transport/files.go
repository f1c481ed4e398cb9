package transport

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// The files of a certificate directory, as cert-manager writes a
// Certificate's Secret and SPIFFE helpers write an SVID: the holder's
// certificate (and any intermediates after it), its private key, and the
// certificate authorities it trusts.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
	CAFile   = "ca.crt"
)

// stamp tells a file's versions apart: a changed modification time,
// size, inode or device is a new version. A Kubernetes Secret volume
// swaps a symbolic link to a new directory; os.Stat follows it.
type stamp struct {
	mod        time.Time
	size       int64
	ino, dev   uint64
	statFailed bool
}

func stampOf(path string) stamp {
	st, err := os.Stat(path)
	if err != nil {
		return stamp{statFailed: true}
	}
	s := stamp{mod: st.ModTime(), size: st.Size()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		s.ino, s.dev = uint64(sys.Ino), uint64(sys.Dev)
	}
	return s
}

// material is one version of a directory's files, parsed.
type material struct {
	cert  *tls.Certificate
	leaf  *x509.Certificate
	id    Identity
	pool  *x509.CertPool
	stamp [3]stamp
}

// files reads a certificate directory and reads it again when one of
// its files changes: every handshake asks for the current material,
// which costs three stat calls when nothing changed. A change that does
// not parse (a key written after its certificate, a half-written file)
// keeps the last good material and is tried again at the next
// handshake; the failure is logged once per distinct error.
type files struct {
	dir, trustDomain string
	log              *slog.Logger
	onReload         func()

	mu      sync.Mutex
	cur     *material
	lastErr string
}

func loadFiles(dir, trustDomain string, log *slog.Logger, onReload func()) (*files, error) {
	f := &files{dir: dir, trustDomain: trustDomain, log: log, onReload: onReload}
	m, err := f.read()
	if err != nil {
		return nil, err
	}
	f.cur = m
	return f, nil
}

func (f *files) paths() [3]string {
	return [3]string{filepath.Join(f.dir, CertFile), filepath.Join(f.dir, KeyFile), filepath.Join(f.dir, CAFile)}
}

// current returns the material as the files now are.
func (f *files) current() *material {
	p := f.paths()
	now := [3]stamp{stampOf(p[0]), stampOf(p[1]), stampOf(p[2])}
	f.mu.Lock()
	defer f.mu.Unlock()
	if now == f.cur.stamp {
		return f.cur
	}
	m, err := f.read()
	if err != nil {
		if msg := err.Error(); msg != f.lastErr {
			f.lastErr = msg
			f.log.Warn("certificate files changed but cannot be used; keeping the ones loaded before", "dir", f.dir, "err", err)
		}
		return f.cur
	}
	// m.stamp was taken before the files were read: a change during the
	// read differs from it, and is read again at the next handshake.
	f.lastErr = ""
	f.cur = m
	f.log.Info("certificates reloaded", "dir", f.dir, "identity", m.id, "not_after", m.leaf.NotAfter.UTC().Format(time.RFC3339))
	if f.onReload != nil {
		f.onReload()
	}
	return m
}

// read parses the directory's files.
func (f *files) read() (*material, error) {
	p := f.paths()
	m := &material{stamp: [3]stamp{stampOf(p[0]), stampOf(p[1]), stampOf(p[2])}}
	certPEM, err := os.ReadFile(p[0])
	if err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	keyPEM, err := os.ReadFile(p[1])
	if err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	caPEM, err := os.ReadFile(p[2])
	if err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("transport: %s and %s in %s: %w", CertFile, KeyFile, f.dir, err)
	}
	m.cert, m.leaf = &cert, cert.Leaf
	if m.id, err = IdentityOf(m.leaf, f.trustDomain); err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, p[0])
	}
	m.pool = x509.NewCertPool()
	if !m.pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("transport: %s holds no PEM certificate", p[2])
	}
	return m, nil
}

// verify checks a peer's certificate chain against the current
// authorities, for usage, at now, and returns the identity it names.
func (m *material) verify(chain []*x509.Certificate, usage x509.ExtKeyUsage, trustDomain string, now time.Time) (Identity, error) {
	if len(chain) == 0 {
		return Identity{}, errNoCert
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: m.pool, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}})
	if err != nil {
		return Identity{}, fmt.Errorf("certificate %q not trusted: %w", subject(chain[0]), err)
	}
	return IdentityOf(chain[0], trustDomain)
}

var errNotTLS = errors.New("transport: not a TLS connection")
