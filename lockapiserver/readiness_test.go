package lockapiserver

import (
	"crypto/x509"
	"testing"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

// ca is a CA bundle provider whose content the test sets, as the
// ConfigMap's informer fills the real one.
type ca struct{ pem string }

func (c *ca) Name() string                              { return "test" }
func (c *ca) CurrentCABundleContent() []byte            { return []byte(c.pem) }
func (c *ca) VerifyOptions() (x509.VerifyOptions, bool) { return x509.VerifyOptions{}, c.pem != "" }
func (c *ca) AddListener(dynamiccertificates.Listener)  {}

func TestAuthenticationCAsLoaded(t *testing.T) {
	const clients, front, other = "-----CLIENTS CA-----\n", "-----FRONT PROXY CA-----\n", "-----ANOTHER CA-----\n"
	published := map[string]string{clientCAKey: clients, requestHeaderClientCAKey: front}
	for _, tc := range []struct {
		name              string
		data              map[string]string
		clientCA, frontCA string
		// fromFile: the server's flags give this CA as a file, so it
		// does not wait for the ConfigMap's.
		clientFromFile, frontFromFile bool
		noFrontProxy, loaded          bool
	}{
		{name: "nothing loaded", data: published},
		{name: "only the clients' CA", data: published, clientCA: clients},
		{name: "only the front proxy's", data: published, frontCA: front},
		{name: "both", data: published, clientCA: clients, frontCA: front, loaded: true},
		{name: "the same CA for both, only the front proxy's loaded", data: map[string]string{clientCAKey: front, requestHeaderClientCAKey: front}, frontCA: front},
		{name: "the same CA for both, both loaded", data: map[string]string{clientCAKey: front, requestHeaderClientCAKey: front}, clientCA: front, frontCA: front, loaded: true},
		{name: "an older clients' CA than published", data: published, clientCA: other, frontCA: front},
		{name: "no clients' CA published", data: map[string]string{requestHeaderClientCAKey: front}, frontCA: front, loaded: true},
		{name: "no front proxy published", data: map[string]string{clientCAKey: clients}, clientCA: clients, loaded: true},
		{name: "no front proxy configured, clients' CA not loaded", data: published, noFrontProxy: true},
		{name: "no front proxy configured, clients' CA loaded", data: published, clientCA: clients, noFrontProxy: true, loaded: true},
		{name: "the front proxy's CA from a file", data: published, clientCA: clients, frontCA: other, frontFromFile: true, loaded: true},
		{name: "the clients' CA from a file, the front proxy's not loaded", data: published, clientCA: other, clientFromFile: true},
		{name: "nothing published", data: map[string]string{}, loaded: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, f := &ca{tc.clientCA}, &ca{tc.frontCA}
			// As k8s.io/apiserver joins them: the clients' CA, then the front proxy's.
			a := authenticationCAs{serving: dynamiccertificates.NewUnionCAContentProvider(c, f), requestHeader: f,
				clientCA: !tc.clientFromFile, frontProxy: !tc.frontFromFile}
			if tc.noFrontProxy {
				a = authenticationCAs{serving: c, clientCA: true, frontProxy: true}
			}
			err := a.loaded(tc.data)
			if (err == nil) != tc.loaded {
				t.Errorf("loaded: %v, want loaded %v", err, tc.loaded)
			}
		})
	}
}
