package model

// KernelPort is a link as the census needs it.
type KernelPort struct {
	Exists   bool
	Master   string // the name of the bridge it is a port of, "" for none
	Isolated bool
	// peer names a veth's other end when it is in the host's own
	// namespace: plugged into no instance at all.
	Peer string
}
