package terminal

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// Header is the first line of an asciicast v2 recording.
type Header struct {
	Width     int               `json:"width"`
	Height    int               `json:"height"`
	Timestamp int64             `json:"timestamp,omitempty"` // Unix seconds
	Title     string            `json:"title,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
}

// EventType is the second field of an asciicast event.
type EventType string

// Event types written by Recorder.
const (
	EventOutput EventType = "o"
	EventInput  EventType = "i"
	EventResize EventType = "r"
)

// Event is one asciicast v2 event line: [time, type, data].
type Event struct {
	Time float64 // seconds since the recording started
	Type EventType
	Data string
}

// RecorderOptions configures a Recorder.
type RecorderOptions struct {
	// RecordInput records keystrokes ("i" events). Off by default: input
	// contains passwords typed at prompts that do not echo.
	RecordInput bool
	// Now returns the current time; time.Now when nil.
	Now func() time.Time
}

// ErrRecorderClosed is returned by writes after Close.
var ErrRecorderClosed = errors.New("terminal: recorder closed")

// Recorder writes an asciicast v2 recording (one JSON header line, then one
// JSON event line per call) to an io.Writer it does not own. Data is bytes
// from a PTY: an incomplete UTF-8 sequence at the end of a chunk is held
// back until the next chunk of the same stream, so a character split across
// two reads is recorded whole; invalid bytes become U+FFFD, one per byte.
// Methods are safe for concurrent use. The first write error is sticky.
type Recorder struct {
	mu      sync.Mutex
	w       io.Writer
	now     func() time.Time
	start   time.Time
	input   bool
	partial map[EventType][]byte // held-back incomplete UTF-8 per stream
	err     error
	closed  bool
}

// NewRecorder writes hdr to w and returns a Recorder whose event times count
// from now. A zero hdr.Timestamp is set from the clock.
func NewRecorder(w io.Writer, hdr Header, opts RecorderOptions) (*Recorder, error) {
	r := &Recorder{w: w, now: opts.Now, input: opts.RecordInput, partial: map[EventType][]byte{}}
	if r.now == nil {
		r.now = time.Now
	}
	r.start = r.now()
	if hdr.Timestamp == 0 {
		hdr.Timestamp = r.start.Unix()
	}
	line, err := json.Marshal(struct {
		Version int `json:"version"`
		Header
	}{2, hdr})
	if err != nil {
		return nil, fmt.Errorf("asciicast header: %w", err)
	}
	if _, err := w.Write(append(line, '\n')); err != nil {
		return nil, fmt.Errorf("write asciicast header: %w", err)
	}
	return r, nil
}

// Output records PTY output.
func (r *Recorder) Output(p []byte) error { return r.text(EventOutput, p) }

// Input records browser input; it does nothing unless RecordInput is set.
func (r *Recorder) Input(p []byte) error {
	if !r.input {
		return nil
	}
	return r.text(EventInput, p)
}

// Resize records a terminal resize as "COLSxROWS".
func (r *Recorder) Resize(s Size) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.event(EventResize, s.String())
}

// Close writes what is still held back (an incomplete sequence is invalid
// at the end, so it becomes U+FFFD) and stops recording. It does not close
// the writer.
func (r *Recorder) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return r.err
	}
	for _, t := range []EventType{EventOutput, EventInput} {
		if rest := r.partial[t]; len(rest) > 0 {
			delete(r.partial, t)
			if err := r.event(t, validUTF8(rest)); err != nil {
				break
			}
		}
	}
	r.closed = true
	return r.err
}

func (r *Recorder) text(t EventType, p []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrRecorderClosed
	}
	buf := append(r.partial[t], p...)
	cut := incompleteTail(buf)
	r.partial[t] = append([]byte(nil), buf[cut:]...)
	if cut == 0 {
		return r.err
	}
	return r.event(t, validUTF8(buf[:cut]))
}

// event writes one event line; called with mu held.
func (r *Recorder) event(t EventType, data string) error {
	if r.closed {
		return ErrRecorderClosed
	}
	if r.err != nil {
		return r.err
	}
	var line bytes.Buffer
	line.WriteByte('[')
	line.WriteString(strconv.FormatFloat(r.now().Sub(r.start).Seconds(), 'f', 6, 64))
	line.WriteString(`, "`)
	line.WriteString(string(t))
	line.WriteString(`", `)
	enc := json.NewEncoder(&line)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(data); err != nil { // appends '\n'
		r.err = fmt.Errorf("asciicast event: %w", err)
		return r.err
	}
	line.Truncate(line.Len() - 1)
	line.WriteString("]\n")
	if _, err := r.w.Write(line.Bytes()); err != nil {
		r.err = fmt.Errorf("write asciicast event: %w", err)
	}
	return r.err
}

// incompleteTail returns the index where an incomplete but so far valid
// UTF-8 sequence at the end of b starts, or len(b) if there is none.
func incompleteTail(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax+1; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return i
			}
			break
		}
	}
	return len(b)
}

// validUTF8 converts b to a string, replacing each invalid byte with U+FFFD.
func validUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	out := make([]byte, 0, len(b)+8)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			out = utf8.AppendRune(out, utf8.RuneError)
		} else {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return string(out)
}

// ReadCast reads an asciicast v2 recording. It rejects other versions and
// malformed lines; blank lines are skipped.
func ReadCast(rd io.Reader) (Header, []Event, error) {
	br := bufio.NewReader(rd)
	var hdr Header
	var events []Event
	first := true
	for lineNo := 1; ; lineNo++ {
		line, err := br.ReadBytes('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return Header{}, nil, fmt.Errorf("read asciicast: %w", err)
		}
		if trimmed := bytes.TrimSpace(line); len(trimmed) > 0 {
			if first {
				if hdr, err = parseHeader(trimmed); err != nil {
					return Header{}, nil, err
				}
				first = false
			} else {
				ev, perr := parseEvent(trimmed)
				if perr != nil {
					return Header{}, nil, fmt.Errorf("asciicast line %d: %w", lineNo, perr)
				}
				events = append(events, ev)
			}
		}
		if err != nil { // io.EOF
			break
		}
	}
	if first {
		return Header{}, nil, errors.New("asciicast: no header")
	}
	return hdr, events, nil
}

func parseHeader(line []byte) (Header, error) {
	var h struct {
		Version int `json:"version"`
		Header
	}
	if err := json.Unmarshal(line, &h); err != nil {
		return Header{}, fmt.Errorf("asciicast header: %w", err)
	}
	if h.Version != 2 {
		return Header{}, fmt.Errorf("asciicast header: version %d, want 2", h.Version)
	}
	return h.Header, nil
}

func parseEvent(line []byte) (Event, error) {
	var raw []json.RawMessage
	if err := json.Unmarshal(line, &raw); err != nil {
		return Event{}, err
	}
	if len(raw) != 3 {
		return Event{}, fmt.Errorf("event has %d fields, want 3", len(raw))
	}
	var ev Event
	var typ string
	if err := json.Unmarshal(raw[0], &ev.Time); err != nil {
		return Event{}, fmt.Errorf("event time: %w", err)
	}
	if err := json.Unmarshal(raw[1], &typ); err != nil {
		return Event{}, fmt.Errorf("event type: %w", err)
	}
	if err := json.Unmarshal(raw[2], &ev.Data); err != nil {
		return Event{}, fmt.Errorf("event data: %w", err)
	}
	ev.Type = EventType(typ)
	return ev, nil
}
