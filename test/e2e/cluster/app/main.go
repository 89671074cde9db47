// Command app stands in for the sidecar sample's main container
// (orders-writer) in the cluster suite: it records, in $RECORD_DIR/$POD_NAME,
// when it started and stopped and the fencing token in $FENCING_TOKEN_FILE at
// each moment ("none" when the file is absent), then exits on SIGTERM.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

func main() {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	record("start")
	<-term
	record("stop")
}

func record(event string) {
	token := "none"
	if data, err := os.ReadFile(os.Getenv("FENCING_TOKEN_FILE")); err == nil {
		token = strings.TrimSpace(string(data))
	}
	line := fmt.Sprintf("%s %d %s\n", event, time.Now().UnixNano(), token)
	fmt.Print(line)
	f, err := os.OpenFile(filepath.Join(os.Getenv("RECORD_DIR"), os.Getenv("POD_NAME")), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	_, _ = f.WriteString(line)
	_ = f.Close()
}
