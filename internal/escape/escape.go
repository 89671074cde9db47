// Package escape makes strings that someone else wrote safe to show: in a
// terminal (the CLI), an Event, a denial. Identities, users, keys, messages
// and annotations come from whoever wrote a lock or an object, so a raw
// escape sequence could recolour, hide or rewrite what a person reads, and a
// long one could fill a table, an Event or a log. It imports nothing of
// kubelock: the CLI and the operator both use it.
package escape

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Printable makes s safe to show: control characters (C0, DEL, C1), Unicode
// format characters (such as U+202E, which reverses the text after it), line
// and paragraph separators and invalid UTF-8 are written as Go escapes (\x1b,
// \u202e, \xff). Tabs and newlines are escaped too: they would break a
// table's columns and rows, or a one-line message. Backslashes stay as they
// are, so ordinary names print unchanged.
func Printable(s string) string {
	if IsPrintable(s) {
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

// IsPrintable reports whether Printable(s) == s, without allocating.
func IsPrintable(s string) bool { return utf8.ValidString(s) && !strings.ContainsFunc(s, unsafeRune) }

// unsafeRune reports the runes Printable escapes.
func unsafeRune(r rune) bool {
	return unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

// Args returns args with f (such as Printable) applied to strings, and to
// the text of errors and Stringers, which is as untrusted as a string's: for
// a format string that is itself trusted.
func Args(args []any, f func(string) string) []any {
	out := make([]any, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			out[i] = f(v)
		case error:
			out[i] = f(v.Error())
		case fmt.Stringer:
			out[i] = f(v.String())
		default:
			out[i] = a
		}
	}
	return out
}

// Ellipsis marks where Clip cut a string.
const Ellipsis = "…"

// Clip is s cut to at most n bytes, on a rune boundary, ending in Ellipsis
// when it was cut; n must leave room for the ellipsis.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := max(n-len(Ellipsis), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + Ellipsis
}
