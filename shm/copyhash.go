package shm

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// copyHash copies src into dst (of the same length, not overlapping it)
// and returns the XXH3-64 of src. Where the machine has a fused kernel
// (copyhash_amd64.s), src is at least fusedMin bytes and dst is aligned
// for the kernel's streaming stores, the bytes are read once: each
// 64-byte stripe is loaded, written to dst with a non-temporal store and
// folded into the hash from the same registers, so the hash costs no
// second pass. Elsewhere it is a copy, then a hash of the source while it
// is still in cache.
func copyHash(dst, src []byte) uint64 {
	n := len(src)
	if len(dst) != n {
		panic(fmt.Sprintf("shm: copy of %d bytes into %d", n, len(dst)))
	}
	if !fusedCopyHash || n < fusedMin || uintptr(unsafe.Pointer(unsafe.SliceData(dst)))%32 != 0 {
		copy(dst, src)
		return xxh3.Hash(src)
	}
	raceAccess(dst, src)
	acc := xxh3Init
	blocks := (n - 1) / xxh3Block
	accumCopyBlocks(&acc, dst, src, blocks)
	done := blocks * xxh3Block
	copy(dst[done:], src[done:])
	return xxh3Finish(&acc, src, done)
}

// fusedMin is the smallest piece copyHash copies with the kernel: its
// stores bypass the caches, as Go's copy does from 1 MiB, so a small
// piece (a small tensor, a tensor's short last leaf) that its reader may
// touch soon stays in cache.
const fusedMin = 256 << 10

// XXH3-64 (seed 0, the default secret) of inputs longer than xxh3Mid
// bytes, as the XXH3 specification defines it: eight 64-bit lanes
// accumulate 64-byte stripes, sixteen stripes a block, the lanes
// scrambled after each block; the last partial block's stripes and the
// input's last 64 bytes are accumulated, then the lanes are merged.
const (
	xxh3Mid    = 240 // longest input hashed without the stripe loop
	xxh3Stripe = 64
	xxh3Block  = 1024 // 16 stripes

	prime32_1 = 2654435761
	prime32_2 = 2246822519
	prime32_3 = 3266489917
	prime64_1 = 11400714785074694791
	prime64_2 = 14029467366897019727
	prime64_3 = 1609587929392839161
	prime64_4 = 9650029242287828579
	prime64_5 = 2870177450012600261
)

var xxh3Init = [8]uint64{prime32_3, prime64_1, prime64_2, prime64_3, prime64_4, prime32_2, prime64_5, prime32_1}

// xxh3Secret is the specification's default secret (kSecret), 192 bytes.
var xxh3Secret = [192]byte{
	0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
	0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
	0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
	0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
	0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
	0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
	0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
	0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
	0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
	0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
	0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
	0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
}

// xxh3Finish hashes what follows the whole blocks of src (from done,
// a multiple of xxh3Block, with len(src)-done in 1..xxh3Block bytes) into
// acc and returns the hash of src.
func xxh3Finish(acc *[8]uint64, src []byte, done int) uint64 {
	n := len(src)
	stripes := (n - 1 - done) / xxh3Stripe
	for s := range stripes {
		accumStripe(acc, src[done+s*xxh3Stripe:], xxh3Secret[s*8:])
	}
	accumStripe(acc, src[n-xxh3Stripe:], xxh3Secret[len(xxh3Secret)-xxh3Stripe-7:])
	h := uint64(n) * prime64_1
	for i := range 4 {
		s := xxh3Secret[11+16*i:]
		hi, lo := bits.Mul64(acc[2*i]^binary.LittleEndian.Uint64(s), acc[2*i+1]^binary.LittleEndian.Uint64(s[8:]))
		h += hi ^ lo
	}
	h ^= h >> 37
	h *= 0x165667919e3779f9
	return h ^ h>>32
}

// accumStripe folds one 64-byte stripe of p into acc with the secret at s.
func accumStripe(acc *[8]uint64, p, s []byte) {
	for i := range 8 {
		v := binary.LittleEndian.Uint64(p[8*i:])
		k := v ^ binary.LittleEndian.Uint64(s[8*i:])
		acc[i^1] += v
		acc[i] += (k & 0xffffffff) * (k >> 32)
	}
}

// accumBlocksGeneric folds whole blocks of p into acc, scrambling after
// each: what the fused kernel computes, for the tests.
func accumBlocksGeneric(acc *[8]uint64, p []byte, blocks int) {
	for b := range blocks {
		for s := range xxh3Block / xxh3Stripe {
			accumStripe(acc, p[b*xxh3Block+s*xxh3Stripe:], xxh3Secret[s*8:])
		}
		for i := range 8 {
			a := acc[i]
			a ^= a >> 47
			a ^= binary.LittleEndian.Uint64(xxh3Secret[len(xxh3Secret)-xxh3Stripe+8*i:])
			acc[i] = a * prime32_1
		}
	}
}
