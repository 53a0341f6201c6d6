package keys

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"sync"
	"time"
)

// TicketEpoch is how long one session-ticket key seals new tickets. A
// ticket is accepted while its key is the current or the previous epoch's,
// so a resumable session lives at most two epochs (and never past its
// client certificate's expiry, which crypto/tls checks on resumption).
const TicketEpoch = 12 * time.Hour

// ticketVersion is the first byte of every ticket this package seals.
const ticketVersion = 1

const (
	ticketHeader = 1 + 8 // version, epoch (big endian)
	ticketNonce  = 12
)

// sessionTickets seals the node listener's TLS 1.3 session tickets with
// AES-256-GCM keys derived from the CA's private key, one key per epoch.
// Every replica derives the same keys and a restarted process derives them
// again, so an agent that reconnects after a restart or to another replica
// resumes its session: no certificate is signed or verified, which is most
// of a full handshake's CPU (docs/performance.md, "Reconnect storm: TLS
// session resumption"). A resumed session carries the client certificate
// of the handshake that issued the ticket; crypto/tls checks on
// resumption that it has not expired and still chains to the CA, and every
// node route checks revocation and supersession per request (hosts.NodeAuth)
// as it does after a full handshake.
type sessionTickets struct {
	prk []byte // HKDF-Extract of the CA key
	now func() time.Time

	mu    sync.Mutex
	aeads map[int64]cipher.AEAD // by epoch; the current and previous only
}

// newSessionTickets derives the ticket keys' root from the CA's private
// key (PEM). The label separates it from any other use of that key.
func newSessionTickets(caKeyPEM []byte, now func() time.Time) (*sessionTickets, error) {
	prk, err := hkdf.Extract(sha256.New, caKeyPEM, []byte("drover node listener session tickets v1"))
	if err != nil {
		return nil, fmt.Errorf("session ticket keys: %w", err)
	}
	return &sessionTickets{prk: prk, now: now, aeads: map[int64]cipher.AEAD{}}, nil
}

func (t *sessionTickets) epoch() int64 { return t.now().Unix() / int64(TicketEpoch/time.Second) }

// aead returns epoch e's key, deriving it on first use; it forgets keys
// older than the previous epoch.
func (t *sessionTickets) aead(e int64) (cipher.AEAD, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if a, ok := t.aeads[e]; ok {
		return a, nil
	}
	key, err := hkdf.Expand(sha256.New, t.prk, fmt.Sprintf("epoch %d", e), 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	a, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	for old := range t.aeads {
		if old < e-1 {
			delete(t.aeads, old)
		}
	}
	t.aeads[e] = a
	return a, nil
}

// wrap is tls.Config.WrapSession: the session state sealed under the
// current epoch's key, the version and epoch as associated data.
func (t *sessionTickets) wrap(_ tls.ConnectionState, ss *tls.SessionState) ([]byte, error) {
	plain, err := ss.Bytes()
	if err != nil {
		return nil, err
	}
	e := t.epoch()
	a, err := t.aead(e)
	if err != nil {
		return nil, err
	}
	out := make([]byte, ticketHeader+ticketNonce, ticketHeader+ticketNonce+len(plain)+a.Overhead())
	out[0] = ticketVersion
	binary.BigEndian.PutUint64(out[1:ticketHeader], uint64(e))
	if _, err := rand.Read(out[ticketHeader:]); err != nil {
		return nil, err
	}
	return a.Seal(out, out[ticketHeader:], plain, out[:ticketHeader]), nil
}

// unwrap is tls.Config.UnwrapSession. A ticket that is malformed, of
// another version, of an epoch other than the current or the previous one,
// or that does not open under its epoch's key is ignored (nil, nil): the
// handshake goes on as a full one, as crypto/tls does with a ticket it
// cannot decrypt.
func (t *sessionTickets) unwrap(ticket []byte, _ tls.ConnectionState) (*tls.SessionState, error) {
	if len(ticket) < ticketHeader+ticketNonce || ticket[0] != ticketVersion {
		return nil, nil
	}
	e := int64(binary.BigEndian.Uint64(ticket[1:ticketHeader]))
	if cur := t.epoch(); e != cur && e != cur-1 {
		return nil, nil
	}
	a, err := t.aead(e)
	if err != nil {
		return nil, nil
	}
	plain, err := a.Open(nil, ticket[ticketHeader:ticketHeader+ticketNonce], ticket[ticketHeader+ticketNonce:], ticket[:ticketHeader])
	if err != nil {
		return nil, nil
	}
	ss, err := tls.ParseSessionState(plain)
	if err != nil {
		return nil, nil
	}
	return ss, nil
}
