// Package suggest finds the name a typo probably meant, for the "did you
// mean" of both command lines.
package suggest

import (
	"fmt"
	"strings"
)

// DidYouMean returns ` (did you mean "x"?)` for the name closest to typo
// (at most two edits away, or a prefix of at least two letters), or "".
func DidYouMean(typo string, names []string) string {
	best, bestD := "", 3
	for _, n := range names {
		d := Distance(typo, n)
		if len(typo) >= 2 && strings.HasPrefix(n, typo) {
			d = min(d, 1)
		}
		if d < bestD {
			best, bestD = n, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// Distance is the Levenshtein distance between a and b.
func Distance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
