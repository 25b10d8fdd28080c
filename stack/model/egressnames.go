package model

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"unicode"

	"golang.org/x/net/idna"
	"golang.org/x/net/publicsuffix"
)

// An allowlist's entries (layer L-EGRESS). A name means that name only:
// "api.example.com" allows api.example.com and nothing under it (the
// owner of a name is not the owner of every name an attacker may put
// under it). "*.example.com" allows every name under example.com, and not
// example.com itself. A wildcard at or above a public suffix ("*.com",
// "*.github.io", "*.example") is refused: it is anyone's name. Entries
// are normalised (IDNA to their ASCII form, lower case, no trailing dot);
// an address, a space, a control character or a malformed name is
// refused, and with it the whole list.

// normalizeEntry is one allowlist entry in its canonical form.
func normalizeEntry(s string) (string, error) {
	for _, r := range s {
		switch {
		case unicode.IsControl(r):
			return "", fmt.Errorf("%q has a control character", s)
		case unicode.IsSpace(r):
			return "", fmt.Errorf("%q has a space: one name an entry", s)
		}
	}
	n := strings.TrimSuffix(s, ".")
	wild := strings.HasPrefix(n, "*.")
	n = strings.TrimPrefix(n, "*.")
	if strings.Contains(n, "*") {
		return "", fmt.Errorf("%q: a wildcard is only ever a whole first label (*.example.com)", s)
	}
	if _, err := netip.ParseAddr(strings.Trim(n, "[]")); err == nil {
		return "", fmt.Errorf("%q is an address, not a name: an allowlist takes names (an address's site changes hands; its name is what the box asks for)", s)
	}
	if strings.ContainsAny(n, "/:@?#,") {
		return "", fmt.Errorf("%q is not a name (a URL, a port or a list?): one DNS name an entry, such as api.example.com or *.example.com", s)
	}
	a, err := idna.Lookup.ToASCII(n)
	if err != nil {
		return "", fmt.Errorf("%q is not a DNS name: %v", s, err)
	}
	if len(a) > 253 {
		return "", fmt.Errorf("%q is longer than a DNS name may be (253)", s)
	}
	labels := strings.Split(a, ".")
	if wild && len(labels) < 2 {
		return "", fmt.Errorf("%q is every name under the public suffix %s: allow the names (or *.name) of a site instead", s, a)
	}
	if len(labels) < 2 {
		return "", fmt.Errorf("%q is a single label: an allowlist takes names with a dot, such as api.example.com", s)
	}
	for _, l := range labels {
		if !ldh(l) {
			return "", fmt.Errorf("%q is not a DNS name (label %q: letters, digits and inner hyphens, 1 to 63 of them)", s, l)
		}
	}
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return "", fmt.Errorf("%q ends in a number: not a name", s)
	}
	if wild {
		if ps, _ := publicsuffix.PublicSuffix(a); ps == a {
			return "", fmt.Errorf("%q is every name under the public suffix %s: allow the names (or *.name) of a site instead", s, a)
		}
		return "*." + a, nil
	}
	return a, nil
}

// ldh reports whether a label is letters, digits and inner hyphens.
func ldh(l string) bool {
	if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for _, c := range []byte(l) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// NormalizeNames checks an allowlist (names, and *.suffix for every name
// under a suffix), puts each entry in its canonical form, and drops
// duplicates; sorted. One bad entry refuses the list.
func NormalizeNames(names []string) ([]string, error) {
	var out []string
	for i, n := range names {
		if n == "" {
			continue
		}
		e, err := normalizeEntry(n)
		if err != nil {
			if len(names) > 1 {
				return nil, fmt.Errorf("entry %d: %w", i+1, err)
			}
			return nil, err
		}
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("an allowlist needs at least one name")
	}
	slices.Sort(out)
	return out, nil
}

// ParseAllowlist reads an allowlist file: one name or *.suffix a line;
// blank lines and # comments are skipped. A bad line is refused with its
// number, and nothing of the file is taken.
func ParseAllowlist(r io.Reader) ([]string, error) {
	var names []string
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		e, err := normalizeEntry(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		names = append(names, e)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return NormalizeNames(names)
}

// Allows reports whether an allowlist (normalised) allows a DNS name, as
// a question carries it (any case, a trailing dot or not).
func Allows(names []string, name string) bool {
	q := strings.TrimSuffix(strings.ToLower(name), ".")
	for _, n := range names {
		if suffix, ok := strings.CutPrefix(n, "*"); ok {
			if len(q) > len(suffix) && strings.HasSuffix(q, suffix) {
				return true
			}
		} else if q == n {
			return true
		}
	}
	return false
}

// NameMatcher is an allowlist made for asking often: a question costs a
// lookup per label of the name, however long the list.
type NameMatcher struct {
	exact, under map[string]bool
}

func NewNameMatcher(names []string) *NameMatcher {
	m := &NameMatcher{exact: map[string]bool{}, under: map[string]bool{}}
	for _, n := range names {
		if suffix, ok := strings.CutPrefix(n, "*."); ok {
			m.under[suffix] = true
		} else {
			m.exact[n] = true
		}
	}
	return m
}

// Allows is Allows for the matcher's list.
func (m *NameMatcher) Allows(name string) bool {
	q := strings.TrimSuffix(strings.ToLower(name), ".")
	if m.exact[q] {
		return true
	}
	for {
		_, parent, ok := strings.Cut(q, ".")
		if !ok {
			return false
		}
		if m.under[parent] {
			return true
		}
		q = parent
	}
}
