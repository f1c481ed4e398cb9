package coordinator

import (
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"rewind.dev/rewind/internal/units"
)

// The answers that show a job's steps are bounded by their encoding, not
// by what they count: a copy is 66 bytes with a short node name and some
// 290 with one of 253 characters (shm.MaxNodeLen), so a count that fits
// one cluster's answers is over the limit in another's.

const (
	// clientMaxAnswer is the largest answer a gRPC client takes unless
	// told otherwise (grpc-go's, grpc-java's and grpc-core's default
	// receive limit). An answer without a view is refused past it: one
	// that fits was, and is, received whole; one that does not never was.
	clientMaxAnswer = 4 << 20
	// pageBytes bounds the encoding of a page (of summaries, of copies)
	// as page sizes bound its items: half what a client takes, so that a
	// page holds whatever its node names. A page's first item goes in
	// whatever its size, up to clientMaxAnswer.
	pageBytes = 2 << 20
)

// ErrTooLarge is an answer that would carry more than a client takes.
var ErrTooLarge = errors.New("answer too large")

// tooLarge is an answer without a view over clientMaxAnswer: it says
// which views to ask for instead.
func tooLarge(what string) error {
	return fmt.Errorf("%w: coordinator: %s more than the %s one answer to a client holds: ask for view summary (counts) "+
		"or InspectStep's view copies (a page at a time), as rewind ls and rewind inspect of this release do",
		ErrTooLarge, what, units.Bytes(clientMaxAnswer))
}

// fieldSize returns the bytes a message of size bytes takes as field num
// of its parent: tag, length and itself.
func fieldSize(num protowire.Number, size int) int {
	return protowire.SizeTag(num) + protowire.SizeBytes(size)
}

// checkFits refuses an answer (a page) whose encoding is over what a
// client takes: one item of it alone was (what), which the coordinator's
// limits (places and failures a summary names, --max-copies-per-shard)
// keep far from it, yet a client would be sent a message it cannot read.
func checkFits(answer proto.Message, what string) error {
	if n := proto.Size(answer); n > clientMaxAnswer {
		return fmt.Errorf("%w: coordinator: %s alone is %s encoded, more than the %s one answer to a client holds",
			ErrTooLarge, what, units.Bytes(uint64(n)), units.Bytes(clientMaxAnswer))
	}
	return nil
}

// Page tokens say where the next page starts, and of what:
// "step/N/H" for a listing of job's summaries from step N,
// "rank/N/H" for a step's copies from rank N. H, 8 hex digits of a hash
// of the call's job (and step), binds a token to what it pages: one
// given for another job or step is refused.
const (
	stepToken = "step"
	rankToken = "rank"
)

// pageToken returns the token of kind for the page of job's step (0 for
// a listing) from at.
func pageToken(kind, job string, step, at int64) string {
	return kind + "/" + strconv.FormatInt(at, 10) + "/" + tokenHash(kind, job, step)
}

// tokenHash is the part of a token that names its call.
func tokenHash(kind, job string, step int64) string {
	h := fnv.New32a()
	fmt.Fprintf(h, "%s\x00%s\x00%d", kind, job, step)
	return fmt.Sprintf("%08x", h.Sum32())
}

// parseToken returns where the page tok names starts: 0 for "", the
// first page.
func parseToken(tok, kind, job string, step int64) (int64, error) {
	if tok == "" {
		return 0, nil
	}
	at, hash, _ := strings.Cut(strings.TrimPrefix(tok, kind+"/"), "/")
	v, err := strconv.ParseInt(at, 10, 64)
	if err != nil || v < 0 || !strings.HasPrefix(tok, kind+"/") {
		return 0, fmt.Errorf("%w: coordinator: page token %q is not one this call gives", ErrInvalid, tok)
	}
	if hash != tokenHash(kind, job, step) {
		what := "job " + job
		if kind == rankToken {
			what += " step " + strconv.FormatInt(step, 10)
		}
		return 0, fmt.Errorf("%w: coordinator: page token %q was given for another call, not for %s", ErrInvalid, tok, what)
	}
	return v, nil
}

// pageSize returns the page size asked for: def for 0, at most max.
func pageSize(asked uint32, def, max int) int {
	if asked == 0 {
		return def
	}
	return min(int(asked), max)
}
