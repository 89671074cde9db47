package node

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/kubelock/kubelock/internal/localcluster"
)

func (n *Node) containerdSocket() string { return n.dir("containerd", "containerd.sock") }

// startContainerd starts containerd with the CNI bridge and imports the images.
func (n *Node) startContainerd(ctx context.Context) error {
	bin, err := filepath.Abs(n.o.BinDir)
	if err != nil {
		return err
	}
	cniConf := n.dir("cni", "net.d")
	if _, err := n.writeConfig(filepath.Join("cni", "net.d", "10-kubelock-dev.conflist"), n.cniConfig()); err != nil {
		return err
	}
	cfgPath, err := n.writeConfig(filepath.Join("containerd", "config.toml"), n.containerdConfig(bin, cniConf))
	if err != nil {
		return err
	}
	n.Containerd = &localcluster.Component{
		Name: "containerd", Path: filepath.Join(bin, "containerd"), Args: []string{"--config", cfgPath, "--log-level", "warn"},
		Env:       append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH")), // the shim and runc
		LogPath:   filepath.Join(n.cluster.LogDir(), "containerd.log"),
		Ready:     func(ctx context.Context) error { return n.ctr(ctx, "version") },
		Readiness: "serving", StartTimeout: n.o.StartTimeout,
	}
	if err := n.Containerd.Start(ctx); err != nil {
		return err
	}
	if err := n.ctr(ctx, "images", "import", "--platform", "linux/"+runtime.GOARCH, n.archive); err != nil {
		return fmt.Errorf("importing the images: %w", err)
	}
	n.o.Progress("containerd up; images imported")
	return nil
}

// cniConfig is the pods' network: the bridge's gateway is the host, so pods
// reach the apiserver on the node IP without masquerading, and the plugins
// leave no iptables rules behind.
func (n *Node) cniConfig() string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "kubelock-dev",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, bridgeName, podCIDR, n.dir("cni", "ipam"))
}

// containerdConfig: cgroupfs (these machines have cgroup v1 and no systemd
// cgroup driver), and restrict_oom_score_adj: root may lack
// CAP_SYS_RESOURCE, and runc then fails to lower a sandbox's OOM score.
func (n *Node) containerdConfig(bin, cniConf string) string {
	return fmt.Sprintf(`version = 3
root = %q
state = %q
[grpc]
  address = %q
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %q
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %q
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%q]
    conf_dir = %q
`, n.dir("containerd", "root"), n.dir("containerd", "state"), n.containerdSocket(), PauseImage,
		filepath.Join(bin, "runc"), filepath.Join(bin, "cni"), cniConf)
}

// ctr runs containerd's client in the CRI's namespace.
func (n *Node) ctr(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(n.o.BinDir, "ctr"), append([]string{"--address", n.containerdSocket(), "-n", "k8s.io"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
