// Package upgrade upgrades kubelock from the previous release to this one
// while the previous release's clients hold, share and queue for locks, as
// an operator upgrades a cluster: the previous release's CRDs, webhook
// configuration and operator first, then this release's CRDs applied over
// them, this release's operator started beside the old one, the webhook
// configuration pointed at it, and the old operator stopped. The previous
// release is built from git history by hack/build-previous-release.sh
// (`make previous-release`), into the folder UPGRADE_FROM_BUILD names.
package upgrade

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubelock/kubelock/test/suite"
	"github.com/kubelock/kubelock/test/testenv"
)

// PreviousReleaseEnv names the folder of the previous release's build.
const PreviousReleaseEnv = "UPGRADE_FROM_BUILD"

var (
	// previous holds the previous release's manager, kubelock and config/.
	previous string
	// current holds this release's manager, built by the suite.
	current string
	// workDir holds kubeconfigs and the files that end the wrapped commands.
	workDir string
)

func TestUpgrade(t *testing.T) {
	suite.Run(t, "upgrade from the previous release", 60*time.Second, 100*time.Millisecond)
}

var _ = BeforeSuite(func(ctx SpecContext) {
	previous = os.Getenv(PreviousReleaseEnv)
	Expect(previous).NotTo(BeEmpty(), "%s names the previous release's build (make previous-release; make test sets it)", PreviousReleaseEnv)
	for _, f := range []string{"manager", "kubelock", "config/crd/bases", "config/webhook"} {
		_, err := os.Stat(filepath.Join(previous, f))
		Expect(err).NotTo(HaveOccurred(), "the previous release's build in %s lacks %s: run make previous-release", previous, f)
	}
	workDir = GinkgoT().TempDir()
	var err error
	current, err = testenv.Build(ctx, GinkgoT().TempDir(), "./cmd/manager")
	Expect(err).NotTo(HaveOccurred())
})
