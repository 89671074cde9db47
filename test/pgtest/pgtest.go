// Package pgtest starts a throwaway PostgreSQL server on loopback for tests:
// the real server from the machine's PostgreSQL packages (hack/install-postgres.sh
// installs them), in a temporary data folder, stopped and removed afterwards.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"

	"github.com/kubelock/kubelock/internal/proc"
)

// Server is a running PostgreSQL server.
type Server struct {
	dir  string
	bin  string
	port int
	run  []string // prefix that runs a command as the server's OS user
}

// Start initialises a new cluster in a temporary folder and starts it on a free
// loopback port. Binaries come from $PG_BIN, else the newest
// /usr/lib/postgresql/*/bin. PostgreSQL refuses to run as root, so as root the
// server runs as the "postgres" user that the Debian package creates. It also
// listens on the addresses in listen, open to any client (pods on a node).
func Start(ctx context.Context, listen ...string) (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kubelock-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgtest: running as root needs the postgres OS user (install PostgreSQL with hack/install-postgres.sh): %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
		s.run = []string{"runuser", "-u", "postgres", "--"}
	}
	if s.port, err = proc.FreePort(); err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if out, err := s.cmd(ctx, "initdb", "-D", data, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8").CombinedOutput(); err != nil {
		s.cleanup()
		return nil, fmt.Errorf("pgtest: initdb: %w: %s", err, out)
	}
	if len(listen) > 0 {
		if err := appendFile(filepath.Join(data, "pg_hba.conf"), "host all all 0.0.0.0/0 trust\n"); err != nil {
			s.cleanup()
			return nil, err
		}
	}
	addrs := strings.Join(append([]string{"127.0.0.1"}, listen...), ",")
	opts := fmt.Sprintf("-c listen_addresses=%s -p %d -k %s -c fsync=off -c max_connections=200", addrs, s.port, dir)
	if out, err := s.cmd(ctx, "pg_ctl", "-D", data, "-o", opts, "-l", filepath.Join(dir, "log"), "-w", "-t", "60", "start").CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		s.cleanup()
		return nil, fmt.Errorf("pgtest: starting postgres: %w: %s %s", err, out, log)
	}
	return s, nil
}

// DSN is a connection string for database db as the superuser.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// CreateDatabase makes a fresh database and returns its DSN.
func (s *Server) CreateDatabase(ctx context.Context, name string) (string, error) {
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", err
	}
	return s.DSN(name), nil
}

// Stop stops the server and removes its folder.
func (s *Server) Stop() error {
	out, err := s.cmd(context.Background(), "pg_ctl", "-D", filepath.Join(s.dir, "data"), "-m", "immediate", "-w", "stop").CombinedOutput()
	s.cleanup()
	if err != nil {
		return fmt.Errorf("pgtest: stopping postgres: %w: %s", err, out)
	}
	return nil
}

func (s *Server) cleanup() { _ = os.RemoveAll(s.dir) }

func (s *Server) cmd(ctx context.Context, name string, args ...string) *exec.Cmd {
	argv := append(append(append([]string(nil), s.run...), filepath.Join(s.bin, name)), args...)
	c := exec.CommandContext(ctx, argv[0], argv[1:]...)
	c.Dir = s.dir
	// Its own process group, so a test's Ctrl-C does not reach the server first.
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return c
}

func binDir() (string, error) {
	if b := os.Getenv("PG_BIN"); b != "" {
		return b, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) < version(dirs[j]) })
	if len(dirs) == 0 {
		return "", errors.New("pgtest: no PostgreSQL server found under /usr/lib/postgresql; install it with hack/install-postgres.sh or set PG_BIN")
	}
	return dirs[len(dirs)-1], nil
}

func version(binDir string) int {
	v, _ := strconv.Atoi(strings.Split(filepath.Base(filepath.Dir(binDir)), ".")[0])
	return v
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	return errors.Join(err, f.Close())
}
