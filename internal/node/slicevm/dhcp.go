package slicevm

// The dhcp_reservation phase: the slots' MAC → private IP reservations,
// written to the DHCP store (internal/node/slicedhcp) that the agent's
// slice DHCP server answers from.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/drover-dev/drover/internal/node/slicedhcp"
	"github.com/drover-dev/drover/internal/wire/task"
)

// DHCP returns the store of the slots' DHCP reservations (the agent
// serves it and prunes the reservations of VMs gone after a crash).
func (p *Provisioner) DHCP() *slicedhcp.Store { return p.opts.DHCP }

func (pr *provision) dhcpReservation(context.Context) (step, error) {
	rs, err := reservations(pr.params.VMName, pr.params.Slots)
	if err != nil {
		return step{}, failf(CodeDHCPFailed, "%w", err)
	}
	if len(rs) == 0 {
		return skipped("no slot has a mac_address and private_ip"), nil
	}
	had, err := pr.p.opts.DHCP.Reserve(pr.params.VMName, rs)
	pr.hadDHCP = had
	if err != nil {
		return step{}, failf(CodeDHCPFailed, "%w", err)
	}
	pr.dhcpNew = !had
	lines := make([]string, len(rs))
	for i, r := range rs {
		lines[i] = r.MAC.String() + " → " + r.IP.String()
	}
	return done("%s: %s", pr.p.dhcpPath(pr.params.VMName), strings.Join(lines, ", ")), nil
}

// reservations are the slots' MAC → IP reservations, hostname vm (as a
// DNS label).
func reservations(vm string, slots []task.VMSlot) ([]slicedhcp.Reservation, error) {
	var out []slicedhcp.Reservation
	var errs []error
	for i, s := range slots {
		if s.MACAddress == "" || s.PrivateIP == "" {
			continue
		}
		r, err := slicedhcp.NewReservation(s.MACAddress, s.PrivateIP, hostname(vm))
		if err != nil {
			errs = append(errs, fmt.Errorf("params.slots[%d]: %w", i, err))
			continue
		}
		out = append(out, r)
	}
	return out, errors.Join(errs...)
}
