package stack

import "context"

// MachineIDTemplateOf is (*Manager).machineIDTemplate on host, for the
// system test that proves the template on this machine's incusd.
func MachineIDTemplateOf(host *Host) func(ctx context.Context, name string) error {
	return NewManager(host).machineIDTemplate
}
