package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// etcdPrefix is the kube-apiserver's default --etcd-prefix, which envtest keeps.
const etcdPrefix = "/registry"

// RewriteStored changes an object as stored in etcd, behind the apiserver's
// back: no admission, no schema validation. Tests use it to plant objects that
// no API write could create (e.g. a time the Go types cannot parse), whatever
// the installed CRD allows. change edits the stored JSON (custom resources are
// stored as JSON); the write is conditioned on the revision read, and the
// apiserver's watch delivers the new object to every client.
func (e *Env) RewriteStored(ctx context.Context, gr schema.GroupResource, key types.NamespacedName, change func(obj map[string]any)) error {
	return RewriteKey(ctx, e.Cluster.Etcd.Endpoints(), StoragePath(etcdPrefix, gr, key), change)
}

// StoragePath is where an apiserver whose etcd prefix is prefix keeps the
// object key of gr.
func StoragePath(prefix string, gr schema.GroupResource, key types.NamespacedName) string {
	if gr.Group == "" {
		return fmt.Sprintf("%s/%s/%s/%s", prefix, gr.Resource, key.Namespace, key.Name)
	}
	return fmt.Sprintf("%s/%s/%s/%s/%s", prefix, gr.Group, gr.Resource, key.Namespace, key.Name)
}

// RewriteKey changes the JSON object stored at path in the etcd at
// endpoints, as RewriteStored does.
func RewriteKey(ctx context.Context, endpoints []string, path string, change func(obj map[string]any)) error {
	cli, err := dialEtcd(endpoints)
	if err != nil {
		return err
	}
	defer func() { _ = cli.Close() }()
	kv, err := getStored(ctx, cli, path)
	if err != nil {
		return err
	}
	var obj map[string]any
	if err := json.Unmarshal(kv.Value, &obj); err != nil {
		return fmt.Errorf("testenv: %s is not stored as JSON: %w", path, err)
	}
	change(obj)
	data, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(path), "=", kv.ModRevision)).
		Then(clientv3.OpPut(path, string(data))).
		Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return fmt.Errorf("testenv: %s changed meanwhile", path)
	}
	return nil
}

// Stored is an object's value as etcd holds it: the bytes the apiserver's
// write request carried (custom resources are stored as JSON).
func (e *Env) Stored(ctx context.Context, gr schema.GroupResource, key types.NamespacedName) ([]byte, error) {
	cli, err := dialEtcd(e.Cluster.Etcd.Endpoints())
	if err != nil {
		return nil, err
	}
	defer func() { _ = cli.Close() }()
	kv, err := getStored(ctx, cli, StoragePath(etcdPrefix, gr, key))
	if err != nil {
		return nil, err
	}
	return kv.Value, nil
}

func getStored(ctx context.Context, cli *clientv3.Client, path string) (*mvccpb.KeyValue, error) {
	got, err := cli.Get(ctx, path)
	if err != nil {
		return nil, err
	}
	if len(got.Kvs) != 1 {
		return nil, fmt.Errorf("testenv: %s is not stored in etcd", path)
	}
	return got.Kvs[0], nil
}

func dialEtcd(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 10 * time.Second})
}
