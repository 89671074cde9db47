package lock

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

const (
	// maxPlainName is the longest key used verbatim as an object name; longer
	// ones are shortened so names stay readable in kubectl.
	maxPlainName = 63
	prefixLen    = 40
	hashLen      = 12
	// maxKeyLen is the longest key a client takes.
	maxKeyLen = 1024
)

// NameForKey maps a business key to the lock object's name. A key that already
// is a valid short object name is used as it is; any other key becomes a
// normalised prefix plus a short hash of the whole key, and the client keeps the
// key itself in the locks.kubelock.io/key annotation.
func NameForKey(key string) (string, error) {
	if key == "" {
		return "", fmt.Errorf("kubelock: lock key must not be empty")
	}
	if len(key) > maxKeyLen {
		return "", fmt.Errorf("kubelock: lock key is %d bytes long; the limit is %d", len(key), maxKeyLen)
	}
	if len(key) <= maxPlainName && len(validation.IsDNS1123Subdomain(key)) == 0 {
		return key, nil
	}
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(key) {
		ok := (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9')
		switch {
		case ok:
			b.WriteRune(r)
			dash = false
		case !dash && b.Len() > 0:
			b.WriteByte('-')
			dash = true
		}
		if b.Len() >= prefixLen {
			break
		}
	}
	prefix := strings.Trim(b.String(), "-")
	if prefix == "" {
		prefix = "key"
	}
	sum := sha256.Sum256([]byte(key))
	return prefix + "-" + hex.EncodeToString(sum[:])[:hashLen], nil
}
