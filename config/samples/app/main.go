// Command app is the samples' stand-in workload: the image orders-writer of
// deployment_sidecar.yaml and, next to kubelock, orders-migrations of
// job_kubelock_run.yaml; kubelock-dev --node builds both. It prints when it
// started and stopped and its fencing token ("none" when it has none), also
// into $RECORD_DIR/$POD_NAME when RECORD_DIR is set (the cluster suite reads
// them there after the pod is gone). With $PG_DSN set it writes fenced rows
// (pkg/fencing/postgres) to the table rows while it runs: one every 50 ms, each
// with its pod and token; a write refused for a stale token is recorded as "stale".
//
// With no argument it is the sidecar sample's main container: the token is in
// $FENCING_TOKEN_FILE, and it writes until the token changes or SIGTERM. With
// the argument "migrate" it is the work `kubelock run` starts in the Job
// sample: the token is $KUBELOCK_FENCING_TOKEN; it writes for 1 s and exits.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kubelock/kubelock/pkg/fencing"
	"github.com/kubelock/kubelock/pkg/fencing/postgres"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	job := len(os.Args) > 1 && os.Args[1] == "migrate"
	token := fileToken
	lock := "default/orders-db"
	if job {
		token = func() string { return envOr("KUBELOCK_FENCING_TOKEN", "none") }
		lock = "default/" + envOr("KUBELOCK_LOCK", "orders-db")
	}
	start := token()
	record("start", start)
	if job {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Second)
		defer cancel()
	}
	write(ctx, lock, start, token)
	record("stop", token())
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func fileToken() string {
	data, err := os.ReadFile(os.Getenv("FENCING_TOKEN_FILE"))
	if err != nil {
		return "none"
	}
	return strings.TrimSpace(string(data))
}

// write inserts fenced rows with token start until ctx ends (or, without a
// database, just waits for it), and stops writing once the token changed.
func write(ctx context.Context, lock, start string, token func() string) {
	tok, err := strconv.ParseInt(start, 10, 64)
	dsn := os.Getenv("PG_DSN")
	if dsn == "" || err != nil {
		<-ctx.Done()
		return
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		record("error", strings.ReplaceAll(err.Error(), " ", "_"))
		<-ctx.Done()
		return
	}
	defer func() { _ = conn.Close(context.Background()) }()
	guard := postgres.NewGuard(conn)
	pod := os.Getenv("POD_NAME")
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for token() == start {
		err := guard.Do(ctx, lock, tok, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO rows (pod, token) VALUES ($1, $2)`, pod, tok)
			return err
		})
		if stale := (*fencing.StaleTokenError)(nil); errors.As(err, &stale) {
			record("stale", start)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
	<-ctx.Done()
}

func record(event, token string) {
	line := fmt.Sprintf("%s %d %s\n", event, time.Now().UnixNano(), token)
	fmt.Print(line)
	dir := os.Getenv("RECORD_DIR")
	if dir == "" {
		return
	}
	f, err := os.OpenFile(filepath.Join(dir, os.Getenv("POD_NAME")), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	_, _ = f.WriteString(line)
	_ = f.Close()
}
