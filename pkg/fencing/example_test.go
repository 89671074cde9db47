package fencing_test

import (
	"fmt"
	"net/http"

	"k8s.io/client-go/rest"

	"github.com/kubelock/kubelock/pkg/fencing"
)

// A service guarded by the lock shop/orders-db accepts only tokens that lock
// issued, and never a lower one than it accepted before.
func ExampleMiddleware() {
	var cfg *rest.Config // the service's own connection: get, list, watch on distributedlocks
	verifier, err := fencing.NewAPIVerifierForConfig(cfg)
	if err != nil {
		panic(err)
	}
	defer verifier.Close()
	orders := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	http.Handle("/orders", fencing.Middleware(fencing.Fence{
		// The service names its lock; the client's Kubelock-Lock header
		// ("orders-db", as fencing.Transport sends Holding.Key) only picks it.
		Locks:    map[string]fencing.LockRef{"orders-db": {Namespace: "shop", Name: "orders-db"}},
		Verifier: verifier,
		Store:    fencing.NewMemoryStore(),
	}, orders))
}

// Each permit of the Semaphore shop/shards guards its own shard: the fence
// key of a slot is "namespace/name/slot", and the verifier accepts there only
// tokens the lock issued to that slot.
func ExampleLockRef_WithSlot() {
	shards := fencing.LockRef{Namespace: "shop", Name: "shards"}
	fmt.Println(shards.WithSlot(2))
	ref, err := fencing.ParseLockRef("shop/shards/2")
	fmt.Println(*ref.Slot, err)
	// Output:
	// shop/shards/2
	// 2 <nil>
}
