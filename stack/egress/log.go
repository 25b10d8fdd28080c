package egress

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/box-isolation/box/stack/hostns"
)

// Reasons (layer L-EGRESS): every refusal of the egress service, a name
// the resolver would not answer or a connection the proxy would not make,
// is a line of the namespace's refusal log (/run/box/egress-<ino>.log, one
// JSON object a line; `box egress N log` reads it) and of the service's
// own log (the journal, where systemd runs it). A box that tries a
// thousand names a second is not a thousand lines: past refusalBurst in a
// second, its refusals are counted, and the count is a line of its own.

// Refusal is one refusal.
type Refusal struct {
	At      time.Time `json:"at"`
	Box     string    `json:"box"`
	Project string    `json:"project,omitempty"`
	Policy  string    `json:"policy,omitempty"`
	From    string    `json:"from"`
	// Kind is what was refused: dns (a question), tls (a connection by its
	// server name), http (by its Host), tcp (neither could be read).
	Kind  string `json:"kind"`
	Name  string `json:"name,omitempty"`
	QType string `json:"qtype,omitempty"`
	// To is where a refused connection was going.
	To     string `json:"to,omitempty"`
	Reason string `json:"reason"`
	// Suppressed counts refusals of this box not written one by one.
	Suppressed int `json:"suppressed,omitempty"`
}

func (r Refusal) String() string {
	who := r.Box
	if r.Project != "" && r.Project != "default" {
		who = r.Project + "/" + r.Box
	}
	if r.Suppressed > 0 {
		return fmt.Sprintf("%s %s: %d more refusals in the last second, not logged one by one", r.At.UTC().Format(time.RFC3339), who, r.Suppressed)
	}
	what := r.Name
	if r.QType != "" {
		what += " " + r.QType
	}
	if r.To != "" {
		what += " to " + r.To
	}
	return fmt.Sprintf("%s %s: %s %s refused: %s", r.At.UTC().Format(time.RFC3339), who, r.Kind, what, r.Reason)
}

// LogPath is the refusal log of the namespace with inode ino.
func LogPath(ino uint64) string {
	return filepath.Join(hostns.RunDir, fmt.Sprintf("egress-%d.log", ino))
}

// The refusal log's bounds: rotated to .1 past refusalLogMax bytes;
// refusalBurst lines a box a second.
const (
	refusalLogMax = 4 << 20
	refusalBurst  = 20
)

// refusalLog writes refusals to the file and the service's log.
type refusalLog struct {
	path string
	out  io.Writer
	mu   sync.Mutex
	f    *os.File
	size int64
	// per box: the second being counted, lines in it, refusals left out
	sec     map[string]int64
	lines   map[string]int
	dropped map[string]int
}

func newRefusalLog(path string, out io.Writer) *refusalLog {
	return &refusalLog{path: path, out: out, sec: map[string]int64{}, lines: map[string]int{}, dropped: map[string]int{}}
}

func (l *refusalLog) add(r Refusal) {
	if r.At.IsZero() {
		r.At = time.Now()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	key := r.Project + "/" + r.Box + "/" + r.From
	sec := r.At.Unix()
	if l.sec[key] != sec {
		if n := l.dropped[key]; n > 0 {
			l.write(Refusal{At: r.At, Box: r.Box, Project: r.Project, Policy: r.Policy, From: r.From, Kind: r.Kind, Suppressed: n})
		}
		l.sec[key], l.lines[key], l.dropped[key] = sec, 0, 0
	}
	if l.lines[key] >= refusalBurst {
		l.dropped[key]++
		return
	}
	l.lines[key]++
	l.write(r)
}

// write appends one line (the lock held).
func (l *refusalLog) write(r Refusal) {
	if l.out != nil {
		fmt.Fprintf(l.out, "egress: %s\n", r)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return
	}
	b = append(b, '\n')
	if l.f == nil || l.size+int64(len(b)) > refusalLogMax {
		if l.f != nil {
			l.f.Close()
			l.f = nil
			_ = os.Rename(l.path, l.path+".1")
		}
		if err := os.MkdirAll(filepath.Dir(l.path), 0o755); err != nil {
			return
		}
		f, err := os.OpenFile(l.path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return
		}
		fi, _ := f.Stat()
		l.f, l.size = f, fi.Size()
	}
	n, _ := l.f.Write(b)
	l.size += int64(n)
}

// ReadRefusals reads the refusal logs (the rotated one first), keeping
// the lines keep says.
func ReadRefusals(path string, keep func(Refusal) bool) ([]Refusal, error) {
	var out []Refusal
	for _, p := range []string{path + ".1", path} {
		f, err := os.Open(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading the egress refusals: %w", err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var r Refusal
			if json.Unmarshal(sc.Bytes(), &r) == nil && keep(r) {
				out = append(out, r)
			}
		}
		f.Close()
	}
	return out, nil
}
