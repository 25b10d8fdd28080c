package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/box-isolation/box/drill"
)

// drill list: the catalogue of claims, for people and as JSON.

// listedClaim is one claim as drill list --json prints it.
type listedClaim struct {
	drill.Claim
	StackRule string `json:"stack_rule"`
}

func setupList(fs *flag.FlagSet) runner {
	asJSON := fs.Bool("json", false, "print the claims as JSON")
	return func(_ context.Context, s stdio, _ []string) int {
		var out []listedClaim
		for _, c := range drill.Catalogue {
			out = append(out, listedClaim{c, c.StackRule()})
		}
		emit(s, *asJSON, out, func(w io.Writer) {
			for _, c := range drill.Catalogue {
				fmt.Fprintf(w, "%-10s %s -> %s over %s: %s [%s]\n           %s\n           stack channel: %s\n", c.ID, c.From, c.To,
					joinWords(c.Channels), c.Expect, joinWords(c.Layers), c.Why, c.StackRule())
				if note := c.ModeNote(drill.ModeHost); note != "" {
					fmt.Fprintf(w, "           %s\n", note)
				}
			}
		})
		return exitOK
	}
}

// joinWords joins typed words (channels, layers) for people.
func joinWords[T ~string](ws []T) string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = string(w)
	}
	return strings.Join(out, ", ")
}
