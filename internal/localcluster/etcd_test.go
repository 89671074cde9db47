package localcluster_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kubelock/kubelock/internal/localcluster"
)

// TestStartEtcd: an etcd of its own, beside no cluster, serves and stops.
func TestStartEtcd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := localcluster.StartEtcd(ctx, localcluster.Options{Name: "store", Dir: t.TempDir(), AssetsDir: localcluster.AssetsDir(filepath.Join("..", ".."))})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Stop() }()
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cli.Close() }()
	if _, err := cli.Put(ctx, "/k", "v"); err != nil {
		t.Fatal(err)
	}
	if got, err := cli.Get(ctx, "/k"); err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "v" {
		t.Fatalf("get /k: %v, %v", got, err)
	}
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, m := range e.Members {
		if m.Running() != nil {
			t.Errorf("%s still runs after Stop", m.Name)
		}
	}
}
