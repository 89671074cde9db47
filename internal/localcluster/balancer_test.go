package localcluster

import (
	"maps"
	"testing"
)

func TestParseSessions(t *testing.T) {
	out := `0x55d5c0e1e2a0: proto=tcpv4 src=127.0.0.1:53672 fe=apiserver be=apiservers srv=kube-apiserver0 ts=00 epoch=0 age=5s calls=3
0x55d5c0e1e2b0: proto=tcpv4 src=127.0.0.1:53680 fe=apiserver be=apiservers srv=kube-apiserver1 ts=00 epoch=0 age=1s calls=2
0x55d5c0e1e2c0: proto=unix_stream src=unix:1 fe=GLOBAL be=<NONE> srv=<none> ts=00 age=0s calls=1

`
	want := map[int]string{53672: "kube-apiserver0", 53680: "kube-apiserver1"}
	if got := parseSessions(out); !maps.Equal(got, want) {
		t.Errorf("parseSessions = %v, want %v", got, want)
	}
}

func TestParseStatus(t *testing.T) {
	out := `# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status,weight
apiserver,FRONTEND,,,2,3,4096,10,0,0,0,0,0,,,,,OPEN,
apiservers,kube-apiserver0,0,0,1,2,,5,0,0,,0,,0,0,0,0,UP,1
apiservers,kube-apiserver1,0,0,0,1,,5,0,0,,0,,0,0,0,0,DOWN 1/2,1
apiservers,BACKEND,0,0,1,3,410,10,0,0,0,0,,0,0,0,0,UP,2

`
	want := map[string]string{"kube-apiserver0": "UP", "kube-apiserver1": "DOWN 1/2"}
	if got := parseStatus(out); !maps.Equal(got, want) {
		t.Errorf("parseStatus = %v, want %v", got, want)
	}
}
