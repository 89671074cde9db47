// Command worker is the agent sample's app (deployment_agent.yaml, image
// invoice-worker): it takes a lock per work item through the kubelock agent
// beside it, over plain HTTP as an app in any language would, and fences every
// write of the item's work with the lock's token. kubelock-dev --node builds it.
//
// It loops over $ITEMS until SIGTERM: for each item it waits for the item's
// lock (POST /v1/locks/ITEM?wait=), writes $STEPS rows with the token,
// $STEP_SECONDS apart (default 1), and releases the lock. With $PG_DSN set the rows go to the table work through
// pkg/fencing/postgres, which refuses a token older than one it accepted for
// the same lock; a refused write ends the item's work (the lock was lost).
// Without it the writes are only printed.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kubelock/kubelock/pkg/fencing/postgres"
)

// holding is the part of the agent's answer the worker uses.
type holding struct {
	Lock         string `json:"lock"` // namespace/name: what the fence checks
	LeaseID      string `json:"leaseID"`
	FencingToken int64  `json:"fencingToken"`
	Error        string `json:"error"`
}

var (
	agent = envOr("KUBELOCK_AGENT", "http://127.0.0.1:8477")
	pod   = os.Getenv("POD_NAME")
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	items := strings.Fields(envOr("ITEMS", "invoice-1 invoice-2 invoice-3"))
	steps, err := strconv.Atoi(envOr("STEPS", "3"))
	if err != nil {
		return fmt.Errorf("STEPS: %w", err)
	}
	pause, err := strconv.ParseFloat(envOr("STEP_SECONDS", "1"), 64)
	if err != nil {
		return fmt.Errorf("STEP_SECONDS: %w", err)
	}
	w := worker{steps: steps, pause: time.Duration(pause * float64(time.Second)), write: printWrite}
	if dsn := os.Getenv("PG_DSN"); dsn != "" {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer func() { _ = conn.Close(context.Background()) }()
		w.write = fencedWrite(postgres.NewGuard(conn))
	}
	for ctx.Err() == nil {
		for _, item := range items {
			if err := w.work(ctx, item); err != nil && ctx.Err() == nil {
				fmt.Printf("%s: %v\n", item, err)
				time.Sleep(time.Second) // the agent is not ready, or refused: try again
			}
		}
	}
	return nil
}

// worker does the work of an item: steps writes, pause apart.
type worker struct {
	steps int
	pause time.Duration
	write writeFunc
}

// work takes item's lock, writes w.steps rows with its token and releases it.
func (w worker) work(ctx context.Context, item string) error {
	h, err := call(ctx, http.MethodPost, item, "", "wait=60s&lease=30s")
	if err != nil {
		return err
	}
	fmt.Printf("took %s token %d\n", item, h.FencingToken)
steps:
	for step := range w.steps {
		if err := w.write(ctx, item, h, step); err != nil {
			fmt.Printf("stopped %s token %d: %v\n", item, h.FencingToken, err)
			break
		}
		if step == w.steps-1 {
			break // done: release at once
		}
		select {
		case <-ctx.Done():
			break steps
		case <-time.After(w.pause):
		}
		if _, err := call(ctx, http.MethodPost, item, "/renew", "leaseID="+h.LeaseID); err != nil { // a long item keeps its lease
			fmt.Printf("stopped %s token %d: %v\n", item, h.FencingToken, err)
			break
		}
	}
	// Released even when the pod is stopping: the next holder need not wait.
	_, err = call(context.WithoutCancel(ctx), http.MethodDelete, item, "", "leaseID="+h.LeaseID)
	return err
}

type writeFunc func(ctx context.Context, item string, h holding, step int) error

// fencedWrite inserts a row in the transaction that checks the token.
func fencedWrite(guard *postgres.Guard) writeFunc {
	return func(ctx context.Context, item string, h holding, step int) error {
		return guard.Do(ctx, h.Lock, h.FencingToken, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO work (item, pod, token, step) VALUES ($1, $2, $3, $4)`, item, pod, h.FencingToken, step)
			return err
		})
	}
}

func printWrite(_ context.Context, item string, h holding, step int) error {
	fmt.Printf("wrote %s token %d step %d\n", item, h.FencingToken, step)
	return nil
}

// call sends one request about item's lock to the agent: the key is one
// escaped path segment, action "" or "/renew".
func call(ctx context.Context, method, item, action, query string) (holding, error) {
	var h holding
	u := agent + "/v1/locks/" + url.PathEscape(item) + action + "?" + query
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return h, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return h, err
	}
	defer func() { _ = resp.Body.Close() }()
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		return h, fmt.Errorf("%s %s: %d, %w", method, u, resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusOK {
		return h, errors.New(h.Error)
	}
	return h, nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
