package diag

import "context"

// GPUs lists the GPUs on the PCI bus under sysRoot ("/sys" when empty),
// for capability and capacity reports. No GPU, or no sysfs at all (non-Linux
// hosts), is an empty list, not an error.
func GPUs(ctx context.Context, sysRoot string) ([]PCIDevice, error) {
	if sysRoot == "" {
		sysRoot = "/sys"
	}
	funcs, err := scanPCI(ctx, sysRoot)
	if err != nil {
		return nil, err
	}
	var out []PCIDevice
	for _, f := range funcs {
		if isGPU(f.vendor, f.class) {
			out = append(out, f.PCIDevice)
		}
	}
	return out, nil
}
