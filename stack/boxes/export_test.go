package boxes

import (
	"context"

	"github.com/box-isolation/box/stack"
)

// MachineIDTemplateOf is (*Manager).machineIDTemplate on host, for the
// system test that proves the template on this machine's incusd.
func MachineIDTemplateOf(host *stack.Host) func(ctx context.Context, name string) error {
	return NewManager(host).machineIDTemplate
}
