package lockapiserver

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestValidateNamesTheFlag: each bad flag is refused with its name, and the
// defaults with the required flags set pass.
func TestValidateNamesTheFlag(t *testing.T) {
	valid := func() *Options {
		o := NewOptions()
		o.ControllerUsers = []string{"system:serviceaccount:kubelock-system:kubelock-controller-manager"}
		o.Recommended.Etcd.StorageConfig.Transport.ServerList = []string{"http://127.0.0.1:2379"}
		return o
	}
	if errs := valid().Validate(); len(errs) > 0 {
		t.Fatalf("the defaults with the required flags: %v", errors.Join(errs...))
	}
	for _, tc := range []struct {
		edit func(*Options)
		want string
	}{
		{func(o *Options) { o.ControllerUsers = nil }, "--controller-users is required"},
		{func(o *Options) { o.StorageEncoding = "protobuf" }, `--storage-encoding must be json or cbor, not "protobuf"`},
		{func(o *Options) { o.ShutdownDelay = -time.Second }, "--shutdown-delay-duration must not be negative, not -1s"},
	} {
		o := valid()
		tc.edit(o)
		if err := errors.Join(o.Validate()...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want an error with %q", err, tc.want)
		}
	}
}
