package localcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kubelock/kubelock/internal/proc"
)

// haproxyPaths are where HAProxy is looked for after PATH: Debian installs it
// in /usr/sbin, which a user's PATH often lacks.
var haproxyPaths = []string{"/usr/sbin/haproxy", "/usr/local/sbin/haproxy"}

// Balancer is HAProxy in front of the apiservers, as a production control
// plane has a load balancer before its apiservers: TCP with TLS passed
// through (each apiserver authenticates the client's certificate itself),
// connections spread round-robin over the apiservers whose /readyz passes,
// and the connections of an apiserver that fails its checks cut, so that
// clients reconnect to another one rather than wait on it.
type Balancer struct {
	*Component
	// Port is where it listens; URL is https://127.0.0.1:Port.
	Port int
	URL  string
	// Socket is HAProxy's admin socket (show sess, show servers state, set server).
	Socket string
}

// Health checks: every second, an apiserver is down after two failed checks
// (each given 2 s: an apiserver on a slow etcd answers /readyz late) and up
// after two passed ones.
const balancerHealthCheck = "inter 1s fall 2 rise 2"

// findHAProxy is the haproxy binary: on PATH, or where Debian puts it.
func findHAProxy() (string, error) {
	if p, err := exec.LookPath("haproxy"); err == nil {
		return p, nil
	}
	for _, p := range haproxyPaths {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("localcluster: the load balancer in front of the apiservers is HAProxy, and there is none on PATH or in /usr/sbin: install it (make test-deps, or apt-get install haproxy)")
}

// newBalancer lays out HAProxy in front of apiservers: its configuration
// (checking each apiserver's /readyz over TLS against caFile) written into
// dir, on port of o or a free one.
func newBalancer(o *Options, dir, caFile string, apiservers []*APIServer) (*Balancer, error) {
	bin, err := findHAProxy()
	if err != nil {
		return nil, err
	}
	port := o.BalancerPort
	if port == 0 {
		if port, err = proc.FreePort(); err != nil {
			return nil, err
		}
	}
	b := &Balancer{Port: port, URL: fmt.Sprintf("https://127.0.0.1:%d", port), Socket: filepath.Join(dir, "haproxy.sock")}
	cfg := filepath.Join(dir, "haproxy.cfg")
	if err := writeFile(cfg, []byte(haproxyConfig(port, b.Socket, caFile, apiservers))); err != nil {
		return nil, err
	}
	b.Component = &Component{Name: "haproxy", Path: bin, Args: []string{"-db", "-f", cfg},
		LogPath: filepath.Join(o.LogDir, "haproxy.log"), Readiness: "ready", StartTimeout: o.StartTimeout}
	return b, nil
}

// haproxyConfig balances port over apiservers. Timeouts of an hour on
// either side: a watch is one long request.
func haproxyConfig(port int, socket, caFile string, apiservers []*APIServer) string {
	var b strings.Builder
	fmt.Fprintf(&b, `global
  nbthread 1
  stats socket %s mode 600 level admin
  log stderr format short local0 notice

defaults
  mode tcp
  log global
  option dontlognull
  timeout connect 2s
  timeout check 2s
  timeout client 1h
  timeout server 1h
  retries 2
  option redispatch

frontend apiserver
  bind 127.0.0.1:%d
  default_backend apiservers

backend apiservers
  balance roundrobin
  option httpchk GET /readyz
  http-check expect status 200
  default-server check check-ssl verify required ca-file %s %s on-marked-down shutdown-sessions
`, socket, port, caFile, balancerHealthCheck)
	for _, a := range apiservers {
		fmt.Fprintf(&b, "  server %s 127.0.0.1:%d\n", a.Name, a.Port)
	}
	return b.String()
}

// Command sends one command to HAProxy's admin socket and returns its answer.
func (b *Balancer) Command(cmd string) (string, error) {
	c, err := net.DialTimeout("unix", b.Socket, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, cmd+"\n"); err != nil {
		return "", err
	}
	out, err := io.ReadAll(c)
	return string(out), err
}

// Status is each apiserver's state in the balancer, by component name: "UP",
// "DOWN", or on the way ("UP 1/2", "DOWN 1/2"), from HAProxy's "show stat".
func (b *Balancer) Status() (map[string]string, error) {
	out, err := b.Command("show stat")
	if err != nil {
		return nil, err
	}
	return parseStatus(out), nil
}

// WaitUp returns once the balancer counts apiserver name up, or ctx's error.
func (b *Balancer) WaitUp(ctx context.Context, name string) error {
	for {
		st, err := b.Status()
		if err == nil && st[name] == "UP" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not up in the balancer (%q): %w", name, st[name], ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// parseStatus reads "show stat"'s CSV: a header "# pxname,svname,…,status,…"
// and a row per frontend, server and backend.
func parseStatus(out string) map[string]string {
	lines := strings.Split(out, "\n")
	head := strings.Split(strings.TrimPrefix(lines[0], "# "), ",")
	col := slices.Index(head, "status")
	m := map[string]string{}
	for _, line := range lines[1:] {
		f := strings.Split(line, ",")
		if col < 0 || len(f) <= col || f[0] != "apiservers" || f[1] == "BACKEND" {
			continue
		}
		m[f[1]] = f[col]
	}
	return m
}

// Sessions maps the client port of each connection the balancer carries to
// the apiserver it goes to (by component name), from HAProxy's "show sess".
func (b *Balancer) Sessions() (map[int]string, error) {
	out, err := b.Command("show sess")
	if err != nil {
		return nil, err
	}
	return parseSessions(out), nil
}

// parseSessions reads "show sess" lines: "0x…: proto=tcpv4
// src=127.0.0.1:53672 fe=apiserver be=apiservers srv=kube-apiserver0 …".
func parseSessions(out string) map[int]string {
	m := map[int]string{}
	for _, line := range strings.Split(out, "\n") {
		var src, srv string
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "src="); ok {
				src = v
			} else if v, ok := strings.CutPrefix(f, "srv="); ok {
				srv = v
			}
		}
		_, port, err := net.SplitHostPort(src)
		if err != nil || srv == "" || srv == "<none>" {
			continue
		}
		var p int
		if _, err := fmt.Sscan(port, &p); err == nil {
			m[p] = srv
		}
	}
	return m
}
