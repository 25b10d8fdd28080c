package probes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/box-isolation/box/probes/observation"
)

// ReportVersion is the version of the report format RunAgent writes.
const ReportVersion = 1

// MaxReportBytes bounds what DecodeReport reads: a full plan's worth of
// observations with evidence fits comfortably.
const MaxReportBytes = 8 << 20

// MaxWitnessRecords bounds the packets an outbound witness lists.
const MaxWitnessRecords = 64

// What the probes observe is package observation's (probes/observation),
// so that a report carrying observations is read without the probes;
// these are its types here, as the probes and the agent name them.
type (
	Observation          = observation.Observation
	Evidence             = observation.Evidence
	ICMPEvidence         = observation.ICMPEvidence
	DNSEvidence          = observation.DNSEvidence
	IPv6Evidence         = observation.IPv6Evidence
	LeaseEvidence        = observation.LeaseEvidence
	WitnessEvidence      = observation.WitnessEvidence
	PacketRecord         = observation.PacketRecord
	FrameSummary         = observation.FrameSummary
	ListenerEvidence     = observation.ListenerEvidence
	IDRange              = observation.IDRange
	IDMapEvidence        = observation.IDMapEvidence
	CapsEvidence         = observation.CapsEvidence
	SeccompEvidence      = observation.SeccompEvidence
	SyscallTrial         = observation.SyscallTrial
	MountEntry           = observation.MountEntry
	MountsEvidence       = observation.MountsEvidence
	DeviceNode           = observation.DeviceNode
	FileAttempt          = observation.FileAttempt
	CgroupTry            = observation.CgroupTry
	ReleaseAgentEvidence = observation.ReleaseAgentEvidence
	HTTPAnswer           = observation.HTTPAnswer
	LoadEvidence         = observation.LoadEvidence
)

// Report is everything RunAgent writes to stdout.
type Report struct {
	Version    int       `json:"version"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	// ArmingMS is how long the agent took to arm (its link set-up,
	// listeners and witnesses) before its start; SlackMS how much time
	// arming left before the plan's agreed start (negative: it armed that
	// late, and started that late; 0 with no agreed start).
	ArmingMS     int64           `json:"arming_ms,omitempty"`
	SlackMS      int64           `json:"slack_ms,omitempty"`
	LinkLocal    *LinkLocalState `json:"link_local,omitempty"`
	Neighbors    []NeighborState `json:"neighbors,omitempty"`
	Observations []Observation   `json:"observations"`
	// Error is set when the plan could not be read or run at all.
	Error string `json:"error,omitempty"`
}

// LinkLocalState says what the agent did about an IPv6 link-local address.
type LinkLocalState struct {
	Interface string `json:"interface,omitempty"`
	Address   string `json:"address,omitempty"`
	Added     bool   `json:"added"`
	Removed   bool   `json:"removed"`
	Error     string `json:"error,omitempty"`
}

// DecodeReport reads an agent's report strictly: known fields only, one
// document, bounded size, a version it understands and valid outcomes.
func DecodeReport(r io.Reader) (*Report, error) {
	data, err := readBounded(r, MaxReportBytes, "report")
	if err != nil {
		return nil, err
	}
	var head struct {
		Version int `json:"version"`
	}
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&head); err != nil {
		return nil, fmt.Errorf("decode report: %w", err)
	}
	if head.Version != ReportVersion {
		return nil, fmt.Errorf("decode report: unsupported version %d (this build reads %d)", head.Version, ReportVersion)
	}
	var rep Report
	if err := strictUnmarshal(data, &rep); err != nil {
		return nil, fmt.Errorf("decode report: %w", err)
	}
	for i, o := range rep.Observations {
		if !o.Outcome.Valid() {
			return nil, fmt.Errorf("decode report: observation %d has no valid outcome", i)
		}
	}
	return &rep, nil
}

// readBounded reads at most limit bytes and fails if there is more.
func readBounded(r io.Reader, limit int64, what string) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("read %s: larger than %d bytes", what, limit)
	}
	return data, nil
}

// strictUnmarshal decodes exactly one JSON value with no unknown fields and
// nothing but white space after it.
func strictUnmarshal(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); err != io.EOF {
		return fmt.Errorf("trailing data after the JSON document")
	}
	return nil
}
