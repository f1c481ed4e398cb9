package membership

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// With gossip keys, memberlist takes and gives only encrypted streams, so
// the in-process state exchange of snapshot.go seals its request and
// opens the answer as memberlist does (its security.go and net.go, part
// of its wire protocol): the message
//
//	[encryptMsg] [length uint32] [version 1] [nonce 12] [AES-GCM(payload) + tag 16]
//
// authenticated with [encryptMsg] [length] [label] as additional data.

// encryptMsg is memberlist's message type of an encrypted stream.
const encryptMsg byte = 10

// sealVersion is memberlist's encryption version 1: AES-GCM, no padding
// (the one members of protocol version 2 and later send).
const sealVersion byte = 1

const (
	nonceSize = 12
	tagSize   = 16
	// maxSealed bounds an encrypted answer, as memberlist bounds a state
	// exchange (maxPushStateBytes).
	maxSealed = 20 * 1024 * 1024
)

func gcmOf(key []byte) (cipher.AEAD, error) {
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

// sealStream encrypts msg under key for a stream labelled label.
func sealStream(key, msg []byte, label string) ([]byte, error) {
	gcm, err := gcmOf(key)
	if err != nil {
		return nil, fmt.Errorf("membership: gossip key: %w", err)
	}
	out := make([]byte, 5, 5+1+nonceSize+len(msg)+tagSize)
	out[0] = encryptMsg
	binary.BigEndian.PutUint32(out[1:], uint32(1+nonceSize+len(msg)+tagSize))
	aad := append(append([]byte(nil), out[:5]...), label...)
	out = append(out, sealVersion)
	nonce := make([]byte, nonceSize)
	_, _ = rand.Read(nonce)
	out = append(out, nonce...)
	return gcm.Seal(out, nonce, msg, aad), nil
}

// openStream reads an encrypted message whose type byte was read already
// and decrypts it with the first of keys that opens it.
func openStream(r io.Reader, keys [][]byte, label string) ([]byte, error) {
	var hdr [5]byte
	hdr[0] = encryptMsg
	if _, err := io.ReadFull(r, hdr[1:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n < 1+nonceSize+tagSize || n > maxSealed {
		return nil, fmt.Errorf("membership: an encrypted stream of %d bytes", n)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, err
	}
	if buf[0] != sealVersion {
		return nil, fmt.Errorf("membership: encryption version %d, want %d", buf[0], sealVersion)
	}
	aad := append(hdr[:], label...)
	for _, k := range keys {
		gcm, err := gcmOf(k)
		if err != nil {
			continue
		}
		if plain, err := gcm.Open(nil, buf[1:1+nonceSize], buf[1+nonceSize:], aad); err == nil {
			return plain, nil
		}
	}
	return nil, errors.New("membership: no gossip key opens the stream")
}
