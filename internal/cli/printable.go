package cli

import (
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"
)

// printable makes a name from a lock object (or the server) safe to show on a
// terminal: control characters (C0, DEL, C1), Unicode format characters (such
// as U+202E, which reverses the text after it), line and paragraph separators
// and invalid UTF-8 are written as Go escapes (\x1b, \u202e, \xff). Identities,
// users, keys and messages come from whoever wrote the lock, so a raw escape
// sequence could recolour, hide or rewrite what kubelock prints. Tabs and
// newlines are escaped too: they would break a table's columns and rows.
// Backslashes stay as they are, so ordinary names print unchanged.
func printable(s string) string {
	if isPrintable(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unsafeRune(r) && r < 0x100:
			fmt.Fprintf(&b, `\x%02x`, r)
		case unsafeRune(r) && r < 0x10000:
			fmt.Fprintf(&b, `\u%04x`, r)
		case unsafeRune(r):
			fmt.Fprintf(&b, `\U%08x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// isPrintable reports whether printable(s) == s, without allocating.
func isPrintable(s string) bool { return utf8.ValidString(s) && !strings.ContainsFunc(s, unsafeRune) }

// unsafeRune reports the runes printable escapes.
func unsafeRune(r rune) bool {
	return unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

// printf is fmt.Fprintf with every string argument passed through printable.
// Use it for any line that shows a name; format itself is trusted.
func printf(w io.Writer, format string, args ...any) {
	_, _ = fmt.Fprintf(w, format, printableArgs(args)...)
}

// printableArgs returns args with printable applied to strings (and errors and
// Stringers, whose text is as untrusted as a string's).
func printableArgs(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			out[i] = printable(v)
		case error:
			out[i] = printable(v.Error())
		case fmt.Stringer:
			out[i] = printable(v.String())
		default:
			out[i] = a
		}
	}
	return out
}

// printRow writes cells as one tab-separated row (for a tabwriter), each cell
// through printable, after indent.
func printRow(w io.Writer, indent string, cells ...string) {
	safe := make([]string, len(cells))
	for i, c := range cells {
		safe[i] = printable(c)
	}
	_, _ = io.WriteString(w, indent+strings.Join(safe, "\t")+"\n")
}
