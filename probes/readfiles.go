package probes

import (
	"fmt"
	"io"
	"os"
)

// A read_files probe reads the start of each of its paths (at most
// MaxReadBytes, printable), or says why it could not: what a kernel offers
// (/proc/modules for loadable modules, /sys/kernel/security/lsm for its
// security modules) is known by what is there.

// MaxReadBytes is how much of each file a read_files probe keeps.
const MaxReadBytes = 256

func probeReadFiles(spec ProbeSpec, obs Observation) Observation {
	read := 0
	for _, p := range spec.Paths {
		a := readStart(p)
		if a.Errno == "" {
			read++
		}
		obs.Evidence.Files = append(obs.Evidence.Files, a)
	}
	return done(obs, Reached, fmt.Sprintf("read %d of %d paths", read, len(spec.Paths)))
}

func readStart(path string) FileAttempt {
	f, err := os.Open(path)
	if err != nil {
		return attemptErr(path, err)
	}
	defer f.Close()
	b := make([]byte, MaxReadBytes)
	n, err := io.ReadFull(f, b)
	if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		return attemptErr(path, err)
	}
	return FileAttempt{Path: path, Content: printable(b[:n], MaxReadBytes)}
}
