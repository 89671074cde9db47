// Command sessionholder is the CLI suite's session client: a process that
// holds several locks in one session, for the suite to SIGSTOP. It prints
// "held KEY TOKEN" per lock and "ready", then answers stdin lines:
//
//	status  waits up to 5s for the session and its locks to end, then prints
//	        "status KEY done=BOOL expires=UNIXNANO" per lock
//	write   writes "KEY TOKEN" rows to PostgreSQL through pkg/fencing's Guard,
//	        whether or not the lock still holds (a late writer), and prints
//	        "write KEY TOKEN ok" or "write KEY TOKEN refused: ERR" per lock
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubelock/kubelock/pkg/fencing/postgres"
	"github.com/kubelock/kubelock/pkg/lock"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the lock user")
	ns := flag.String("namespace", "default", "namespace of the locks")
	ttl := flag.Duration("ttl", 5*time.Second, "session TTL")
	dsn := flag.String("pg", "", "PostgreSQL DSN of the protected table")
	flag.Parse()
	if err := run(*kubeconfig, *ns, *ttl, *dsn, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "sessionholder:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, ns string, ttl time.Duration, dsn string, keys []string) error {
	ctx := context.Background()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	c, err := lock.New(cfg, lock.WithNamespace(ns), lock.WithIdentity("sessionholder"))
	if err != nil {
		return err
	}
	db, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	guard := postgres.NewGuard(db)
	s, err := c.NewSession(ctx, lock.WithTTL(ttl))
	if err != nil {
		return err
	}
	locks := make([]*lock.Lock, len(keys))
	for i, k := range keys {
		if locks[i], err = c.TryAcquire(ctx, k, lock.WithSession(s)); err != nil {
			return err
		}
		fmt.Printf("held %s %d\n", k, locks[i].FencingToken())
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch strings.TrimSpace(in.Text()) {
		case "status":
			// A lock's context is a child of its session's, cancelled just
			// after the session's Done closes: wait for the locks too,
			// within the same bound.
			bound := time.After(5 * time.Second)
			select {
			case <-s.Done():
			case <-bound:
			}
			for _, l := range locks {
				select {
				case <-l.Done():
				case <-bound:
				}
			}
			for _, l := range locks {
				fmt.Printf("status %s done=%t expires=%d\n", l.Key(), l.Err() != nil, l.ExpiresAt().UnixNano())
			}
		case "write":
			for _, l := range locks {
				err := guard.Do(ctx, l.Key(), l.FencingToken(), func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "INSERT INTO writes (key, token) VALUES ($1, $2)", l.Key(), l.FencingToken())
					return err
				})
				if err != nil {
					fmt.Printf("write %s %d refused: %v\n", l.Key(), l.FencingToken(), err)
				} else {
					fmt.Printf("write %s %d ok\n", l.Key(), l.FencingToken())
				}
			}
		}
	}
	return in.Err()
}
