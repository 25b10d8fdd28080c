package model

import (
	"fmt"
	"strings"

	"github.com/box-isolation/box/stack/incus"
)

// Instance types, as Incus names them in an instance's "type".
const (
	TypeContainer = "container"
	TypeVM        = "virtual-machine"
)

// TypeDecision is the kind of box `box new` makes, and why.
type TypeDecision struct {
	Type string // TypeContainer or TypeVM
	// Reason is why, for the operator: what the server can run, or that
	// the operator chose.
	Reason string
	// Chosen is set when the operator chose the type; otherwise the
	// server's drivers decided.
	Chosen bool
}

// DecideType is the one decision of what kind of box to make, which box new
// acts on and the drill's report compares its probe boxes with. want is the
// operator's choice, TypeVM or TypeContainer, and wins; with want empty, the
// box is a virtual machine where the server can run one and a container
// where it cannot. srv is what GET /1.0 reported; only an empty want reads
// it. What the server says decides, not /dev/kvm: a host can have /dev/kvm
// and still no qemu driver (docs/world.md, "These machines").
func DecideType(srv *incus.Server, want string) (TypeDecision, error) {
	if want != "" {
		if err := CheckType(want); err != nil {
			return TypeDecision{}, err
		}
		return TypeDecision{Type: want, Reason: "chosen by the operator", Chosen: true}, nil
	}
	if srv == nil {
		return TypeDecision{}, fmt.Errorf("choosing %s or %s: no server information", TypeVM, TypeContainer)
	}
	if srv.CanRunVMs() {
		return TypeDecision{Type: TypeVM, Reason: "this host can run VMs"}, nil
	}
	return TypeDecision{Type: TypeContainer, Reason: fmt.Sprintf("this host cannot run VMs (incus drivers: %s)", strings.Join(srv.Drivers(), ", "))}, nil
}

func CheckType(typ string) error {
	if typ != TypeContainer && typ != TypeVM {
		return fmt.Errorf("instance type %q: want %s or %s", typ, TypeContainer, TypeVM)
	}
	return nil
}
