//go:build !amd64

package shm

// fusedCopyHash says copyHash may use a fused kernel: none here.
const fusedCopyHash = false

func accumCopyBlocks(acc *[8]uint64, dst, src []byte, blocks int) {
	n := blocks * xxh3Block
	copy(dst[:n], src[:n])
	accumBlocksGeneric(acc, src, blocks)
}
