package lognode

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/wire/logstream"
)

// prefixRoom is the longest record prefix ("stdout ").
const prefixRoom = 7

// copyLog sends rc's records on conn until the log ends, the control plane
// closes the stream (or sends anything), sctx ends (the stream's maximum
// lifetime) or agent ends. It closes rc and conn and returns the number of
// data frames sent and how the stream ended.
func copyLog(sctx, agent context.Context, conn *websocket.Conn, rc io.ReadCloser) (int, logstream.End) {
	// CloseRead reads (and drops) what the control plane sends; the
	// context ends when it closes the stream.
	cctx := conn.CloseRead(sctx)
	stop := context.AfterFunc(cctx, func() { rc.Close() })
	defer stop()
	defer rc.Close()
	n, end := pump(cctx, conn, rc)
	switch {
	case agent.Err() != nil:
		end = logstream.End{Reason: logstream.ReasonShutdown}
	case errors.Is(sctx.Err(), context.DeadlineExceeded):
		end = logstream.End{Reason: logstream.ReasonLifetime, Message: "the stream reached its maximum lifetime"}
	case cctx.Err() != nil:
		// The control plane closed the stream: nothing more to say.
		_ = conn.CloseNow()
		return n, logstream.End{Reason: "closed_by_control_plane"}
	}
	wctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	if err := conn.Write(wctx, websocket.MessageBinary, logstream.EncodeEnd(end)); err != nil {
		_ = conn.CloseNow()
		return n, end
	}
	_ = conn.Close(websocket.StatusNormalClosure, end.Reason)
	return n, end
}

// pump reads records ("<stream> <line>\n") and writes one frame per line
// (a line longer than logstream.MaxLine becomes several frames).
func pump(ctx context.Context, conn *websocket.Conn, rc io.Reader) (int, logstream.End) {
	br := bufio.NewReaderSize(rc, logstream.MaxLine+prefixRoom)
	cur := logstream.Stdout
	atStart := true
	n := 0
	for {
		b, err := br.ReadSlice('\n')
		if len(b) > 0 {
			if atStart {
				cur, b = splitPrefix(b, cur)
			}
			atStart = err == nil // a full buffer continues the same line
			for len(b) > 0 {
				piece := b
				if len(piece) > logstream.MaxLine {
					piece = piece[:logstream.MaxLine]
				}
				b = b[len(piece):]
				msg, _ := logstream.EncodeData(cur, piece) // cur is valid, piece bounded
				if werr := conn.Write(ctx, websocket.MessageBinary, msg); werr != nil {
					return n, logstream.End{Reason: logstream.ReasonError, Code: "logs_stream_write_failed", Message: werr.Error()}
				}
				n++
			}
		}
		switch {
		case err == nil, errors.Is(err, bufio.ErrBufferFull):
		case errors.Is(err, io.EOF):
			return n, logstream.End{Reason: logstream.ReasonEOF}
		default:
			return n, logstream.End{Reason: logstream.ReasonError, Code: CodeReadFailed, Message: err.Error()}
		}
	}
}

// splitPrefix takes the stream name off a record; a record without a
// known one is the whole line on the previous stream.
func splitPrefix(b []byte, prev logstream.Stream) (logstream.Stream, []byte) {
	i := bytes.IndexByte(b, ' ')
	if i <= 0 || i > prefixRoom {
		return prev, b
	}
	s := logstream.Stream(b[:i])
	if !s.Valid() {
		return prev, b
	}
	return s, b[i+1:]
}
