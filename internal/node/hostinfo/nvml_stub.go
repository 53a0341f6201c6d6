//go:build !(nvml && cgo && linux)

package hostinfo

import "context"

// NVML is not available in this build: the default build needs no cgo and
// no libnvidia-ml; nvidia-smi answers instead. It returns ErrNVMLNotBuilt.
func NVML(context.Context) ([]NVIDIAGPU, error) { return nil, ErrNVMLNotBuilt }
