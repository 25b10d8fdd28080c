// Package witnesslog is the log of the hermetic world's witness
// nameserver: one JSON line for each question it was asked. The world
// writes it (fixtures/world) and the drill reads it (C-ALLOW's DNS
// tunnels, docs/claims.md), so its format lives here, apart from both.
package witnesslog

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"
)

// Query is one line of the log: a question the witness was asked.
type Query struct {
	At    time.Time `json:"at"`
	From  string    `json:"from"`
	Name  string    `json:"name"`
	QType string    `json:"qtype"`
}

// Append adds q to the log at path, one line.
func Append(path string, q Query) error {
	b, err := json.Marshal(q)
	if err != nil {
		return fmt.Errorf("encoding a witness query: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("opening the witness nameserver's log: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("writing the witness nameserver's log: %w", err)
	}
	return f.Close()
}

// Read reads the log at path: every question since since (a line that is
// no query is skipped).
func Read(path string, since time.Time) ([]Query, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the witness nameserver's log: %w", err)
	}
	var out []Query
	for _, l := range strings.Split(string(b), "\n") {
		var q Query
		if l == "" || json.Unmarshal([]byte(l), &q) != nil || q.At.Before(since) {
			continue
		}
		out = append(out, q)
	}
	return out, nil
}
