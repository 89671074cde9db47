package localcluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/kubelock/kubelock/internal/proc"
)

// Etcd is an etcd cluster on loopback: one member or three (a real cluster,
// the members joined by their peer URLs).
type Etcd struct {
	Members []*Member
}

// Member is one etcd member; Stop and Start it to take it out of the
// cluster and bring it back with its data.
type Member struct {
	*Component
	// ClientURL and PeerURL are where it serves clients and its peers.
	ClientURL string
	PeerURL   string
}

// newEtcd lays out the members of o: named etcd (alone) or etcd0, etcd1...,
// each with its data in o.Dir/<name>, ports from o.EtcdPorts or free ones.
func newEtcd(o *Options) (*Etcd, error) {
	n := max(o.EtcdMembers, 1)
	e := &Etcd{}
	var peers []string
	for i := range n {
		ports, err := etcdPorts(o.EtcdPorts, i)
		if err != nil {
			return nil, err
		}
		name := "etcd"
		if n > 1 {
			name = fmt.Sprintf("etcd%d", i)
		}
		m := &Member{
			Component: &Component{Name: name, Path: filepath.Join(o.AssetsDir, "etcd"), LogPath: filepath.Join(o.LogDir, name+".log"),
				Readiness: "healthy", StartTimeout: o.StartTimeout},
			ClientURL: fmt.Sprintf("http://127.0.0.1:%d", ports.Client),
			PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", ports.Peer),
		}
		m.Ready = m.healthy
		peers = append(peers, name+"="+m.PeerURL)
		e.Members = append(e.Members, m)
	}
	for _, m := range e.Members {
		m.Args = withFlags(m.flags(o, strings.Join(peers, ",")), o.EtcdArgs)
	}
	return e, nil
}

// etcdPorts are member i's ports: given, or free ones.
func etcdPorts(given []EtcdPorts, i int) (EtcdPorts, error) {
	if i < len(given) {
		return given[i], nil
	}
	client, err := proc.FreePort()
	if err != nil {
		return EtcdPorts{}, err
	}
	peer, err := proc.FreePort()
	return EtcdPorts{Client: client, Peer: peer}, err
}

func (m *Member) flags(o *Options, initialCluster string) []string {
	f := []string{
		"--name=" + m.Name,
		"--data-dir=" + filepath.Join(o.Dir, m.Name),
		"--listen-client-urls=" + m.ClientURL, "--advertise-client-urls=" + m.ClientURL,
		"--listen-peer-urls=" + m.PeerURL, "--initial-advertise-peer-urls=" + m.PeerURL,
		"--initial-cluster=" + initialCluster, "--initial-cluster-state=new", "--initial-cluster-token=" + o.Name,
		"--listen-metrics-urls=", // none
		"--log-level=warn",
	}
	if !o.Persist {
		f = append(f, "--unsafe-no-fsync") // throwaway data: start and write fast
	}
	return f
}

// healthy is etcd's own health check: the member has a leader and serves reads.
func (m *Member) healthy(ctx context.Context) error {
	_, err := proc.GetOK(ctx, &http.Client{Timeout: time.Second}, m.ClientURL+"/health")
	return err
}

// StartEtcd starts an etcd of its own, laid out as Start lays out a
// cluster's (o's Name, Dir, LogDir, AssetsDir, Persist, StartTimeout and
// etcd fields): a store beside the cluster's, such as an aggregated API
// server's. It returns once every member is healthy; stop it with Stop.
func StartEtcd(ctx context.Context, o Options) (*Etcd, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	if err := prepareDirs(&o); err != nil {
		return nil, err
	}
	e, err := newEtcd(&o)
	if err != nil {
		return nil, err
	}
	if err := e.start(ctx); err != nil {
		return nil, errors.Join(err, e.Stop())
	}
	return e, nil
}

// Stop stops every member.
func (e *Etcd) Stop() error { return StopAll(e.Components()) }

// Components are the members', in order.
func (e *Etcd) Components() []*Component {
	var cs []*Component
	for _, m := range e.Members {
		cs = append(cs, m.Component)
	}
	return cs
}

// start starts every member, then waits for each: a member of three is
// healthy only once a quorum runs.
func (e *Etcd) start(ctx context.Context) error {
	for _, m := range e.Members {
		if err := m.launch(); err != nil {
			return err
		}
	}
	for _, m := range e.Members {
		if err := m.WaitReady(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Endpoints are the members' client URLs.
func (e *Etcd) Endpoints() []string {
	var urls []string
	for _, m := range e.Members {
		urls = append(urls, m.ClientURL)
	}
	return urls
}
