package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"
)

// devBinary is the local environment's program. It is a binary of its own
// (cmd/kubelock-dev) so that kubelock, which ships in sidecar images, links no
// operator code; `kubelock dev` only hands over to it.
const devBinary = "kubelock-dev"

func newDevCommand(*options) *cobra.Command {
	return &cobra.Command{
		Use:   "dev [flags]",
		Short: "Run " + devBinary + " (next to kubelock or on PATH): a local kubelock until Ctrl-C",
		Long: `dev replaces this process with ` + devBinary + `, found next to kubelock or on PATH,
with the same arguments: a local kubelock until Ctrl-C. "make dev" builds and runs
it; "make ` + devBinary + `" builds it into bin/. "kubelock dev --help" is its help.`,
		DisableFlagParsing: true,
		RunE: func(_ *cobra.Command, args []string) error {
			bin := ""
			if self, err := os.Executable(); err == nil {
				bin = filepath.Join(filepath.Dir(self), devBinary)
			}
			if _, err := os.Stat(bin); err != nil {
				if bin, err = exec.LookPath(devBinary); err != nil {
					return errorf("kubelock dev runs %s, which is neither next to kubelock nor on PATH: build it with `make %s` (or run `make dev`)", devBinary, devBinary)
				}
			}
			// Exec, not a child: signals, the exit code and the process tree stay as if it had been run itself.
			if err := syscall.Exec(bin, append([]string{bin}, args...), os.Environ()); err != nil {
				return errorf("running %s: %w", bin, err)
			}
			return nil
		},
	}
}
