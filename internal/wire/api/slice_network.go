package api

// SliceNetwork is the slice network an agent serves (NODE_AGENT_SLICE_CIDR
// set): the bridge slice VMs' taps go on and the IPv4 network whose DHCP
// reservations the agent answers there. The slice workflow provisions a
// slice VM on it when its slots' addresses lie inside CIDR.
type SliceNetwork struct {
	Bridge string `json:"bridge"`
	CIDR   string `json:"cidr"`
}
