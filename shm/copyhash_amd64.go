package shm

import "golang.org/x/sys/cpu"

// fusedCopyHash says copyHash may use the AVX2 kernel.
var fusedCopyHash = cpu.X86.HasAVX2

// accumCopyAVX2 copies blocks*1024 bytes from src to dst (32-byte
// aligned) with non-temporal stores and folds them into acc, scrambling
// after each block, with the 192-byte secret.
//
//go:noescape
func accumCopyAVX2(acc *[8]uint64, dst, src *byte, blocks int, secret *byte)

// accumCopyBlocks copies the first blocks*1024 bytes of src into dst and
// folds them into acc.
func accumCopyBlocks(acc *[8]uint64, dst, src []byte, blocks int) {
	if blocks == 0 {
		return
	}
	_, _ = dst[blocks*xxh3Block-1], src[blocks*xxh3Block-1]
	accumCopyAVX2(acc, &dst[0], &src[0], blocks, &xxh3Secret[0])
}
