package bench

import (
	"math"
	"slices"
	"sync"
	"time"
)

// Latency summarises a set of latency samples in milliseconds.
type Latency struct {
	Count  int     `json:"count"`
	MeanMs float64 `json:"mean_ms"`
	P50Ms  float64 `json:"p50_ms"`
	P90Ms  float64 `json:"p90_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
	MaxMs  float64 `json:"max_ms"`
}

// Percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// sorted, which must be in ascending order; 0 for an empty slice.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	if p <= 0 {
		return sorted[0]
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

// Summarize computes a Latency from unsorted samples (the slice is sorted in
// place).
func Summarize(samples []time.Duration) Latency {
	if len(samples) == 0 {
		return Latency{}
	}
	slices.Sort(samples)
	var sum time.Duration
	for _, d := range samples {
		sum += d
	}
	return Latency{
		Count:  len(samples),
		MeanMs: ms(sum / time.Duration(len(samples))),
		P50Ms:  ms(Percentile(samples, 50)),
		P90Ms:  ms(Percentile(samples, 90)),
		P99Ms:  ms(Percentile(samples, 99)),
		P999Ms: ms(Percentile(samples, 99.9)),
		MaxMs:  ms(samples[len(samples)-1]),
	}
}

// ms converts to milliseconds rounded to microseconds.
func ms(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }

// recorder collects latency samples from many goroutines.
type recorder struct {
	mu      sync.Mutex
	samples []time.Duration
	// seconds has, for the samples added by addTimed, the second of the
	// phase each was scheduled in.
	seconds []int32
}

// timedSample is a latency and the second of the phase it began in.
type timedSample struct {
	at int32
	d  time.Duration
}

// addTimed adds samples taken by one goroutine.
func (r *recorder) addTimed(ss []timedSample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range ss {
		r.samples = append(r.samples, s.d)
		r.seconds = append(r.seconds, s.at)
	}
}

// p99PerSecond is the 99th percentile of the samples begun in each of the
// first n seconds (addTimed), in milliseconds (0 for a second with none).
func (r *recorder) p99PerSecond(n int) []float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.seconds) == 0 {
		return nil
	}
	by := make([][]time.Duration, n)
	for i, at := range r.seconds {
		if int(at) < n {
			by[at] = append(by[at], r.samples[i])
		}
	}
	out := make([]float64, n)
	for i, ds := range by {
		if len(ds) > 0 {
			out[i] = Summarize(ds).P99Ms
		}
	}
	return out
}

func (r *recorder) add(d time.Duration) {
	r.mu.Lock()
	r.samples = append(r.samples, d)
	r.mu.Unlock()
}

func (r *recorder) summary() Latency {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seconds != nil { // Summarize sorts; keep samples beside their seconds
		return Summarize(slices.Clone(r.samples))
	}
	return Summarize(r.samples)
}

func (r *recorder) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.samples)
}

// Quantile is one point of a latency distribution.
type Quantile struct {
	Q  float64 `json:"q"` // 0..1
	Ms float64 `json:"ms"`
}

// cdf is the samples' latency at fixed quantiles.
func (r *recorder) cdf() []Quantile {
	qs := []float64{0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995, 0.999, 1}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.samples) == 0 {
		return nil
	}
	slices.Sort(r.samples)
	out := make([]Quantile, 0, len(qs))
	for _, q := range qs {
		out = append(out, Quantile{Q: q, Ms: ms(Percentile(r.samples, q*100))})
	}
	return out
}
