package sqlstore

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"
)

// ms encodes a time as unix milliseconds; the zero time is 0.
func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// tm decodes unix milliseconds as a UTC time; 0 is the zero time.
func tm(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMilli(v).UTC()
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// rawText encodes a JSON document; nil or empty is the empty string.
func rawText(m json.RawMessage) string { return string(m) }

// textRaw decodes a JSON document; the empty string is nil.
func textRaw(s string) json.RawMessage {
	if s == "" {
		return nil
	}
	return json.RawMessage(s)
}

// labelsText encodes labels as a JSON object; nil or empty is the empty string.
func labelsText(l map[string]string) (string, error) {
	if len(l) == 0 {
		return "", nil
	}
	b, err := json.Marshal(l)
	if err != nil {
		return "", fmt.Errorf("encode labels: %w", err)
	}
	return string(b), nil
}

// textLabels decodes labels; the empty string and {} are nil.
func textLabels(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	var l map[string]string
	if err := json.Unmarshal([]byte(s), &l); err != nil {
		return nil, fmt.Errorf("decode labels: %w", err)
	}
	if len(l) == 0 {
		return nil, nil
	}
	return l, nil
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func unb64(s string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("decode base64: %w", err)
	}
	return b, nil
}

// lastAuditID is the last audit id this process handed out.
var lastAuditID atomic.Int64

// nextAuditID returns a process-wide strictly increasing id derived from the
// wall clock in unix nanoseconds, so ids from different replicas interleave
// roughly in time order. Another replica may, very rarely, pick the same
// value; AppendAudit retries on the unique violation.
func nextAuditID() int64 {
	for {
		last := lastAuditID.Load()
		id := max(time.Now().UnixNano(), last+1)
		if lastAuditID.CompareAndSwap(last, id) {
			return id
		}
	}
}

// limit applies the default page size.
func limit(n int) int {
	if n <= 0 {
		return 100
	}
	return n
}
