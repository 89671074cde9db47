package lock

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
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

// errKeyCollision: the lock of a key's name is another key's (collidingKey).
// Reading it again cannot help.
var errKeyCollision = errors.New("kubelock: two keys map to one lock name")

// KeyOf is the business key obj is the lock of: its key annotation when
// that key's name is obj's, else its name. Whoever creates a lock writes the
// annotation, and a lock user may create the lock of someone else's key
// first naming another key there (no admission engine can tell which key a
// name comes from: a policy computes no hash), so an annotation of a key of
// another name says nothing about obj.
func KeyOf(obj *locksv1alpha1.DistributedLock) string {
	if k, ok := obj.Annotations[locksv1alpha1.KeyAnnotation]; ok && namesTo(k, obj.Name) {
		return k
	}
	return obj.Name
}

// collidingKey is the key in obj's key annotation when it is another key
// whose name is obj's too (two keys that map to one name), so that obj is
// not key's lock. An annotation of a key of another name is ignored (KeyOf).
func collidingKey(obj *locksv1alpha1.DistributedLock, key string) (string, bool) {
	k, ok := obj.Annotations[locksv1alpha1.KeyAnnotation]
	return k, ok && k != key && namesTo(k, obj.Name)
}

// namesTo reports whether key's lock is called name.
func namesTo(key, name string) bool {
	n, err := NameForKey(key)
	return err == nil && n == name
}
