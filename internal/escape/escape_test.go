package escape

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestPrintable(t *testing.T) {
	cases := []struct {
		name, in, want string
	}{
		{"plain", "worker-7d9f", "worker-7d9f"},
		{"empty", "", ""},
		{"unicode letters stay", "zürich-日本-🔒", "zürich-日本-🔒"},
		{"backslash stays", `C:\tmp\x1b`, `C:\tmp\x1b`},
		{"spaces stay", "stuck job, ticket 42", "stuck job, ticket 42"},
		{"CSI colour", "\x1b[31mred\x1b[0m", `\x1b[31mred\x1b[0m`},
		{"OSC title", "\x1b]0;pwned\x07", `\x1b]0;pwned\x07`},
		{"clear screen", "a\x1b[2Jb", `a\x1b[2Jb`},
		{"newline", "a\nb", `a\x0ab`},
		{"tab", "a\tb", `a\x09b`},
		{"carriage return", "ok\rforged", `ok\x0dforged`},
		{"NUL", "a\x00b", `a\x00b`},
		{"DEL", "a\x7fb", `a\x7fb`},
		{"C1 CSI", "a\u009b31mb", `a\x9b31mb`},
		{"right-to-left override", "alice\u202eecila", `alice\u202eecila`},
		{"zero width space", "ali\u200bce", `ali\u200bce`},
		{"byte order mark", "\ufeffalice", `\ufeffalice`},
		{"line separator", "a\u2028b", `a\u2028b`},
		{"paragraph separator", "a\u2029b", `a\u2029b`},
		{"tag character (plane 14)", "a\U000e0041b", `a\U000e0041b`},
		{"invalid UTF-8", "a\xffb\xc3", `a\xffb\xc3`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Printable(tc.in)
			if got != tc.want {
				t.Errorf("Printable(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if again := Printable(got); again != got {
				t.Errorf("Printable is not idempotent: %q then %q", got, again)
			}
			if IsPrintable(tc.in) != (got == tc.in) {
				t.Errorf("IsPrintable(%q) = %v, but Printable changed it: %v", tc.in, IsPrintable(tc.in), got != tc.in)
			}
		})
	}
}

// TestPrintableLeavesNothingUnsafe checks every rune of the BMP and the supplementary planes' format characters.
func TestPrintableLeavesNothingUnsafe(t *testing.T) {
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if r >= 0xd800 && r <= 0xdfff {
			continue // surrogates are not valid in UTF-8
		}
		out := Printable(string(r))
		for _, o := range out {
			if unicode.IsControl(o) || unicode.In(o, unicode.Cf, unicode.Zl, unicode.Zp) || o == utf8.RuneError && r != utf8.RuneError {
				t.Fatalf("Printable(%U) = %q still holds %U", r, out, o)
			}
		}
	}
}

func TestClip(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"eleven chars", 10, "eleven …"},
		{"日本語日本語", 10, "日本…"}, // never half a rune
		{strings.Repeat("x", 100<<10), 64, strings.Repeat("x", 61) + "…"},
	} {
		got := Clip(tc.in, tc.n)
		if got != tc.want || len(got) > tc.n || !utf8.ValidString(got) {
			t.Errorf("Clip(%.20q, %d) = %q (%d bytes), want %q", tc.in, tc.n, got, len(got), tc.want)
		}
	}
}
