package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/kubelock/kubelock/internal/escape"
)

// maxShown is the most the CLI shows of one string someone else wrote: more
// than any string the schema allows (512 characters of up to 4 bytes), so
// only what no schema bounds (the key annotation, an Event's message, an
// error from the server) is ever cut.
const maxShown = 2048

// shown is s as the CLI shows it: cut to maxShown bytes, its control and
// format characters escaped (escape.Printable). Identities, users, keys and
// messages come from whoever wrote the lock.
func shown(s string) string { return escape.Printable(escape.Clip(s, maxShown)) }

// printf is fmt.Fprintf with every string argument passed through shown.
// Use it for any line that shows a name; format itself is trusted.
func printf(w io.Writer, format string, args ...any) {
	_, _ = fmt.Fprintf(w, format, escape.Args(args, shown)...)
}

// printRow writes cells as one tab-separated row (for a tabwriter), each cell
// through shown, after indent.
func printRow(w io.Writer, indent string, cells ...string) {
	safe := make([]string, len(cells))
	for i, c := range cells {
		safe[i] = shown(c)
	}
	_, _ = io.WriteString(w, indent+strings.Join(safe, "\t")+"\n")
}
