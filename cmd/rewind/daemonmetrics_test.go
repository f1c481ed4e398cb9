package main

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
)

// TestDaemonsServeGossipMetrics runs a coordinator and an agent as
// processes of the rewind binary, with failure detection on loopback,
// and scrapes each one's /metrics: both serve the rewind_membership_*
// metrics docs/operations.md lists (members by state, key reloads), and
// each counts the other alive.
func TestDaemonsServeGossipMetrics(t *testing.T) {
	coordAddr, coordMetrics, coordGossip := testcluster.FreeAddr(t), testcluster.FreeAddr(t), testcluster.FreeAddr(t)
	startDaemon(t, "coordinator", "--listen", coordAddr, "--metrics", coordMetrics, "--data", filepath.Join(t.TempDir(), "data"),
		"--gossip", coordGossip)
	agentMetrics := testcluster.FreeAddr(t)
	listen := testcluster.FreeAddr(t)
	startDaemon(t, "agent", "--node", "n1", "--shm-root", filepath.Join(testcluster.ShmDir(t), "shm"),
		"--socket", filepath.Join(t.TempDir(), "a.sock"), "--listen", listen, "--advertise", listen, "--metrics", agentMetrics,
		"--coordinator", coordAddr, "--gossip", testcluster.FreeAddr(t), "--gossip-join", coordGossip)
	for _, d := range []struct{ name, addr string }{{"coordinator", coordMetrics}, {"agent", agentMetrics}} {
		wait.ForNil(t, 30*time.Second, "the "+d.name+" to serve its failure detection's metrics", func() error {
			text, err := scrape(d.addr)
			if err != nil {
				return err
			}
			for _, want := range []string{`rewind_membership_members{state="alive"} 2`, "rewind_membership_key_reloads_total 0"} {
				if !strings.Contains(text, want) {
					return fmt.Errorf("no %q in its /metrics", want)
				}
			}
			return nil
		})
	}
}

// scrape returns the plaintext /metrics of a daemon at addr.
func scrape(addr string) (string, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
