package transport

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
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
	// verified remembers the peer chains verified against pool (which
	// never changes: new files make new material), so that a peer that
	// connects again (a shard copy is a connection) costs no chain
	// verification until its certificates' validity ends.
	verified verifiedCache
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
	key := verifiedKey{usage: usage, chain: chainSum(chain)}
	if id, ok := m.verified.get(key, now); ok {
		return id, nil
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	chains, err := chain[0].Verify(x509.VerifyOptions{Roots: m.pool, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}})
	if err != nil {
		return Identity{}, fmt.Errorf("certificate %q not trusted: %w", subject(chain[0]), err)
	}
	id, err := IdentityOf(chain[0], trustDomain)
	if err != nil {
		return Identity{}, err
	}
	m.verified.put(key, id, chains)
	return id, nil
}

// verifiedCache holds chains that verified, until the first of their
// certificates' validity ends; at most maxVerified, then it starts over.
type verifiedCache struct {
	mu sync.Mutex
	m  map[verifiedKey]verifiedID
}

type verifiedKey struct {
	usage x509.ExtKeyUsage
	chain [sha256.Size]byte
}

type verifiedID struct {
	id                  Identity
	notBefore, notAfter time.Time
}

const maxVerified = 4096

// chainSum identifies a presented chain by its certificates' bytes.
func chainSum(chain []*x509.Certificate) [sha256.Size]byte {
	h := sha256.New()
	for _, c := range chain {
		h.Write(c.Raw)
	}
	var s [sha256.Size]byte
	h.Sum(s[:0])
	return s
}

func (c *verifiedCache) get(k verifiedKey, now time.Time) (Identity, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[k]
	if !ok || now.Before(v.notBefore) || now.After(v.notAfter) {
		return Identity{}, false
	}
	return v.id, true
}

// put remembers k's identity for as long as every certificate of every
// chain it verified through is valid.
func (c *verifiedCache) put(k verifiedKey, id Identity, chains [][]*x509.Certificate) {
	v := verifiedID{id: id}
	for _, ch := range chains {
		for _, cert := range ch {
			if v.notBefore.IsZero() || cert.NotBefore.After(v.notBefore) {
				v.notBefore = cert.NotBefore
			}
			if v.notAfter.IsZero() || cert.NotAfter.Before(v.notAfter) {
				v.notAfter = cert.NotAfter
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxVerified {
		c.m = map[verifiedKey]verifiedID{}
	}
	c.m[k] = v
}
