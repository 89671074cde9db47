package proc

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// GetOK is a readiness check's GET: the body (at most 64 KiB) of a 200 answer, else an error.
func GetOK(ctx context.Context, hc *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return string(body), err
}

// InsecureTransport is for the health endpoints of the Kubernetes components,
// whose serving certificates are self-signed, in memory: /healthz is all a
// client with it reads.
func InsecureTransport() *http.Transport {
	return &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // a local health probe
}
