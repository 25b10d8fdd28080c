package stack

// MachineIDTemplateOf is (*Host).machineIDTemplate, for the system test
// that proves the template on this machine's incusd.
var MachineIDTemplateOf = (*Host).machineIDTemplate
