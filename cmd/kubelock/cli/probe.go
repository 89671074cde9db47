package cli

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/spf13/cobra"
)

// newProbeCommand is the sidecar's and the agent's probe for exec probes:
// they listen on localhost, which the kubelet's HTTP probes (sent to the
// pod's IP) cannot reach, and their image has no shell or HTTP client
// besides kubelock.
func newProbeCommand(o *options) *cobra.Command {
	var (
		listen  string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "probe readyz|healthz",
		Short: "Ask a sidecar or agent in the same pod for /readyz or /healthz (for exec probes); exit 0 when it answers 200",
		Example: `  readinessProbe:
    exec: {command: ["/kubelock", "probe", "readyz"]}`,
		Args: exactArgs(1, "readyz or healthz"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] != "readyz" && args[0] != "healthz" {
				return usageErrorf("expected readyz or healthz, got %q", args[0])
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			url := "http://" + listen + "/" + args[0]
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return usageErrorf("--listen %s: %v", listen, err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return errorf("%s: %w", url, err)
			}
			defer func() { _ = resp.Body.Close() }()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
			if resp.StatusCode != http.StatusOK {
				return errorf("%s: %s: %s", url, resp.Status, body)
			}
			_, err = o.streams.Out.Write(body)
			return err
		},
	}
	cmd.Flags().StringVar(&listen, "listen", DefaultListen, "the sidecar's or agent's --listen address")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Second, "how long to wait for the answer")
	return cmd
}
